"""The README's first Python example runs as written, against a test server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support import Server

README = Path(__file__).resolve().parent.parent / "README.md"


def first_python_block() -> str:
    match = re.search(r"^```python\n(.*?)^```", README.read_text("utf-8"), re.M | re.S)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_the_readme_rag_flow_runs(server: Server) -> None:
    code = first_python_block()
    assert len(code.strip().splitlines()) < 20
    assert 'os.environ.get("TURNSTORE_URL", "http://127.0.0.1:8080")' in code
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
