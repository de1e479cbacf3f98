"""The first Python example of this client's README, and of the project's
README, runs as written against a test server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import Server

HERE = Path(__file__).resolve().parent.parent
READMES = {
    "client": HERE / "README.md",
    "project": HERE.parent.parent / "README.md",
}


def first_python_block(readme: Path) -> str:
    match = re.search(r"^```python\n(.*?)^```", readme.read_text("utf-8"), re.M | re.S)
    assert match, f"{readme} has no ```python block"
    return match.group(1)


@pytest.mark.parametrize("which", sorted(READMES))
def test_the_readme_rag_flow_runs(server: Server, which: str) -> None:
    code = first_python_block(READMES[which])
    assert len(code.strip().splitlines()) < 20
    assert 'os.environ.get("TURNSTORE_URL", "http://127.0.0.1:8080")' in code
    # Each run gets a session of its own: the example names one.
    session = f"readme-{os.urandom(6).hex()}"
    code = code.replace('"chat-42"', repr(session))
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TURNSTORE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("### Conversation history:\nUser: What is a vector index?")
    assert "User: How do I build one?" in result.stdout
