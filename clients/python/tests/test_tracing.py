"""Trace context: inside an OpenTelemetry span (a real SDK tracer), every
request the clients send, retries included, carries the span's
``traceparent`` and ``tracestate``; outside one, or switched off, none.

The headers are read where they arrive: a recording reverse proxy in front
of the real server (the server's own spans are test_server_spans.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterator, List, Optional

import httpx
import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from support import Server, new_id

from turnstore import AsyncClient, Client

# Not the global provider: the clients must find the span through the
# current context alone, as they do under any provider.
TRACER = TracerProvider().get_tracer("turnstore-tests")

# The upstream request the caller's span continues, with a vendor's tracestate.
UPSTREAM = SpanContext(
    trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
    span_id=0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("congo", "t61rcWkgMzE")]),
)
# ... and baggage, which the default propagators send as well, but not the clients.
UPSTREAM_CONTEXT: Context = baggage.set_baggage(
    "user", "alice", context=trace.set_span_in_context(NonRecordingSpan(UPSTREAM))
)

TRACE_HEADERS = ("traceparent", "tracestate")


@contextmanager
def upstream_request() -> Iterator[None]:
    """The caller's context while it serves the upstream request."""
    token = otel_context.attach(UPSTREAM_CONTEXT)
    try:
        yield
    finally:
        otel_context.detach(token)


