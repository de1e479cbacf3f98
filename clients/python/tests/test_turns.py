"""start_turn, finalize_turn, regenerate_turn and abort_turn against the real server."""

from __future__ import annotations

import uuid
from datetime import timezone

import pytest
from support import finished_turn, new_id

from turnstore import (
    Client,
    ConflictError,
    ForbiddenError,
    HistoryOptions,
    NotFoundError,
    PayloadTooLargeError,
    SummaryConflictError,
    ValidationError,
)


def test_start_without_session_id_makes_a_uuid4_session(client: Client) -> None:
    started = client.start_turn("What is a vector index?")
    assert uuid.UUID(started.session_id).version == 4
    assert uuid.UUID(started.turn_id).version == 7
    assert started.seq == 1
    assert started.user_id is None
    assert started.history is None
    assert started.replayed is False
    assert started.started_at.tzinfo is not None
    assert started.started_at.utcoffset() == timezone.utc.utcoffset(None)
    assert client.get_session(started.session_id).pending_count == 1


def test_start_returns_the_history_before_the_turn(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    started = client.start_turn(
        "q2", session_id=sid, user_id="alice", history=HistoryOptions(format="messages")
    )
    assert started.seq == 2
    assert started.user_id == "alice"
    assert started.history is not None
    assert started.history.format == "messages"
    assert started.history.messages == [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
    ]
    assert started.history.total_turns == 1


def test_seqs_follow_start_order_and_history_follows_seq(client: Client) -> None:
    sid = new_id()
    first = client.start_turn("first", session_id=sid)
    second = client.start_turn("second", session_id=sid)
    assert (first.seq, second.seq) == (1, 2)
    client.finalize_turn(sid, second.turn_id, "answer 2")
    client.finalize_turn(sid, first.turn_id, "answer 1")
    turns = client.get_history(sid, format="turns").turns
    assert turns is not None
    assert [t.seq for t in turns] == [1, 2]
    assert [t.final_answer for t in turns] == ["answer 1", "answer 2"]


def test_finalize_returns_the_turn_and_is_safe_to_repeat(client: Client) -> None:
    sid = new_id()
    started = client.start_turn("q", session_id=sid)
    turn = client.finalize_turn(sid, started.turn_id, "a")
    assert (turn.turn_id, turn.seq, turn.user_query, turn.final_answer) == (
        started.turn_id,
        1,
        "q",
        "a",
    )
    assert turn.truncated is False
    assert turn.finalized_at >= turn.started_at
    assert client.finalize_turn(sid, started.turn_id, "a") == turn


def test_finalize_with_another_answer_is_a_conflict(client: Client) -> None:
    sid = new_id()
    started = client.start_turn("q", session_id=sid)
    client.finalize_turn(sid, started.turn_id, "a")
    with pytest.raises(ConflictError) as info:
        client.finalize_turn(sid, started.turn_id, "b")
    assert info.value.status == 409
    assert info.value.code == "turn_already_finalized"


def test_abort_removes_pending_and_finalized_turns(client: Client) -> None:
    sid = new_id()
    done = client.start_turn("kept then deleted", session_id=sid)
    client.finalize_turn(sid, done.turn_id, "a")
    pending = client.start_turn("failed", session_id=sid)
    client.abort_turn(sid, pending.turn_id)
    session = client.get_session(sid)
    assert (session.turn_count, session.pending_count) == (1, 0)
    client.abort_turn(sid, done.turn_id)
    assert client.get_history(sid).total_turns == 0
    with pytest.raises(NotFoundError) as info:
        client.finalize_turn(sid, pending.turn_id, "too late")
    assert info.value.code == "turn_not_found"


def test_abort_of_an_unknown_turn_is_not_found(client: Client) -> None:
    sid = new_id()
    client.start_turn("q", session_id=sid)
    with pytest.raises(NotFoundError) as info:
        client.abort_turn(sid, str(uuid.uuid4()))
    assert info.value.code == "turn_not_found"


def test_a_session_belongs_to_its_first_user(client: Client) -> None:
    sid = new_id()
    client.start_turn("q", session_id=sid, user_id="alice")
    with pytest.raises(ForbiddenError) as info:
        client.start_turn("q", session_id=sid, user_id="mallory")
    assert info.value.code == "session_owner_mismatch"
    assert client.get_session(sid).pending_count == 1


def test_an_explicit_idempotency_key_replays_the_start(client: Client) -> None:
    sid, key = new_id(), new_id("key")
    first = client.start_turn("q", session_id=sid, idempotency_key=key)
    again = client.start_turn("q", session_id=sid, idempotency_key=key)
    assert (again.turn_id, again.seq, again.replayed) == (first.turn_id, first.seq, True)
    assert first.replayed is False
    with pytest.raises(ValidationError) as info:
        client.start_turn("another question", session_id=sid, idempotency_key=key)
    assert info.value.code == "idempotency_key_reused"
    assert client.get_session(sid).pending_count == 1


# --- regenerate ----------------------------------------------------------------


def test_regenerate_replaces_an_answer_in_place(client: Client) -> None:
    sid = new_id()
    for n in (1, 2, 3):
        finished_turn(client, sid, f"q{n}", f"a{n}")
    before = client.get_history(sid, format="turns").turns
    assert before is not None
    old = before[1]
    turn = client.regenerate_turn(sid, old.turn_id, "b2")
    assert (turn.turn_id, turn.seq, turn.user_query, turn.started_at) == (
        old.turn_id,
        2,
        "q2",
        old.started_at,
    )
    assert turn.final_answer == "b2" and turn.finalized_at >= old.finalized_at
    # The newest turn too; the same answer again is the same answer.
    newest = client.regenerate_turn(sid, before[2].turn_id, "b3")
    again = client.regenerate_turn(sid, before[2].turn_id, "b3")
    assert (again.seq, again.final_answer) == (newest.seq, "b3")
    turns = client.get_history(sid, format="turns").turns
    assert turns is not None
    assert [(t.seq, t.final_answer) for t in turns] == [(1, "a1"), (2, "b2"), (3, "b3")]
    assert turns[1] == turn
    assert client.get_session(sid).turn_count == 3
    # The session goes on after the regenerated turns.
    assert client.start_turn("q4", session_id=sid).seq == 4


def test_regenerate_keeps_the_questions_english_copy_only(client: Client) -> None:
    sid = new_id()
    started = client.start_turn("Was ist das?", session_id=sid, user_query_en="What is it?")
    client.finalize_turn(sid, started.turn_id, "Ein Baum.", final_answer_en="A tree.")
    plain = client.regenerate_turn(sid, started.turn_id, "Ein Graph.")
    assert (plain.user_query_en, plain.final_answer_en) == ("What is it?", None)
    copied = client.regenerate_turn(
        sid, started.turn_id, "Eine Liste.", final_answer_en="A list."
    )
    assert (copied.user_query_en, copied.final_answer_en) == ("What is it?", "A list.")
    text = client.get_history_text(sid, lang="en").text
    assert text.endswith("User: What is it?\nAssistant: A list.")


def test_regenerate_refuses_summarized_pending_and_unknown_turns(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    finished_turn(client, sid, "q2", "a2")
    turns = client.get_history(sid, format="turns").turns
    assert turns is not None
    first, second = (t.turn_id for t in turns)
    client.put_summary(sid, "q1 was asked", 1)

    with pytest.raises(ConflictError) as info:
        client.regenerate_turn(sid, first, "b1")
    error = info.value
    assert (error.status, error.code) == (409, "turn_summarized")
    assert not isinstance(error, SummaryConflictError)
    assert "through seq 1" in error.detail and error.request_id
    pending = client.start_turn("q3", session_id=sid)
    with pytest.raises(ConflictError) as info:
        client.regenerate_turn(sid, pending.turn_id, "b3")
    assert (info.value.status, info.value.code) == (409, "turn_pending")
    with pytest.raises(NotFoundError) as missing:
        client.regenerate_turn(sid, str(uuid.uuid4()), "b")
    assert (missing.value.status, missing.value.code) == (404, "turn_not_found")
    with pytest.raises(NotFoundError):
        client.regenerate_turn(new_id(), second, "b")
    with pytest.raises(ValidationError) as invalid:
        client.regenerate_turn(sid, second, "   ")
    assert [e.field for e in invalid.value.errors] == ["final_answer"]
    with pytest.raises(PayloadTooLargeError):
        client.regenerate_turn(sid, second, "x" * 200_000)
    # Nothing changed; without the summary, the first turn may change too.
    assert [t.final_answer for t in client.get_history(sid, format="turns").turns or []] == [
        "a1",
        "a2",
    ]
    client.delete_summary(sid)
    assert client.regenerate_turn(sid, first, "b1").final_answer == "b1"
    assert client.regenerate_turn(sid, second, "b2").final_answer == "b2"
