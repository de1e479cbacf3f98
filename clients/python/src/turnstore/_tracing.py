"""Trace context for the requests the clients send: when the caller has a
current OpenTelemetry span, each request carries it (W3C ``traceparent`` and
``tracestate``, as the application's propagator writes them), so the
server's span of the request joins the caller's trace.

Only those two headers are sent, whatever else the propagator writes
(``baggage``, B3): the server reads no other, its CORS allows no other, and
baggage may hold what an application would not send to a store.

OpenTelemetry is optional (the ``otel`` extra): ``opentelemetry-api`` is
imported on the first request, once per process. Without it the import
fails once, that result is kept, and requests carry no trace headers.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Mapping, Optional

__all__ = ["add_trace_context"]

logger = logging.getLogger("turnstore")

Inject = Callable[[Dict[str, str]], None]

TRACE_HEADERS = ("traceparent", "tracestate")

# The result of the one import attempt: how to write the current context's
# headers, or None without OpenTelemetry. Set once, read by every request
# (two threads racing through the first import both set the same result).
_inject: Optional[Inject] = None
_imported = False


def add_trace_context(headers: Dict[str, str], explicit: Mapping[str, str]) -> None:
    """Adds the current span's trace headers to ``headers``, unless a header
    of that name is already in ``headers`` or in ``explicit`` (the httpx
    client's own headers): the caller's headers win. Adds nothing without
    OpenTelemetry or without a current valid span."""
    inject = _inject if _imported else _import()
    if inject is None:
        return
    carrier: Dict[str, str] = {}
    inject(carrier)
    if not carrier:
        return
    present = {name.lower() for name in headers}
    for name, value in carrier.items():
        name = name.lower()
        if name in TRACE_HEADERS and name not in present and name not in explicit:
            headers[name] = value


def _import() -> Optional[Inject]:
    global _inject, _imported
    inject: Optional[Inject]
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        inject = None
    except Exception as exc:
        # E.g. OTEL_PROPAGATORS naming a propagator that is not installed:
        # tracing is the application's to fix; requests go on without it.
        logger.warning("OpenTelemetry failed to load; requests carry no trace context: %s", exc)
        inject = None
    else:

        def inject(carrier: Dict[str, str]) -> None:
            # A composite propagator (baggage) writes headers even without
            # a span; only a valid span is a trace to join.
            if trace.get_current_span().get_span_context().is_valid:
                propagate.inject(carrier)

    _inject, _imported = inject, True
    return inject
