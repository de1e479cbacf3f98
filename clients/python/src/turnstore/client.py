"""The synchronous client."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Iterable, Iterator, Mapping, Optional, Type, Union

import httpx

from . import _core, _tracing
from ._core import Attempts, Call, RetryPolicy
from .errors import NotFoundError, SummaryConflictError
from .export import ExportStream, TranscriptStream
from .models import (
    Erasure,
    ForkResult,
    History,
    HistoryFormat,
    HistoryOptions,
    HistoryText,
    ImportMode,
    ImportResult,
    Language,
    Session,
    StartedTurn,
    Summary,
    Turn,
    UserSession,
    UserSessionsPage,
    WindowKind,
)
from .turn import DEFAULT_TURN_HISTORY, TurnContext

__all__ = ["Client"]


class Client:
    """A synchronous turnstore client (thread-safe, like the httpx client under it).

    Args:
        base_url: the service's root URL; by default ``TURNSTORE_URL``, or
            ``http://127.0.0.1:8080`` when that is unset.
        api_key: sent as ``Authorization: Bearer <api_key>`` when set; by
            default ``TURNSTORE_API_KEY``, or no key when that is unset or empty.
        timeout: seconds (or an ``httpx.Timeout``) for each try of a request;
            applies to the httpx client this class makes, not to an injected one.
        max_retries: how many times a failed request is tried again (on
            connection errors, timeouts, 502/503/504 only). 0 disables retries.
        initial_backoff, max_backoff: bounds of the jittered exponential
            wait between tries (see :class:`RetryPolicy`).
        headers: extra headers sent with every request.
        http_client: an ``httpx.Client`` to use (connection pools, proxies,
            mTLS, event hooks); it is not closed by :meth:`close`.
        transport: an httpx transport for the client this class makes
            (e.g. ``httpx.MockTransport`` in tests).
        propagate_trace: send the current OpenTelemetry span's trace
            context (``traceparent``, ``tracestate``) with each request, when
            ``opentelemetry-api`` is installed and a span is current. False:
            never (and OpenTelemetry is not even imported).

    Use it as a context manager, or call :meth:`close`, to release connections.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        timeout: Union[float, httpx.Timeout] = _core.DEFAULT_TIMEOUT,
        max_retries: int = 2,
        initial_backoff: float = 0.25,
        max_backoff: float = 4.0,
        headers: Optional[Mapping[str, str]] = None,
        http_client: Optional[httpx.Client] = None,
        transport: Optional[httpx.BaseTransport] = None,
        propagate_trace: bool = True,
    ) -> None:
        if http_client is not None and transport is not None:
            raise ValueError("pass http_client or transport, not both")
        self.base_url = _core.base_url(base_url)
        self.retry_policy = RetryPolicy(max_retries, initial_backoff, max_backoff)
        self._headers = _core.base_headers(_core.api_key(api_key), headers)
        self._propagate_trace = propagate_trace
        self._owns_http = http_client is None
        self._http = (
            http_client
            if http_client is not None
            else httpx.Client(timeout=timeout, transport=transport)
        )

    # --- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Closes the connections, unless the httpx client was injected."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    # --- turns -----------------------------------------------------------

    def start_turn(
        self,
        user_query: str,
        *,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: Optional[HistoryOptions] = None,
        idempotency_key: Optional[str] = None,
        user_query_en: Optional[str] = None,
    ) -> StartedTurn:
        """Starts a turn with the user's question; the turn is pending until
        :meth:`finalize_turn` or :meth:`abort_turn`.

        With ``history``, the result carries the history as it stood before
        this turn: one round trip to begin a request. Without ``session_id``
        a new session is made; its id (a UUID v4 this client generates so
        that the start can be retried safely) is in the result. The start is
        sent with an Idempotency-Key (``idempotency_key`` or a new UUID),
        the same on every retry, so a retried start returns the same turn
        (``replayed=True``) instead of making a second one.

        ``user_query_en`` keeps an English copy of the question (a pipeline
        that translates), which ``lang="en"`` histories render.
        """
        call = _core.start_call(
            user_query, session_id, user_id, history, idempotency_key, user_query_en
        )
        response = self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: StartedTurn.from_json(d, replayed=replayed)
        )

    def finalize_turn(
        self,
        session_id: str,
        turn_id: str,
        final_answer: str,
        *,
        final_answer_en: Optional[str] = None,
    ) -> Turn:
        """Finalizes a turn with its answer (and, optionally, an English copy
        of it, ``final_answer_en``); it enters the history at its ``seq``.
        Finalizing again with the same answer (and the same English copy, or
        again none) returns the same turn, so retries are safe; another
        answer raises :class:`ConflictError`."""
        call = _core.finalize_call(session_id, turn_id, final_answer, final_answer_en)
        return _core.parse(self._send(call), call.request_id, lambda d: Turn.from_json(d["turn"]))

    def regenerate_turn(
        self,
        session_id: str,
        turn_id: str,
        final_answer: str,
        *,
        final_answer_en: Optional[str] = None,
    ) -> Turn:
        """Replaces the answer of a finalized turn (a chat UI's "regenerate"):
        the turn keeps its ``seq``, its question and the question's English
        copy; the old answer and its English copy are gone
        (``final_answer_en`` is the new answer's copy). Its ``finalized_at``
        becomes now. The answer follows a finalize's rules
        (:class:`ValidationError`, :class:`PayloadTooLargeError`).

        A turn not finalized yet raises :class:`ConflictError`
        ``turn_pending`` (finalize it); one the session's summary covers
        raises :class:`ConflictError` ``turn_summarized`` (its ``detail``
        says through which seq: delete the summary, or write one that
        covers less, first); an unknown or expired turn raises
        :class:`NotFoundError` ``turn_not_found``. Nothing is written then.

        Retried like a finalize: the same answer again replaces the answer
        with itself."""
        call = _core.regenerate_call(session_id, turn_id, final_answer, final_answer_en)
        return _core.parse(self._send(call), call.request_id, lambda d: Turn.from_json(d["turn"]))

    def abort_turn(self, session_id: str, turn_id: str) -> None:
        """Removes a pending turn (the pipeline failed) or a finalized one.

        An unknown turn raises :class:`NotFoundError`, except when an earlier
        try of this same call may have removed it (its response was lost):
        then the 404 of the retry means the abort is done.
        """
        self._send(_core.abort_call(session_id, turn_id))

    def turn(
        self,
        user_query: str,
        *,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: Optional[HistoryOptions] = DEFAULT_TURN_HISTORY,
        idempotency_key: Optional[str] = None,
        user_query_en: Optional[str] = None,
    ) -> TurnContext:
        """A context manager for one RAG request; see :class:`TurnContext`.

        ``history`` defaults to the ``messages`` format with the server's
        limits, ready for :meth:`TurnContext.prompt`. ``user_query_en`` is
        the question's English copy (see :meth:`start_turn`).
        """
        return TurnContext(
            self,
            user_query,
            session_id=session_id,
            user_id=user_id,
            history=history,
            idempotency_key=idempotency_key,
            user_query_en=user_query_en,
        )

    # --- history ---------------------------------------------------------

    def get_history(
        self,
        session_id: str,
        options: Optional[HistoryOptions] = None,
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
    ) -> History:
        """A session's finalized turns, newest first up to the bounds, in one
        format; keyword arguments override the fields of ``options`` (see
        :class:`HistoryOptions`). An unknown or expired session has an empty
        history.

        ``summary=True`` begins with the session's summary; ``lang="en"``
        renders the English copies; ``template`` renders with a server
        template (``xml``, ``markdown``, or the operator's): an unknown one
        raises :class:`NotFoundError` (``template_not_found``), one that
        fails :class:`ValidationError` (``template_error``).
        ``chat_template=True`` budgets the prompt the messages make through
        the chat template of the tokenizer named by ``encoding`` (or
        ``model``), ``system=`` beginning it; ``prompt=True`` also returns
        that prompt (:attr:`History.prompt`). ``window="stable"`` (with
        ``stride=``) begins the history at a stride boundary once the budget
        leaves turns out, so that consecutive reads begin alike and a prompt
        cache keeps serving them (:attr:`History.window`,
        :attr:`History.breakpoint`); ``format="anthropic"`` returns a
        Messages API request (:attr:`History.anthropic`,
        :meth:`History.anthropic_request`), its prompt-cache breakpoints
        marked with ``cache_control=True``."""
        opts = _core.history_options(
            options,
            limit=limit,
            max_tokens=max_tokens,
            format=format,
            model=model,
            encoding=encoding,
            max_query_chars=max_query_chars,
            max_answer_chars=max_answer_chars,
            keep_first=keep_first,
            after_seq=after_seq,
            through_seq=through_seq,
            lang=lang,
            summary=summary,
            template=template,
            chat_template=chat_template,
            prompt=prompt,
            system=system,
            window=window,
            stride=stride,
            cache_control=cache_control,
        )
        call = _core.history_call(session_id, opts)
        return _core.parse(self._send(call), call.request_id, History.from_json)

    def get_history_text(
        self,
        session_id: str,
        options: Optional[HistoryOptions] = None,
        *,
        limit: Optional[int] = None,
        max_tokens: Optional[int] = None,
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
        window: Optional[WindowKind] = None,
        stride: Optional[int] = None,
    ) -> HistoryText:
        """The ``text`` rendering (or the ``template``'s) alone
        (``Accept: text/plain``), with its exact token count from the
        ``x-token-count`` header; ``window="stable"`` (with ``stride=``)
        as in :meth:`get_history`."""
        opts = _core.history_options(
            options,
            limit=limit,
            max_tokens=max_tokens,
            model=model,
            encoding=encoding,
            max_query_chars=max_query_chars,
            max_answer_chars=max_answer_chars,
            keep_first=keep_first,
            after_seq=after_seq,
            through_seq=through_seq,
            lang=lang,
            summary=summary,
            template=template,
            window=window,
            stride=stride,
        )
        call = _core.history_call(session_id, opts, text=True)
        return _core.history_text(self._send(call), call.request_id)

    # --- summaries -------------------------------------------------------

    def put_summary(
        self,
        session_id: str,
        summary: str,
        through_seq: int,
        *,
        expected_through_seq: Optional[int] = None,
        expected_generation: Optional[str] = None,
        user_id: Optional[str] = None,
    ) -> Summary:
        """Writes the session's rolling summary of every turn with
        ``seq <= through_seq`` (at most the newest finalized turn's seq, else
        :class:`ValidationError`).

        With ``expected_through_seq`` the write is a compare-and-set: it
        happens only if the stored summary covers exactly that far (0: no
        summary yet), else :class:`SummaryConflictError` (409
        ``summary_conflict``), as for a ``through_seq`` below the stored
        one: read again and fold what is left. With ``expected_generation``
        (the :attr:`History.generation` of the history the summary was folded
        from) it happens only if the session is still that incarnation: one
        cleared, erased or expired since, even if started again under the
        same id, raises :class:`SummaryConflictError` and nothing is written.
        Send both: ``expected_through_seq=0`` alone cannot tell a session
        started again from the one read. ``user_id`` is checked against the
        session's owner (:class:`ForbiddenError`); it does not claim the
        session.

        Retries are safe: when a try whose response was lost wrote the
        summary, the retry's conflict is recognised (the stored summary is
        this one, in the session's ``expected_generation`` when given) and
        the stored summary is returned.
        """
        call = _core.put_summary_call(
            session_id, summary, through_seq, expected_through_seq, user_id, expected_generation
        )
        attempts = Attempts(call, self.retry_policy)
        try:
            response = self._send(call, attempts)
        except SummaryConflictError:
            stored = None
            if attempts.maybe_applied:
                stored = self._lost_write(session_id, summary, through_seq, expected_generation)
            if stored is None:
                raise
            return stored
        return _core.parse(response, call.request_id, Summary.from_json)

    def _lost_write(
        self, session_id: str, summary: str, through_seq: int, generation: Optional[str]
    ) -> Optional[Summary]:
        """The stored summary if it is the one a lost try wrote (in
        ``generation``, when the write named one), else ``None``."""
        if generation is not None:
            call = _core.history_call(session_id, _core.STORED_SUMMARY)
            history = _core.parse(self._send(call), call.request_id, History.from_json)
            return _core.written_in(history, summary, through_seq, generation)
        try:
            stored = self.get_summary(session_id)
        except NotFoundError:
            return None
        return stored if _core.is_written(stored, summary, through_seq) else None

    def get_summary(self, session_id: str) -> Summary:
        """The session's summary (``token_count`` in the server's encoding);
        :class:`NotFoundError` (``summary_not_found``) when it has none, as
        for an unknown or expired session."""
        call = _core.summary_call("GET", session_id)
        return _core.parse(self._send(call), call.request_id, Summary.from_json)

    def delete_summary(self, session_id: str) -> None:
        """Deletes the session's summary (also when it has none)."""
        self._send(_core.summary_call("DELETE", session_id))

    # --- import and export -----------------------------------------------

    def import_messages(
        self,
        session_id: str,
        messages: Iterable[Mapping[str, object]],
        *,
        user_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        mode: ImportMode = "strict",
    ) -> ImportResult:
        """Appends a chat transcript made elsewhere as finalized turns, with
        the session's next seqs.

        ``mode="strict"`` (the default): each ``{"role": "user", "content":
        ...}`` message and the ``assistant`` message after it become one
        turn; any other role or key is refused.

        ``mode="distill"``: the messages are an agent loop's, as the OpenAI
        or Anthropic SDKs write them (``system``, ``developer``, ``tool`` and
        ``function`` roles, ``orchestrator`` as an assistant, a content that
        is a string, a list of parts or ``None``, ``tool_calls``,
        ``refusal``, ``thinking``, ``tool_use`` and ``tool_result`` blocks),
        and each exchange becomes one turn: its question (the consecutive
        user texts, joined by a blank line) and its final answer (the last
        assistant text before the next question). System and developer
        prompts, tool calls and results, thinking, refusals, parts that are
        not text, replaced answers and a last question without an answer
        are dropped, and :attr:`ImportResult.dropped` reports them by reason
        with the indexes of the first few. A message's optional
        ``timestamp`` (RFC 3339 with its zone) becomes its turn's
        ``started_at`` (the question's) or ``finalized_at`` (the answer's);
        given for one exchange, it is needed for all.

        All or nothing: any invalid message raises :class:`ValidationError`
        whose ``errors`` name every wrong one by its index
        (``messages[3].role``, ``messages[4]``, ``messages[2].content``) and
        nothing is written; a content over its limit raises
        :class:`PayloadTooLargeError`. ``user_id`` claims an unowned session
        (another owner's: :class:`ForbiddenError`).

        The import is sent with an Idempotency-Key (``idempotency_key`` or a
        new UUID), the same on every retry, so a retried import returns what
        the first made (``replayed=True``, with the same ``dropped``)
        instead of importing twice.
        """
        call = _core.import_call(session_id, messages, user_id, idempotency_key, mode)
        response = self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: ImportResult.from_json(d, replayed=replayed)
        )

    def export_user(self, user_id: str) -> ExportStream:
        """Every live session of a user, with its finalized turns and
        summary, in the order of :meth:`iter_user_sessions`, streamed: an
        iterator of :class:`ExportedSession` that holds one session at a
        time. Use it in a ``with`` block to release the connection when the
        loop stops early::

            with client.export_user("alice") as export:
                for session in export:
                    ...

        A stream the server cuts raises :class:`ExportIncompleteError`
        after the complete sessions (see :mod:`turnstore.export`).
        """
        call = _core.export_call(user_id)
        return ExportStream(lambda: self._send(call, stream=True), call)

    def export_transcripts(self, user_id: str) -> TranscriptStream:
        """Every live session of a user, as :meth:`export_user` streams them,
        but with each session's turns as a chat transcript
        (``?format=messages``): an iterator of :class:`ExportedTranscript`,
        whose ``messages`` are a user and an assistant
        :class:`ExportedMessage` a turn (the question at its
        ``started_at``, the answer at its ``finalized_at``). Imported with
        ``mode="distill"``, a transcript's messages make the same turns at
        the same times::

            with client.export_transcripts("alice") as export:
                for transcript in export:
                    messages = [m.to_json() for m in transcript.messages]
                    other.import_messages(transcript.session_id, messages, mode="distill")

        Held, retried and cut like :meth:`export_user`
        (:class:`ExportIncompleteError`).
        """
        call = _core.export_call(user_id, "messages")
        return TranscriptStream(lambda: self._send(call, stream=True), call)

    # --- sessions and users ----------------------------------------------

    def get_session(self, session_id: str) -> Session:
        """A live session's owner, times and counts; :class:`NotFoundError`
        (``session_not_found``) when it does not exist or expired."""
        call = _core.session_call("GET", session_id)
        return _core.parse(self._send(call), call.request_id, Session.from_json)

    def clear_session(self, session_id: str) -> None:
        """Deletes a session and all its turns (also for an unknown session)."""
        self._send(_core.session_call("DELETE", session_id))

    def fork_session(
        self,
        session_id: str,
        new_session_id: str,
        *,
        through_seq: Optional[int] = None,
        user_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ForkResult:
        """Makes ``new_session_id`` a branch of the conversation: a new
        session of ``session_id``'s finalized turns with ``seq <=
        through_seq`` (by default through the newest), as they are (seqs,
        turn ids, texts, English copies, times), with the session's summary
        when it covers no later turn (:attr:`ForkResult.summary`). The next
        start in the fork takes ``through_seq + 1``; the source does not
        change. A chat UI's "edit question N" is a fork through ``N - 1``,
        then :meth:`start_turn` in the fork (its "regenerate" is
        :meth:`regenerate_turn`).

        The fork belongs to the source's owner; ``user_id`` is checked
        against it as in a start (another owner's: :class:`ForbiddenError`),
        and owns the fork of an unowned session. An unknown or expired
        source raises :class:`NotFoundError` (``session_not_found``); a
        ``new_session_id`` a live session has raises :class:`ConflictError`
        (``session_exists``); a ``through_seq`` of 0, past the newest
        finalized turn or below the oldest one kept, or a ``new_session_id``
        that is invalid or the source's own, raises :class:`ValidationError`.

        The fork is sent with an Idempotency-Key (``idempotency_key`` or a
        new UUID), the same on every retry, so a retried fork returns what
        the first made (``replayed=True``), even once the source is gone,
        instead of failing on the session it made.

        A 409 ``session_exists`` *with* ``Retry-After`` is waited out and
        retried (within the retry policy, as a 503 is): the server answers
        so while another attempt of a fork into that id may still be
        writing, and the likeliest such attempt is this call's own earlier
        try, cut off by a timeout after it began. Raising then would report
        the caller's own half-made fork as someone else's session; the
        retry with the same key instead gets that fork once it is done
        (a replay), or, once the stopped attempt is stale (5 s without a
        write), takes over and completes it. A fork by another caller that
        finished answers a plain 409 (no ``Retry-After``), which is raised.
        (A 429, whose wait can be minutes, is not retried; this wait is
        seconds at most.) When the retries run out first, the
        :class:`ConflictError` carries ``retry_after``; calling again after
        it with the same ``idempotency_key`` (pass your own to be able to)
        completes the fork.
        """
        call = _core.fork_call(session_id, new_session_id, through_seq, user_id, idempotency_key)
        response = self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: ForkResult.from_json(d, replayed=replayed)
        )

    def list_user_sessions(
        self, user_id: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> UserSessionsPage:
        """One page of a user's live sessions, most recently active first.
        Pass the page's ``next_cursor`` as ``cursor`` for the next one, or
        use :meth:`iter_user_sessions`."""
        call = _core.user_sessions_call(user_id, limit, cursor)
        return _core.parse(self._send(call), call.request_id, UserSessionsPage.from_json)

    def iter_user_sessions(
        self, user_id: str, *, page_size: Optional[int] = None
    ) -> Iterator[UserSession]:
        """Every live session of a user, following ``next_cursor`` until it
        is ``None`` (pages may be short, even empty, before the end)."""
        cursor: Optional[str] = None
        while True:
            page = self.list_user_sessions(user_id, limit=page_size, cursor=cursor)
            yield from page.sessions
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def erase_user(self, user_id: str) -> Erasure:
        """One erasure call; ``complete`` is false when the server ran out of
        time and more sessions remain (see :meth:`erase_user_completely`)."""
        call = _core.erase_call(user_id)
        return _core.parse(self._send(call), call.request_id, Erasure.from_json)

    def erase_user_completely(self, user_id: str) -> Erasure:
        """Erases every session of a user, calling again while the server
        answers ``complete: false`` (each call continues where the last one
        stopped). Returns the total of deleted sessions."""
        deleted = 0
        while True:
            erasure = self.erase_user(user_id)
            deleted += erasure.deleted_sessions
            if erasure.complete:
                return Erasure(user_id=erasure.user_id, deleted_sessions=deleted, complete=True)

    # --- transport -------------------------------------------------------

    def _send(
        self, call: Call, attempts: Optional[Attempts] = None, *, stream: bool = False
    ) -> httpx.Response:
        """Sends ``call`` with its retries; returns the success response.
        With ``stream``, its body is left to read (and the response to
        close) by the caller; error bodies are read here either way."""
        if attempts is None:
            attempts = Attempts(call, self.retry_policy)
        headers = call.request_headers(self._headers)
        if self._propagate_trace:
            _tracing.add_trace_context(headers, self._http.headers)
        content = call.content()
        while True:
            request = self._http.build_request(
                call.method,
                self.base_url + call.path,
                params=call.params,
                content=content,
                headers=headers,
            )
            try:
                response = self._http.send(request, stream=stream)
                if stream and not response.is_success:
                    try:
                        response.read()
                    finally:
                        response.close()
            except httpx.TransportError as exc:
                time.sleep(attempts.on_exception(exc))
                continue
            wait = attempts.on_response(response)
            if wait is None:
                return response
            time.sleep(wait)
