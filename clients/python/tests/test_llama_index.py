"""The LlamaIndex memory and chat store, with LlamaIndex's own engines, agents
and mock LLMs (no network) against the real server."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import BaseMemory, ChatMemoryBuffer
from llama_index.core.storage.chat_store.base import BaseChatStore
from llama_index.core.tools import FunctionTool
from support import finished_turn, new_id

from turnstore import AsyncClient, Client, HistoryOptions
from turnstore.llama_index import TurnstoreChatStore, TurnstoreMemory

# LlamaIndex's workflows inspect their agents' attributes, which makes
# pydantic warn about its deprecated ones (not ours).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:inspect")


def stored(client: Client, sid: str) -> List[Tuple[str, str]]:
    turns = client.get_history(sid, format="turns").turns or []
    return [(t.user_query, t.final_answer) for t in turns]


def pairs(messages: Sequence[ChatMessage]) -> List[Tuple[str, str]]:
    return [(m.role.value, m.content or "") for m in messages]


def echo_llm() -> MockLLM:
    return MockLLM(messages_to_prompt=lambda ms: f"You asked: {ms[-1].content}")


class BrokenLLM(MockLLM):
    """A model that fails."""

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise RuntimeError("the model went away")


# --- the memory --------------------------------------------------------------


def test_a_chat_engine_with_the_memory(client: Client) -> None:
    sid = new_id()
    memory = TurnstoreMemory(client, sid, user_id="alice")
    engine = SimpleChatEngine.from_defaults(llm=echo_llm(), memory=memory)
    assert str(engine.chat("What is a vector index?")) == "You asked: What is a vector index?"
    memory.put(ChatMessage(role=MessageRole.USER, content="How do I build one?"))
    assert client.get_session(sid).pending_count == 1  # started with the question
    assert pairs(memory.get()) == [
        ("user", "What is a vector index?"),
        ("assistant", "You asked: What is a vector index?"),
        ("user", "How do I build one?"),
    ]
    memory.put(ChatMessage(role=MessageRole.ASSISTANT, content="Embed, then insert."))
    assert stored(client, sid) == [
        ("What is a vector index?", "You asked: What is a vector index?"),
        ("How do I build one?", "Embed, then insert."),
    ]
    assert client.get_session(sid).user_id == "alice"
    memory.reset()
    assert memory.get_all() == []


def test_the_memory_asks_turnstore_for_the_budget(client: Client) -> None:
    sid = new_id()
    for n in range(1, 7):
        finished_turn(client, sid, f"question {n} " + "word " * 20, f"answer {n} " + "word " * 20)
    budget = HistoryOptions(max_tokens=150, model="gpt-4o")
    memory = TurnstoreMemory(client, sid, history=budget)
    expected = client.get_history(sid, budget, format="messages")
    assert expected.stopped_by == "max_tokens" and 0 < expected.included_turns < 6
    assert [m.content for m in memory.get()] == [m["content"] for m in expected.messages or []]
    # The start returns the same bounded history (one round trip), then the question.
    memory.put(ChatMessage(role=MessageRole.USER, content="question 7"))
    got = memory.get()
    assert [m.content for m in got[:-1]] == [m["content"] for m in expected.messages or []]
    assert got[-1].content == "question 7"
    assert len(memory.get_all()) == 13  # all six turns and the question


def test_a_failed_chat_is_aborted_by_the_guard(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    memory = TurnstoreMemory(client, sid)
    engine = SimpleChatEngine.from_defaults(llm=BrokenLLM(max_tokens=None), memory=memory)
    with pytest.raises(RuntimeError, match="went away"):
        with memory.guard():
            engine.chat("q2")
    assert client.get_session(sid).pending_count == 0
    assert stored(client, sid) == [("q1", "a1")]
    # Unguarded, the failed question is aborted by the next one.
    with pytest.raises(RuntimeError):
        engine.chat("q3")
    assert client.get_session(sid).pending_count == 1
    SimpleChatEngine.from_defaults(llm=echo_llm(), memory=memory).chat("q4")
    assert client.get_session(sid).pending_count == 0
    assert stored(client, sid) == [("q1", "a1"), ("q4", "You asked: q4")]


def search_docs(query: str) -> str:
    """Searches the documents."""
    return "Settings > API keys > Rotate."


def scripted_agent_llm(final: str) -> MockFunctionCallingLLM:
    """Calls search_docs first, then answers ``final``."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        if any(m.role == MessageRole.TOOL for m in messages[-2:]):
            return ChatMessage(role=MessageRole.ASSISTANT, content=final)
        call = ToolCallBlock(
            tool_call_id="call_1", tool_name="search_docs", tool_kwargs={"query": "rotate"}
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    return MockFunctionCallingLLM(response_generator=respond)


async def test_a_function_agent_with_the_memory(client: Client, aclient: AsyncClient) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    memory = TurnstoreMemory(aclient, sid, history=HistoryOptions(max_tokens=1000))
    answer = "Open Settings > API keys and choose Rotate."
    agent = FunctionAgent(
        llm=scripted_agent_llm(answer),
        tools=[FunctionTool.from_defaults(search_docs)],
        system_prompt="Answer from the documents.",
    )
    async with memory.guard():
        response = await agent.run("How do I rotate an API key?", memory=memory)
    assert str(response) == answer
    assert stored(client, sid) == [("q1", "a1"), ("How do I rotate an API key?", answer)]
    assert pairs(await memory.aget()) == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "How do I rotate an API key?"),
        ("assistant", answer),
    ]


