"""The README examples run as written against a test server: the first
Python example of this client's README and of the project's README (the
RAG flow), every other block of this README that reads
``TURNSTORE_URL``, the project README's ``curl`` example, and the shell
blocks of docs/history.md, each checked against what it prints."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple, Union

import pytest
from support import Server, real_tokenizers, start_turnstore

HERE = Path(__file__).resolve().parent.parent
READMES = {
    "client": HERE / "README.md",
    "project": HERE.parent.parent / "README.md",
}
HISTORY_STRATEGIES = HERE.parent.parent / "docs" / "history.md"
# A block runs when it makes its client from the environment (TURNSTORE_URL).
RUNNABLE = "client = Client()"


def first_python_block(readme: Path) -> str:
    match = re.search(r"^```python\n(.*?)^```", readme.read_text("utf-8"), re.M | re.S)
    assert match, f"{readme} has no ```python block"
    return match.group(1)


def runnable_blocks(readme: Path) -> Dict[str, List[str]]:
    """The Python blocks that read ``TURNSTORE_URL``, by the heading of their
    section (``## ``) or subsection (``### ``)."""
    blocks: Dict[str, List[str]] = {}
    heading = ""
    pattern = re.compile(r"^###? ([^\n]*)$|^```python\n(.*?)^```", re.M | re.S)
    for match in pattern.finditer(readme.read_text("utf-8")):
        if match.group(1) is not None:
            heading = match.group(1)
        elif RUNNABLE in match.group(2):
            blocks.setdefault(heading, []).append(match.group(2))
    return blocks


def run(code: str, server: Server) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **{k: v for k, v in os.environ.items() if k != "TURNSTORE_API_KEY"},
            "TURNSTORE_URL": server.url,
        },
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


# The history the framework examples leave: two questions, each answered by
# a stand-in model that echoes it.
ECHOED_HISTORY = (
    "### Conversation history:\n"
    "User: What is a vector index?\nAssistant: You asked: What is a vector index?\n\n"
    "User: How do I build one?\nAssistant: You asked: How do I build one?\n"
)

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
    "Prompt caching": "1 None 1\n2 1 3\n3 1 5\n4 1 7\n5 1 9\n6 1 11\n7 4 7\n",
    "Import": "2 1 2\n['messages[0].role']\n",
    "Agent transcripts": (
        "1 [('instructions', [0]), ('tool_result', [3]), ('tool_call', [2])]\n"
        "How do I rotate an API key? -> Open Settings > API keys and choose Rotate.\n"
    ),
    "Export": lambda stdout, suffix: sorted(stdout.splitlines())
    == [f"chat-48-{suffix} 1 None", f"chat-49-{suffix} 1 None"],
    "As transcripts": "[('user', 'Hi'), ('assistant', 'Hello!')]\nTrue\n",
    "Regenerating an answer": (
        "1 HNSW.\n"
        "turn_summarized\n"
        "### Conversation history:\nUser: Name a vector index.\nAssistant: HNSW.\n"
    ),
    "LangChain": (
        "An index of embeddings.\n"
        "Never\n"
        "### Conversation history:\n"
        "User: What is a vector index?\nAssistant: An index of embeddings.\n"
    ),
    "LlamaIndex": (
        "You asked: What is a vector index?\nYou asked: How do I build one?\n" + ECHOED_HISTORY
    ),
    "OpenAI Agents SDK": (
        "You asked: What is a vector index?\nYou asked: How do I build one?\n4\n" + ECHOED_HISTORY
    ),
    "LangGraph": (
        "2 You asked: What is a vector index?\n4 You asked: How do I build one?\n" + ECHOED_HISTORY
    ),
    "Editing a question": (
        "1 False\n"
        "2\n"
        "### Conversation history:\nUser: Name a vector index.\nAssistant: IVF.\n\n"
        "User: How much memory does it take?\nAssistant: About 1.5 times the vectors.\n"
        "2\n"
    ),
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


