"""start_turn, finalize_turn and abort_turn against the real server."""

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
