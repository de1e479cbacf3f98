"""The ``with client.turn(...)`` helper: start, finalize, abort on failure."""

from __future__ import annotations

import logging

import pytest
from support import finished_turn, new_id

from turnstore import Client, HistoryOptions


class PipelineFailed(Exception):
    pass


def test_the_history_arrives_before_generation(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "What is a vector index?", "An index of embeddings.")
    with client.turn("How do I build one?", session_id=sid, user_id="alice") as turn:
        assert turn.seq == 2
        assert turn.history is not None and turn.history.format == "messages"
        assert client.get_session(sid).pending_count == 1
        assert turn.prompt(system="Be brief.") == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is a vector index?"},
            {"role": "assistant", "content": "An index of embeddings."},
            {"role": "user", "content": "How do I build one?"},
        ]
        result = turn.finalize("Embed, then insert.")
    assert turn.result == result and result.seq == 2
    history = client.get_history(sid)
    assert history.total_turns == 2 and history.pending_turns == 0


def test_an_exception_aborts_the_turn_and_propagates(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    with pytest.raises(PipelineFailed):
        with client.turn("q2", session_id=sid) as turn:
            assert client.get_history(sid).pending_turns == 1
            raise PipelineFailed("the LLM timed out")
    assert turn.aborted
    history = client.get_history(sid)
    assert (history.total_turns, history.pending_turns) == (1, 0)


def test_a_failed_finalize_aborts_too(client: Client) -> None:
    sid = new_id()
    with pytest.raises(Exception) as info:
        with client.turn("q", session_id=sid) as turn:
            turn.finalize("")  # empty answers are rejected (422)
    assert getattr(info.value, "status", None) == 422
    assert client.get_session(sid).pending_count == 0


def test_leaving_without_finalize_aborts_with_a_warning(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    sid = new_id()
    with caplog.at_level(logging.WARNING, logger="turnstore"):
        with client.turn("q", session_id=sid) as turn:
            pass
    assert turn.aborted and turn.result is None
    assert "without finalize()" in caplog.text
    assert client.get_session(sid).pending_count == 0


def test_an_explicit_abort_is_quiet(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    sid = new_id()
    with caplog.at_level(logging.WARNING, logger="turnstore"):
        with client.turn("q", session_id=sid) as turn:
            turn.abort()
            with pytest.raises(RuntimeError):
                turn.finalize("too late")
    assert caplog.text == ""
    assert client.get_session(sid).pending_count == 0


def test_a_failing_abort_does_not_hide_the_original_error(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    sid = new_id()
    with caplog.at_level(logging.WARNING, logger="turnstore"):
        with pytest.raises(PipelineFailed):
            with client.turn("q", session_id=sid):
                client.clear_session(sid)  # the abort will find no turn
                raise PipelineFailed()
    assert "could not abort" in caplog.text


def test_history_options_and_no_history(client: Client) -> None:
    sid = new_id()
    for n in range(3):
        finished_turn(client, sid, f"q{n}", f"a{n}")
    with client.turn("next", session_id=sid, history=HistoryOptions(limit=1)) as turn:
        assert turn.history is not None and turn.history.included_turns == 1
        assert turn.history.format == "text"
        turn.finalize("a")
    with client.turn("last", session_id=sid, history=None) as turn:
        assert turn.history is None
        assert turn.prompt() == [{"role": "user", "content": "last"}]
        turn.finalize("a")


def test_a_turn_is_started_only_inside_its_block(client: Client) -> None:
    turn = client.turn("q", session_id=new_id())
    with pytest.raises(RuntimeError, match="entered"):
        _ = turn.session_id
