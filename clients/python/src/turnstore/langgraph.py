"""LangGraph integration (``pip install './clients/python[langgraph]'`` from a clone).

:class:`TurnstoreHooks` gives a graph turnstore's flow with two nodes and a
guard:

- ``pre_model_hook`` (before the model node): takes the question, the last
  ``HumanMessage`` of ``state["messages"]``, **starts** the turn with it (the
  session id, required, and the user id, optional, come from
  ``config["configurable"]``), and replaces the state's messages with the
  bounded history turnstore returned in that same call, then the question
  (system messages the state begins with stay in front). The turn is kept in
  the state, under ``turnstore_turn`` (:class:`TurnstoreState`).
- ``post_model_hook`` (after the answer node): **finalizes** the turn with the
  text of the last ``AIMessage``. An ``AIMessage`` that calls tools is not
  the answer yet: the hook then does nothing, so both nodes also serve as
  ``create_react_agent``'s hooks of the same names (the pre-model hook runs
  before each model call, and starts a turn once per question).
- :meth:`TurnstoreHooks.guard` wraps the compiled graph: if ``invoke``,
  ``ainvoke``, ``stream`` or ``astream`` raises (or a stream is closed before
  its end), the turn the run started is **aborted**, and the error
  propagates. A run that ends normally keeps its turn: one paused on an
  interrupt stays pending in the (checkpointed) state, and the resumed run
  finalizes it.

The state needs the ``messages`` key with LangGraph's ``add_messages``
reducer, and the ``turnstore_turn`` key: use :class:`TurnstoreState`, or add
``turnstore_turn: Optional[TurnRef]`` to your own schema (LangGraph drops a
node's update to a key the schema lacks; the post-model hook then raises).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import (
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
    TypedDict,
    Union,
)

try:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
    from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
    from langgraph.graph import MessagesState
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnstore.langgraph needs LangGraph: pip install 'langgraph>=1.2' "
        "(or install the client with its [langgraph] extra)"
    ) from exc

from ._frameworks import Plan, abort_quietly, call, run_async, run_sync
from .async_client import AsyncClient
from .client import Client
from .langchain import message_text, to_langchain_messages
from .models import HistoryOptions, StartedTurn

__all__ = [
    "HISTORY_ID_PREFIX",
    "TURN_KEY",
    "TurnRef",
    "TurnstoreGuardedGraph",
    "TurnstoreHooks",
    "TurnstoreState",
]

TURN_KEY = "turnstore_turn"
"""The state key holding the turn under way."""

HISTORY_ID_PREFIX = "turnstore-history-"
"""The ids of the history messages the pre-model hook puts in the state (so
that the next run's hook replaces them, and leaves your messages alone)."""

# The config key through which a guarded run hears of the turns its nodes start.
_RUN_KEY = "__turnstore_run"

_MESSAGES = HistoryOptions(format="messages")


class TurnRef(TypedDict):
    """A turn under way, as the state keeps it (JSON, for checkpointers)."""

    session_id: str
    turn_id: str
    seq: int
    question_id: str


class TurnstoreState(MessagesState, total=False):
    """``MessagesState`` with the turn under way (``turnstore_turn``)."""

    turnstore_turn: Optional[TurnRef]


@dataclass
class _Run:
    """The turns one guarded run started (finalized since or not: a run that
    raises leaves none of them in the history)."""

    started: List[TurnRef] = field(default_factory=list)


class TurnstoreHooks:
    """The node pair and the guard (see the module doc).

    Args:
        client: a :class:`~turnstore.Client` (sync and async graphs; the
            async ones run its calls in a worker thread) or an
            :class:`~turnstore.AsyncClient` (``ainvoke``/``astream`` only).
        history: which history to inject (``limit``, ``max_tokens``,
            ``model``/``encoding``, ``summary``, ...); the format is always
            ``messages``.
        session_id_key, user_id_key: the ``config["configurable"]`` keys of
            the session id (required) and the user id (optional).
    """

    def __init__(
        self,
        client: Union[Client, AsyncClient],
        *,
        history: HistoryOptions = _MESSAGES,
        session_id_key: str = "session_id",
        user_id_key: str = "user_id",
    ) -> None:
        self.client = client
        self.history = replace(history, format="messages")
        self.session_id_key = session_id_key
        self.user_id_key = user_id_key
        self.pre_model_hook: Runnable[Any, Dict[str, Any]] = RunnableLambda(
            self._pre, afunc=self._apre, name="turnstore_pre_model_hook"
        )
        self.post_model_hook: Runnable[Any, Dict[str, Any]] = RunnableLambda(
            self._post, afunc=self._apost, name="turnstore_post_model_hook"
        )

    def guard(self, graph: Runnable[Any, Any]) -> TurnstoreGuardedGraph:
        """The compiled graph, aborting the turn of a run that raises."""
        channels = getattr(graph, "channels", None)
        if isinstance(channels, dict) and TURN_KEY not in channels:
            raise ValueError(
                f"the graph's state has no {TURN_KEY!r} key: build it on TurnstoreState "
                f"(or add `{TURN_KEY}: Optional[TurnRef]` to your state schema)"
            )
        return TurnstoreGuardedGraph(graph, self)

    # --- the nodes ---------------------------------------------------------

    def _pre(self, state: Any, config: RunnableConfig) -> Dict[str, Any]:
        return run_sync(self.client, self._start(state, config), "a sync graph")

    async def _apre(self, state: Any, config: RunnableConfig) -> Dict[str, Any]:
        return await run_async(self.client, self._start(state, config))

    def _post(self, state: Any, config: RunnableConfig) -> Dict[str, Any]:
        return run_sync(self.client, self._finalize(state, config), "a sync graph")

    async def _apost(self, state: Any, config: RunnableConfig) -> Dict[str, Any]:
        return await run_async(self.client, self._finalize(state, config))

    def _start(self, state: Any, config: RunnableConfig) -> Plan[Dict[str, Any]]:
        messages: List[BaseMessage] = list(_get(state, "messages") or [])
        question = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        if question is None or question.id is None:
            raise ValueError("the state's messages have no HumanMessage to start a turn with")
        ref: Optional[TurnRef] = _get(state, TURN_KEY)
        if ref is not None and ref["question_id"] == question.id:
            return {}  # this question's turn is under way (a tool loop's next model call)
        if ref is not None:
            # A turn left by a run that failed unguarded (or was abandoned).
            yield from abort_quietly(ref["session_id"], ref["turn_id"], "superseded")
        session_id, user_id = self._ids(config)
        started: StartedTurn = yield call(
            "start_turn",
            message_text(question),
            session_id=session_id,
            user_id=user_id,
            history=self.history,
        )
        new_ref: TurnRef = {
            "session_id": started.session_id,
            "turn_id": started.turn_id,
            "seq": started.seq,
            "question_id": question.id,
        }
        run = _run_of(config)
        if run is not None:
            run.started.append(new_ref)
        history = to_langchain_messages(
            started.history.chat_messages() if started.history is not None else []
        )
        for n, message in enumerate(history):
            message.id = f"{HISTORY_ID_PREFIX}{started.turn_id}-{n}"
        leading: List[BaseMessage] = []
        for message in messages:
            if message.type != "system":
                break
            if not (message.id or "").startswith(HISTORY_ID_PREFIX):
                leading.append(message)
        return {
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *leading, *history, question],
            TURN_KEY: new_ref,
        }

    def _finalize(self, state: Any, config: RunnableConfig) -> Plan[Dict[str, Any]]:
        ref: Optional[TurnRef] = _get(state, TURN_KEY)
        if ref is None:
            raise RuntimeError(
                f"no turn to finalize: the state has no {TURN_KEY!r}. Run pre_model_hook "
                "first, on a state schema with that key (TurnstoreState)"
            )
        messages: List[BaseMessage] = list(_get(state, "messages") or [])
        answer = messages[-1] if messages else None
        if not isinstance(answer, AIMessage):
            raise ValueError(
                "post_model_hook runs after the answer: the last message is no AIMessage"
            )
        if answer.tool_calls:
            return {}  # the model asked for tools: the answer is still to come
        yield call("finalize_turn", ref["session_id"], ref["turn_id"], message_text(answer))
        return {TURN_KEY: None}

    def _ids(self, config: RunnableConfig) -> Tuple[str, Optional[str]]:
        configurable = config.get("configurable") or {}
        session_id = configurable.get(self.session_id_key)
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(
                f"pass the session id as config={{'configurable': "
                f"{{'{self.session_id_key}': ...}}}}"
            )
        user_id = configurable.get(self.user_id_key)
        return session_id, user_id if isinstance(user_id, str) else None

    def _abort_plan(self, run: _Run) -> Plan[None]:
        for ref in run.started:
            yield from abort_quietly(ref["session_id"], ref["turn_id"], "the graph raised")


