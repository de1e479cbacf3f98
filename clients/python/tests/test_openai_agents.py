"""The OpenAI Agents SDK session, with the real SDK's runner and its own
scripted test model (``agents.testing``: no network) against the real server."""

from __future__ import annotations

from typing import Any, List, Tuple, Union

import pytest
from agents import Agent, Runner, TResponseInputItem, function_tool, set_tracing_disabled
from agents.memory import Session
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from support import finished_turn, new_id

from turnstore import AsyncClient, Client, HistoryOptions
from turnstore.openai_agents import TurnstoreSession

set_tracing_disabled(True)


def inputs(model: ScriptedModel) -> List[Union[str, List[TResponseInputItem]]]:
    """The input of each call the model got."""
    return [call.input for call in model.calls]


def texts(items: Union[str, List[TResponseInputItem]]) -> List[Tuple[str, str]]:
    """(role, text) of the message items of a model input."""
    if isinstance(items, str):
        return [("user", items)]
    out: List[Tuple[str, str]] = []
    for item in items:
        role, content = item.get("role"), item.get("content")
        if isinstance(role, str) and isinstance(content, str):
            out.append((role, content))
        elif isinstance(role, str) and isinstance(content, list):
            out.append((role, "".join(str(p.get("text", "")) for p in content)))
    return out


async def stored(aclient: AsyncClient, sid: str) -> List[Tuple[str, str]]:
    turns = (await aclient.get_history(sid, format="turns")).turns or []
    return [(t.user_query, t.final_answer) for t in turns]


def test_it_is_a_session(aclient: AsyncClient) -> None:
    session: Session = TurnstoreSession("s", aclient)
    assert isinstance(session, Session)
    assert session.session_settings is None


async def test_a_run_starts_then_finalizes_and_the_next_gets_the_history(
    aclient: AsyncClient,
) -> None:
    sid = new_id()

    pending: List[int] = []

    def answer(text: str) -> ModelStep:
        async def respond(call: ModelCall) -> Any:
            pending.append((await aclient.get_session(sid)).pending_count)
            return [assistant_message(text)]

        return ModelStep.respond(respond)

    model = ScriptedModel([answer("An index of embeddings."), answer("Embed, then insert.")])
    agent = Agent(name="docs", instructions="Answer from the documents.", model=model)
    session = TurnstoreSession(sid, aclient, user_id="alice")

    first = await Runner.run(agent, "What is a vector index?", session=session)
    second = await Runner.run(agent, "How do I build one?", session=session)

    assert first.final_output == "An index of embeddings."
    assert second.final_output == "Embed, then insert."
    assert pending == [1, 1]  # the turn was pending while the model ran
    assert texts(inputs(model)[1]) == [
        ("user", "What is a vector index?"),
        ("assistant", "An index of embeddings."),
        ("user", "How do I build one?"),
    ]
    assert await stored(aclient, sid) == [
        ("What is a vector index?", "An index of embeddings."),
        ("How do I build one?", "Embed, then insert."),
    ]
    assert (await aclient.get_session(sid)).user_id == "alice"
    assert await session.get_items() == [
        {"role": "user", "content": "What is a vector index?"},
        {"role": "assistant", "content": "An index of embeddings."},
        {"role": "user", "content": "How do I build one?"},
        {"role": "assistant", "content": "Embed, then insert."},
    ]


async def test_tool_calls_and_interim_messages_are_not_stored(aclient: AsyncClient) -> None:
    sid = new_id()

    @function_tool
    def search_docs() -> str:
        """Searches the documents."""
        return "Settings > API keys > Rotate."

    model = ScriptedModel(
        [
            [
                assistant_message("Let me look that up."),
                function_call("search_docs", {}, call_id="c1"),
            ],
            [assistant_message("Open Settings > API keys and choose Rotate.")],
        ]
    )
    agent = Agent(name="docs", model=model, tools=[search_docs])
    session = TurnstoreSession(sid, aclient)
    result = await Runner.run(agent, "How do I rotate an API key?", session=session)
    assert result.final_output == "Open Settings > API keys and choose Rotate."
    assert await stored(aclient, sid) == [
        ("How do I rotate an API key?", "Open Settings > API keys and choose Rotate.")
    ]
    # The second model call saw the tool traffic of its own run, as usual.
    assert any(
        isinstance(i, dict) and i.get("type") == "function_call_output" for i in inputs(model)[1]
    )
    assert len(await session.get_items()) == 2


async def test_a_failed_run_is_aborted_by_the_guard(aclient: AsyncClient) -> None:
    sid = new_id()
    first = await aclient.start_turn("q1", session_id=sid)
    await aclient.finalize_turn(sid, first.turn_id, "a1")
    session = TurnstoreSession(sid, aclient)
    agent = Agent(name="docs", model=ScriptedModel([RuntimeError("the model went away")]))
    with pytest.raises(RuntimeError, match="went away"):
        async with session.guard():
            await Runner.run(agent, "q2", session=session)
    assert (await aclient.get_session(sid)).pending_count == 0
    assert await stored(aclient, sid) == [("q1", "a1")]


