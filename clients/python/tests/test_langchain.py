"""The LangChain integration, with langchain-core's fake chat models
against the real server."""

from __future__ import annotations

import types
from typing import Any, Iterator, List, Optional, Tuple

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models import FakeListChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from support import finished_turn, new_id

from turnstore import AsyncClient, Client, HistoryOptions
from turnstore.langchain import (
    RunnableWithTurnstoreHistory,
    TurnstoreChatMessageHistory,
    message_text,
)

PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer from the documents."),
        MessagesPlaceholder("history"),
        ("human", "{question}"),
    ]
)


class Recorder:
    """A chain step that records the prompt the model is about to get and,
    at that moment, how many turns of the session are pending."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.prompts: List[List[BaseMessage]] = []
        self.pending: List[int] = []

    def step(self, session_id: str) -> Runnable[Any, Any]:
        def record(prompt: PromptValue) -> PromptValue:
            self.prompts.append(prompt.to_messages())
            self.pending.append(self.client.get_session(session_id).pending_count)
            return prompt

        return RunnableLambda(record)


def test_the_wrapper_starts_before_and_finalizes_after(client: Client) -> None:
    sid = new_id()
    recorder = Recorder(client)
    model = FakeListChatModel(responses=["An index of embeddings.", "Embed, then insert."])
    chain = RunnableWithTurnstoreHistory(
        PROMPT | recorder.step(sid) | model,
        client,
        input_messages_key="question",
        history_messages_key="history",
        history=HistoryOptions(max_tokens=1000),
    )
    config: Any = {"configurable": {"session_id": sid, "user_id": "alice"}}

    first = chain.invoke({"question": "What is a vector index?"}, config)
    second = chain.invoke({"question": "How do I build one?"}, config)

    assert message_text(first) == "An index of embeddings."
    assert message_text(second) == "Embed, then insert."
    assert recorder.pending == [1, 1]  # the turn existed while the model ran
    assert [type(m) for m in recorder.prompts[1]] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        HumanMessage,
    ]
    assert [m.content for m in recorder.prompts[1][1:]] == [
        "What is a vector index?",
        "An index of embeddings.",
        "How do I build one?",
    ]
    history = client.get_history(sid, format="turns")
    assert history.turns is not None
    assert [(t.user_query, t.final_answer) for t in history.turns] == [
        ("What is a vector index?", "An index of embeddings."),
        ("How do I build one?", "Embed, then insert."),
    ]
    assert client.get_session(sid).user_id == "alice"


def test_the_wrapper_aborts_when_the_chain_fails(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")

    def explode(_: Any) -> str:
        raise RuntimeError("retrieval failed")

    chain = RunnableWithTurnstoreHistory(
        RunnableLambda(explode), client, input_messages_key="question"
    )
    with pytest.raises(RuntimeError, match="retrieval failed"):
        chain.invoke({"question": "q2"}, {"configurable": {"session_id": sid}})
    history = client.get_history(sid)
    assert (history.total_turns, history.pending_turns) == (1, 0)


def test_the_wrapper_around_a_chat_model(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    seen: List[List[BaseMessage]] = []

    def record(messages: List[BaseMessage]) -> List[BaseMessage]:
        seen.append(messages)
        return messages

    model = FakeListChatModel(responses=["a2"])
    chain = RunnableWithTurnstoreHistory(RunnableLambda(record) | model, client)
    out = chain.invoke(HumanMessage(content="q2"), {"configurable": {"session_id": sid}})
    assert message_text(out) == "a2"
    assert [m.content for m in seen[0]] == ["q1", "a1", "q2"]
    assert client.get_history(sid).total_turns == 2


def test_the_wrapper_needs_a_session_id(client: Client) -> None:
    chain = RunnableWithTurnstoreHistory(
        FakeListChatModel(responses=["a"]), client, input_messages_key="question"
    )
    with pytest.raises(ValueError, match="session_id"):
        chain.invoke({"question": "q"})


def test_a_dict_output_names_its_answer(client: Client) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(
        RunnableLambda(lambda d: {"answer": "a1", "sources": ["doc-1"]}),
        client,
        input_messages_key="question",
        output_messages_key="answer",
    )
    out = chain.invoke({"question": "q1"}, {"configurable": {"session_id": sid}})
    assert out["sources"] == ["doc-1"]
    assert client.get_history_text(sid).text.endswith("Assistant: a1")


async def test_ainvoke_with_either_client(client: Client, aclient: AsyncClient) -> None:
    sid = new_id()
    model = FakeListChatModel(responses=["a1", "a2"])
    config: Any = {"configurable": {"session_id": sid}}
    native = RunnableWithTurnstoreHistory(PROMPT | model, aclient, input_messages_key="question")
    threaded = RunnableWithTurnstoreHistory(PROMPT | model, client, input_messages_key="question")
    await native.ainvoke({"question": "q1"}, config)
    await threaded.ainvoke({"question": "q2"}, config)
    history = await aclient.get_history(sid, format="messages")
    assert history.messages is not None
    assert [m["content"] for m in history.messages] == ["q1", "a1", "q2", "a2"]

    def explode(_: Any) -> str:
        raise RuntimeError("boom")

    failing = RunnableWithTurnstoreHistory(
        RunnableLambda(explode), aclient, input_messages_key="question"
    )
    with pytest.raises(RuntimeError):
        await failing.ainvoke({"question": "q3"}, config)
    assert (await aclient.get_session(sid)).pending_count == 0
    with pytest.raises(TypeError):
        native.invoke({"question": "sync call on an async client"}, config)


def test_chat_message_history(client: Client) -> None:
    sid = new_id()
    store = TurnstoreChatMessageHistory(client, sid, user_id="bob")
    assert store.messages == []
    store.add_messages([HumanMessage(content="q1"), AIMessage(content="a1")])
    store.add_user_message("q2")
    assert client.get_history(sid).total_turns == 1  # held until answered
    store.add_ai_message("a2")
    assert [(type(m), m.content) for m in store.messages] == [
        (HumanMessage, "q1"),
        (AIMessage, "a1"),
        (HumanMessage, "q2"),
        (AIMessage, "a2"),
    ]
    assert client.get_session(sid).user_id == "bob"
    with pytest.raises(ValueError):
        store.add_messages([AIMessage(content="an answer to nothing")])
    with pytest.raises(ValueError):
        store.add_messages([SystemMessage(content="not a turn")])
    store.clear()
    assert store.messages == []


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_chat_message_history_in_runnable_with_message_history(client: Client) -> None:
    sid = new_id()
    model = FakeListChatModel(responses=["a1", "a2"])

    def history_for(session_id: str) -> BaseChatMessageHistory:
        return TurnstoreChatMessageHistory(client, session_id)

    chain = RunnableWithMessageHistory(
        PROMPT | model,
        history_for,
        input_messages_key="question",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": sid}}
    chain.invoke({"question": "q1"}, config)
    chain.invoke({"question": "q2"}, config)
    history = client.get_history(sid, format="messages")
    assert history.messages is not None
    assert [m["content"] for m in history.messages] == ["q1", "a1", "q2", "a2"]


# --- streaming ---------------------------------------------------------------

ANSWER = "Embed the documents, then index the vectors."


def streaming_model() -> GenericFakeChatModel:
    """A chat model that streams ANSWER word by word (spaces as chunks of their own)."""
    return GenericFakeChatModel(messages=iter([AIMessage(content=ANSWER)]))


class BrokenStreamModel(GenericFakeChatModel):
    """Streams two chunks, then fails."""

    def _stream(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        yield ChatGenerationChunk(message=AIMessageChunk(content="Half "))
        yield ChatGenerationChunk(message=AIMessageChunk(content="an answer"))
        raise RuntimeError("the model went away")


def _stored(client: Client, sid: str) -> List[Tuple[str, str]]:
    turns = client.get_history(sid, format="turns").turns or []
    return [(t.user_query, t.final_answer) for t in turns]


def test_stream_yields_the_models_chunks_as_they_come(client: Client) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(streaming_model(), client)
    config: Any = {"configurable": {"session_id": sid}}
    chunks: List[str] = []
    pending_while_streaming: List[int] = []
    for chunk in chain.stream("How do I build one?", config):
        assert isinstance(chunk, AIMessageChunk), chunk
        chunks.append(message_text(chunk))
        pending_while_streaming.append(client.get_session(sid).pending_count)
        assert _stored(client, sid) == []  # not finalized before the end
    assert len(chunks) > 5
    assert pending_while_streaming == [1] * len(chunks)
    assert "".join(chunks) == ANSWER
    assert _stored(client, sid) == [("How do I build one?", ANSWER)]
    assert client.get_session(sid).pending_count == 0


async def test_astream_yields_the_models_chunks_as_they_come(
    client: Client, aclient: AsyncClient
) -> None:
    for turnstore in (aclient, client):
        sid = new_id()
        chain = RunnableWithTurnstoreHistory(
            PROMPT | streaming_model(),
            turnstore,
            input_messages_key="question",
            history_messages_key="history",
        )
        config: Any = {"configurable": {"session_id": sid}}
        chunks: List[str] = []
        async for chunk in chain.astream({"question": "And with async?"}, config):
            chunks.append(message_text(chunk))
            assert client.get_session(sid).pending_count == 1
        assert len(chunks) > 5 and "".join(chunks) == ANSWER
        assert _stored(client, sid) == [("And with async?", ANSWER)]


def test_stream_with_a_dict_output_records_its_key(client: Client) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(
        streaming_model() | RunnableLambda(lambda text: {"answer": text, "sources": []}),
        client,
        output_messages_key="answer",
    )
    outputs = list(chain.stream("Which key?", {"configurable": {"session_id": sid}}))
    assert outputs and all(isinstance(o, dict) for o in outputs)
    assert _stored(client, sid) == [("Which key?", ANSWER)]


def test_a_stream_that_fails_aborts_the_turn(client: Client) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(BrokenStreamModel(messages=iter([])), client)
    received: List[str] = []
    with pytest.raises(RuntimeError, match="went away"):
        for chunk in chain.stream("Will it fail?", {"configurable": {"session_id": sid}}):
            received.append(message_text(chunk))
    assert received == ["Half ", "an answer"]
    assert client.get_session(sid).pending_count == 0
    assert _stored(client, sid) == []


def test_closing_a_stream_early_aborts_the_turn(client: Client) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(streaming_model(), client)
    stream = chain.stream("Stop halfway?", {"configurable": {"session_id": sid}})
    assert isinstance(stream, types.GeneratorType)
    assert message_text(next(stream)) == "Embed"
    assert client.get_session(sid).pending_count == 1
    stream.close()  # what a for loop's break does to a generator it owns, once dropped
    assert client.get_session(sid).pending_count == 0
    assert _stored(client, sid) == []


async def test_closing_an_astream_early_aborts_the_turn(aclient: AsyncClient) -> None:
    sid = new_id()
    chain = RunnableWithTurnstoreHistory(streaming_model(), aclient)
    stream = chain.astream("Stop halfway?", {"configurable": {"session_id": sid}})
    assert isinstance(stream, types.AsyncGeneratorType)
    assert message_text(await stream.__anext__()) == "Embed"
    assert (await aclient.get_session(sid)).pending_count == 1
    await stream.aclose()
    assert (await aclient.get_session(sid)).pending_count == 0
    assert (await aclient.get_history(sid, format="turns")).turns == []
