"""What the framework adapters share (LlamaIndex, the OpenAI Agents SDK,
LangGraph): the two-phase turn kept behind interfaces that only see messages
go by, written once for the sync and the async client.

The logic is written as *plans*: generators that yield the client calls they
need (:func:`call`) and receive each result (or have its exception thrown
in). :func:`run_sync` runs a plan on a :class:`~turnstore.Client`,
:func:`run_async` on an :class:`~turnstore.AsyncClient` (or on a ``Client``
in a worker thread), so each adapter's logic exists once.

:class:`Exchanges` is the question/answer state machine of the adapters
whose framework writes messages one by one (a chat store, a memory, an
agent session): a question starts a turn, an answer finalizes it (or, later
in the same exchange, replaces its answer), and a question that comes while
an earlier one is still unanswered aborts that earlier turn: the run that
asked it failed, or was abandoned, and turnstore keeps no question without
its answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Dict, Generator, Optional, Tuple, Type, TypeVar, Union, cast

from .async_client import AsyncClient
from .client import Client
from .errors import NotFoundError, TurnstoreError
from .models import HistoryOptions, StartedTurn, Turn

logger = logging.getLogger("turnstore")

T = TypeVar("T")
AnyClient = Union[Client, AsyncClient]


@dataclass(frozen=True)
class Call:
    """One call of a client method that a plan asks for."""

    method: str
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call(method, args, kwargs)


# A plan yields Calls, receives each call's result, and returns a T.
Plan = Generator[Call, Any, T]


def run_sync(client: AnyClient, plan: Plan[T], what: str) -> T:
    """Runs ``plan`` on a sync client (``what`` names the caller in the
    error an async client gets)."""
    if not isinstance(client, Client):
        plan.close()
        raise TypeError(
            f"{what} needs a turnstore.Client; with an AsyncClient use the async method"
        )
    try:
        step = next(plan)
        while True:
            try:
                result = getattr(client, step.method)(*step.args, **step.kwargs)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as stop:
        return cast(T, stop.value)


async def run_async(client: AnyClient, plan: Plan[T]) -> T:
    """Runs ``plan``: awaited on an async client, in a worker thread on a sync one."""
    try:
        step = next(plan)
        while True:
            try:
                method = getattr(client, step.method)
                if isinstance(client, AsyncClient):
                    result = await method(*step.args, **step.kwargs)
                else:
                    result = await asyncio.to_thread(method, *step.args, **step.kwargs)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as stop:
        return cast(T, stop.value)


def abort_quietly(session_id: str, turn_id: str, why: str) -> Plan[None]:
    """Aborts a turn; a turn already gone counts as aborted, and any other
    failure is logged (never raised: this runs while another error
    propagates, or on a path that must go on)."""
    try:
        yield call("abort_turn", session_id, turn_id)
    except NotFoundError:
        pass
    except TurnstoreError as error:
        logger.warning("could not abort turn %s (%s): %s", turn_id, why, error)


@dataclass
class Exchange:
    """The turn of the current exchange on one session, as this object started it."""

    started: StartedTurn
    question: str
    answer: Optional[str] = None  # set once finalized

    @property
    def pending(self) -> bool:
        return self.answer is None


@dataclass
class Exchanges:
    """The question/answer state machine, per session id (see the module doc).

    ``held`` keeps, per session, the question of an exchange whose answer was
    popped (:meth:`pop`): the exchange left turnstore whole, and the question
    waits here for the next :meth:`pop` (which returns it) or for a new
    answer (which records the exchange again)."""

    user_id: Optional[str] = None
    open: Dict[str, Exchange] = field(default_factory=dict)
    held: Dict[str, str] = field(default_factory=dict)

    def ask(
        self, session_id: str, question: str, history: Optional[HistoryOptions] = None
    ) -> Plan[StartedTurn]:
        """Starts a turn with the question (aborting an unanswered earlier one)."""
        self.held.pop(session_id, None)
        stale = self.open.pop(session_id, None)
        if stale is not None and stale.pending:
            logger.warning(
                "a new question came while turn %s of session %s was unanswered: "
                "aborting that turn (the run that asked it failed or was abandoned)",
                stale.started.turn_id,
                session_id,
            )
            yield from abort_quietly(session_id, stale.started.turn_id, "superseded")
        started: StartedTurn = yield call(
            "start_turn", question, session_id=session_id, user_id=self.user_id, history=history
        )
        self.open[session_id] = Exchange(started, question)
        return started

    def answer(self, session_id: str, text: str) -> Plan[Turn]:
        """Finalizes the open turn with the answer; replaces the answer when
        the turn is already finalized (a later answer in the same exchange);
        records a held question with it."""
        exchange = self.open.get(session_id)
        if exchange is None:
            question = self.held.get(session_id)
            if question is None:
                raise ValueError(
                    f"an answer without a question before it (session {session_id}): "
                    "turnstore keeps each answer with its question"
                )
            yield from self.ask(session_id, question)
            exchange = self.open[session_id]
        method = "finalize_turn" if exchange.pending else "regenerate_turn"
        turn: Turn = yield call(method, session_id, exchange.started.turn_id, text)
        exchange.answer = text
        return turn

    def abort(self, session_id: str, why: str) -> Plan[bool]:
        """Aborts the exchange's turn, pending or finalized; whether there was one."""
        self.held.pop(session_id, None)
        exchange = self.open.pop(session_id, None)
        if exchange is None:
            return False
        yield from abort_quietly(session_id, exchange.started.turn_id, why)
        return True

    def pop(self, session_id: str) -> Plan[Optional[Tuple[str, str]]]:
        """Removes the newest message, as ``(role, text)``; ``None`` when the
        session has none. A held or pending question goes (the pending turn
        is aborted); an answer takes its exchange out of turnstore whole (the
        turn is aborted) and holds its question (see the class doc)."""
        question = self.held.pop(session_id, None)
        if question is not None:
            return ("user", question)
        exchange = self.open.pop(session_id, None)
        if exchange is not None and exchange.pending:
            yield from abort_quietly(session_id, exchange.started.turn_id, "popped")
            return ("user", exchange.question)
        if exchange is not None and exchange.answer is not None:
            turn_id, question, answer = (
                exchange.started.turn_id,
                exchange.question,
                exchange.answer,
            )
        else:
            history = yield call(
                "get_history",
                session_id,
                HistoryOptions(format="turns", limit=1, max_tokens=10_000_000),
            )
            if not history.turns:
                return None
            newest = history.turns[-1]
            turn_id, question, answer = newest.turn_id, newest.user_query, newest.final_answer
        yield call("abort_turn", session_id, turn_id)
        self.held[session_id] = question
        return ("assistant", answer)

    def clear(self, session_id: str) -> Plan[None]:
        """Deletes the session; forgets its exchange."""
        self.open.pop(session_id, None)
        self.held.pop(session_id, None)
        yield call("clear_session", session_id)

    def tail(self, session_id: str) -> Optional[str]:
        """The question of this session that is not in its history: pending
        (started, unanswered) or held."""
        exchange = self.open.get(session_id)
        if exchange is not None and exchange.pending:
            return exchange.question
        return self.held.get(session_id)


class TurnGuard:
    """``with`` / ``async with``: if the block raises, the turn of the
    session's exchange begun inside the block is aborted, pending or already
    finalized (a failed run leaves nothing in the history), and the error
    propagates. A block that ends normally leaves the turn as it is: one a
    run paused on (an interruption awaiting approval) stays pending, for the
    resumed run to finalize."""

    def __init__(self, client: AnyClient, exchanges: Exchanges, session_id: str) -> None:
        self._client = client
        self._exchanges = exchanges
        self._session_id = session_id
        self._before: Optional[Exchange] = None

    def _begun_inside(self, exc: Optional[BaseException]) -> bool:
        if exc is None:
            return False
        exchange = self._exchanges.open.get(self._session_id)
        return exchange is not None and exchange is not self._before

    def __enter__(self) -> TurnGuard:
        self._before = self._exchanges.open.get(self._session_id)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._begun_inside(exc):
            run_sync(
                self._client,
                self._exchanges.abort(self._session_id, "the run failed"),
                "guard()",
            )

    async def __aenter__(self) -> TurnGuard:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._begun_inside(exc):
            await run_async(self._client, self._exchanges.abort(self._session_id, "the run failed"))
