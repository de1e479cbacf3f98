"""LlamaIndex integration (``pip install './clients/python[llamaindex]'`` from a clone).

Two ways in:

- :class:`TurnstoreMemory`, a LlamaIndex memory (``BaseMemory``, what agents
  such as ``FunctionAgent`` and chat engines take as ``memory=``): a user
  message put into it **starts** a turn, whose start returns the bounded
  history (turnstore's exact budget: ``max_tokens`` with
  ``model``/``encoding``, no trimming on the client); ``get`` returns that
  history and the question; the final assistant message **finalizes** the
  turn. Tool calls, tool results and system messages are not stored (an
  assistant message that calls tools is not the answer). It implements
  ``BaseMemory``, the interface agents and chat engines are typed against;
  llama-index-core 0.14's default implementation of it, ``Memory``, keeps
  the messages in SQL and trims them to a token limit on the client, both
  of which this one leaves to turnstore.
- :class:`TurnstoreChatStore`, a ``BaseChatStore`` whose keys are turnstore
  session ids, for code built on a chat store (e.g. ``ChatMemoryBuffer``).

Neither hears of a failed run from LlamaIndex: wrap the run in
``with memory.guard():`` (``async with`` for agents) or
``store.guard(key)`` to abort the turn it started if it raises. Without
it, the unanswered turn is aborted by the next question, or expires after
the server's pending TTL. The state of the current exchange lives in the
object (one memory per conversation at a time; one store per process is
fine, its state is per key).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.llms import LLM
    from llama_index.core.memory.types import BaseMemory
    from llama_index.core.storage.chat_store.base import BaseChatStore
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnstore.llama_index needs LlamaIndex: pip install 'llama-index-core>=0.14' "
        "(or install the client with its [llamaindex] extra)"
    ) from exc

from dataclasses import replace

from ._frameworks import Exchanges, Plan, TurnGuard, call, run_async, run_sync
from .async_client import AsyncClient
from .client import Client
from .messages import Message
from .models import History, HistoryOptions

__all__ = ["TurnstoreChatStore", "TurnstoreMemory", "to_llama_index_messages"]

_MESSAGES = HistoryOptions(format="messages")
# As much as one read returns: the server's largest limit and budget.
_ALL = HistoryOptions(format="messages", limit=10_000, max_tokens=10_000_000)


def to_llama_index_messages(messages: Sequence[Message]) -> List[ChatMessage]:
    """turnstore messages as LlamaIndex ``ChatMessage``s (same roles)."""
    return [ChatMessage(role=MessageRole(m["role"]), content=m["content"]) for m in messages]


def _text(message: ChatMessage) -> str:
    return "".join(block.text for block in message.blocks if isinstance(block, TextBlock))


def _calls_tools(message: ChatMessage) -> bool:
    if message.additional_kwargs.get("tool_calls"):
        return True
    return any(getattr(block, "block_type", None) == "tool_call" for block in message.blocks)


def _read(
    exchanges: Exchanges, session_id: str, options: HistoryOptions, *, fresh: bool = False
) -> Plan[List[ChatMessage]]:
    """The history (unless ``fresh``, the start's while this object's turn is
    pending: it was read in that same call), then the question not in it yet."""
    exchange = exchanges.open.get(session_id)
    history: Optional[History] = None
    if exchange is not None and exchange.pending and not fresh:
        history = exchange.started.history
    if history is None:
        history = yield call("get_history", session_id, options)
    assert history is not None
    messages = to_llama_index_messages(history.chat_messages())
    tail = exchanges.tail(session_id)
    if tail is not None:
        messages.append(ChatMessage(role=MessageRole.USER, content=tail))
    return messages


def _replace(
    exchanges: Exchanges,
    session_id: str,
    messages: Sequence[ChatMessage],
    history: HistoryOptions,
    strict: bool,
) -> Plan[None]:
    """Replaces the session with ``messages``: a new session of their
    question/answer pairs (imported), and a trailing question started."""
    pairs: List[Message] = []
    for n, message in enumerate(messages):
        text = _text(message)
        if message.role == MessageRole.USER and text:
            pairs.append({"role": "user", "content": text})
        elif message.role == MessageRole.ASSISTANT and text and not _calls_tools(message):
            pairs.append({"role": "assistant", "content": text})
        elif strict:
            raise ValueError(
                f"messages[{n}]: turnstore keeps text questions and final answers only, "
                f"not a {message.role.value} message"
                + (" that calls tools" if _calls_tools(message) else "")
            )
    if strict:
        for n, pair in enumerate(pairs):
            if pair["role"] != ("user" if n % 2 == 0 else "assistant"):
                raise ValueError(
                    f"messages[{n}]: questions and answers must alternate, beginning "
                    "with a question"
                )
    trailing: List[str] = []
    while pairs and pairs[-1]["role"] == "user":
        trailing.insert(0, pairs.pop()["content"])
    yield from exchanges.clear(session_id)
    if pairs:
        yield call(
            "import_messages",
            session_id,
            pairs,
            user_id=exchanges.user_id,
            mode="strict" if strict else "distill",
        )
    if trailing:
        yield from exchanges.ask(session_id, "\n\n".join(trailing), history)


class TurnstoreMemory(BaseMemory):
    """A LlamaIndex memory over one turnstore session.

    Args:
        client: a :class:`~turnstore.Client` (sync and async methods; the
            async ones run its calls in a worker thread) or an
            :class:`~turnstore.AsyncClient` (async methods only: agents).
        session_id: the turnstore session.
        user_id: the user the session belongs to (claims it on the first turn).
        history: which history to return (``max_tokens`` with
            ``model``/``encoding`` for an exact budget, ``limit``,
            ``summary``, ...); the format is always ``messages``.

    What each method does:

    - ``put``/``aput``, ``put_messages``/``aput_messages``: a user message
      starts a turn (an earlier question still unanswered is aborted: its
      run failed); an assistant message with text that calls no tools
      finalizes it (a later one in the same exchange replaces the answer).
      Tool calls, tool results and system messages are skipped.
    - ``get``/``aget``: the bounded history, then the question while its turn
      is pending. ``get_all``/``aget_all``: the same, with the server's
      largest limit and budget.
    - ``set``/``aset``: replaces the session: it is cleared, the
      question/answer pairs of the messages are imported (tool traffic and
      system messages left out), and a trailing question starts a turn.
    - ``reset``/``areset``: deletes the session.
    """

    session_id: str = Field(description="The turnstore session id.")
    user_id: Optional[str] = Field(default=None, description="The user the session belongs to.")

    _client: Union[Client, AsyncClient] = PrivateAttr()
    _history: HistoryOptions = PrivateAttr()
    _exchanges: Exchanges = PrivateAttr()

    def __init__(
        self,
        client: Union[Client, AsyncClient],
        session_id: str,
        *,
        user_id: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
    ) -> None:
        fields: Dict[str, Any] = {"session_id": session_id, "user_id": user_id}
        super().__init__(**fields)
        self._client = client
        self._history = replace(history, format="messages")
        self._exchanges = Exchanges(user_id=user_id)

    @classmethod
    def class_name(cls) -> str:
        return "TurnstoreMemory"

    @classmethod
    def from_defaults(  # type: ignore[override]  # the base takes **kwargs (as Memory does)
        cls,
        chat_history: Optional[List[ChatMessage]] = None,
        llm: Optional[LLM] = None,
        *,
        client: Union[Client, AsyncClient, None] = None,
        session_id: Optional[str] = None,
        user_id: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
    ) -> TurnstoreMemory:
        """A memory (``client`` and ``session_id`` are required; ``llm`` is
        unused: turnstore counts the tokens); ``chat_history`` replaces the
        session's (see ``set``)."""
        if client is None or session_id is None:
            raise TypeError("TurnstoreMemory.from_defaults needs client= and session_id=")
        memory = cls(client, session_id, user_id=user_id, history=history)
        if chat_history is not None:
            memory.set(chat_history)
        return memory

    def guard(self) -> TurnGuard:
        """``with memory.guard():`` (``async with``) around a run: if it
        raises, the turn it started is aborted (pending, or finalized
        already) and the error propagates."""
        return TurnGuard(self._client, self._exchanges, self.session_id)

    # --- reads -------------------------------------------------------------

    def get(self, input: Optional[str] = None, **kwargs: Any) -> List[ChatMessage]:
        return run_sync(self._client, self._read(), "get")

    async def aget(self, input: Optional[str] = None, **kwargs: Any) -> List[ChatMessage]:
        return await run_async(self._client, self._read())

    def get_all(self) -> List[ChatMessage]:
        return run_sync(self._client, self._read(everything=True), "get_all")

    async def aget_all(self) -> List[ChatMessage]:
        return await run_async(self._client, self._read(everything=True))

    def _read(self, everything: bool = False) -> Plan[List[ChatMessage]]:
        if everything:
            return _read(self._exchanges, self.session_id, _ALL, fresh=True)
        return _read(self._exchanges, self.session_id, self._history)

    # --- writes ------------------------------------------------------------

    def put(self, message: ChatMessage) -> None:
        run_sync(self._client, self._put([message]), "put")

    async def aput(self, message: ChatMessage) -> None:
        await run_async(self._client, self._put([message]))

    def put_messages(self, messages: List[ChatMessage]) -> None:
        run_sync(self._client, self._put(messages), "put_messages")

    async def aput_messages(self, messages: List[ChatMessage]) -> None:
        await run_async(self._client, self._put(messages))

    def set(self, messages: List[ChatMessage]) -> None:
        run_sync(self._client, self._set(messages), "set")

    async def aset(self, messages: List[ChatMessage]) -> None:
        await run_async(self._client, self._set(messages))

    def reset(self) -> None:
        run_sync(self._client, self._exchanges.clear(self.session_id), "reset")

    async def areset(self) -> None:
        await run_async(self._client, self._exchanges.clear(self.session_id))

    def _put(self, messages: Sequence[ChatMessage]) -> Plan[None]:
        for message in messages:
            text = _text(message)
            if message.role == MessageRole.USER:
                if not text:
                    raise ValueError("a user message without text: turnstore keeps text questions")
                yield from self._exchanges.ask(self.session_id, text, self._history)
            elif message.role == MessageRole.ASSISTANT and text and not _calls_tools(message):
                yield from self._exchanges.answer(self.session_id, text)

    def _set(self, messages: Sequence[ChatMessage]) -> Plan[None]:
        return _replace(self._exchanges, self.session_id, messages, self._history, strict=False)