def shell_blocks(text: str, level: str) -> Dict[str, str]:
    """The ```sh blocks of a document that read ``TURNSTORE_URL``, and its
    ```jinja block, by the heading (of ``level``, e.g. "## ") above them."""
    blocks: Dict[str, str] = {}
    heading = ""
    pattern = re.compile(r"^" + level + r"([^\n]*)$|^```(sh|jinja)\n(.*?)^```", re.M | re.S)
    for match in pattern.finditer(text):
        if match.group(1) is not None:
            heading = match.group(1)
        elif match.group(2) == "jinja":
            blocks["template file"] = match.group(3)
        elif "TURNSTORE_URL" in match.group(3):
            blocks[heading] = match.group(3)
    return blocks


def strategy_blocks() -> Dict[str, str]:
    """docs/history.md's blocks, by their "## " heading."""
    return shell_blocks(HISTORY_STRATEGIES.read_text("utf-8"), "## ")


def run_shell(block: str, server: Server) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env={
            **{k: v for k, v in os.environ.items() if k != "TURNSTORE_API_KEY"},
            "TURNSTORE_URL": server.url,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def shown_output(block: str) -> List[str]:
    """The block's "# " comment lines: the documents show each line a block
    prints as one (among comments that explain)."""
    return [line[2:] for line in block.splitlines() if line.startswith("# ")]


def test_the_project_readme_curl_example_runs_as_shown(server: Server) -> None:
    blocks = shell_blocks(READMES["project"].read_text("utf-8"), "## ")
    block = blocks["One RAG request"]
    # A session of its own for each run: the example names one.
    block = block.replace("chat-42", f"readme-{os.urandom(6).hex()}")
    result = run_shell(block, server)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    expected = [
        '"seq":1',
        '"messages":[]',
        '"seq":1',
        "### Conversation history:",
        "User: What is a vector index?",
        "Assistant: An index over embeddings that finds the nearest ones fast.",
    ]
    assert printed == expected, result.stdout
    # The README shows each printed line as a comment.
    shown = shown_output(block)
    assert all(line in shown for line in expected), shown


# What each block prints, in document order (they build on each other). The
# document shows each line as a comment; the export's creation time varies.
STRATEGIES = {
    "Import a transcript": [
        '{"session_id":"chat-44","user_id":"alice","imported_turns":3,"first_seq":1,"last_seq":3}'
    ],
    "Import an agent loop's transcript": [
        '"imported_turns":1',
        '"reason":"instructions"',
        '"reason":"tool_result"',
        '"reason":"tool_call"',
        '"reason":"unanswered"',
        '"role":"user","content":"How do I rotate an API key?"',
        '"role":"assistant","content":"Open Settings > API keys and choose Rotate."',
    ],
    "Rolling summaries, kept by your client": [
        '"unsummarized":{"after_seq":0,"through_seq":2,"turns":2,"tokens":38}',
        '"through_seq":2',
        "### Conversation summary:",
        "Alice asked about vector indexes and chose HNSW for recall.",
        "",
        "### Conversation history:",
        "User: How much memory does it take?",
        "Assistant: About 1.5 times the vectors.",
    ],
    "Templates": [
        '<history><turn role="user">How much memory does it take?</turn>'
        '<turn role="assistant">About 1.5 times the vectors.</turn></history>',
        "Earlier in this conversation:",
        "[2] Q: Which one should I use?",
        "A: HNSW, for recall.",
        "[3] Q: How much memory does it take?",
        "A: About 1.5 times the vectors.",
    ],
    "Export, and translations": ['{"session_id":"chat-44","created_at":"'],
    "Exact budgets for open models": [
        '"encoding":"llama3","token_count":62',
        '"encoding":"llama3","token_count":24',
        '"stopped_by":"max_tokens"',
        '"token_count":31',
        '"prompt":"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n'
        "How much memory does it take?<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\\n\\nAbout 1.5 times the vectors.<|eot_id|><|start_header_id|>assistant"
        '<|end_header_id|>\\n\\n"',
    ],
    "Prompt caches: stable windows": [
        '"window":{"stride":3,"from_seq":7,"left_out":2}',
        '"breakpoint":{"seq":8,"messages":4}',
        '"window":{"stride":3,"from_seq":7,"left_out":1}',
        '"breakpoint":{"seq":9,"messages":6}',
    ],
    "Branches: regenerate an answer, edit a question": [
        '"seq":2,"user_query":"And for recall?","final_answer":"HNSW, with a higher ef_search."',
        '"copied_turns":1',
        '"seq":2',
    ],
}


@pytest.fixture(params=["memory", "redis"])
def strategies_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Tuple[Server, Dict[str, str]]]:
    """A fresh server whose templates are docs/history.md's template file,
    with the tokenizers and model table its open-models block names."""
    blocks = strategy_blocks()
    (tmp_path / "numbered.jinja").write_text(blocks["template file"], "utf-8")
    (tmp_path / "models.txt").write_text("llama-3* = llama3\n", "utf-8")
    env = {
        "TURNSTORE_TEMPLATES_DIR": str(tmp_path),
        "TURNSTORE_TOKENIZERS_DIR": real_tokenizers(),
        "TURNSTORE_MODELS": str(tmp_path / "models.txt"),
    }
    if request.param == "redis":
        env["TURNSTORE_REDIS_URL"] = request.getfixturevalue("redis_url")
    srv = start_turnstore(request.param, env)
    yield srv, blocks
    srv.stop()


