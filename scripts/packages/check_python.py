"""Checks the Python client's sdist and wheel as a user gets them. For each
archive: what it holds; then, installed alone (`pip install <file>`) into a
fresh venv outside the repository (no dev tools, no editable install), its
metadata against pyproject.toml, its files against src/turnstore, and the
client README's first example (the quick start), run there as written
against a fresh turnstore on the in-memory store.

Usage: check_python.py <turnstore binary> <work dir with dist/ in it>
(run by scripts/check-python-package, in the venv that has `build`, which
brings `packaging`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Set, Tuple

try:
    import tomllib
except ImportError:  # Python 3.10: `build` depends on tomli there.
    import tomli as tomllib  # type: ignore[no-redef]

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "python"
sys.path.insert(0, str(ROOT / "scripts" / "openapi"))
from server import turnstore  # noqa: E402  (the OpenAPI checks' server starter)

PYPROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text("utf-8"))["project"]
NAME = PYPROJECT["name"]
VERSION = PYPROJECT["version"]
DIST_INFO = f"{NAME}-{VERSION}.dist-info"

# What the quick start prints on a fresh server (it names its session).
QUICK_START_OUTPUT = (
    "### Conversation history:\n"
    "User: What is a vector index?\nAssistant: You asked: What is a vector index?\n\n"
    "User: How do I build one?\nAssistant: You asked: How do I build one?\n"
)

# The installed package reports this, as JSON, from inside its venv.
INSPECT = """
import json, importlib.metadata as md, turnstore
dist = md.distribution("turnstore")
print(json.dumps({
    "version": dist.version,
    "module_version": turnstore.__version__,
    "module_file": turnstore.__file__,
    "requires_python": dist.metadata["Requires-Python"],
    "requires_dist": dist.requires or [],
    "provides_extra": dist.metadata.get_all("Provides-Extra") or [],
    "files": [str(f) for f in dist.files or []],
    "installed": sorted(d.metadata["Name"] for d in md.distributions()),
}))
"""


def source_modules() -> Set[str]:
    """The package's modules as the source tree has them, as `turnstore/...` paths."""
    src = PACKAGE / "src"
    return {
        p.relative_to(src).as_posix()
        for p in (src / "turnstore").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def junk(path: str) -> bool:
    """Build and tool leftovers that no archive should carry."""
    parts = path.split("/")
    return path.endswith((".pyc", ".pyo")) or any(
        p in {"__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", "tests"}
        or p.endswith(".egg-info")
        for p in parts
    )


def sdist_problems(path: Path) -> List[str]:
    """The sdist holds the package's source, its README and its metadata: no
    tests (they need the repository around them), no venv, no caches."""
    top = f"{NAME}-{VERSION}/"
    with tarfile.open(path) as archive:
        names = [m.name for m in archive.getmembers() if m.isfile()]
    problems = [f"{n}: outside {top}" for n in names if not n.startswith(top)]
    inside = [n[len(top):] for n in names if n.startswith(top)]
    needed = {"PKG-INFO", "pyproject.toml", "README.md"}
    for name in inside:
        if junk(name):
            problems.append(f"{name}: a test, cache or venv file")
        elif not (
            name.startswith(("src/turnstore/", "LICENSE")) or name in needed | {".gitignore"}
        ):
            problems.append(f"{name}: not part of the package")
    shipped = {n[len("src/"):] for n in inside if n.startswith("src/turnstore/")}
    problems += [f"src/{m}: missing" for m in sorted(source_modules() - shipped)]
    problems += [f"{n}: missing" for n in sorted(needed - set(inside))]
    return problems


def wheel_problems(path: Path) -> List[str]:
    """The wheel holds the package and its dist-info, nothing else."""
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
    problems = [f"{n}: a test, cache or venv file" for n in names if junk(n)]
    problems += [
        f"{n}: not part of the package"
        for n in names
        if not n.startswith(("turnstore/", f"{DIST_INFO}/"))
    ]
    problems += [f"{m}: missing" for m in sorted(source_modules() - set(names))]
    return problems


def requirement_key(text: str, extra: str = "") -> Tuple[str, str, str] | None:
    """A requirement as (name, extras, specifier), or None when its marker
    leaves it out of `extra` ("" for the base install) on this Python."""
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": extra}):
        return None
    return canonicalize_name(req.name), ",".join(sorted(req.extras)), str(req.specifier)


def keys(texts: List[str], extra: str = "") -> Set[Tuple[str, str, str]]:
    return {k for k in (requirement_key(t, extra) for t in texts) if k is not None}


def metadata_problems(seen: Dict[str, Any], venv: Path) -> List[str]:
    """The installed metadata says what pyproject.toml says."""
    problems = []
    if seen["version"] != VERSION or seen["module_version"] != VERSION:
        problems.append(
            f"version: pyproject.toml {VERSION}, metadata {seen['version']}, "
            f"turnstore.__version__ {seen['module_version']}"
        )
    if seen["requires_python"] != PYPROJECT["requires-python"]:
        problems.append(f"Requires-Python: {seen['requires_python']}")
    base = keys(seen["requires_dist"])
    if base != keys(PYPROJECT["dependencies"]):
        problems.append(f"dependencies: metadata {sorted(base)}")
    extras: Dict[str, List[str]] = {
        canonicalize_name(k): v for k, v in PYPROJECT.get("optional-dependencies", {}).items()
    }
    provided = {canonicalize_name(e) for e in seen["provides_extra"]}
    if provided != set(extras):
        problems.append(f"extras: metadata {sorted(provided)}, pyproject.toml {sorted(extras)}")
    for extra, wanted in extras.items():
        # An extra's own requirements: those its marker adds to the base install.
        got = keys(seen["requires_dist"], extra) - base
        if got != keys(wanted, extra):
            problems.append(f"extra {extra}: metadata {sorted(got)}")
    # Installed alone: no extra's (nor the dev tools') packages came along.
    optional = {k[0] for reqs in extras.values() for k in keys(reqs, "x")}
    optional -= {k[0] for k in keys(PYPROJECT["dependencies"])}
    stray = optional & {canonicalize_name(n) for n in seen["installed"]}
    if stray:
        problems.append(f"installed with it: {sorted(stray)}")
    if not Path(seen["module_file"]).resolve().is_relative_to(venv.resolve()):
        problems.append(f"imported from {seen['module_file']}, not from the venv")
    files = {f for f in seen["files"] if "__pycache__" not in f}
    problems += [f"{m}: not installed" for m in sorted(source_modules() - files)]
    problems += [
        f"{f}: installed but not part of the package"
        for f in sorted(files)
        if not f.startswith(("turnstore/", f"{DIST_INFO}/"))
    ]
    return problems


def quick_start() -> str:
    """The client README's first ```python block, as written (as
    tests/test_readme.py extracts it)."""
    readme = (PACKAGE / "README.md").read_text("utf-8")
    match = re.search(r"^```python\n(.*?)^```", readme, re.M | re.S)
    assert match, "clients/python/README.md has no ```python block"
    return match.group(1)


def run(args: List[str], cwd: Path, env: Dict[str, str], timeout: float = 300) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def check_installed(artifact: Path, work: Path, binary: str) -> List[str]:
    """Installs `artifact` alone into a fresh venv in `work`, then checks what
    got installed and runs the quick start with it."""
    venv = work / f"venv-{artifact.name}"
    # The user's shell, less anything that would point Python at other code.
    env = {
        k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    }
    run([sys.executable, "-m", "venv", str(venv)], work, env)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(artifact)], work, env)
    run([python, "-m", "pip", "check"], work, env)
    problems = metadata_problems(json.loads(run([python, "-c", INSPECT], work, env)), venv)
    # The README's example, saved as a user would save it, run beside no
    # source of the package, against a fresh server (it names its session).
    (work / "quick_start.py").write_text(quick_start(), "utf-8")
    with turnstore(binary) as url:
        result = subprocess.run(
            [python, "quick_start.py"],
            cwd=work,
            env={**env, "TURNSTORE_URL": url},
            capture_output=True,
            text=True,
            timeout=60,
        )
    if result.returncode != 0:
        problems.append(f"the README's quick start failed:\n{result.stderr}")
    elif result.stdout != QUICK_START_OUTPUT:
        problems.append(f"the README's quick start printed {result.stdout!r}")
    return problems