class TurnstoreChatStore(BaseChatStore):
    """A ``BaseChatStore`` over turnstore; each key is a session id.

    Args:
        client: a :class:`~turnstore.Client` (sync and async methods) or an
            :class:`~turnstore.AsyncClient` (async methods only).
        user_id: the user the sessions belong to (claims new ones); it also
            makes ``get_keys`` possible.
        history: which history ``get_messages`` returns (the server's limits
            unless set); the format is always ``messages``.

    How each method maps to turnstore (each has its async twin):

    - ``add_message``: a user message starts a turn (a question still
      unanswered on that key is aborted first); an assistant message
      finalizes it (a later one in the same exchange replaces the answer).
      A system or tool message, or an assistant message that calls tools,
      raises ``ValueError``: turnstore keeps questions and final answers.
    - ``get_messages``: the bounded history, then the pending question.
    - ``set_messages``: replaces the session: it is cleared, the messages
      (alternating questions and answers, else ``ValueError``, before
      anything is written) are imported as finalized turns, and a trailing
      question starts a turn.
    - ``delete_messages``: deletes the session (returns what it held).
    - ``delete_last_message``: a pending question is removed (its turn
      aborted). An answer cannot leave without its question: its whole turn
      is aborted, and its question stays with this store as the last message
      (``get_messages`` shows it) until deleted in turn, or answered anew by
      ``add_message`` (which records the exchange again).
    - ``delete_message``: the last message, as ``delete_last_message``; any
      other raises ``NotImplementedError`` (it would leave half an exchange
      in the history).
    - ``get_keys``: the user's sessions (``NotImplementedError`` without
      ``user_id``: turnstore lists sessions by user).
    """

    user_id: Optional[str] = Field(default=None, description="The user the sessions belong to.")

    _client: Union[Client, AsyncClient] = PrivateAttr()
    _history: HistoryOptions = PrivateAttr()
    _exchanges: Exchanges = PrivateAttr()

    def __init__(
        self,
        client: Union[Client, AsyncClient],
        *,
        user_id: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
    ) -> None:
        fields: Dict[str, Any] = {"user_id": user_id}
        super().__init__(**fields)
        self._client = client
        self._history = replace(history, format="messages")
        self._exchanges = Exchanges(user_id=user_id)

    @classmethod
    def class_name(cls) -> str:
        return "TurnstoreChatStore"

    def guard(self, key: str) -> TurnGuard:
        """``with store.guard(key):`` (``async with``) around a run on that
        session: if it raises, the turn it started is aborted."""
        return TurnGuard(self._client, self._exchanges, key)

    # --- sync --------------------------------------------------------------

    def set_messages(self, key: str, messages: List[ChatMessage]) -> None:
        run_sync(self._client, self._set(key, messages), "set_messages")

    def get_messages(self, key: str) -> List[ChatMessage]:
        return run_sync(self._client, self._get(key), "get_messages")

    def add_message(self, key: str, message: ChatMessage) -> None:
        run_sync(self._client, self._add(key, message), "add_message")

    def delete_messages(self, key: str) -> Optional[List[ChatMessage]]:
        return run_sync(self._client, self._delete_all(key), "delete_messages")

    def delete_message(self, key: str, idx: int) -> Optional[ChatMessage]:
        return run_sync(self._client, self._delete_at(key, idx), "delete_message")

    def delete_last_message(self, key: str) -> Optional[ChatMessage]:
        return run_sync(self._client, self._delete_last(key), "delete_last_message")

    def get_keys(self) -> List[str]:
        return run_sync(self._client, self._keys(), "get_keys")

    # --- async -------------------------------------------------------------

    async def aset_messages(self, key: str, messages: List[ChatMessage]) -> None:
        await run_async(self._client, self._set(key, messages))

    async def aget_messages(self, key: str) -> List[ChatMessage]:
        return await run_async(self._client, self._get(key))

    async def async_add_message(self, key: str, message: ChatMessage) -> None:
        await run_async(self._client, self._add(key, message))

    async def adelete_messages(self, key: str) -> Optional[List[ChatMessage]]:
        return await run_async(self._client, self._delete_all(key))

    async def adelete_message(self, key: str, idx: int) -> Optional[ChatMessage]:
        return await run_async(self._client, self._delete_at(key, idx))

    async def adelete_last_message(self, key: str) -> Optional[ChatMessage]:
        return await run_async(self._client, self._delete_last(key))

    async def aget_keys(self) -> List[str]:
        return await run_async(self._client, self._keys())

    # --- the plans ---------------------------------------------------------

    def _set(self, key: str, messages: Sequence[ChatMessage]) -> Plan[None]:
        return _replace(self._exchanges, key, messages, self._history, strict=True)

    def _get(self, key: str) -> Plan[List[ChatMessage]]:
        return _read(self._exchanges, key, self._history)

    def _add(self, key: str, message: ChatMessage) -> Plan[None]:
        text = _text(message)
        if message.role == MessageRole.USER and text:
            yield from self._exchanges.ask(key, text, self._history)
        elif message.role == MessageRole.ASSISTANT and text and not _calls_tools(message):
            yield from self._exchanges.answer(key, text)
        else:
            raise ValueError(
                "turnstore keeps text questions and final answers only, not a "
                f"{message.role.value} message"
                + (" that calls tools" if _calls_tools(message) else "")
                + ("" if text else " without text")
            )

    def _delete_all(self, key: str) -> Plan[Optional[List[ChatMessage]]]:
        messages = yield from _read(self._exchanges, key, self._history)
        yield from self._exchanges.clear(key)
        return messages or None

    def _delete_last(self, key: str) -> Plan[Optional[ChatMessage]]:
        popped = yield from self._exchanges.pop(key)
        if popped is None:
            return None
        role, text = popped
        return ChatMessage(role=MessageRole(role), content=text)

    def _delete_at(self, key: str, idx: int) -> Plan[Optional[ChatMessage]]:
        messages = yield from _read(self._exchanges, key, self._history)
        if idx < 0 or idx >= len(messages):
            return None
        if idx != len(messages) - 1:
            raise NotImplementedError(
                "turnstore keeps whole exchanges: deleting one message other than the last "
                "would leave half of one (delete_last_message removes the newest; "
                "delete_messages the session)"
            )
        return (yield from self._delete_last(key))

    def _keys(self) -> Plan[List[str]]:
        if self.user_id is None:
            raise NotImplementedError(
                "turnstore lists sessions by user: make the store with user_id= to get_keys"
            )
        keys: List[str] = []
        cursor: Optional[str] = None
        while True:
            page = yield call("list_user_sessions", self.user_id, limit=1000, cursor=cursor)
            keys.extend(s.session_id for s in page.sessions)
            cursor = page.next_cursor
            if cursor is None:
                return keys
