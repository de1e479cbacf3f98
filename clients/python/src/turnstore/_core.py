"""What the sync and async clients share: request descriptions, the retry
policy and its decisions, and the mapping of responses to results or errors.

The clients differ only in how they send a request and wait between tries
(``httpx.Client`` and ``time.sleep`` or ``httpx.AsyncClient`` and
``asyncio.sleep``); every decision is made here, once.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Generic,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    TypeVar,
    Union,
)
from urllib.parse import quote

import httpx

from .errors import (
    ConnectionFailedError,
    ExportIncompleteError,
    FieldError,
    TurnstoreError,
    error_class_for,
)
from .models import (
    History,
    HistoryFormat,
    HistoryOptions,
    HistoryText,
    ImportMode,
    Language,
    Summary,
    WindowKind,
)

__all__ = ["Call", "RetryPolicy"]

VERSION = "0.1.0"
USER_AGENT = f"turnstore-python/{VERSION}"
DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 10.0
#: Read when a client is given no ``base_url`` / ``api_key``.
URL_VARIABLE = "TURNSTORE_URL"
API_KEY_VARIABLE = "TURNSTORE_API_KEY"

T = TypeVar("T")

RETRYABLE_STATUSES = frozenset({502, 503, 504})

ExportFormat = Literal["turns", "messages"]
"""An export's lines: sessions with their turns (``turns``, the server's
default) or with their turns as a chat transcript (``messages``)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait before trying a request again.

    Only failures that leave the request's effect unknown or absent are
    retried: connection errors, timeouts, and 502/503/504 (and a fork's
    409 ``session_exists`` with ``Retry-After``: another attempt of a fork
    into that id is still writing). Each retry waits
    a random time between 0 and ``min(max_backoff, initial_backoff * 2**n)``
    ("full jitter", so many clients failing together do not retry in
    lockstep); a ``Retry-After`` header raises the wait, up to
    ``max_backoff``.
    """

    max_retries: int = 2
    initial_backoff: float = 0.25
    max_backoff: float = 4.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff times must be >= 0")

    def delay(self, retry: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        ceiling = min(self.max_backoff, self.initial_backoff * (2 ** (retry - 1)))
        wait = random.uniform(0, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_backoff))
        return wait


@dataclass
class Call:
    """One logical operation: a request, sent once plus its retries.

    ``request_id`` is sent as ``x-request-id`` on every try, so the
    service's logs tie the tries of one operation together.
    ``gone_means_done``: a 404 ``turn_not_found`` after an earlier try that
    may have reached the server is the success of that try (abort).
    ``busy_means_wait``: a 409 ``session_exists`` with ``Retry-After`` (a
    fork into that id is under way, perhaps this call's own stopped try) is
    retried like a 503, after the wait it names (fork; see
    :func:`fork_call`).
    """

    method: str
    path: str
    params: Dict[str, Union[str, int]] = field(default_factory=dict)
    json_body: Optional[Mapping[str, Any]] = None
    headers: Dict[str, str] = field(default_factory=dict)
    accept: str = "application/json"
    gone_means_done: bool = False
    busy_means_wait: bool = False
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def request_headers(self, base: Mapping[str, str]) -> Dict[str, str]:
        headers = dict(base)
        headers.update(self.headers)
        headers["Accept"] = self.accept
        headers["x-request-id"] = self.request_id
        if self.json_body is not None:
            headers["Content-Type"] = "application/json"
        return headers

    def content(self) -> Optional[bytes]:
        if self.json_body is None:
            return None
        return json.dumps(self.json_body, ensure_ascii=False).encode("utf-8")


class Attempts:
    """The retry state of one :class:`Call`: what each outcome means next.

    ``on_exception`` and ``on_response`` return the seconds to wait before
    trying again, or raise / return the final outcome.
    """

    def __init__(self, call: Call, policy: RetryPolicy) -> None:
        self.call = call
        self.policy = policy
        self.tries = 0
        self.maybe_applied = False

    def on_exception(self, exc: httpx.TransportError) -> float:
        """Retry a transport failure, or raise :class:`ConnectionFailedError`."""
        self.tries += 1
        if not _retryable_exception(exc) or self.tries > self.policy.max_retries:
            timeout = isinstance(exc, httpx.TimeoutException)
            raise ConnectionFailedError(
                0,
                "timeout" if timeout else "connection_error",
                "Request timed out" if timeout else "Connection failed",
                _describe(self.call, exc),
                request_id=self.call.request_id,
            ) from exc
        # A request that failed before a connection existed never reached
        # the server; any later failure may have been processed there.
        if not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            self.maybe_applied = True
        return self.policy.delay(self.tries)

    def on_response(self, response: httpx.Response) -> Optional[float]:
        """``None``: the response is the outcome (success, or a 404 that
        completes an earlier try); a number: wait and retry; else raise."""
        self.tries += 1
        if response.is_success:
            return None
        status = response.status_code
        if (
            self.call.gone_means_done
            and self.maybe_applied
            and status == 404
            and _problem_code(response) == "turn_not_found"
        ):
            return None
        if status in RETRYABLE_STATUSES and self.tries <= self.policy.max_retries:
            # A gateway may have forwarded the request before failing.
            self.maybe_applied = True
            return self.policy.delay(self.tries, _retry_after(response))
        if self._busy(response) and self.tries <= self.policy.max_retries:
            return self.policy.delay(self.tries, _retry_after(response))
        raise error_from_response(response, self.call.request_id)

    def _busy(self, response: httpx.Response) -> bool:
        """A fork's 409 ``session_exists`` that says when to try again: an
        attempt into the new id is still writing (not: the id is taken)."""
        return (
            self.call.busy_means_wait
            and response.status_code == 409
            and _retry_after(response) is not None
            and _problem_code(response) == "session_exists"
        )


def _describe(call: Call, exc: Exception) -> str:
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{call.method} {call.path}: {reason}"


def _retryable_exception(exc: httpx.TransportError) -> bool:
    return isinstance(
        exc,
        (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError),
    )


def _retry_after(response: httpx.Response) -> Optional[float]:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare enough to fall back to backoff
    return seconds if seconds >= 0 else None


def _problem(response: httpx.Response) -> Optional[Dict[str, Any]]:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _problem_code(response: httpx.Response) -> Optional[str]:
    problem = _problem(response)
    code = None if problem is None else problem.get("code")
    return code if isinstance(code, str) else None


def error_from_response(response: httpx.Response, request_id: str) -> TurnstoreError:
    """The exception for an error response, from its problem document if it
    has one (a proxy's HTML error page does not)."""
    status = response.status_code
    problem = _problem(response) or {}
    code = problem.get("code")
    title = problem.get("title")
    detail = problem.get("detail")
    raw_errors = problem.get("errors")
    errors: List[FieldError] = []
    if isinstance(raw_errors, list):
        for item in raw_errors:
            if isinstance(item, dict):
                errors.append(FieldError(str(item.get("field", "")), str(item.get("message", ""))))
    if not isinstance(detail, str):
        detail = "" if problem else response.text[:500]
    cls = error_class_for(status, code if isinstance(code, str) else None)
    return cls(
        status,
        code if isinstance(code, str) else "unexpected_response",
        title if isinstance(title, str) else response.reason_phrase,
        detail,
        errors=errors,
        request_id=response.headers.get("x-request-id", request_id),
        retry_after=_retry_after(response),
    )


def parse(response: httpx.Response, request_id: str, build: Callable[[Any], T]) -> T:
    """Builds a result from a success response's JSON; a body that is not
    what the contract says (wrong proxy, wrong URL) is a TurnstoreError, not
    a KeyError deep in the caller."""
    try:
        return build(response.json())
    except (ValueError, KeyError, TypeError) as exc:
        raise TurnstoreError(
            response.status_code,
            "unexpected_response",
            "Unexpected response",
            f"the response to {response.request.method} {response.request.url.path} "
            f"is not a turnstore response ({type(exc).__name__}: {exc})",
            request_id=response.headers.get("x-request-id", request_id),
        ) from exc


def segment(value: str) -> str:
    """A path segment, percent-encoded so that any string stays one segment
    (the server then rejects an invalid id with a 422 naming it)."""
    return quote(value, safe="")


def base_url(given: Optional[str]) -> str:
    """``given``, else ``TURNSTORE_URL``, else ``http://127.0.0.1:8080``."""
    url = given if given is not None else os.environ.get(URL_VARIABLE) or DEFAULT_BASE_URL
    return url.rstrip("/")


def api_key(given: Optional[str]) -> Optional[str]:
    """``given``, else ``TURNSTORE_API_KEY`` (unset or empty: no key)."""
    return given if given is not None else os.environ.get(API_KEY_VARIABLE) or None


def base_headers(api_key: Optional[str], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    headers = {"User-Agent": USER_AGENT}
    if extra:
        headers.update(extra)
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def new_id() -> str:
    """A UUID v4: the session ids and Idempotency-Keys this client makes are
    as unguessable as the ones the server makes."""
    return str(uuid.uuid4())


# --- request builders, one per operation ---------------------------------


def start_call(
    user_query: str,
    session_id: Optional[str],
    user_id: Optional[str],
    history: Optional[HistoryOptions],
    idempotency_key: Optional[str],
    user_query_en: Optional[str] = None,
) -> Call:
    """A retry-safe start: the server only recognises a retried start by its
    Idempotency-Key, and only with a session id in the body, so both are
    made here when the caller gives none, once per logical start."""
    body: Dict[str, Any] = {
        "session_id": session_id if session_id is not None else new_id(),
        "user_query": user_query,
    }
    if user_id is not None:
        body["user_id"] = user_id
    if user_query_en is not None:
        body["user_query_en"] = user_query_en
    if history is not None:
        body["history"] = history.to_json()
    key = idempotency_key if idempotency_key is not None else new_id()
    return Call("POST", "/v1/turns", json_body=body, headers={"Idempotency-Key": key})


def finalize_call(
    session_id: str, turn_id: str, final_answer: str, final_answer_en: Optional[str] = None
) -> Call:
    return _answer_call("finalize", session_id, turn_id, final_answer, final_answer_en)


def regenerate_call(
    session_id: str, turn_id: str, final_answer: str, final_answer_en: Optional[str] = None
) -> Call:
    """A regenerate: a finalize's body, sent to ``.../regenerate``. Retried
    like a finalize: the same answer again replaces the answer with itself."""
    return _answer_call("regenerate", session_id, turn_id, final_answer, final_answer_en)


def _answer_call(
    action: str,
    session_id: str,
    turn_id: str,
    final_answer: str,
    final_answer_en: Optional[str],
) -> Call:
    body = {"final_answer": final_answer}
    if final_answer_en is not None:
        body["final_answer_en"] = final_answer_en
    return Call(
        "POST",
        f"/v1/sessions/{segment(session_id)}/turns/{segment(turn_id)}/{action}",
        json_body=body,
    )


def abort_call(session_id: str, turn_id: str) -> Call:
    return Call(
        "DELETE",
        f"/v1/sessions/{segment(session_id)}/turns/{segment(turn_id)}",
        gone_means_done=True,
    )


def history_options(
    options: Optional[HistoryOptions],
    *,
    limit: Optional[int] = None,
    max_tokens: Optional[int] = None,
    format: Optional[HistoryFormat] = None,
    model: Optional[str] = None,
    encoding: Optional[str] = None,
    max_query_chars: Optional[int] = None,
    max_answer_chars: Optional[int] = None,
    keep_first: Optional[bool] = None,
    after_seq: Optional[int] = None,
    through_seq: Optional[int] = None,
    lang: Optional[Language] = None,
    summary: Optional[bool] = None,
    template: Optional[str] = None,
    chat_template: Optional[bool] = None,
    prompt: Optional[bool] = None,
    system: Optional[str] = None,
    window: Optional[WindowKind] = None,
    stride: Optional[int] = None,
    cache_control: Optional[bool] = None,
) -> HistoryOptions:
    """``options`` with the keyword arguments that are set taking precedence."""
    base = options if options is not None else HistoryOptions()
    overrides = {
        "limit": limit,
        "max_tokens": max_tokens,
        "format": format,
        "model": model,
        "encoding": encoding,
        "max_query_chars": max_query_chars,
        "max_answer_chars": max_answer_chars,
        "keep_first": keep_first,
        "after_seq": after_seq,
        "through_seq": through_seq,
        "lang": lang,
        "summary": summary,
        "template": template,
        "chat_template": chat_template,
        "prompt": prompt,
        "system": system,
        "window": window,
        "stride": stride,
        "cache_control": cache_control,
    }
    merged = base.to_json()
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return HistoryOptions(**merged)


def history_call(session_id: str, options: HistoryOptions, *, text: bool = False) -> Call:
    return Call(
        "GET",
        f"/v1/sessions/{segment(session_id)}/history",
        params=options.to_params(),
        accept="text/plain" if text else "application/json",
    )


def session_call(method: str, session_id: str) -> Call:
    return Call(method, f"/v1/sessions/{segment(session_id)}")


def user_sessions_call(user_id: str, limit: Optional[int], cursor: Optional[str]) -> Call:
    params: Dict[str, Union[str, int]] = {}
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return Call("GET", f"/v1/users/{segment(user_id)}/sessions", params=params)


def erase_call(user_id: str) -> Call:
    return Call("DELETE", f"/v1/users/{segment(user_id)}")


def summary_call(method: str, session_id: str) -> Call:
    return Call(method, f"/v1/sessions/{segment(session_id)}/summary")


def put_summary_call(
    session_id: str,
    summary: str,
    through_seq: int,
    expected_through_seq: Optional[int],
    user_id: Optional[str],
    expected_generation: Optional[str] = None,
) -> Call:
    body: Dict[str, Any] = {"summary": summary, "through_seq": through_seq}
    if expected_through_seq is not None:
        body["expected_through_seq"] = expected_through_seq
    if expected_generation is not None:
        body["expected_generation"] = expected_generation
    if user_id is not None:
        body["user_id"] = user_id
    return Call("PUT", f"/v1/sessions/{segment(session_id)}/summary", json_body=body)


def import_call(
    session_id: str,
    messages: Iterable[Mapping[str, object]],
    user_id: Optional[str],
    idempotency_key: Optional[str],
    mode: ImportMode = "strict",
) -> Call:
    """A retry-safe import: an Idempotency-Key (the caller's or a new one)
    sent with every try, so a retried import answers what the first made.

    The messages are sent as given (copied), not filtered: the server
    checks every one and names each wrong one by its index. ``mode`` is
    sent only when it is not ``strict`` (the server's default), so a strict
    import's body is the same as before modes existed."""
    body: Dict[str, Any] = {"messages": [dict(m) for m in messages]}
    if user_id is not None:
        body["user_id"] = user_id
    if mode != "strict":
        body["mode"] = mode
    key = idempotency_key if idempotency_key is not None else new_id()
    return Call(
        "POST",
        f"/v1/sessions/{segment(session_id)}/import",
        json_body=body,
        headers={"Idempotency-Key": key},
    )


def fork_call(
    session_id: str,
    new_session_id: str,
    through_seq: Optional[int],
    user_id: Optional[str],
    idempotency_key: Optional[str],
) -> Call:
    """A retry-safe fork: an Idempotency-Key (the caller's or a new one)
    sent with every try, as an import's, so a retried fork answers what the
    first made. Absent fields are not sent (the server's defaults).

    A 409 ``session_exists`` with ``Retry-After`` is waited out and retried
    (``busy_means_wait``): the server answers so while another attempt of a
    fork into ``new_session_id`` may still be writing its copy, typically
    this very call's earlier try, stopped by a timeout or a killed instance
    after it began, whose retry would otherwise fail on its own half-made
    fork. Once that attempt finishes, the retry with the same key is its
    replay; once it is stale (5 s without a write), the retry takes over and
    completes the fork. Either way the answer after the wait is the
    verdict, and a fork by another call (another key) that did finish is
    then a plain 409 ``session_exists`` (no ``Retry-After``), raised."""
    body: Dict[str, Any] = {"new_session_id": new_session_id}
    if through_seq is not None:
        body["through_seq"] = through_seq
    if user_id is not None:
        body["user_id"] = user_id
    key = idempotency_key if idempotency_key is not None else new_id()
    return Call(
        "POST",
        f"/v1/sessions/{segment(session_id)}/fork",
        json_body=body,
        headers={"Idempotency-Key": key},
        busy_means_wait=True,
    )


def export_call(user_id: str, format: ExportFormat = "turns") -> Call:
    """An export; ``format`` is sent only when it is not ``turns`` (the
    server's default), so an export of sessions is the request it was."""
    params: Dict[str, Union[str, int]] = {} if format == "turns" else {"format": format}
    return Call(
        "GET",
        f"/v1/users/{segment(user_id)}/export",
        params=params,
        accept="application/x-ndjson",
    )


def replayed(response: httpx.Response) -> bool:
    """Whether the server answered with an earlier request's result (the
    same Idempotency-Key and body)."""
    value: str = response.headers.get("idempotent-replayed", "")
    return value.lower() == "true"


def is_written(stored: Optional[Summary], summary: str, through_seq: int) -> bool:
    """Whether the stored summary is the one a write would have made: how a
    retried compare-and-set write recognises its own lost success."""
    return stored is not None and (stored.summary, stored.through_seq) == (summary, through_seq)


STORED_SUMMARY = HistoryOptions(summary=True, format="turns", limit=0, max_tokens=10_000_000)
"""A history read of the summary alone, with the session's generation: how a
retried write that named a generation checks both in one read (no stored
summary fills the budget: it is at most 32 KiB)."""


def written_in(
    history: History, summary: str, through_seq: int, generation: str
) -> Optional[Summary]:
    """The history's summary if it is the one a write would have made, in
    the generation the write named, else ``None``: an equal summary in a
    later generation of the session (started again under the same id) is
    not that write's, which a clear deleted."""
    if history.generation != generation or not is_written(history.summary, summary, through_seq):
        return None
    return history.summary


# --- exports: NDJSON read as it arrives --------------------------------


class NdjsonLines:
    """Splits a byte stream into lines as the chunks arrive, holding only
    the line being received (never the whole body), and tells whether the
    stream ended in the middle of a line: the mark of a cut export."""

    def __init__(self) -> None:
        self._partial: List[bytes] = []

    def feed(self, chunk: bytes) -> List[bytes]:
        """The lines this chunk completes (without their newline)."""
        lines: List[bytes] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            piece = chunk[start:end]
            if self._partial:
                self._partial.append(piece)
                piece = b"".join(self._partial)
                self._partial = []
            lines.append(piece)
            start = end + 1
        if start < len(chunk):
            self._partial.append(chunk[start:])
        return lines

    @property
    def pending_bytes(self) -> int:
        """Bytes received of a line whose newline has not arrived."""
        return sum(len(p) for p in self._partial)


class ExportState(Generic[T]):
    """What the sync and async export streams share: the lines received and
    not yet yielded, their parsing (``build``: a line's JSON to the item;
    ``what``: the item, for errors), and the errors of a cut stream."""

    def __init__(self, call: Call, build: Callable[[Any], T], what: str) -> None:
        self.call = call
        self.build = build
        self.what = what
        self.lines = NdjsonLines()
        self.ready: Deque[bytes] = deque()
        self.sessions = 0
        self.status = 200
        self.request_id = call.request_id

    def started(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.request_id = response.headers.get("x-request-id", self.call.request_id)

    def feed(self, chunk: bytes) -> None:
        # Blank lines carry nothing (NDJSON readers skip them).
        self.ready.extend(line for line in self.lines.feed(chunk) if line.strip())

    def take(self) -> Optional[T]:
        """The next complete session received, or ``None`` for more bytes."""
        if not self.ready:
            return None
        line = self.ready.popleft()
        try:
            session = self.build(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise TurnstoreError(
                self.status,
                "unexpected_response",
                "Unexpected response",
                f"line {self.sessions + 1} of {self.call.method} {self.call.path} is not "
                f"{self.what} ({type(exc).__name__}: {exc})",
                request_id=self.request_id,
            ) from exc
        self.sessions += 1
        return session

    def end(self) -> None:
        """The body ended: raises if it ended in the middle of a line."""
        if self.lines.pending_bytes:
            raise self._incomplete(
                f"the export ended in the middle of a line ({self.lines.pending_bytes} bytes "
                "without their newline)"
            )

    def broken(self, exc: Exception) -> ExportIncompleteError:
        return self._incomplete(f"the connection broke during the export ({_reason(exc)})")

    def _incomplete(self, what: str) -> ExportIncompleteError:
        error = ExportIncompleteError(
            self.status,
            "export_incomplete",
            "Export incomplete",
            f"{what}, after {self.sessions} complete session(s): the server cuts an export "
            "on a store failure or at TURNSTORE_EXPORT_TIMEOUT; export again",
            request_id=self.request_id,
        )
        error.sessions = self.sessions
        return error


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def history_text(response: httpx.Response, request_id: str) -> HistoryText:
    """A text/plain history: the body, and its count from ``x-token-count``."""
    count = response.headers.get("x-token-count")
    try:
        token_count = int(count) if count is not None else None
    except ValueError:
        token_count = None
    if token_count is None:
        raise TurnstoreError(
            response.status_code,
            "unexpected_response",
            "Unexpected response",
            "a text/plain history came without a valid x-token-count header",
            request_id=response.headers.get("x-request-id", request_id),
        )
    return HistoryText(response.text, token_count, response.headers.get("x-encoding", ""))