class TurnstoreGuardedGraph(Runnable[Any, Any]):
    """A compiled graph whose runs abort their turn when they raise (see
    :meth:`TurnstoreHooks.guard`). Other attributes (``get_state``,
    ``get_graph``, ...) are the graph's."""

    def __init__(self, graph: Runnable[Any, Any], hooks: TurnstoreHooks) -> None:
        self.graph = graph
        self.hooks = hooks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        run, config = _guarded(config)
        try:
            return self.graph.invoke(input, config, **kwargs)
        except BaseException:
            self._abort(run)
            raise

    async def ainvoke(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any
    ) -> Any:
        run, config = _guarded(config)
        try:
            return await self.graph.ainvoke(input, config, **kwargs)
        except BaseException:
            await self._aabort(run)
            raise

    def stream(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Optional[Any]
    ) -> Iterator[Any]:
        run, config = _guarded(config)
        try:
            yield from self.graph.stream(input, config, **kwargs)
        except BaseException:  # GeneratorExit too: the consumer stopped early
            self._abort(run)
            raise

    async def astream(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Optional[Any]
    ) -> AsyncIterator[Any]:
        run, config = _guarded(config)
        try:
            async for chunk in self.graph.astream(input, config, **kwargs):
                yield chunk
        except BaseException:
            await self._aabort(run)
            raise

    def _abort(self, run: _Run) -> None:
        if run.started:
            run_sync(self.hooks.client, self.hooks._abort_plan(run), "a sync graph")

    async def _aabort(self, run: _Run) -> None:
        if run.started:
            await run_async(self.hooks.client, self.hooks._abort_plan(run))


def _guarded(config: Optional[RunnableConfig]) -> Tuple[_Run, RunnableConfig]:
    run = _Run()
    config = config or {}
    configurable = {**(config.get("configurable") or {}), _RUN_KEY: run}
    patched: RunnableConfig = {**config, "configurable": configurable}
    return run, patched


def _run_of(config: RunnableConfig) -> Optional[_Run]:
    run = (config.get("configurable") or {}).get(_RUN_KEY)
    return run if isinstance(run, _Run) else None


def _get(state: Any, key: str) -> Any:
    if isinstance(state, dict):
        return state.get(key)
    return getattr(state, key, None)