async def test_the_guard_aborts_an_answered_turn_when_the_run_then_fails(
    aclient: AsyncClient,
) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, aclient)
    agent = Agent(name="docs", model=ScriptedModel([[assistant_message("a1")]]))
    with pytest.raises(RuntimeError, match="after the run"):
        async with session.guard():
            await Runner.run(agent, "q1", session=session)
            assert await stored(aclient, sid) == [("q1", "a1")]
            raise RuntimeError("after the run: delivering the answer failed")
    assert await stored(aclient, sid) == []
    # Outside a guard nothing is undone, and a later block keeps earlier turns.
    agent = Agent(
        name="docs", model=ScriptedModel([[assistant_message("a2")], RuntimeError("boom")])
    )
    await Runner.run(agent, "q2", session=session)
    with pytest.raises(RuntimeError, match="boom"):
        async with session.guard():
            await Runner.run(agent, "q3", session=session)
    assert await stored(aclient, sid) == [("q2", "a2")]


async def test_an_unguarded_failure_is_aborted_by_the_next_question(
    aclient: AsyncClient,
) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, aclient)
    model = ScriptedModel([RuntimeError("boom"), [assistant_message("a2")]])
    agent = Agent(name="docs", model=model)
    with pytest.raises(RuntimeError):
        await Runner.run(agent, "q1", session=session)
    assert (await aclient.get_session(sid)).pending_count == 1
    await Runner.run(agent, "q2", session=session)
    assert texts(inputs(model)[1]) == [("user", "q2")]  # the failed question is no history
    assert (await aclient.get_session(sid)).pending_count == 0
    assert await stored(aclient, sid) == [("q2", "a2")]


async def test_get_items_is_the_bounded_history(client: Client, aclient: AsyncClient) -> None:
    sid = new_id()
    for n in range(1, 7):
        finished_turn(client, sid, f"question {n} " + "word " * 20, f"answer {n} " + "word " * 20)
    budget = HistoryOptions(max_tokens=150, model="gpt-4o")
    session = TurnstoreSession(sid, aclient, history=budget)
    items = await session.get_items()
    expected = await aclient.get_history(sid, budget, format="messages")
    assert expected.stopped_by == "max_tokens" and 0 < expected.included_turns < 6
    assert [i.get("content") for i in items] == [m["content"] for m in (expected.messages or [])]
    last3 = await session.get_items(limit=3)
    assert [i.get("role") for i in last3] == ["assistant", "user", "assistant"]
    assert str(last3[-1].get("content")).startswith("answer 6")
    assert await session.get_items(limit=0) == []


async def test_pop_item_corrects_the_last_question(aclient: AsyncClient) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, aclient)
    model = ScriptedModel([[assistant_message("4")], [assistant_message("5")]])
    agent = Agent(name="math", model=model)
    await Runner.run(agent, "What's 2 + 2?", session=session)

    assert await session.pop_item() == {"role": "assistant", "content": "4"}
    assert await stored(aclient, sid) == []  # the exchange left whole
    assert await session.pop_item() == {"role": "user", "content": "What's 2 + 2?"}
    assert await session.pop_item() is None

    await Runner.run(agent, "What's 2 + 3?", session=session)
    assert texts(inputs(model)[1]) == [("user", "What's 2 + 3?")]
    assert await stored(aclient, sid) == [("What's 2 + 3?", "5")]

    # A popped answer's question takes a new answer: the exchange is recorded again.
    await session.pop_item()
    await session.add_items([{"role": "assistant", "content": "Five."}])
    assert await stored(aclient, sid) == [("What's 2 + 3?", "Five.")]


async def test_add_items_by_hand(aclient: AsyncClient) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, aclient)
    await session.add_items(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "input_text", "text": "there"}]},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert await stored(aclient, sid) == [("Hi\n\nthere", "Hello!")]
    assert (await aclient.get_session(sid)).pending_count == 1
    assert await session.pop_item() == {"role": "user", "content": "Bye"}
    assert (await aclient.get_session(sid)).pending_count == 0
    with pytest.raises(ValueError, match="without a question"):
        await session.add_items([{"role": "assistant", "content": "an answer to nothing"}])
    await session.clear_session()
    assert await session.get_items() == []


async def test_a_sync_client_works_in_a_thread(client: Client) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, client)
    agent = Agent(
        name="docs", model=ScriptedModel([[assistant_message("a1")], RuntimeError("boom")])
    )
    await Runner.run(agent, "q1", session=session)
    with pytest.raises(RuntimeError):
        async with session.guard():
            await Runner.run(agent, "q2", session=session)
    history = client.get_history(sid, format="turns")
    assert [(t.user_query, t.final_answer) for t in history.turns or []] == [("q1", "a1")]
    assert history.pending_turns == 0


async def test_a_streamed_run(aclient: AsyncClient) -> None:
    sid = new_id()
    session = TurnstoreSession(sid, aclient)
    model = ScriptedModel([[assistant_message("An index of embeddings.")], RuntimeError("boom")])
    agent = Agent(name="docs", model=model)
    async with session.guard():
        result = Runner.run_streamed(agent, "What is a vector index?", session=session)
        deltas = [
            e.data.delta
            async for e in result.stream_events()
            if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"
        ]
    assert "".join(deltas) == "An index of embeddings."
    assert await stored(aclient, sid) == [("What is a vector index?", "An index of embeddings.")]
    with pytest.raises(RuntimeError, match="boom"):
        async with session.guard():
            result = Runner.run_streamed(agent, "And a graph?", session=session)
            async for _ in result.stream_events():
                pass
    assert (await aclient.get_session(sid)).pending_count == 0
    assert await stored(aclient, sid) == [("What is a vector index?", "An index of embeddings.")]
