"""LangChain integration (``pip install './clients/python[langchain]'`` from a clone).

Two ways in, for two kinds of code:

- :class:`RunnableWithTurnstoreHistory` wraps a chain and keeps turnstore's
  flow: the turn is started with the question *before* the chain runs (the
  history comes back in that same call and is passed into the chain as
  messages), finalized with the chain's output, and aborted if the chain
  raises. Concurrent requests on one session get distinct, ordered turns.
- :class:`TurnstoreChatMessageHistory` implements LangChain's
  ``BaseChatMessageHistory``, for code built around that interface (e.g.
  ``RunnableWithMessageHistory``). That interface reads the history, runs
  the chain, and only then writes the question and answer together, so a
  question is not recorded while it is being answered, a failed run leaves
  no trace, and two concurrent requests are ordered by when they finish, not
  when they started. Prefer the wrapper when you can.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForChainRun,
        CallbackManagerForChainRun,
    )
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import Runnable, RunnableConfig
    from langchain_core.runnables.config import patch_config
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnstore.langchain needs langchain-core: pip install 'langchain-core>=0.3' "
        "(or install the client with its [langchain] extra)"
    ) from exc

from .async_client import AsyncClient
from .client import Client
from .errors import TurnstoreError
from .messages import Message
from .models import History, HistoryOptions, StartedTurn

__all__ = [
    "RunnableWithTurnstoreHistory",
    "TurnstoreChatMessageHistory",
    "message_text",
    "to_langchain_messages",
]

logger = logging.getLogger("turnstore")

_MESSAGES = HistoryOptions(format="messages")


def to_langchain_messages(messages: Sequence[Message]) -> List[BaseMessage]:
    """turnstore messages as LangChain messages (user -> HumanMessage,
    assistant -> AIMessage, system -> SystemMessage)."""
    out: List[BaseMessage] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "user":
            out.append(HumanMessage(content=content))
        elif role == "assistant":
            out.append(AIMessage(content=content))
        else:
            out.append(SystemMessage(content=content))
    return out


def message_text(value: Any) -> str:
    """The text of a chain output or message: a string as is, a message's
    content, with the text blocks of a multi-part content joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseMessage):
        content = value.content
        if isinstance(content, str):
            return content
        parts: List[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    raise TypeError(
        f"cannot record a {type(value).__name__} as an answer: the chain must return "
        "a string or a message (or a dict, with output_messages_key naming it)"
    )


def _history_messages(history: Optional[History]) -> List[BaseMessage]:
    return [] if history is None else to_langchain_messages(history.chat_messages())


class RunnableWithTurnstoreHistory(Runnable[Any, Any]):
    """Runs a chain inside a turnstore turn: start (history in) -> chain ->
    finalize (answer out), or abort if the chain raises.

    Args:
        runnable: the chain. With ``input_messages_key`` it takes a dict and
            receives it with the history added under ``history_messages_key``
            (for a ``MessagesPlaceholder``); without, it takes the message
            list ``history + [HumanMessage(question)]`` (a chat model, say).
        client: a :class:`~turnstore.Client` (for ``invoke``; ``ainvoke``
            then runs its calls in a thread) or an
            :class:`~turnstore.AsyncClient` (``ainvoke`` only).
        input_messages_key: the key of the question in a dict input (its
            value a string or a message). ``None``: the input is the question.
        history_messages_key: where a dict input receives the history.
        output_messages_key: the key of the answer when the chain returns a
            dict; otherwise the output is a string or a message.
        history: which history to fetch (limit, max_tokens, encoding, ...);
            the format is always ``messages``.
        session_id_key, user_id_key: the ``config["configurable"]`` keys
            holding the session id (required) and the user id (optional).

    The output of the chain is returned unchanged. ``stream`` and
    ``astream`` stream the chain (its ``stream``/``astream``): each chunk is
    yielded as it comes, and once the last one has come the turn is
    finalized with the text of every chunk, concatenated (with
    ``output_messages_key``, of the chunks' values under that key). If the
    chain raises while streaming, the turn is aborted and the error
    propagates. If the consumer closes the stream before its end (breaks
    out of the loop and the generator is closed, ``aclose()`` for
    ``astream``), the turn is aborted too: an answer not delivered whole is
    never recorded, and the history stays as it was.
    """

    def __init__(
        self,
        runnable: Runnable[Any, Any],
        client: Union[Client, AsyncClient],
        *,
        input_messages_key: Optional[str] = None,
        history_messages_key: str = "history",
        output_messages_key: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
        session_id_key: str = "session_id",
        user_id_key: str = "user_id",
    ) -> None:
        self.runnable = runnable
        self.client = client
        self.input_messages_key = input_messages_key
        self.history_messages_key = history_messages_key
        self.output_messages_key = output_messages_key
        self.history = replace(history, format="messages")
        self.session_id_key = session_id_key
        self.user_id_key = user_id_key

    # --- the Runnable interface ------------------------------------------

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        if not isinstance(self.client, Client):
            raise TypeError("invoke needs a turnstore.Client; with an AsyncClient use ainvoke")
        return self._call_with_config(self._run, input, config, **kwargs)

    async def ainvoke(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any
    ) -> Any:
        return await self._acall_with_config(self._arun, input, config, **kwargs)

    def stream(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Optional[Any]
    ) -> Iterator[Any]:
        if not isinstance(self.client, Client):
            raise TypeError("stream needs a turnstore.Client; with an AsyncClient use astream")
        body: List[Iterator[Any]] = []

        def transformer(
            inputs: Iterator[Any], run_manager: CallbackManagerForChainRun, config: RunnableConfig
        ) -> Iterator[Any]:
            body.append(self._stream_turn(inputs, run_manager, config))
            return body[0]

        try:
            yield from self._transform_stream_with_config(
                iter([input]), transformer, config, **kwargs
            )
        finally:
            # A consumer that stopped early closed this generator: close the
            # turn's now, so that it aborts the turn before close() returns.
            for turn in body:
                close = getattr(turn, "close", None)
                if close is not None:
                    close()

    async def astream(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Optional[Any]
    ) -> AsyncIterator[Any]:
        body: List[AsyncIterator[Any]] = []

        def transformer(
            inputs: AsyncIterator[Any],
            run_manager: AsyncCallbackManagerForChainRun,
            config: RunnableConfig,
        ) -> AsyncIterator[Any]:
            body.append(self._astream_turn(inputs, run_manager, config))
            return body[0]

        async def one() -> AsyncIterator[Any]:
            yield input

        try:
            async for chunk in self._atransform_stream_with_config(
                one(), transformer, config, **kwargs
            ):
                yield chunk
        finally:
            for turn in body:
                aclose = getattr(turn, "aclose", None)
                if aclose is not None:
                    await aclose()

    # --- the flow --------------------------------------------------------

    def _stream_turn(
        self,
        inputs: Iterator[Any],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> Iterator[Any]:
        assert isinstance(self.client, Client)
        question, chain_input = self._split(_only(inputs))
        session_id, user_id = self._ids(config)
        started = self.client.start_turn(
            question, session_id=session_id, user_id=user_id, history=self.history
        )
        parts: List[str] = []
        try:
            for chunk in self.runnable.stream(
                chain_input(_history_messages(started.history)),
                patch_config(config, callbacks=run_manager.get_child()),
            ):
                parts.append(self._answer_part(chunk))
                yield chunk
            self.client.finalize_turn(started.session_id, started.turn_id, "".join(parts))
        except BaseException:  # GeneratorExit too: the consumer stopped early
            try:
                self.client.abort_turn(started.session_id, started.turn_id)
            except TurnstoreError as error:
                logger.warning("could not abort turn %s: %s", started.turn_id, error)
            raise

    async def _astream_turn(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AsyncIterator[Any]:
        received = [item async for item in inputs]
        question, chain_input = self._split(_only(iter(received)))
        session_id, user_id = self._ids(config)
        started = await self._astart(question, session_id, user_id)
        parts: List[str] = []
        try:
            async for chunk in self.runnable.astream(
                chain_input(_history_messages(started.history)),
                patch_config(config, callbacks=run_manager.get_child()),
            ):
                parts.append(self._answer_part(chunk))
                yield chunk
            await self._afinalize(started, "".join(parts))
        except BaseException:  # GeneratorExit too: the consumer stopped early
            try:
                await self._aabort(started)
            except TurnstoreError as error:
                logger.warning("could not abort turn %s: %s", started.turn_id, error)
            raise

    def _run(
        self, input: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> Any:
        assert isinstance(self.client, Client)
        question, chain_input = self._split(input)
        session_id, user_id = self._ids(config)
        started = self.client.start_turn(
            question, session_id=session_id, user_id=user_id, history=self.history
        )
        try:
            output = self.runnable.invoke(
                chain_input(_history_messages(started.history)),
                patch_config(config, callbacks=run_manager.get_child()),
            )
            self.client.finalize_turn(started.session_id, started.turn_id, self._answer(output))
        except BaseException:
            try:
                self.client.abort_turn(started.session_id, started.turn_id)
            except TurnstoreError as error:
                logger.warning("could not abort turn %s: %s", started.turn_id, error)
            raise
        return output

    async def _arun(
        self, input: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> Any:
        question, chain_input = self._split(input)
        session_id, user_id = self._ids(config)
        started = await self._astart(question, session_id, user_id)
        try:
            output = await self.runnable.ainvoke(
                chain_input(_history_messages(started.history)),
                patch_config(config, callbacks=run_manager.get_child()),
            )
            await self._afinalize(started, self._answer(output))
        except BaseException:
            try:
                await self._aabort(started)
            except TurnstoreError as error:
                logger.warning("could not abort turn %s: %s", started.turn_id, error)
            raise
        return output

    async def _astart(self, question: str, session_id: str, user_id: Optional[str]) -> StartedTurn:
        if isinstance(self.client, AsyncClient):
            return await self.client.start_turn(
                question, session_id=session_id, user_id=user_id, history=self.history
            )
        return await asyncio.to_thread(
            self.client.start_turn,
            question,
            session_id=session_id,
            user_id=user_id,
            history=self.history,
        )

    async def _afinalize(self, started: StartedTurn, answer: str) -> None:
        if isinstance(self.client, AsyncClient):
            await self.client.finalize_turn(started.session_id, started.turn_id, answer)
        else:
            await asyncio.to_thread(
                self.client.finalize_turn, started.session_id, started.turn_id, answer
            )

    async def _aabort(self, started: StartedTurn) -> None:
        if isinstance(self.client, AsyncClient):
            await self.client.abort_turn(started.session_id, started.turn_id)
        else:
            await asyncio.to_thread(self.client.abort_turn, started.session_id, started.turn_id)

    # --- input and output shapes -----------------------------------------

    def _split(self, input: Any) -> Tuple[str, Callable[[List[BaseMessage]], Any]]:
        """The question, and how to make the chain's input from the history."""
        if self.input_messages_key is None:
            if isinstance(input, dict):
                raise TypeError("the input is a dict: pass input_messages_key naming its question")
            question = message_text(input)
            return question, lambda history: [*history, HumanMessage(content=question)]
        if not isinstance(input, dict):
            raise TypeError(
                f"input_messages_key={self.input_messages_key!r} needs a dict input, "
                f"got {type(input).__name__}"
            )
        if self.input_messages_key not in input:
            raise KeyError(f"the input has no {self.input_messages_key!r} key")
        question = message_text(input[self.input_messages_key])
        key = self.history_messages_key
        fields: Dict[str, Any] = dict(input)
        return question, lambda history: {**fields, key: history}

    def _answer_part(self, chunk: Any) -> str:
        """The text a streamed chunk adds to the answer."""
        if self.output_messages_key is not None:
            if not isinstance(chunk, dict):
                raise TypeError(
                    f"output_messages_key={self.output_messages_key!r} needs dict chunks, "
                    f"got {type(chunk).__name__}"
                )
            if self.output_messages_key not in chunk:
                return ""
            return message_text(chunk[self.output_messages_key])
        return message_text(chunk)

    def _answer(self, output: Any) -> str:
        if self.output_messages_key is not None:
            if not isinstance(output, dict) or self.output_messages_key not in output:
                raise KeyError(f"the chain's output has no {self.output_messages_key!r} key")
            return message_text(output[self.output_messages_key])
        return message_text(output)

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


def _only(inputs: Iterator[Any]) -> Any:
    """The one input of a stream (``stream`` passes exactly one)."""
    items = list(inputs)
    if len(items) != 1:
        raise ValueError(f"expected one input to stream, got {len(items)}")
    return items[0]


class TurnstoreChatMessageHistory(BaseChatMessageHistory):
    """A session's history behind LangChain's ``BaseChatMessageHistory``.

    - ``messages`` reads the history (``messages`` format, within
      ``history``'s limits: the server's defaults unless set).
    - ``add_messages`` records question/answer pairs: a ``HumanMessage``
      is held until the ``AIMessage`` that answers it arrives (in the same
      call or a later one on this object), then both are written as one
      turn (start + finalize). Other message kinds raise ``ValueError``:
      turnstore keeps only questions and final answers.
    - ``clear`` deletes the session.

    This interface writes after generation, so it does not keep turnstore's
    start-before-generation flow (see the module doc);
    :class:`RunnableWithTurnstoreHistory` does.
    """

    def __init__(
        self,
        client: Client,
        session_id: str,
        *,
        user_id: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.user_id = user_id
        self.history = replace(history, format="messages")
        self._question: Optional[str] = None

    @property
    def messages(self) -> List[BaseMessage]:  # type: ignore[override]
        """The history, oldest first (a property: each read asks the server)."""
        history = self.client.get_history(self.session_id, self.history)
        return _history_messages(history)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        for message in messages:
            if isinstance(message, HumanMessage):
                if self._question is not None:
                    raise ValueError("two questions in a row: each needs its answer first")
                self._question = message_text(message)
            elif isinstance(message, AIMessage):
                if self._question is None:
                    raise ValueError("an answer without a question before it")
                self._record(self._question, message_text(message))
                self._question = None
            else:
                raise ValueError(
                    f"turnstore keeps questions and answers only, not {type(message).__name__}"
                )

    def _record(self, question: str, answer: str) -> None:
        started = self.client.start_turn(question, session_id=self.session_id, user_id=self.user_id)
        try:
            self.client.finalize_turn(self.session_id, started.turn_id, answer)
        except BaseException:
            try:
                self.client.abort_turn(self.session_id, started.turn_id)
            except TurnstoreError as error:
                logger.warning("could not abort turn %s: %s", started.turn_id, error)
            raise

    def clear(self) -> None:
        self._question = None
        self.client.clear_session(self.session_id)
