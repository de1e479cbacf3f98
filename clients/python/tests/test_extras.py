"""Each framework integration imports its framework when it is imported,
and names the extra to install when the framework is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

# module of turnstore, the framework's top-level package, the extra
INTEGRATIONS = [
    ("langchain", "langchain_core", "langchain"),
    ("langgraph", "langgraph", "langgraph"),
    ("llama_index", "llama_index", "llamaindex"),
    ("openai_agents", "agents", "openai-agents"),
]


@pytest.mark.parametrize("module,framework,extra", INTEGRATIONS)
def test_a_missing_framework_names_its_extra(module: str, framework: str, extra: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{framework!r}] = None  # as if not installed\n"
        "import turnstore\n"
        "try:\n"
        f"    import turnstore.{module}\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert f"[{extra}] extra" in result.stdout, result.stdout + result.stderr
    assert f"turnstore.{module} needs" in result.stdout


def test_the_core_imports_no_framework() -> None:
    code = (
        "import sys, turnstore\n"
        "print(sorted(m for m in ('langchain_core', 'langgraph', 'llama_index', 'agents')"
        " if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == "[]\n"
