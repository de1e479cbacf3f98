"""End to end: the trace context the clients send is the parent of the
real server's spans, as an OTLP collector receives them.

A turnstore on the memory store exports to a receiver this module runs
(OTLP/HTTP, protobuf bodies); the caller's span comes from a real SDK
tracer, whose root spans carry traceparent flags ``03`` (sampled, random
trace id), so this also proves the server takes those as a parent. Only
server spans are checked: the memory store makes no Redis script calls."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterable, Iterator, List, Tuple

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span as CallerSpan
from support import Server, new_id, start_turnstore

from turnstore import AsyncClient, Client

# Not the global provider: the clients find the span through the current
# context alone.
TRACER = TracerProvider().get_tracer("turnstore-tests")

# How long the server may take to export a span (it sends every 100 ms).
SPAN_TIMEOUT = 15.0

START = "POST /v1/turns"
FINALIZE = "POST /v1/sessions/{session_id}/turns/{turn_id}/finalize"


class OtlpReceiver:
    """An OTLP/HTTP trace receiver: keeps each body POSTed to ``/v1/traces``
    as sent, and answers an empty ExportTraceServiceResponse."""

    def __init__(self) -> None:
        # (path, content-type, content-encoding, body) of each POST, as received.
        self.received: List[Tuple[str, str, str, bytes]] = []
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def bodies(self) -> List[bytes]:
        """Each body, decompressed if it came gzipped."""
        with self.lock:
            received = list(self.received)
        return [gzip.decompress(body) if encoding == "gzip" else body
                for _, _, encoding, body in received]

    def spans(self) -> List[Span]:
        spans: List[Span] = []
        for body in self.bodies():
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    spans.extend(scope.spans)
        return spans

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    receiver.received.append((
                        self.path,
                        self.headers.get("content-type", ""),
                        self.headers.get("content-encoding", ""),
                        body,
                    ))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced_server(receiver: OtlpReceiver) -> Iterator[Server]:
    """A turnstore on the memory store that sends its spans to ``receiver``."""
    srv = start_turnstore(
        "memory",
        {"TURNSTORE_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    yield srv
    srv.stop()


def ids(span: CallerSpan) -> Tuple[bytes, bytes]:
    """The caller span's trace id and span id, as OTLP encodes them."""
    context = span.get_span_context()
    # 03: sampled, and a random trace id (W3C Trace Context Level 2).
    assert int(context.trace_flags) == 0x03
    return context.trace_id.to_bytes(16, "big"), context.span_id.to_bytes(8, "big")


def server_spans(
    receiver: OtlpReceiver, server: Server, trace_id: bytes, names: Iterable[str]
) -> Dict[str, Span]:
    """The server spans of the trace ``trace_id``, by name, once one of each
    of ``names`` has arrived (polls up to ``SPAN_TIMEOUT``)."""
    wanted = set(names)
    deadline = time.monotonic() + SPAN_TIMEOUT
    while True:
        found = {
            span.name: span
            for span in receiver.spans()
            if span.trace_id == trace_id and span.kind == Span.SpanKind.SPAN_KIND_SERVER
        }
        if wanted <= set(found):
            return found
        if time.monotonic() > deadline:
            seen = [(s.name, s.trace_id.hex(), s.parent_span_id.hex()) for s in receiver.spans()]
            pytest.fail(
                f"no server spans {sorted(wanted - set(found))} in trace {trace_id.hex()} "
                f"after {SPAN_TIMEOUT}s; received (name, trace, parent): {seen}\n"
                f"turnstore log:\n{''.join(server.log[-40:])}"
            )
        time.sleep(0.05)


def test_the_server_spans_of_a_turn_are_children_of_the_callers_span(
    receiver: OtlpReceiver, traced_server: Server
) -> None:
    sid, uid = new_id("s"), new_id("u")
    question, answer = f"question {new_id('q')}", f"answer {new_id('a')}"
    with Client(traced_server.url) as client:
        with TRACER.start_as_current_span("rag request") as caller:
            started = client.start_turn(question, session_id=sid, user_id=uid)
            client.finalize_turn(sid, started.turn_id, answer)

    trace_id, span_id = ids(caller)
    spans = server_spans(receiver, traced_server, trace_id, [START, FINALIZE])
    assert sorted(spans) == sorted([START, FINALIZE])
    for span in spans.values():
        assert span.parent_span_id == span_id, span.name
    with receiver.lock:
        received = list(receiver.received)
    assert {(path, kind) for path, kind, _, _ in received} == {
        ("/v1/traces", "application/x-protobuf")
    }
    sent = [body for _, _, _, body in received] + receiver.bodies()
    for secret in (question, answer, sid, uid):
        assert not any(secret.encode() in body for body in sent), secret


async def test_an_async_request_is_a_child_of_the_callers_span(
    receiver: OtlpReceiver, traced_server: Server
) -> None:
    question = f"question {new_id('q')}"
    async with AsyncClient(traced_server.url) as client:
        with TRACER.start_as_current_span("rag request") as caller:
            await client.start_turn(question, session_id=new_id("s"))

    trace_id, span_id = ids(caller)
    spans = server_spans(receiver, traced_server, trace_id, [START])
    assert list(spans) == [START]
    assert spans[START].parent_span_id == span_id
    assert not any(question.encode() in body for body in receiver.bodies())
