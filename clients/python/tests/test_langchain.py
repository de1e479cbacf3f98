"""The LangChain integration, with langchain-core's fake chat models
against the real server."""

from __future__ import annotations

from typing import Any, List

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
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
