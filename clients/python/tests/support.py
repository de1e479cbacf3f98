"""Helpers shared by the tests: the turnstore process, ids, shortcuts, and
httpx transports that fail on purpose, to exercise the clients' retries
against the real server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import pytest

from turnstore import Client

# What a scripted transport does with a request:
#   "pass":   forward it and return the server's response;
#   "lose":   forward it, then raise ReadError (the server acted, the reply was lost);
#   "refuse": raise ConnectError without forwarding (the server never saw it);
#   "503":    answer 503 without forwarding (an overloaded proxy);
#   "busy":   answer a fork's 409 session_exists with Retry-After: 1 without
#             forwarding (another fork into the id is under way).
PASS, LOSE, REFUSE, UNAVAILABLE, BUSY = "pass", "lose", "refuse", "503", "busy"


STARTUP_TIMEOUT = 30.0
API_KEYS = ("test-key-1", "test-key-2")


@dataclass
class Server:
    """A running turnstore process."""

    url: str
    store: str
    process: "subprocess.Popen[str]"
    log: List[str]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _binary() -> str:
    path = os.environ.get("TURNSTORE_BIN")
    if not path:
        pytest.exit(
            "TURNSTORE_BIN is not set: point it at a turnstore binary "
            "(e.g. TURNSTORE_BIN=target/debug/turnstore)",
            returncode=4,
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.exit(f"TURNSTORE_BIN={path} is not an executable file", returncode=4)
    return path


def start_turnstore(store: str, extra_env: Optional[Dict[str, str]] = None) -> Server:
    """Starts ``turnstore serve`` on a port the OS picks, and reads that port
    from its "turnstore serving" log line (so no port can be raced for)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTORE_")}
    env.update(
        TURNSTORE_LISTEN="127.0.0.1:0",
        TURNSTORE_LOG_FORMAT="json",
        TURNSTORE_KEY_PREFIX=f"pytest-{uuid.uuid4().hex[:12]}",
    )
    env.update(extra_env or {})
    process = subprocess.Popen(
        [_binary(), "serve"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: List[str] = []
    port: List[int] = []
    ready = threading.Event()

    def drain() -> None:
        # Reads the log to the end, so a chatty server never blocks on a full pipe.
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line)
            if not ready.is_set():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("message") == "turnstore serving":
                    port.append(int(record["port"]))
                    ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(STARTUP_TIMEOUT) or not port:
        process.kill()
        process.wait()
        raise RuntimeError("turnstore did not start:\n" + "".join(log))
    return Server(f"http://127.0.0.1:{port[0]}", store, process, log)


def new_id(prefix: str = "t") -> str:
    """An id no other test uses (the servers are shared)."""
    return f"{prefix}-{uuid.uuid4().hex}"


TRANSCRIPTS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "transcripts"


def transcript_fixture(name: str) -> List[Dict[str, Any]]:
    """One of the repository's agent-loop transcripts (``tests/fixtures/transcripts``,
    the server's distill fixtures), as the messages of an import."""
    messages: List[Dict[str, Any]] = json.loads((TRANSCRIPTS / name).read_text("utf-8"))
    return messages


def finished_turn(client: Client, session_id: str, question: str, answer: str) -> int:
    """Starts and finalizes one turn; returns its seq."""
    started = client.start_turn(question, session_id=session_id)
    client.finalize_turn(session_id, started.turn_id, answer)
    return started.seq


def _unavailable(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        503,
        json={
            "type": "urn:turnstore:problem:overloaded",
            "title": "Overloaded",
            "status": 503,
            "detail": "injected by the test transport",
            "code": "overloaded",
        },
        headers={"content-type": "application/problem+json"},
        request=request,
    )


def _busy(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        409,
        json={
            "type": "urn:turnstore:problem:session_exists",
            "title": "Session exists",
            "status": 409,
            "detail": "injected by the test transport: another fork is under way",
            "code": "session_exists",
        },
        headers={"content-type": "application/problem+json", "retry-after": "1"},
        request=request,
    )


def redis_command(url: str, *args: str) -> bytes:
    """One command to the Redis at ``url`` (``redis://host:port``); its
    reply's first line (enough for the writes the tests make)."""
    host, port = url.removeprefix("redis://").rsplit(":", 1)
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"".join(parts))
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    if reply.startswith(b"-"):
        raise RuntimeError(f"redis {args[0]}: {reply.decode().strip()}")
    return reply


class ScriptedTransport(httpx.BaseTransport):
    """Forwards to the real server, except as ``script`` says for the first
    requests (one action per request, then "pass"). Records every request."""

    def __init__(self, script: Optional[List[str]] = None) -> None:
        self.script = list(script or [])
        self.requests: List[httpx.Request] = []
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        action = self.script.pop(0) if self.script else PASS
        if action == REFUSE:
            raise httpx.ConnectError("injected: connection refused", request=request)
        if action == UNAVAILABLE:
            return _unavailable(request)
        if action == BUSY:
            return _busy(request)
        response = self._inner.handle_request(request)
        if action == LOSE:
            response.read()
            response.close()
            raise httpx.ReadError("injected: response lost", request=request)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncScriptedTransport(httpx.AsyncBaseTransport):
    """:class:`ScriptedTransport` for the async client."""

    def __init__(self, script: Optional[List[str]] = None) -> None:
        self.script = list(script or [])
        self.requests: List[httpx.Request] = []
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        action = self.script.pop(0) if self.script else PASS
        if action == REFUSE:
            raise httpx.ConnectError("injected: connection refused", request=request)
        if action == UNAVAILABLE:
            return _unavailable(request)
        if action == BUSY:
            return _busy(request)
        response = await self._inner.handle_async_request(request)
        if action == LOSE:
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("injected: response lost", request=request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def real_tokenizers() -> str:
    """The real tokenizers `scripts/fetch-tokenizers` brings (scripts/test
    names where: TURNSTORE_TEST_TOKENIZERS)."""
    found = os.environ.get("TURNSTORE_TEST_TOKENIZERS")
    if found:
        return found
    root = Path(__file__).resolve().parents[3]
    there = root / "target" / "tokenizers"
    subprocess.run([str(root / "scripts" / "fetch-tokenizers"), str(there)], check=True)
    return str(there)
