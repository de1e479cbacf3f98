"""The AsyncClient: the same operations, awaited, against the real server."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator, List, Optional

import httpx
import pytest
from support import LOSE, REFUSE, AsyncScriptedTransport, Server, new_id, transcript_fixture

from turnstore import (
    AsyncClient,
    ConflictError,
    DroppedReport,
    ExportIncompleteError,
    HistoryOptions,
    NotFoundError,
    SummaryConflictError,
    ValidationError,
)


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


async def test_async_lost_summary_write_with_a_generation(
    server: Server, aclient: AsyncClient
) -> None:
    sid = new_id()
    for n in (1, 2):
        started = await aclient.start_turn(f"q{n}", session_id=sid)
        await aclient.finalize_turn(sid, started.turn_id, f"a{n}")
    generation = (await aclient.get_history(sid)).generation
    transport = AsyncScriptedTransport([LOSE])
    async with AsyncClient(server.url, transport=transport, initial_backoff=0.001) as flaky:
        written = await flaky.put_summary(
            sid, "both", 2, expected_through_seq=0, expected_generation=generation
        )
        assert [r.method for r in transport.requests] == ["PUT", "PUT", "GET"]
        assert written == await aclient.get_summary(sid)
        # The same write, retried after the session was started again: refused.
        await aclient.clear_session(sid)
        for n in (1, 2):
            started = await aclient.start_turn(f"q{n}", session_id=sid)
            await aclient.finalize_turn(sid, started.turn_id, f"a{n}")
        await aclient.put_summary(sid, "both", 2)
        transport.requests.clear()
        transport.script = [LOSE]
        with pytest.raises(SummaryConflictError):
            await flaky.put_summary(
                sid, "both", 2, expected_through_seq=0, expected_generation=generation
            )
        assert [r.method for r in transport.requests] == ["PUT", "PUT", "GET"]


async def test_async_v1_1_operations(aclient: AsyncClient) -> None:
    sid, user = new_id(), new_id("user")
    imported = await aclient.import_messages(
        sid,
        [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
        user_id=user,
        idempotency_key="import-1",
    )
    assert (imported.imported_turns, imported.first_seq, imported.replayed) == (1, 1, False)
    again = await aclient.import_messages(
        sid,
        [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
        user_id=user,
        idempotency_key="import-1",
    )
    assert (again.replayed, again.first_seq) == (True, 1)
    with pytest.raises(ValidationError) as info:
        await aclient.import_messages(sid, [{"role": "tool", "content": "x"}])
    assert [e.field for e in info.value.errors] == ["messages[0].role"]

    # A distilled import (an Anthropic tool loop) reports what it dropped, and replays it.
    loop = transcript_fixture("anthropic_tool_loop.json")
    distilled = await aclient.import_messages(
        new_id(), loop, idempotency_key=f"distill-{sid}", mode="distill"
    )
    assert (distilled.imported_turns, distilled.first_seq, distilled.last_seq) == (2, 1, 2)
    assert distilled.dropped is not None
    assert [d.reason for d in distilled.dropped] == [
        "tool_result",
        "tool_call",
        "thinking",
        "non_text",
        "superseded",
    ]
    assert distilled.dropped[0] == DroppedReport("tool_result", 2, [2, 5])
    replayed = await aclient.import_messages(
        distilled.session_id, loop, idempotency_key=f"distill-{sid}", mode="distill"
    )
    assert (replayed.replayed, replayed.dropped) == (True, distilled.dropped)
    assert imported.dropped is None

    english = HistoryOptions(format="messages", lang="en")
    async with aclient.turn("Wie?", session_id=sid, user_query_en="How?", history=english) as turn:
        assert turn.prompt()[-1] == {"role": "user", "content": "How?"}
        done = await turn.finalize("So.", final_answer_en="Like so.")
    assert (done.seq, done.user_query_en, done.final_answer_en) == (2, "How?", "Like so.")
    started = await aclient.start_turn("Und?", session_id=sid, user_query_en="And?")
    await aclient.finalize_turn(sid, started.turn_id, "Nichts.", final_answer_en="Nothing.")
    text = await aclient.get_history_text(sid, lang="en", limit=1)
    assert text.text.endswith("User: And?\nAssistant: Nothing.")

    generation = (await aclient.get_history(sid)).generation
    assert generation is not None and generation == (await aclient.get_session(sid)).generation
    summary = await aclient.put_summary(
        sid, "q1 was asked", 1, expected_through_seq=0, expected_generation=generation
    )
    assert await aclient.get_summary(sid) == summary
    with pytest.raises(SummaryConflictError):
        await aclient.put_summary(sid, "stale", 2, expected_through_seq=0)
    with pytest.raises(SummaryConflictError) as replaced:
        await aclient.put_summary(
            sid, "q1 q2", 2, expected_through_seq=1, expected_generation="another generation"
        )
    assert "generation" in replaced.value.detail
    history = await aclient.get_history(sid, summary=True, format="turns", limit=1)
    assert history.summary == summary
    assert history.unsummarized is not None
    assert (history.unsummarized.after_seq, history.unsummarized.through_seq) == (1, 2)
    rendered = await aclient.get_history(sid, summary=True, template="markdown", limit=1)
    assert rendered.rendered == (
        "## Conversation summary\n\nq1 was asked\n\n"
        "## Conversation history\n\n**User:** Und?\n\n**Assistant:** Nichts."
    )
    with pytest.raises(NotFoundError) as not_found:
        await aclient.get_history(sid, template="nope")
    assert not_found.value.code == "template_not_found"

    async with aclient.export_user(user) as export:
        sessions = [s async for s in export]
    assert [s.session_id for s in sessions] == [sid]
    assert [t.seq for t in sessions[0].turns] == [1, 2, 3]
    assert sessions[0].summary == summary
    assert [s async for s in aclient.export_user(new_id("user"))] == []

    # As transcripts: the same sessions, their turns as messages.
    async with aclient.export_transcripts(user) as transcripts:
        exported = [t async for t in transcripts]
    assert [t.session_id for t in exported] == [sid]
    assert exported[0].summary == summary
    assert [(m.role, m.content, m.timestamp) for m in exported[0].messages] == [
        (role, text, at)
        for t in sessions[0].turns
        for role, text, at in (
            ("user", t.user_query, t.started_at),
            ("assistant", t.final_answer, t.finalized_at),
        )
    ]
    assert [t async for t in aclient.export_transcripts(new_id("user"))] == []

    # Regenerate: not a turn the summary covers, the newest one.
    first, *_, last = sessions[0].turns
    with pytest.raises(ConflictError) as covered:
        await aclient.regenerate_turn(sid, first.turn_id, "again")
    assert covered.value.code == "turn_summarized"
    redone = await aclient.regenerate_turn(sid, last.turn_id, "Gar nichts.", final_answer_en="-")
    assert (redone.seq, redone.user_query, redone.final_answer, redone.final_answer_en) == (
        last.seq,
        last.user_query,
        "Gar nichts.",
        "-",
    )
    pending = await aclient.start_turn("Noch?", session_id=sid)
    with pytest.raises(ConflictError) as not_yet:
        await aclient.regenerate_turn(sid, pending.turn_id, "Ja.")
    assert not_yet.value.code == "turn_pending"
    with pytest.raises(NotFoundError) as unknown:
        await aclient.regenerate_turn(sid, str(uuid.uuid4()), "Ja.")
    assert unknown.value.code == "turn_not_found"

    await aclient.delete_summary(sid)
    with pytest.raises(NotFoundError):
        await aclient.get_summary(sid)


class _AsyncBody(httpx.AsyncByteStream):
    def __init__(self, chunks: List[bytes], error: Optional[Exception]) -> None:
        self.chunks = chunks
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error


def _async_export_client(chunks: List[bytes], error: Optional[Exception] = None) -> AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_AsyncBody(chunks, error))

    return AsyncClient("http://turnstore.test", transport=httpx.MockTransport(handler))


def _session_line(sid: str) -> bytes:
    at = "2026-11-25T10:15:30.123Z"
    line = {"session_id": sid, "created_at": at, "last_active_at": at, "turns": []}
    return json.dumps(line).encode() + b"\n"


async def test_async_export_cuts_raise() -> None:
    whole = _session_line("s-1") + _session_line("s-2")
    async with _async_export_client([whole[:10], whole[10:], b'{"session_id": "s-3"']) as client:
        received = []
        with pytest.raises(ExportIncompleteError) as info:
            async for session in client.export_user("u-1"):
                received.append(session.session_id)
    assert received == ["s-1", "s-2"] and info.value.sessions == 2

    async with _async_export_client([whole], httpx.RemoteProtocolError("cut")) as client:
        async with client.export_user("u-1") as export:
            assert (await export.__anext__()).session_id == "s-1"
            assert (await export.__anext__()).session_id == "s-2"
            with pytest.raises(ExportIncompleteError) as info:
                await export.__anext__()
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
