"""The LangGraph hooks, in real graphs with fake chat models, against the real server."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import pytest
from langchain_core.language_models import FakeListChatModel, LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.managed import RemainingSteps
from langgraph.types import Command, interrupt
from support import finished_turn, new_id
from typing_extensions import NotRequired

from turnstore import AsyncClient, Client, HistoryOptions
from turnstore.langgraph import TURN_KEY, TurnstoreHooks, TurnstoreState


def stored(client: Client, sid: str) -> List[Tuple[str, str]]:
    turns = client.get_history(sid, format="turns").turns or []
    return [(t.user_query, t.final_answer) for t in turns]


class Model:
    """A model node around a fake chat model: records each prompt, and how
    many turns of the session were pending then."""

    def __init__(self, client: Client, session_id: str, *answers: str) -> None:
        self.llm = FakeListChatModel(responses=list(answers))
        self.client = client
        self.session_id = session_id
        self.prompts: List[List[BaseMessage]] = []
        self.pending: List[int] = []

    def __call__(self, state: TurnstoreState) -> Dict[str, Any]:
        self.prompts.append(list(state["messages"]))
        self.pending.append(self.client.get_session(self.session_id).pending_count)
        return {"messages": [self.llm.invoke(state["messages"])]}


def build(hooks: TurnstoreHooks, model: Any, checkpointer: Any = None) -> Any:
    builder = StateGraph(TurnstoreState)
    builder.add_node("history", hooks.pre_model_hook)
    builder.add_node("model", model)
    builder.add_node("finalize", hooks.post_model_hook)
    builder.add_edge(START, "history")
    builder.add_edge("history", "model")
    builder.add_edge("model", "finalize")
    builder.add_edge("finalize", END)
    return hooks.guard(builder.compile(checkpointer=checkpointer))


def test_the_hooks_start_inject_and_finalize(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "What is a vector index?", "An index of embeddings.")
    model = Model(client, sid, "Embed, then insert.")
    hooks = TurnstoreHooks(client, history=HistoryOptions(max_tokens=1000, model="gpt-4o"))
    graph = build(hooks, model)
    config: Any = {"configurable": {"session_id": sid, "user_id": "alice"}}
    out = graph.invoke(
        {"messages": [SystemMessage("Answer briefly."), HumanMessage("How do I build one?")]},
        config,
    )
    assert model.pending == [1]  # the turn was started before the model ran
    assert [(m.type, m.content) for m in model.prompts[0]] == [
        ("system", "Answer briefly."),
        ("human", "What is a vector index?"),
        ("ai", "An index of embeddings."),
        ("human", "How do I build one?"),
    ]
    assert out["messages"][-1].content == "Embed, then insert."
    assert out.get(TURN_KEY) is None
    assert stored(client, sid) == [
        ("What is a vector index?", "An index of embeddings."),
        ("How do I build one?", "Embed, then insert."),
    ]
    assert client.get_session(sid).user_id == "alice"


def test_the_budget_is_turnstores(client: Client) -> None:
    sid = new_id()
    for n in range(1, 7):
        finished_turn(client, sid, f"question {n} " + "word " * 20, f"answer {n} " + "word " * 20)
    budget = HistoryOptions(max_tokens=150, model="gpt-4o")
    model = Model(client, sid, "a7")
    graph = build(TurnstoreHooks(client, history=budget), model)
    graph.invoke({"messages": [HumanMessage("q7")]}, {"configurable": {"session_id": sid}})
    expected = client.get_history(sid, budget, format="messages", through_seq=6)
    assert expected.stopped_by == "max_tokens"
    assert [m.content for m in model.prompts[0][:-1]] == [
        m["content"] for m in expected.messages or []
    ]


def test_a_graph_that_raises_aborts_its_turn(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")

    def broken(state: TurnstoreState) -> Dict[str, Any]:
        raise RuntimeError("the model went away")

    graph = build(TurnstoreHooks(client), broken)
    with pytest.raises(RuntimeError, match="went away"):
        graph.invoke({"messages": [HumanMessage("q2")]}, {"configurable": {"session_id": sid}})
    assert client.get_session(sid).pending_count == 0
    assert stored(client, sid) == [("q1", "a1")]


def test_a_stream_closed_early_aborts_its_turn(client: Client) -> None:
    sid = new_id()
    graph = build(TurnstoreHooks(client), Model(client, sid, "a1"))
    stream = graph.stream({"messages": [HumanMessage("q1")]}, {"configurable": {"session_id": sid}})
    first = next(stream)
    assert "history" in first
    assert client.get_session(sid).pending_count == 1
    stream.close()
    assert client.get_session(sid).pending_count == 0
    assert stored(client, sid) == []
    # Streamed to the end, the turn is finalized.
    updates = list(
        graph.stream({"messages": [HumanMessage("q2")]}, {"configurable": {"session_id": sid}})
    )
    assert [next(iter(u)) for u in updates] == ["history", "model", "finalize"]
    assert stored(client, sid) == [("q2", "a1")]


async def test_async_graphs_with_either_client(client: Client, aclient: AsyncClient) -> None:
    for turnstore in (aclient, client):
        sid = new_id()
        finished_turn(client, sid, "q1", "a1")
        model = Model(client, sid, "a2")
        graph = build(TurnstoreHooks(turnstore), model)
        config: Any = {"configurable": {"session_id": sid}}
        await graph.ainvoke({"messages": [HumanMessage("q2")]}, config)
        assert [m.content for m in model.prompts[0]] == ["q1", "a1", "q2"]
        assert stored(client, sid) == [("q1", "a1"), ("q2", "a2")]

        def broken(state: TurnstoreState) -> Dict[str, Any]:
            raise RuntimeError("boom")

        failing = build(TurnstoreHooks(turnstore), broken)
        with pytest.raises(RuntimeError):
            async for _ in failing.astream({"messages": [HumanMessage("q3")]}, config):
                pass
        assert client.get_session(sid).pending_count == 0
        assert stored(client, sid) == [("q1", "a1"), ("q2", "a2")]

    with pytest.raises(TypeError, match="AsyncClient"):
        build(TurnstoreHooks(aclient), Model(client, "x", "a")).invoke(
            {"messages": [HumanMessage("q")]}, {"configurable": {"session_id": new_id()}}
        )


def test_a_checkpointed_thread_gets_turnstores_history_each_time(client: Client) -> None:
    sid = new_id()
    model = Model(client, sid, "a1", "a2")
    graph = build(TurnstoreHooks(client, history=HistoryOptions(limit=1)), model, InMemorySaver())
    config: Any = {"configurable": {"session_id": sid, "thread_id": sid}}
    graph.invoke({"messages": [HumanMessage("q1")]}, config)
    out = graph.invoke({"messages": [HumanMessage("q2")]}, config)
    # The thread's own messages are replaced by turnstore's (bounded) history.
    assert [m.content for m in model.prompts[1]] == ["q1", "a1", "q2"]
    assert [m.content for m in out["messages"]] == ["q1", "a1", "q2", "a2"]
    graph.invoke({"messages": [HumanMessage("q3")]}, config)
    assert [m.content for m in model.prompts[2]] == ["q2", "a2", "q3"]  # limit=1


def test_an_interrupted_run_keeps_its_turn_for_the_resumed_one(client: Client) -> None:
    sid = new_id()
    model = Model(client, sid, "a1")

    def approve(state: TurnstoreState) -> Dict[str, Any]:
        interrupt("approve the answer?")
        return {}

    hooks = TurnstoreHooks(client)
    builder = StateGraph(TurnstoreState)
    builder.add_node("history", hooks.pre_model_hook)
    builder.add_node("model", model)
    builder.add_node("approve", approve)
    builder.add_node("finalize", hooks.post_model_hook)
    builder.add_edge(START, "history")
    builder.add_edge("history", "model")
    builder.add_edge("model", "approve")
    builder.add_edge("approve", "finalize")
    builder.add_edge("finalize", END)
    graph = hooks.guard(builder.compile(checkpointer=InMemorySaver()))
    config: Any = {"configurable": {"session_id": sid, "thread_id": sid}}
    paused = graph.invoke({"messages": [HumanMessage("q1")]}, config)
    assert "__interrupt__" in paused
    assert client.get_session(sid).pending_count == 1
    graph.invoke(Command(resume=True), config)
    assert stored(client, sid) == [("q1", "a1")]


class ReactState(TurnstoreState, total=False):
    """What create_react_agent keeps, and the turn under way."""

    remaining_steps: NotRequired[RemainingSteps]


class ToolCallingModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (it answers from its script)."""

    def bind_tools(
        self,
        tools: Sequence[Union[Dict[str, Any], type, Callable[..., Any], BaseTool]],
        *,
        tool_choice: Optional[str] = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_the_hooks_of_create_react_agent(client: Client) -> None:
    from langgraph.prebuilt import create_react_agent

    sid = new_id()
    finished_turn(client, sid, "q1", "a1")

    @tool
    def search_docs(query: str) -> str:
        """Searches the documents."""
        return "Settings > API keys > Rotate."

    tools: List[BaseTool] = [search_docs]
    llm = ToolCallingModel(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[{"name": "search_docs", "args": {"query": "rotate"}, "id": "c1"}],
                ),
                AIMessage("Open Settings > API keys and choose Rotate."),
            ]
        )
    )
    hooks = TurnstoreHooks(client)
    agent = hooks.guard(
        create_react_agent(
            llm,
            tools,
            pre_model_hook=hooks.pre_model_hook,
            post_model_hook=hooks.post_model_hook,
            state_schema=ReactState,
        )
    )
    out = agent.invoke(
        {"messages": [HumanMessage("How do I rotate an API key?")]},
        {"configurable": {"session_id": sid}},
    )
    assert [m.type for m in out["messages"]] == ["human", "ai", "human", "ai", "tool", "ai"]
    assert stored(client, sid) == [
        ("q1", "a1"),
        ("How do I rotate an API key?", "Open Settings > API keys and choose Rotate."),
    ]


def test_guard_wants_the_turn_key(client: Client) -> None:
    builder = StateGraph(MessagesState)
    hooks = TurnstoreHooks(client)
    builder.add_node("history", hooks.pre_model_hook)
    builder.add_edge(START, "history")
    builder.add_edge("history", END)
    with pytest.raises(ValueError, match=TURN_KEY):
        hooks.guard(builder.compile())


def test_the_session_id_is_required(client: Client) -> None:
    graph = build(TurnstoreHooks(client), Model(client, "x", "a"))
    with pytest.raises(ValueError, match="session_id"):
        graph.invoke({"messages": [HumanMessage("q")]})