async def test_a_failed_agent_run_is_aborted(client: Client, aclient: AsyncClient) -> None:
    sid = new_id()
    memory = TurnstoreMemory(aclient, sid)

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        raise RuntimeError("the model went away")

    agent = FunctionAgent(llm=MockFunctionCallingLLM(response_generator=respond), tools=[])
    with pytest.raises(Exception, match="went away"):
        async with memory.guard():
            await agent.run("q1", memory=memory)
    assert client.get_session(sid).pending_count == 0
    assert stored(client, sid) == []


def test_set_replaces_the_session(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "old", "gone")
    memory = TurnstoreMemory.from_defaults(
        [
            ChatMessage(role=MessageRole.SYSTEM, content="Be brief."),
            ChatMessage(role=MessageRole.USER, content="q1"),
            ChatMessage(role=MessageRole.ASSISTANT, content="a1"),
            ChatMessage(role=MessageRole.USER, content="q2"),
        ],
        client=client,
        session_id=sid,
    )
    assert stored(client, sid) == [("q1", "a1")]
    assert client.get_session(sid).pending_count == 1
    assert pairs(memory.get()) == [("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    assert isinstance(memory, BaseMemory)
    with pytest.raises(TypeError):
        TurnstoreMemory.from_defaults()


# --- the chat store ----------------------------------------------------------


def user(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


def test_the_chat_store_maps_to_turns(client: Client) -> None:
    sid = new_id()
    store = TurnstoreChatStore(client)
    assert isinstance(store, BaseChatStore)
    assert store.get_messages(sid) == []
    store.add_message(sid, user("q1"))
    assert client.get_session(sid).pending_count == 1
    assert pairs(store.get_messages(sid)) == [("user", "q1")]
    store.add_message(sid, assistant("a1"))
    store.add_message(sid, user("q2"))
    store.add_message(sid, assistant("a2"))
    assert stored(client, sid) == [("q1", "a1"), ("q2", "a2")]

    with pytest.raises(ValueError, match="system"):
        store.add_message(sid, ChatMessage(role=MessageRole.SYSTEM, content="Be brief."))
    with pytest.raises(ValueError, match="without a question"):
        store.add_message(new_id(), assistant("an answer to nothing"))
    with pytest.raises(NotImplementedError, match="half"):
        store.delete_message(sid, 0)
    assert store.delete_message(sid, 10) is None

    # The last answer leaves with its exchange; its question stays, to delete or answer anew.
    popped = store.delete_last_message(sid)
    assert popped is not None and pairs([popped]) == [("assistant", "a2")]
    assert stored(client, sid) == [("q1", "a1")]
    assert pairs(store.get_messages(sid)) == [("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    store.add_message(sid, assistant("a2, again"))
    assert stored(client, sid) == [("q1", "a1"), ("q2", "a2, again")]
    deleted = store.delete_message(sid, 3)
    assert deleted is not None and deleted.content == "a2, again"
    popped = store.delete_last_message(sid)
    assert popped is not None and pairs([popped]) == [("user", "q2")]
    assert pairs(store.get_messages(sid)) == [("user", "q1"), ("assistant", "a1")]

    store.set_messages(sid, [user("x1"), assistant("y1"), user("x2")])
    assert stored(client, sid) == [("x1", "y1")]
    assert pairs(store.get_messages(sid)) == [("user", "x1"), ("assistant", "y1"), ("user", "x2")]
    with pytest.raises(ValueError, match="alternate"):
        store.set_messages(sid, [user("x1"), user("x2")])
    assert stored(client, sid) == [("x1", "y1")]  # nothing written

    deleted_all = store.delete_messages(sid)
    assert deleted_all is not None and len(deleted_all) == 3
    assert store.get_messages(sid) == []
    assert client.get_history(sid).pending_turns == 0

    with pytest.raises(NotImplementedError, match="user_id"):
        store.get_keys()


async def test_the_chat_store_async_and_its_keys(client: Client, aclient: AsyncClient) -> None:
    owner = new_id("user")
    store = TurnstoreChatStore(aclient, user_id=owner)
    first, second = new_id(), new_id()
    for sid in (first, second):
        await store.async_add_message(sid, user("q"))
        await store.async_add_message(sid, assistant("a"))
    assert sorted(await store.aget_keys()) == sorted([first, second])
    assert pairs(await store.aget_messages(first)) == [("user", "q"), ("assistant", "a")]
    await store.aset_messages(first, [user("q1"), assistant("a1")])
    assert stored(client, first) == [("q1", "a1")]
    assert client.get_session(first).user_id == owner
    popped = await store.adelete_last_message(second)
    assert popped is not None and popped.content == "a"
    assert await store.adelete_messages(second) is not None
    with pytest.raises(TypeError, match="AsyncClient"):
        store.get_messages(first)


def test_a_chat_memory_buffer_over_the_store(client: Client) -> None:
    sid = new_id()
    store = TurnstoreChatStore(client)
    memory = ChatMemoryBuffer.from_defaults(chat_store=store, chat_store_key=sid)
    engine = SimpleChatEngine.from_defaults(llm=echo_llm(), memory=memory)
    engine.chat("q1")
    engine.chat("q2")
    assert stored(client, sid) == [("q1", "You asked: q1"), ("q2", "You asked: q2")]
    failing = SimpleChatEngine.from_defaults(llm=BrokenLLM(max_tokens=None), memory=memory)
    with pytest.raises(RuntimeError):
        with store.guard(sid):
            failing.chat("q3")
    assert client.get_session(sid).pending_count == 0
    assert len(stored(client, sid)) == 2