def test_the_history_strategies_run_as_the_readme_shows(
    strategies_server: Tuple[Server, Dict[str, str]],
) -> None:
    server, blocks = strategies_server
    assert sorted(b for b in blocks if b != "template file") == sorted(STRATEGIES)
    for heading, expected in STRATEGIES.items():
        block = blocks[heading]
        # The document shows what the block prints (the export's first 60
        # characters, with some creation time).
        shown = shown_output(block)
        for line in expected:
            assert any(s.startswith(line) for s in shown) or line == "", (heading, line)
        result = run_shell(block, server)
        assert result.returncode == 0, (heading, result.stderr)
        printed = result.stdout.splitlines()
        if heading == "Export, and translations":
            assert len(printed) == 1 and printed[0].startswith(expected[0]), printed
        else:
            assert printed == expected, (heading, result.stdout)


# --- install lines -----------------------------------------------------------

ROOT = HERE.parent.parent
INSTALL_READMES = [
    ROOT / "README.md",
    HERE / "README.md",
    ROOT / "clients/typescript/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# This repository's packages: published nowhere, installed from a clone.
OURS = {"turnstore", "turnstore-client"}


def install_lines(readme: Path) -> List[Tuple[str, List[str]]]:
    """Every `pip install ...` and `npm install ...` of a README, with its
    arguments (options and `<placeholders>` left out)."""
    found = []
    for match in re.finditer(r"\b(pip|npm) install (?!-scripts)([^`\n#]*)", readme.read_text()):
        args = [a for a in shlex.split(match.group(2)) if not a.startswith(("-", "<"))]
        found.append((match.group(1), args))
    return found


def test_install_lines_work_from_a_clone() -> None:
    """pip runs from the clone's root; npm from a project beside the clone
    (`../turnstore/...`). A package of this repository is named by its
    folder, never by its name, and the extras named exist."""
    extras = re.search(
        r"^\[project.optional-dependencies\]\n(.*?)^\[", (HERE / "pyproject.toml").read_text(),
        re.M | re.S,
    )
    assert extras
    known_extras = set(re.findall(r"^([\w-]+) = ", extras.group(1), re.M))
    checked = 0
    for readme in INSTALL_READMES:
        for tool, args in install_lines(readme):
            for arg in args:
                name, _, extra = arg.partition("[")
                where = f"{readme.relative_to(ROOT)}: {tool} install {arg}"
                assert name not in OURS, f"{where}: not published; install the folder of a clone"
                if not name.startswith((".", "/")):
                    continue  # a published package
                path = name.replace("../turnstore/", "./", 1) if tool == "npm" else name
                assert (ROOT / path).is_dir(), where
                manifest = "package.json" if tool == "npm" else "pyproject.toml"
                assert (ROOT / path / manifest).is_file(), where
                if extra:
                    assert set(extra.rstrip("]").split(",")) <= known_extras, where
                checked += 1
    assert checked >= 5