def main() -> int:
    binary, work = sys.argv[1], Path(sys.argv[2])
    # The developer's settings (API keys, a Redis URL) must not reach the
    # server nor the example.
    for name in [n for n in os.environ if n.startswith("TURNSTORE_")]:
        del os.environ[name]
    dist = work / "dist"
    checks: List[Tuple[Path, Callable[[Path], List[str]]]] = [
        (dist / f"{NAME}-{VERSION}-py3-none-any.whl", wheel_problems),
        (dist / f"{NAME}-{VERSION}.tar.gz", sdist_problems),
    ]
    failed = False
    for artifact, contents in checks:
        started = time.monotonic()
        if not artifact.is_file():
            print(f"check_python: {artifact.name}: not built (dist/: {sorted(os.listdir(dist))})")
            failed = True
            continue
        problems = [f"in the archive: {p}" for p in contents(artifact)]
        problems += [f"installed: {p}" for p in check_installed(artifact, work, binary)]
        took = time.monotonic() - started
        if problems:
            failed = True
            print(f"check_python: {artifact.name}: FAILED ({took:.0f}s)")
            for problem in problems:
                print(f"  {problem}")
        else:
            print(
                f"check_python: {artifact.name}: contents, metadata, files and "
                f"the README's quick start OK ({took:.0f}s)"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