class RecordingProxy:
    """A reverse proxy in front of a turnstore: records each request's
    headers as received, and answers 503 itself to the first
    ``unavailable`` ones (the client's retries then reach the server)."""

    def __init__(self, upstream: str, unavailable: int = 0) -> None:
        self.received: List[Dict[str, str]] = []
        self.unavailable = unavailable
        self._upstream = httpx.Client(base_url=upstream)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                headers = {name.lower(): value for name, value in self.headers.items()}
                proxy.received.append(headers)
                if len(proxy.received) <= proxy.unavailable:
                    self._answer(503, {"content-type": "application/problem+json"},
                                 json.dumps({"status": 503, "code": "overloaded"}).encode())
                    return
                length = int(self.headers.get("content-length") or 0)
                response = proxy._upstream.request(
                    self.command,
                    self.path,
                    content=self.rfile.read(length) if length else None,
                    headers={k: v for k, v in headers.items() if k not in ("host", "content-length")},
                )
                skip = ("content-length", "transfer-encoding", "connection", "content-encoding")
                kept = {k: v for k, v in response.headers.items() if k.lower() not in skip}
                self._answer(response.status_code, kept, response.content)

            def _answer(self, status: int, headers: Dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def proxy(server: Server) -> Iterator[RecordingProxy]:
    p = RecordingProxy(server.url)
    yield p
    p.close()


@pytest.fixture
def flaky_proxy(server: Server) -> Iterator[RecordingProxy]:
    p = RecordingProxy(server.url, unavailable=1)
    yield p
    p.close()


def expected_traceparent(span: trace.Span) -> str:
    context = span.get_span_context()
    assert context.trace_flags.sampled
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def trace_headers(received: List[Dict[str, str]]) -> List[Dict[str, Optional[str]]]:
    return [{name: headers.get(name) for name in TRACE_HEADERS} for headers in received]


def test_every_request_in_a_span_carries_its_trace_context(proxy: RecordingProxy) -> None:
    sid, uid = new_id("s"), new_id("u")
    with Client(proxy.url) as client:
        with upstream_request(), TRACER.start_as_current_span("rag request") as span:
            written: Dict[str, str] = {}
            propagate.inject(written)
            assert sorted(written) == ["baggage", "traceparent", "tracestate"]
            started = client.start_turn("q", session_id=sid, user_id=uid)
            client.finalize_turn(sid, started.turn_id, "a")
            client.get_history(sid, format="turns")
            client.get_history_text(sid)
            with client.export_user(uid) as export:
                assert [s.session_id for s in export] == [sid]
            client.get_session(sid)
            client.clear_session(sid)

    traceparent = expected_traceparent(span)
    assert traceparent.startswith(f"00-{UPSTREAM.trace_id:032x}-")
    assert trace_headers(proxy.received) == [
        {"traceparent": traceparent, "tracestate": "congo=t61rcWkgMzE"}
    ] * 7
    assert not any("baggage" in headers for headers in proxy.received)


async def test_every_async_request_in_a_span_carries_its_trace_context(
    proxy: RecordingProxy,
) -> None:
    sid, uid = new_id("s"), new_id("u")
    async with AsyncClient(proxy.url) as client:
        with TRACER.start_as_current_span("rag request") as span:
            started = await client.start_turn("q", session_id=sid, user_id=uid)
            await client.finalize_turn(sid, started.turn_id, "a")
            await client.get_history(sid)
            async with client.export_user(uid) as export:
                assert [s.session_id async for s in export] == [sid]
            await client.abort_turn(sid, started.turn_id)

    assert trace_headers(proxy.received) == [
        {"traceparent": expected_traceparent(span), "tracestate": None}
    ] * 5


def test_a_retried_request_carries_the_trace_context_on_every_try(
    flaky_proxy: RecordingProxy,
) -> None:
    with Client(flaky_proxy.url, initial_backoff=0.001, max_backoff=0.01) as client:
        with TRACER.start_as_current_span("rag request") as span:
            started = client.start_turn("q", session_id=new_id())

    assert started.replayed is False  # the first try never reached the server
    traceparents = [h.get("traceparent") for h in flaky_proxy.received]
    assert traceparents == [expected_traceparent(span)] * 2
    assert len({h["x-request-id"] for h in flaky_proxy.received}) == 1


async def test_a_retried_async_request_carries_the_trace_context_on_every_try(
    flaky_proxy: RecordingProxy,
) -> None:
    async with AsyncClient(flaky_proxy.url, initial_backoff=0.001, max_backoff=0.01) as client:
        with TRACER.start_as_current_span("rag request") as span:
            await client.get_history(new_id())

    traceparents = [h.get("traceparent") for h in flaky_proxy.received]
    assert traceparents == [expected_traceparent(span)] * 2


async def test_no_trace_context_without_a_current_span(proxy: RecordingProxy) -> None:
    sid = new_id()
    with Client(proxy.url) as client:
        client.start_turn("q", session_id=sid)
        with TRACER.start_as_current_span("ended"):
            pass
        client.get_history(sid)
    async with AsyncClient(proxy.url) as aclient:
        await aclient.get_session(sid)

    assert trace_headers(proxy.received) == [{"traceparent": None, "tracestate": None}] * 3


async def test_no_trace_context_when_switched_off(proxy: RecordingProxy) -> None:
    sid = new_id()
    with upstream_request(), TRACER.start_as_current_span("rag request"):
        with Client(proxy.url, propagate_trace=False) as client:
            client.start_turn("q", session_id=sid)
        async with AsyncClient(proxy.url, propagate_trace=False) as aclient:
            await aclient.get_session(sid)

    assert trace_headers(proxy.received) == [{"traceparent": None, "tracestate": None}] * 2


def test_the_callers_own_trace_headers_win(proxy: RecordingProxy) -> None:
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sid = new_id()
    with upstream_request(), TRACER.start_as_current_span("rag request"):
        with Client(proxy.url, headers={"TraceParent": mine}) as client:
            client.start_turn("q", session_id=sid)
        with httpx.Client(headers={"tracestate": "mine=1"}) as http:
            with Client(proxy.url, http_client=http) as client:
                client.get_session(sid)

    received = trace_headers(proxy.received)
    assert received[0] == {"traceparent": mine, "tracestate": "congo=t61rcWkgMzE"}
    assert received[1]["tracestate"] == "mine=1"
    assert received[1]["traceparent"] != mine and received[1]["traceparent"] is not None


def test_without_opentelemetry_the_import_is_tried_once_and_nothing_is_sent() -> None:
    # Nothing imports it with the package, nor for a client with tracing off;
    # the first request of one with tracing on tries, once.
    code = """
import sys
import httpx

tried = []

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            tried.append(name)
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import turnstore
print(tried)
seen = []

def answer(request):
    seen.append(sorted(name for name in request.headers if name in ("traceparent", "tracestate")))
    return httpx.Response(204)

off = turnstore.Client("http://turnstore.test", transport=httpx.MockTransport(answer),
                       propagate_trace=False)
off.clear_session("s")
print(tried)
client = turnstore.Client("http://turnstore.test", transport=httpx.MockTransport(answer))
for _ in range(3):
    client.clear_session("s")
print(tried, seen)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.splitlines()
    assert lines == ["[]", "[]", "['opentelemetry'] [[], [], [], []]"], result.stdout + result.stderr
