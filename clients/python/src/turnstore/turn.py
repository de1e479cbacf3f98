"""Context managers for one RAG request: start, generate, finalize or abort.

::

    with client.turn(question, session_id=sid, user_id=uid) as turn:
        answer = generate(turn.prompt(system="You answer from the documents."))
        turn.finalize(answer)

Entering starts the turn, so the history arrives before generation
(``turn.history``). Leaving the block:

- after :meth:`TurnContext.finalize`: nothing more to do;
- with an exception: the turn is aborted (the pipeline failed; no half
  answer enters the history) and the exception propagates. If the abort
  itself fails, that failure is logged and the original exception still
  propagates (the pending turn then expires after the server's pending TTL);
- without finalize: the turn is aborted too, with a warning in the
  ``turnstore`` logger, since a turn nobody finalizes would only occupy a
  pending slot until it expires. Call :meth:`TurnContext.abort` to do this
  on purpose, without the warning.

A pipeline that translates passes the question's English copy as
``user_query_en`` and the answer's as ``turn.finalize(answer,
final_answer_en=...)``; with ``history=HistoryOptions(lang="en")`` the
history and :meth:`TurnContext.prompt`'s question are then in English.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, List, Optional, Type

from .errors import TurnstoreError
from .messages import build_chat_messages
from .models import History, HistoryOptions, StartedTurn, Turn

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

    from .async_client import AsyncClient
    from .client import Client

__all__ = ["AsyncTurnContext", "DEFAULT_TURN_HISTORY", "TurnContext"]

logger = logging.getLogger("turnstore")

DEFAULT_TURN_HISTORY = HistoryOptions(format="messages")
"""What a turn helper asks for unless told otherwise: the history as chat
messages, within the server's default limit and token budget."""


class _TurnState:
    """What the sync and async turn contexts share: the started turn and
    what has happened to it since."""

    def __init__(
        self,
        user_query: str,
        session_id: Optional[str],
        user_id: Optional[str],
        history: Optional[HistoryOptions],
        idempotency_key: Optional[str],
        user_query_en: Optional[str],
    ) -> None:
        self.user_query = user_query
        self.user_query_en = user_query_en
        self._session_id = session_id
        self._user_id = user_id
        self._history_options = history
        self._idempotency_key = idempotency_key
        self._started: Optional[StartedTurn] = None
        # The finalized turn, once finalize() succeeded; or aborted, once abort() did.
        self.result: Optional[Turn] = None
        self.aborted = False

    @property
    def started(self) -> StartedTurn:
        """The start's result (session id, turn id, seq, history)."""
        if self._started is None:
            raise RuntimeError("the turn is started when its `with` block is entered")
        return self._started

    @property
    def session_id(self) -> str:
        return self.started.session_id

    @property
    def turn_id(self) -> str:
        return self.started.turn_id

    @property
    def seq(self) -> int:
        return self.started.seq

    @property
    def history(self) -> Optional[History]:
        """The history as it stood before this turn (``None`` if the turn
        was entered with ``history=None``)."""
        return self.started.history

    @property
    def question(self) -> str:
        """The question as :meth:`prompt` puts it: the English copy when the
        turn has one and its history is read with ``lang="en"`` (as the
        history renders each text), else the original."""
        options = self._history_options
        if self.user_query_en is not None and options is not None and options.lang == "en":
            return self.user_query_en
        return self.user_query

    def prompt(self, system: Optional[str] = None) -> List[ChatCompletionMessageParam]:
        """The messages for a chat model: ``system`` (if given), the history
        (after its summary, when read with ``summary=True``), and this
        turn's :attr:`question` last."""
        history = self.history
        return build_chat_messages(
            history.chat_messages() if history is not None else [],
            system=system,
            question=self.question,
        )

    def _check_open(self) -> None:
        if self.result is not None:
            raise RuntimeError("this turn is already finalized")
        if self.aborted:
            raise RuntimeError("this turn was aborted")

    def _should_abort(self, failed: bool) -> bool:
        if self._started is None or self.result is not None or self.aborted:
            return False
        if not failed:
            logger.warning(
                "turn %s of session %s left its block without finalize(): aborting it",
                self.turn_id,
                self.session_id,
            )
        return True


class TurnContext(_TurnState):
    """One turn of a synchronous :class:`~turnstore.Client`; see the module doc."""

    def __init__(
        self,
        client: Client,
        user_query: str,
        *,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: Optional[HistoryOptions] = DEFAULT_TURN_HISTORY,
        idempotency_key: Optional[str] = None,
        user_query_en: Optional[str] = None,
    ) -> None:
        super().__init__(user_query, session_id, user_id, history, idempotency_key, user_query_en)
        self._client = client

    def __enter__(self) -> TurnContext:
        self._started = self._client.start_turn(
            self.user_query,
            session_id=self._session_id,
            user_id=self._user_id,
            history=self._history_options,
            idempotency_key=self._idempotency_key,
            user_query_en=self.user_query_en,
        )
        return self

    def finalize(self, final_answer: str, *, final_answer_en: Optional[str] = None) -> Turn:
        """Finalizes the turn with the answer (and its English copy, if
        given); it enters the history."""
        self._check_open()
        self.result = self._client.finalize_turn(
            self.session_id, self.turn_id, final_answer, final_answer_en=final_answer_en
        )
        return self.result

    def abort(self) -> None:
        """Aborts the turn: it never enters the history."""
        self._check_open()
        self._client.abort_turn(self.session_id, self.turn_id)
        self.aborted = True

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._should_abort(failed=exc is not None):
            return
        if exc is None:
            self.abort()
            return
        try:
            self.abort()
        except TurnstoreError as abort_error:
            logger.warning("could not abort turn %s: %s", self.turn_id, abort_error)


class AsyncTurnContext(_TurnState):
    """One turn of an :class:`~turnstore.AsyncClient`, for ``async with``;
    see the module doc."""

    def __init__(
        self,
        client: AsyncClient,
        user_query: str,
        *,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: Optional[HistoryOptions] = DEFAULT_TURN_HISTORY,
        idempotency_key: Optional[str] = None,
        user_query_en: Optional[str] = None,
    ) -> None:
        super().__init__(user_query, session_id, user_id, history, idempotency_key, user_query_en)
        self._client = client

    async def __aenter__(self) -> AsyncTurnContext:
        self._started = await self._client.start_turn(
            self.user_query,
            session_id=self._session_id,
            user_id=self._user_id,
            history=self._history_options,
            idempotency_key=self._idempotency_key,
            user_query_en=self.user_query_en,
        )
        return self

    async def finalize(self, final_answer: str, *, final_answer_en: Optional[str] = None) -> Turn:
        """Finalizes the turn with the answer (and its English copy, if
        given); it enters the history."""
        self._check_open()
        self.result = await self._client.finalize_turn(
            self.session_id, self.turn_id, final_answer, final_answer_en=final_answer_en
        )
        return self.result

    async def abort(self) -> None:
        """Aborts the turn: it never enters the history."""
        self._check_open()
        await self._client.abort_turn(self.session_id, self.turn_id)
        self.aborted = True

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._should_abort(failed=exc is not None):
            return
        if exc is None:
            await self.abort()
            return
        try:
            await self.abort()
        except TurnstoreError as abort_error:
            logger.warning("could not abort turn %s: %s", self.turn_id, abort_error)
