"""A user's export, read as it arrives: one :class:`ExportedSession` per
line of the server's NDJSON stream (:meth:`Client.export_user`), or one
:class:`ExportedTranscript` (:meth:`Client.export_transcripts`: each
session's turns as a chat transcript).

::

    with client.export_user("alice") as export:
        for session in export:
            archive(session)

Only the line being received is held in memory, whatever the user holds.
The request is sent when the stream is entered or first iterated (with the
client's retries, until the server's answer begins); an error answer
(401, 422, 503 ...) raises the usual :class:`~turnstore.TurnstoreError`
there. Once sessions flow, a stream the server cuts (on a store failure or
at its ``TURNSTORE_EXPORT_TIMEOUT``: the body ends without its last
newline, or the connection breaks) raises
:class:`~turnstore.ExportIncompleteError` after the complete sessions:
never a partial session, and never a silent short export.

Leaving the ``with`` block (or :meth:`ExportStream.close`) releases the
connection; a loop that runs to the end, or raises, releases it too.
"""

from __future__ import annotations

from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Generic,
    Iterator,
    Optional,
    Type,
    TypeVar,
)

import httpx

from ._core import Call, ExportState
from .models import ExportedSession, ExportedTranscript

__all__ = [
    "AsyncExportStream",
    "AsyncTranscriptStream",
    "ExportStream",
    "TranscriptStream",
]

T = TypeVar("T")
S = TypeVar("S", bound="_Lines[Any]")
A = TypeVar("A", bound="_AsyncLines[Any]")


class _Lines(Generic[T]):
    """The lines of an export (see the module doc), each parsed to a ``T``:
    an iterator and a context manager."""

    def __init__(self, open_response: Callable[[], httpx.Response], state: ExportState[T]) -> None:
        self._open = open_response
        self._state = state
        self._response: Optional[httpx.Response] = None
        self._chunks: Optional[Iterator[bytes]] = None
        self._closed = False

    @property
    def sessions(self) -> int:
        """How many sessions were yielded so far."""
        return self._state.sessions

    @property
    def request_id(self) -> str:
        """The export's ``x-request-id`` (the server's once it answered)."""
        return self._state.request_id

    def close(self) -> None:
        """Stops reading and releases the connection (the server stops too)."""
        self._closed = True
        if self._response is not None:
            self._response.close()

    def __enter__(self: S) -> S:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __iter__(self: S) -> S:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        try:
            session = self._next()
        except BaseException:
            self.close()
            raise
        if session is None:
            self.close()
            raise StopIteration
        return session

    def _start(self) -> Iterator[bytes]:
        if self._chunks is None:
            if self._closed:
                raise RuntimeError("this export stream is closed")
            self._response = self._open()
            self._state.started(self._response)
            self._chunks = self._response.iter_bytes()
        return self._chunks

    def _next(self) -> Optional[T]:
        chunks = self._start()
        while True:
            session = self._state.take()
            if session is not None:
                return session
            try:
                chunk = next(chunks, None)
            except httpx.TransportError as exc:
                raise self._state.broken(exc) from exc
            if chunk is None:
                self._state.end()
                return None
            self._state.feed(chunk)


class ExportStream(_Lines[ExportedSession]):
    """The sessions of a user's export (see the module doc), from
    :meth:`Client.export_user`: an iterator of :class:`ExportedSession` and a
    context manager."""

    def __init__(self, open_response: Callable[[], httpx.Response], call: Call) -> None:
        super().__init__(
            open_response, ExportState(call, ExportedSession.from_json, "an exported session")
        )


class TranscriptStream(_Lines[ExportedTranscript]):
    """The sessions of a user's export as transcripts (see the module doc),
    from :meth:`Client.export_transcripts`: an iterator of
    :class:`ExportedTranscript` and a context manager."""

    def __init__(self, open_response: Callable[[], httpx.Response], call: Call) -> None:
        super().__init__(
            open_response,
            ExportState(call, ExportedTranscript.from_json, "an exported transcript"),
        )


class _AsyncLines(Generic[T]):
    """The lines of an export (see the module doc), each parsed to a ``T``:
    an async iterator and an async context manager."""

    def __init__(
        self, open_response: Callable[[], Awaitable[httpx.Response]], state: ExportState[T]
    ) -> None:
        self._open = open_response
        self._state = state
        self._response: Optional[httpx.Response] = None
        self._chunks: Optional[AsyncIterator[bytes]] = None
        self._closed = False

    @property
    def sessions(self) -> int:
        """How many sessions were yielded so far."""
        return self._state.sessions

    @property
    def request_id(self) -> str:
        """The export's ``x-request-id`` (the server's once it answered)."""
        return self._state.request_id

    async def aclose(self) -> None:
        """Stops reading and releases the connection (the server stops too)."""
        self._closed = True
        chunks, self._chunks = self._chunks, None
        # httpx's chunk iterator is an async generator: closed here, not
        # left to the event loop's finalizer.
        close_chunks = getattr(chunks, "aclose", None)
        if close_chunks is not None:
            await close_chunks()
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self: A) -> A:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.aclose()

    def __aiter__(self: A) -> A:
        return self

    async def __anext__(self) -> T:
        if self._closed:
            raise StopAsyncIteration
        try:
            session = await self._next()
        except BaseException:
            await self.aclose()
            raise
        if session is None:
            await self.aclose()
            raise StopAsyncIteration
        return session

    async def _start(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            if self._closed:
                raise RuntimeError("this export stream is closed")
            self._response = await self._open()
            self._state.started(self._response)
            self._chunks = self._response.aiter_bytes()
        return self._chunks

    async def _next(self) -> Optional[T]:
        chunks = await self._start()
        while True:
            session = self._state.take()
            if session is not None:
                return session
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                self._state.end()
                return None
            except httpx.TransportError as exc:
                raise self._state.broken(exc) from exc
            self._state.feed(chunk)


class AsyncExportStream(_AsyncLines[ExportedSession]):
    """The sessions of a user's export (see the module doc), from
    :meth:`AsyncClient.export_user`: an async iterator of
    :class:`ExportedSession` and an async context manager."""

    def __init__(self, open_response: Callable[[], Awaitable[httpx.Response]], call: Call) -> None:
        super().__init__(
            open_response, ExportState(call, ExportedSession.from_json, "an exported session")
        )


class AsyncTranscriptStream(_AsyncLines[ExportedTranscript]):
    """The sessions of a user's export as transcripts (see the module doc),
    from :meth:`AsyncClient.export_transcripts`: an async iterator of
    :class:`ExportedTranscript` and an async context manager."""

    def __init__(self, open_response: Callable[[], Awaitable[httpx.Response]], call: Call) -> None:
        super().__init__(
            open_response,
            ExportState(call, ExportedTranscript.from_json, "an exported transcript"),
        )
