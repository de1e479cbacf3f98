"""The README examples run as written against a test server: the first
Python example of this client's README and of the project's README (the
RAG flow), and every other block of this README that reads
``TURNSTORE_URL``, checked against what it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Union

import pytest
from support import Server

HERE = Path(__file__).resolve().parent.parent
READMES = {
    "client": HERE / "README.md",
    "project": HERE.parent.parent / "README.md",
}
RUNNABLE = 'os.environ.get("TURNSTORE_URL", "http://127.0.0.1:8080")'


def first_python_block(readme: Path) -> str:
    match = re.search(r"^```python\n(.*?)^```", readme.read_text("utf-8"), re.M | re.S)
    assert match, f"{readme} has no ```python block"
    return match.group(1)


def runnable_blocks(readme: Path) -> Dict[str, List[str]]:
    """The Python blocks that read ``TURNSTORE_URL``, by their section's heading."""
    blocks: Dict[str, List[str]] = {}
    heading = ""
    pattern = re.compile(r"^## ([^\n]*)$|^```python\n(.*?)^```", re.M | re.S)
    for match in pattern.finditer(readme.read_text("utf-8")):
        if match.group(1) is not None:
            heading = match.group(1)
        elif RUNNABLE in match.group(2):
            blocks.setdefault(heading, []).append(match.group(2))
    return blocks


def run(code: str, server: Server) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TURNSTORE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("which", sorted(READMES))
def test_the_readme_rag_flow_runs(server: Server, which: str) -> None:
    code = first_python_block(READMES[which])
    assert len(code.strip().splitlines()) < 20
    assert RUNNABLE in code
    # Each run gets a session of its own: the example names one.
    session = f"readme-{os.urandom(6).hex()}"
    code = code.replace('"chat-42"', repr(session))
    stdout = run(code, server)
    assert stdout.startswith("### Conversation history:\nUser: What is a vector index?")
    assert "User: How do I build one?" in stdout


# What each section's example prints: the exact output, or (for the export,
# whose ids get the run's suffix and whose order may tie) a check of it.
EXPECTED: Dict[str, Union[str, Callable[[str, str], bool]]] = {
    "Translations": (
        "### Conversation history:\n"
        "User: Was ist ein Vektorindex?\n"
        "Assistant: [de] You asked: [en] Was ist ein Vektorindex?\n"
        "### Conversation history:\n"
        "User: [en] Was ist ein Vektorindex?\n"
        "Assistant: You asked: [en] Was ist ein Vektorindex?\n"
    ),
    "Rolling summaries": (
        "### Conversation summary:\n"
        "user message 1 assistant message 1 user message 2 assistant message 2 "
        "user message 3 assistant message 3\n\n"
        "### Conversation history:\n"
        "User: user message 4\nAssistant: assistant message 4\n\n"
        "User: user message 5\nAssistant: assistant message 5\n"
    ),
    "Templates": (
        '<history><turn role="user">Is HNSW &lt; IVF?</turn>'
        '<turn role="assistant">For recall, yes.</turn></history>\n'
        "## Conversation history\n\n**User:** Is HNSW < IVF?\n\n**Assistant:** For recall, yes.\n"
    ),
    "Import": "2 1 2\n['messages[0].role']\n",
    "Export": lambda stdout, suffix: sorted(stdout.splitlines())
    == [f"chat-48-{suffix} 1 None", f"chat-49-{suffix} 1 None"],
}


def test_every_runnable_example_is_checked() -> None:
    sections = runnable_blocks(READMES["client"])
    assert sections.pop("One RAG request") == [first_python_block(READMES["client"])]
    assert sorted(sections) == sorted(EXPECTED)
    assert all(len(blocks) == 1 for blocks in sections.values())


@pytest.mark.parametrize("section", sorted(EXPECTED))
def test_a_readme_example_runs(server: Server, section: str) -> None:
    (code,) = runnable_blocks(READMES["client"])[section]
    # Fresh ids for each run: the examples name theirs.
    suffix = os.urandom(6).hex()
    code = re.sub(r'"(chat-\d+|alice|bob)"', lambda m: f'"{m.group(1)}-{suffix}"', code)
    stdout = run(code, server)
    expected = EXPECTED[section]
    if isinstance(expected, str):
        assert stdout == expected
    else:
        assert expected(stdout, suffix), stdout
