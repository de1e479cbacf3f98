"""The AsyncClient: the same operations, awaited, against the real server."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from support import LOSE, REFUSE, AsyncScriptedTransport, Server, new_id

from turnstore import AsyncClient, ConflictError, HistoryOptions, NotFoundError


async def test_every_operation(aclient: AsyncClient) -> None:
    sid, user = new_id(), new_id("user")
    started = await aclient.start_turn(
        "q1", session_id=sid, user_id=user, history=HistoryOptions(format="turns")
    )
    assert started.seq == 1 and started.history is not None and started.history.turns == []
    turn = await aclient.finalize_turn(sid, started.turn_id, "a1")
    assert turn.final_answer == "a1"
    with pytest.raises(ConflictError):
        await aclient.finalize_turn(sid, started.turn_id, "other")

    history = await aclient.get_history(sid, format="messages", limit=5, encoding="cl100k_base")
    assert history.messages == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
    ]
    text = await aclient.get_history_text(sid)
    assert text.text.endswith("User: q1\nAssistant: a1") and text.token_count > 0

    pending = await aclient.start_turn("q2", session_id=sid)
    await aclient.abort_turn(sid, pending.turn_id)
    session = await aclient.get_session(sid)
    assert (session.turn_count, session.pending_count, session.user_id) == (1, 0, user)

    page = await aclient.list_user_sessions(user)
    assert [s.session_id for s in page.sessions] == [sid]
    assert [s.session_id async for s in aclient.iter_user_sessions(user, page_size=1)] == [sid]

    erasure = await aclient.erase_user_completely(user)
    assert (erasure.deleted_sessions, erasure.complete) == (1, True)
    with pytest.raises(NotFoundError):
        await aclient.get_session(sid)
    await aclient.clear_session(sid)


async def test_concurrent_starts_get_distinct_seqs(aclient: AsyncClient) -> None:
    sid = new_id()
    started = await asyncio.gather(*(aclient.start_turn(f"q{n}", session_id=sid) for n in range(8)))
    assert sorted(s.seq for s in started) == list(range(1, 9))


async def test_async_turn_helper(aclient: AsyncClient) -> None:
    sid = new_id()
    async with aclient.turn("q1", session_id=sid) as turn:
        assert turn.prompt() == [{"role": "user", "content": "q1"}]
        await turn.finalize("a1")
    with pytest.raises(KeyError):
        async with aclient.turn("q2", session_id=sid) as turn:
            assert turn.history is not None and turn.history.total_turns == 1
            raise KeyError("retrieval failed")
    history = await aclient.get_history(sid)
    assert (history.total_turns, history.pending_turns) == (1, 0)


async def test_async_retries(server: Server) -> None:
    transport = AsyncScriptedTransport([LOSE])
    async with AsyncClient(server.url, transport=transport, initial_backoff=0.001) as client:
        sid = new_id()
        started = await client.start_turn("q", session_id=sid)
        assert started.replayed and started.seq == 1
        assert (await client.get_session(sid)).pending_count == 1

        transport.script = [LOSE]
        await client.abort_turn(sid, started.turn_id)
        assert (await client.get_session(sid)).pending_count == 0

        transport.script = [REFUSE]
        with pytest.raises(NotFoundError):
            await client.abort_turn(sid, str(uuid.uuid4()))
