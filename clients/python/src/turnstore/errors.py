"""Exceptions raised by the turnstore clients.

The service answers every error with an RFC 9457 problem document whose
``code`` is stable and machine-readable; :class:`TurnstoreError` carries it,
and the subclasses group the codes a caller typically handles differently
(fix the request, look the session up again, back off, degrade gracefully).
Catch :class:`TurnstoreError` to handle them all, or branch on ``code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Type

__all__ = [
    "ConflictError",
    "ConnectionFailedError",
    "ExportIncompleteError",
    "FieldError",
    "ForbiddenError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ServerError",
    "SummaryConflictError",
    "TooManyRequestsError",
    "TurnstoreError",
    "UnauthorizedError",
    "UnavailableError",
    "ValidationError",
]


@dataclass(frozen=True)
class FieldError:
    """One invalid input of a 422: ``field`` names it (``history.limit``,
    ``user_query``, ``Idempotency-Key``, a query parameter, ``body``, or an
    imported message by its index: ``messages[3].role``, ``messages[4]``)."""

    field: str
    message: str


class TurnstoreError(Exception):
    """An operation failed: the service answered an error, or could not be reached.

    Attributes:
        status: the HTTP status; ``0`` when no HTTP response was received
            (see :class:`ConnectionFailedError`).
        code: the problem document's stable ``code`` (``turn_not_found``,
            ``validation_failed``, ...); ``http_<status>`` when the body was
            not a problem document (e.g. a proxy's error page).
        title: the problem's short human-readable summary.
        detail: what went wrong with this request.
        errors: the field errors of a ``validation_failed`` 422 (else empty).
        request_id: the ``x-request-id`` of the response (or the one the
            client sent, when there was no response): quote it when asking
            the service's operators.
        retry_after: seconds from a ``Retry-After`` header (429, 503, a
            fork's 409 ``session_exists`` while another fork into the id is
            under way), if any.
    """

    status: int
    code: str
    title: str
    detail: str
    errors: List[FieldError]
    request_id: Optional[str]
    retry_after: Optional[float]

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str = "",
        *,
        errors: Optional[List[FieldError]] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.errors = list(errors or [])
        self.request_id = request_id
        self.retry_after = retry_after
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.status} {self.code}" if self.status else self.code
        text = self.detail or self.title
        message = f"{head}: {text}" if text else head
        if self.request_id:
            message += f" (request id {self.request_id})"
        return message

    def __reduce__(self) -> Any:
        # Keeps the exception picklable (multiprocessing, task queues) despite
        # the keyword-only arguments Exception.__reduce__ would drop.
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: Type[TurnstoreError], state: Dict[str, Any]) -> TurnstoreError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, error._message())
    return error


class UnauthorizedError(TurnstoreError):
    """401 ``unauthorized``: the API key is missing or not one the service knows."""


class ForbiddenError(TurnstoreError):
    """403 ``session_owner_mismatch``: the session belongs to another user."""


class NotFoundError(TurnstoreError):
    """404: ``turn_not_found`` (finalize, regenerate or abort of an unknown,
    aborted or expired turn),
    ``session_not_found`` (get_session, or fork_session of an unknown or
    expired session), ``summary_not_found``
    (get_summary), ``template_not_found`` (a history's ``template`` names no
    template the server has), or ``not_found`` (no such route: check
    ``base_url``)."""


class ConflictError(TurnstoreError):
    """409: ``turn_already_finalized`` (the turn was finalized with another
    answer), ``turn_pending`` (a regenerate of a turn not finalized yet:
    finalize it), ``turn_summarized`` (a regenerate of a turn the session's
    summary covers; ``detail`` says through which seq: delete the summary,
    or write one that covers less, first), ``session_exists`` (a fork's
    ``new_session_id`` names a live session: choose another; with
    ``retry_after`` when another fork into it was still under way after the
    client's retries) or ``summary_conflict`` (see
    :class:`SummaryConflictError`). Nothing was written."""


class SummaryConflictError(ConflictError):
    """409 ``summary_conflict``: a summary write expected another coverage
    (``expected_through_seq``: someone else wrote the summary since it was
    read), or another incarnation of the session (``expected_generation``:
    it was cleared, erased or expired since, perhaps started again under
    the same id), or would make the summary go backwards (a ``through_seq``
    below the stored one). ``detail`` says what is stored. Read the history
    again with ``summary=True`` and fold what is left."""


class PayloadTooLargeError(TurnstoreError):
    """413 ``payload_too_large``: a question, answer or body over the server's limits."""


class ValidationError(TurnstoreError):
    """422: ``validation_failed`` (see ``errors`` for the fields),
    ``idempotency_key_reused`` (one Idempotency-Key with two different
    bodies), ``template_error`` (a history's template failed while
    rendering; ``detail`` names its line), or ``unknown_model`` (a
    history's ``model`` is in no model table of a server that refuses
    such models: send ``encoding``, or have the operator add the model to
    ``TURNSTORE_MODELS``)."""


class TooManyRequestsError(TurnstoreError):
    """429 ``too_many_pending_turns``: the session has too many turns started
    and not finalized; ``retry_after`` says when the oldest one expires."""


class ServerError(TurnstoreError):
    """A 5xx answer: the service (or a proxy in front of it) failed."""


class UnavailableError(ServerError):
    """502, 503 or 504 (``store_unavailable``, ``overloaded``,
    ``request_timeout``, a gateway error) that was still failing after the
    client's retries. Catch this to degrade gracefully, e.g. to answer
    without history when turnstore is down."""


class ConnectionFailedError(UnavailableError):
    """No HTTP response at all after the client's retries: connection
    refused or reset, DNS failure, timeout. ``status`` is ``0``, ``code`` is
    ``connection_error`` or ``timeout``, and the httpx exception is chained
    as ``__cause__``."""


class ExportIncompleteError(TurnstoreError):
    """An export stream ended before its end: the connection broke in the
    middle of the body, or the body ended without the newline of its last
    line. The server cuts an export so on a store failure or at its
    ``TURNSTORE_EXPORT_TIMEOUT``, so that a cut export is never taken for a
    complete one.

    ``status`` is the export's HTTP status (200: the error came after it),
    ``code`` is ``export_incomplete``; ``sessions`` is how many complete
    sessions were received (and yielded) before the cut. A transport
    failure is chained as ``__cause__``. The export is not resumable:
    export again (and read faster, or ask the operator for a longer
    timeout).
    """

    sessions: int = 0


_BY_CODE: Mapping[str, Type[TurnstoreError]] = {
    "summary_conflict": SummaryConflictError,
}

_BY_STATUS: Mapping[int, Type[TurnstoreError]] = {
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: ValidationError,
    429: TooManyRequestsError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}


def error_class_for(status: int, code: Optional[str] = None) -> Type[TurnstoreError]:
    """The most specific exception class for an HTTP error status and, when
    the problem document has one, its ``code``."""
    by_code = _BY_CODE.get(code) if code is not None else None
    if by_code is not None and issubclass(by_code, _BY_STATUS.get(status, TurnstoreError)):
        return by_code
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    return ServerError if status >= 500 else TurnstoreError
