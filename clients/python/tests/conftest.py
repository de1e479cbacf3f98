"""Test servers: the real turnstore binary (``TURNSTORE_BIN``), on the
in-memory store and on a Redis this suite starts, one of each per run.

Every test that takes ``server`` (or a fixture built on it) runs once per
store. Tests isolate themselves by using fresh session and user ids, so the
servers are shared across tests.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import AsyncIterator, Dict, Iterator

import pytest
import pytest_asyncio
from support import API_KEYS, STARTUP_TIMEOUT, Server, start_turnstore

from turnstore import AsyncClient, Client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private redis-server for this run, with persistence off."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.exit("redis-server is not on PATH (apt-get install redis-server)", returncode=4)
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not _redis_ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"redis-server did not start on port {port}")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def _store_env(store: str, request: pytest.FixtureRequest) -> Dict[str, str]:
    if store == "redis":
        url: str = request.getfixturevalue("redis_url")
        return {"TURNSTORE_REDIS_URL": url}
    return {}


@pytest.fixture(scope="session", params=["memory", "redis"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """An open turnstore (no API keys), once per store."""
    store: str = request.param
    srv = start_turnstore(store, _store_env(store, request))
    yield srv
    srv.stop()


@pytest.fixture(scope="session", params=["memory", "redis"])
def auth_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A turnstore that requires one of ``API_KEYS``, once per store."""
    store: str = request.param
    env = _store_env(store, request)
    env["TURNSTORE_API_KEYS"] = ",".join(API_KEYS)
    srv = start_turnstore(store, env)
    yield srv
    srv.stop()


@pytest.fixture(scope="session", params=["memory", "redis"])
def capped_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A turnstore allowing 2 pending turns per session, once per store."""
    store: str = request.param
    env = _store_env(store, request)
    env["TURNSTORE_MAX_PENDING_TURNS"] = "2"
    srv = start_turnstore(store, env)
    yield srv
    srv.stop()


# Operator templates (TURNSTORE_TEMPLATES_DIR) of ``templates_server``:
# ``conv`` uses every macro, ``broken`` fails on its line 2 for any turn,
# ``plain`` has no summary macro.
TEMPLATES = {
    "conv": (
        '{% macro header() %}<conversation id="{{ session_id }}">{% endmacro %}\n'
        '{% macro turn(turn) %}<q n="{{ turn.seq }}">{{ turn.user_query }}</q>'
        "<a>{{ turn.final_answer }}</a>{% endmacro %}\n"
        "{% macro separator() %}\n{% endmacro %}\n"
        "{% macro footer() %}</conversation>{% endmacro %}\n"
        '{% macro summary(summary) %}<summary upto="{{ summary.through_seq }}">'
        "{{ summary.text }}</summary>{% endmacro %}\n"
    ),
    "broken": "{% macro turn(turn) %}{{ turn.seq }}\n{{ no_such_name.field }}{% endmacro %}\n",
    "plain": (
        "{% macro turn(turn) %}[{{ turn.user_query }}|{{ turn.final_answer }}]{% endmacro %}\n"
    ),
}


@pytest.fixture(scope="session")
def templates_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("templates")
    for name, source in TEMPLATES.items():
        (directory / f"{name}.jinja").write_text(source, "utf-8")
    return directory


@pytest.fixture(scope="session", params=["memory", "redis"])
def templates_server(request: pytest.FixtureRequest, templates_dir: Path) -> Iterator[Server]:
    """A turnstore with the operator templates of ``TEMPLATES``, once per store."""
    yield from _server_with(request, TURNSTORE_TEMPLATES_DIR=str(templates_dir))


def _server_with(request: pytest.FixtureRequest, **env: str) -> Iterator[Server]:
    """A turnstore on the store ``request.param`` names, with ``env`` besides."""
    store: str = request.param
    srv = start_turnstore(store, {**_store_env(store, request), **env})
    yield srv
    srv.stop()


# A loaded tokenizer with a chat template (TURNSTORE_TOKENIZERS_DIR of
# ``chat_server``): the repository's tiny BPE fixture with ChatML's special
# tokens, and ChatML as its template.
TINY_TOKENIZER = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-tokenizer.json"
CHATML_TOKENS = [
    {
        "id": 261 + i,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    for i, content in enumerate(["<|im_start|>", "<|im_end|>"])
]
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def tokenizers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TURNSTORE_TOKENIZERS_DIR holding ``chat``, a tokenizer with a chat template."""
    directory = tmp_path_factory.mktemp("tokenizers")
    (directory / "chat").mkdir()
    tokenizer = json.loads(TINY_TOKENIZER.read_text("utf-8"))
    tokenizer["added_tokens"] = CHATML_TOKENS
    (directory / "chat" / "tokenizer.json").write_text(json.dumps(tokenizer), "utf-8")
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>"}
    (directory / "chat" / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return directory


@pytest.fixture(scope="session", params=["memory", "redis"])
def chat_server(request: pytest.FixtureRequest, tokenizers_dir: Path) -> Iterator[Server]:
    """A turnstore with the ``chat`` tokenizer of ``tokenizers_dir``, once per store."""
    yield from _server_with(request, TURNSTORE_TOKENIZERS_DIR=str(tokenizers_dir))


EXPORT_TIMEOUT = "300ms"


@pytest.fixture(scope="session", params=["memory", "redis"])
def export_cut_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A turnstore whose exports stop at ``EXPORT_TIMEOUT``, once per store."""
    store: str = request.param
    env = _store_env(store, request)
    env["TURNSTORE_EXPORT_TIMEOUT"] = EXPORT_TIMEOUT
    srv = start_turnstore(store, env)
    yield srv
    srv.stop()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    """A client with short backoffs (retries take milliseconds in tests)."""
    with Client(server.url, initial_backoff=0.01, max_backoff=0.05) as c:
        yield c


@pytest_asyncio.fixture
async def aclient(server: Server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url, initial_backoff=0.01, max_backoff=0.05) as c:
        yield c
