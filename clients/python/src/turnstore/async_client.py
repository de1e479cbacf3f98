"""The asynchronous client: the same operations as :class:`turnstore.Client`, awaited."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import AsyncIterator, Iterable, Mapping, Optional, Type, Union

import httpx

from . import _core, _tracing
from ._core import Attempts, Call, RetryPolicy
from .errors import NotFoundError, SummaryConflictError
from .export import AsyncExportStream, AsyncTranscriptStream
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
from .turn import DEFAULT_TURN_HISTORY, AsyncTurnContext

__all__ = ["AsyncClient"]


class AsyncClient:
    """An asynchronous turnstore client, on ``httpx.AsyncClient``.

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
        http_client: an ``httpx.AsyncClient`` to use (connection pools, proxies,
            mTLS, event hooks); it is not closed by :meth:`close`.
        transport: an httpx transport for the client this class makes
            (e.g. ``httpx.MockTransport`` in tests).
        propagate_trace: send the current OpenTelemetry span's trace
            context (``traceparent``, ``tracestate``) with each request, when
            ``opentelemetry-api`` is installed and a span is current. False:
            never (and OpenTelemetry is not even imported).

    Use it as an async context manager, or await :meth:`close`, to release
    connections.
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
        http_client: Optional[httpx.AsyncClient] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
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
            else httpx.AsyncClient(timeout=timeout, transport=transport)
        )

    # --- lifecycle -------------------------------------------------------

    async def close(self) -> None:
        """Closes the connections, unless the httpx client was injected."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    # --- turns -----------------------------------------------------------

    async def start_turn(
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
        response = await self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: StartedTurn.from_json(d, replayed=replayed)
        )

    async def finalize_turn(
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
        return _core.parse(
            await self._send(call), call.request_id, lambda d: Turn.from_json(d["turn"])
        )

    async def regenerate_turn(
        self,
        session_id: str,
        turn_id: str,
        final_answer: str,
        *,
        final_answer_en: Optional[str] = None,
    ) -> Turn:
        """Replaces a finalized turn's answer (a chat UI's "regenerate"),
        keeping its ``seq`` and question; see :meth:`Client.regenerate_turn`
        (:class:`ConflictError` ``turn_pending`` or ``turn_summarized``,
        :class:`NotFoundError` ``turn_not_found``; safe retries)."""
        call = _core.regenerate_call(session_id, turn_id, final_answer, final_answer_en)
        return _core.parse(
            await self._send(call), call.request_id, lambda d: Turn.from_json(d["turn"])
        )

    async def abort_turn(self, session_id: str, turn_id: str) -> None:
        """Removes a pending turn (the pipeline failed) or a finalized one.

        An unknown turn raises :class:`NotFoundError`, except when an earlier
        try of this same call may have removed it (its response was lost):
        then the 404 of the retry means the abort is done.
        """
        await self._send(_core.abort_call(session_id, turn_id))

    def turn(
        self,
        user_query: str,
        *,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: Optional[HistoryOptions] = DEFAULT_TURN_HISTORY,
        idempotency_key: Optional[str] = None,
        user_query_en: Optional[str] = None,
    ) -> AsyncTurnContext:
        """An async context manager for one RAG request; see
        :class:`AsyncTurnContext`.

        ``history`` defaults to the ``messages`` format with the server's
        limits, ready for :meth:`AsyncTurnContext.prompt`. ``user_query_en``
        is the question's English copy (see :meth:`start_turn`).
        """
        return AsyncTurnContext(
            self,
            user_query,
            session_id=session_id,
            user_id=user_id,
            history=history,
            idempotency_key=idempotency_key,
            user_query_en=user_query_en,
        )

    # --- history ---------------------------------------------------------

    async def get_history(
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
        return _core.parse(await self._send(call), call.request_id, History.from_json)

    async def get_history_text(
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
        return _core.history_text(await self._send(call), call.request_id)

    # --- summaries -------------------------------------------------------

    async def put_summary(
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
        ``seq <= through_seq``; see :meth:`Client.put_summary` (compare-and-set
        with ``expected_through_seq`` and ``expected_generation``,
        :class:`SummaryConflictError`, safe retries)."""
        call = _core.put_summary_call(
            session_id, summary, through_seq, expected_through_seq, user_id, expected_generation
        )
        attempts = Attempts(call, self.retry_policy)
        try:
            response = await self._send(call, attempts)
        except SummaryConflictError:
            stored = None
            if attempts.maybe_applied:
                stored = await self._lost_write(
                    session_id, summary, through_seq, expected_generation
                )
            if stored is None:
                raise
            return stored
        return _core.parse(response, call.request_id, Summary.from_json)

    async def _lost_write(
        self, session_id: str, summary: str, through_seq: int, generation: Optional[str]
    ) -> Optional[Summary]:
        """The stored summary if it is the one a lost try wrote (in
        ``generation``, when the write named one), else ``None``."""
        if generation is not None:
            call = _core.history_call(session_id, _core.STORED_SUMMARY)
            history = _core.parse(await self._send(call), call.request_id, History.from_json)
            return _core.written_in(history, summary, through_seq, generation)
        try:
            stored = await self.get_summary(session_id)
        except NotFoundError:
            return None
        return stored if _core.is_written(stored, summary, through_seq) else None

    async def get_summary(self, session_id: str) -> Summary:
        """The session's summary (``token_count`` in the server's encoding);
        :class:`NotFoundError` (``summary_not_found``) when it has none, as
        for an unknown or expired session."""
        call = _core.summary_call("GET", session_id)
        return _core.parse(await self._send(call), call.request_id, Summary.from_json)

    async def delete_summary(self, session_id: str) -> None:
        """Deletes the session's summary (also when it has none)."""
        await self._send(_core.summary_call("DELETE", session_id))

    # --- import and export -----------------------------------------------

    async def import_messages(
        self,
        session_id: str,
        messages: Iterable[Mapping[str, object]],
        *,
        user_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        mode: ImportMode = "strict",
    ) -> ImportResult:
        """Appends a chat transcript as finalized turns, all or nothing,
        retry-safe with an Idempotency-Key: user/assistant pairs
        (``mode="strict"``), or an agent loop's messages distilled to each
        exchange's question and final answer (``mode="distill"``; system,
        tool and thinking content is dropped and reported in
        :attr:`ImportResult.dropped`); see :meth:`Client.import_messages`."""
        call = _core.import_call(session_id, messages, user_id, idempotency_key, mode)
        response = await self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: ImportResult.from_json(d, replayed=replayed)
        )

    def export_user(self, user_id: str) -> AsyncExportStream:
        """Every live session of a user, streamed: an async iterator of
        :class:`ExportedSession` holding one session at a time; see
        :meth:`Client.export_user`::

            async with client.export_user("alice") as export:
                async for session in export:
                    ...
        """
        call = _core.export_call(user_id)
        return AsyncExportStream(lambda: self._send(call, stream=True), call)

    def export_transcripts(self, user_id: str) -> AsyncTranscriptStream:
        """Every live session of a user as a chat transcript, streamed: an
        async iterator of :class:`ExportedTranscript`; see
        :meth:`Client.export_transcripts`::

            async with client.export_transcripts("alice") as export:
                async for transcript in export:
                    ...
        """
        call = _core.export_call(user_id, "messages")
        return AsyncTranscriptStream(lambda: self._send(call, stream=True), call)

    # --- sessions and users ----------------------------------------------

    async def get_session(self, session_id: str) -> Session:
        """A live session's owner, times and counts; :class:`NotFoundError`
        (``session_not_found``) when it does not exist or expired."""
        call = _core.session_call("GET", session_id)
        return _core.parse(await self._send(call), call.request_id, Session.from_json)

    async def clear_session(self, session_id: str) -> None:
        """Deletes a session and all its turns (also for an unknown session)."""
        await self._send(_core.session_call("DELETE", session_id))

    async def fork_session(
        self,
        session_id: str,
        new_session_id: str,
        *,
        through_seq: Optional[int] = None,
        user_id: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> ForkResult:
        """Makes ``new_session_id`` a branch of the conversation: a copy of
        ``session_id``'s finalized turns through ``through_seq`` (by default
        the newest), with its summary when that covers no later turn, and
        its owner. Retry-safe with an Idempotency-Key (a replay has
        ``replayed=True``); a 409 ``session_exists`` with ``Retry-After``
        (a fork into that id still being written, likeliest this call's own
        stopped try) is waited out and retried, a plain one raised; see
        :meth:`Client.fork_session`."""
        call = _core.fork_call(session_id, new_session_id, through_seq, user_id, idempotency_key)
        response = await self._send(call)
        replayed = _core.replayed(response)
        return _core.parse(
            response, call.request_id, lambda d: ForkResult.from_json(d, replayed=replayed)
        )

    async def list_user_sessions(
        self, user_id: str, *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> UserSessionsPage:
        """One page of a user's live sessions, most recently active first.
        Pass the page's ``next_cursor`` as ``cursor`` for the next one, or
        use :meth:`iter_user_sessions`."""
        call = _core.user_sessions_call(user_id, limit, cursor)
        return _core.parse(await self._send(call), call.request_id, UserSessionsPage.from_json)

    async def iter_user_sessions(
        self, user_id: str, *, page_size: Optional[int] = None
    ) -> AsyncIterator[UserSession]:
        """Every live session of a user, following ``next_cursor`` until it
        is ``None`` (pages may be short, even empty, before the end)."""
        cursor: Optional[str] = None
        while True:
            page = await self.list_user_sessions(user_id, limit=page_size, cursor=cursor)
            for session in page.sessions:
                yield session
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def erase_user(self, user_id: str) -> Erasure:
        """One erasure call; ``complete`` is false when the server ran out of
        time and more sessions remain (see :meth:`erase_user_completely`)."""
        call = _core.erase_call(user_id)
        return _core.parse(await self._send(call), call.request_id, Erasure.from_json)

    async def erase_user_completely(self, user_id: str) -> Erasure:
        """Erases every session of a user, calling again while the server
        answers ``complete: false`` (each call continues where the last one
        stopped). Returns the total of deleted sessions."""
        deleted = 0
        while True:
            erasure = await self.erase_user(user_id)
            deleted += erasure.deleted_sessions
            if erasure.complete:
                return Erasure(user_id=erasure.user_id, deleted_sessions=deleted, complete=True)

    # --- transport -------------------------------------------------------

    async def _send(
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
                response = await self._http.send(request, stream=stream)
                if stream and not response.is_success:
                    try:
                        await response.aread()
                    finally:
                        await response.aclose()
            except httpx.TransportError as exc:
                await asyncio.sleep(attempts.on_exception(exc))
                continue
            wait = attempts.on_response(response)
            if wait is None:
                return response
            await asyncio.sleep(wait)
