"""Rolling summaries: put/get/delete, compare-and-set, ``summary=True``
reads in every format, and ``unsummarized``."""

from __future__ import annotations

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


@pytest.fixture
def session(client: Client) -> str:
    """Five finalized turns, no summary."""
    sid = new_id()
    for n in range(1, 6):
        finished_turn(client, sid, f"question {n}", f"answer {n}")
    return sid


def test_put_get_and_delete(client: Client, session: str) -> None:
    written = client.put_summary(session, "Questions 1 and 2 were asked.", 2)
    assert (written.summary, written.through_seq) == ("Questions 1 and 2 were asked.", 2)
    assert written.token_count > 0
    assert written.updated_at.tzinfo == timezone.utc
    assert client.get_summary(session) == written

    client.delete_summary(session)
    with pytest.raises(NotFoundError) as info:
        client.get_summary(session)
    assert info.value.code == "summary_not_found"
    client.delete_summary(session)  # idempotent
    client.delete_summary(new_id())


def test_a_session_without_summary_is_not_found(client: Client, session: str) -> None:
    for sid in (session, new_id()):
        with pytest.raises(NotFoundError) as info:
            client.get_summary(sid)
        assert (info.value.status, info.value.code) == (404, "summary_not_found")


def test_compare_and_set(client: Client, session: str) -> None:
    first = client.put_summary(session, "up to 2", 2, expected_through_seq=0)
    # A writer that read before the first write lost the race.
    with pytest.raises(SummaryConflictError) as info:
        client.put_summary(session, "up to 3 from a stale read", 3, expected_through_seq=0)
    error = info.value
    assert isinstance(error, ConflictError)
    assert (error.status, error.code) == (409, "summary_conflict")
    assert "2" in error.detail  # says what is stored
    assert client.get_summary(session) == first

    second = client.put_summary(session, "up to 4", 4, expected_through_seq=2)
    assert second.through_seq == 4
    # The same coverage again rewrites the text; going back is a conflict.
    assert client.put_summary(session, "up to 4, rewritten", 4).summary == "up to 4, rewritten"
    with pytest.raises(SummaryConflictError):
        client.put_summary(session, "back to 3", 3)
    assert client.get_summary(session).through_seq == 4


def test_a_summary_covers_finalized_turns_only(client: Client, session: str) -> None:
    with pytest.raises(ValidationError) as info:
        client.put_summary(session, "beyond the newest turn", 6)
    assert info.value.code == "validation_failed"
    assert [e.field for e in info.value.errors] == ["through_seq"]
    assert "5" in info.value.errors[0].message  # the newest finalized seq

    with pytest.raises(ValidationError) as info:
        client.put_summary(new_id(), "an unknown session has no turn", 1)
    assert [e.field for e in info.value.errors] == ["through_seq"]

    with pytest.raises(ValidationError) as info:
        client.put_summary(session, "   ", 0)
    assert sorted(e.field for e in info.value.errors) == ["summary", "through_seq"]

    with pytest.raises(PayloadTooLargeError):
        client.put_summary(session, "x" * (32 * 1024 + 1), 1)
    with pytest.raises(NotFoundError):
        client.get_summary(session)


def test_the_owner_is_checked_but_not_claimed(client: Client) -> None:
    owned, unowned = new_id(), new_id()
    started = client.start_turn("q", session_id=owned, user_id="alice")
    client.finalize_turn(owned, started.turn_id, "a")
    finished_turn(client, owned, "q", "a")
    finished_turn(client, unowned, "q", "a")
    with pytest.raises(ForbiddenError):
        client.put_summary(owned, "s", 2, user_id="mallory")
    assert client.put_summary(owned, "s", 2, user_id="alice").through_seq == 2
    client.put_summary(unowned, "s", 1, user_id="bob")
    assert client.get_session(unowned).user_id is None


def test_summary_true_in_the_text_format(client: Client, session: str) -> None:
    client.put_summary(session, "S", 3)
    history = client.get_history(session, summary=True)
    assert history.rendered == (
        "### Conversation summary:\nS\n\n### Conversation history:\n"
        "User: question 4\nAssistant: answer 4\n\n"
        "User: question 5\nAssistant: answer 5"
    )
    assert (history.total_turns, history.included_turns) == (2, 2)
    assert history.summary is None  # the text carries it
    alone = client.get_history(session, summary=True, limit=0)
    assert alone.rendered == "### Conversation summary:\nS"
    assert client.get_history_text(session, summary=True).text == history.rendered
    # Without summary=True the history is as always.
    assert client.get_history(session).included_turns == 5


def test_summary_true_in_the_messages_and_turns_formats(client: Client, session: str) -> None:
    stored = client.put_summary(session, "S", 3)
    messages = client.get_history(session, summary=True, format="messages")
    assert messages.messages is not None
    assert messages.messages[0] == {
        "role": "system",
        "content": "Summary of the conversation so far:\nS",
    }
    assert len(messages.messages) == 5

    turns = client.get_history(session, summary=True, format="turns")
    assert turns.turns is not None and [t.seq for t in turns.turns] == [4, 5]
    assert turns.summary is not None
    assert (turns.summary.summary, turns.summary.through_seq) == ("S", 3)
    assert turns.summary.updated_at == stored.updated_at
    # The turns format gives the same chat messages as the messages format.
    assert turns.chat_messages() == messages.chat_messages()
    assert turns.to_openai_messages(system="sys")[:2] == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "Summary of the conversation so far:\nS"},
    ]
    assert client.get_history(session, format="turns").summary is None


def test_a_summary_that_does_not_fit_returns_nothing(client: Client, session: str) -> None:
    client.put_summary(session, "a summary of several words", 2)
    history = client.get_history(session, summary=True, format="turns", max_tokens=1)
    assert history.summary is None and history.turns == []
    assert history.stopped_by == "max_tokens"
    assert history.token_count == 0


def test_unsummarized_describes_what_to_fold_next(client: Client, session: str) -> None:
    whole = client.get_history(session)
    assert whole.unsummarized is None  # everything is returned

    history = client.get_history(session, limit=2)
    todo = history.unsummarized
    assert todo is not None
    assert (todo.after_seq, todo.through_seq, todo.turns) == (0, 3, 3)
    older = client.get_history_text(session, through_seq=3)  # with its header line
    assert todo.tokens is not None and 0 < todo.tokens < older.token_count

    client.put_summary(session, "S", 2, expected_through_seq=todo.after_seq)
    after = client.get_history(session, summary=True, limit=2).unsummarized
    assert after is not None
    assert (after.after_seq, after.through_seq, after.turns) == (2, 3, 1)

    # keep_first returns the oldest candidate: it is not unsummarized.
    kept = client.get_history(session, summary=True, limit=2, keep_first=True).unsummarized
    assert kept is not None and (kept.after_seq, kept.through_seq, kept.turns) == (2, 4, 1)

    # Counted in the read's encoding, another than the server's too.
    other = client.get_history(session, summary=True, limit=2, encoding="cl100k_base")
    assert other.unsummarized is not None
    assert other.unsummarized.tokens is not None and other.unsummarized.tokens > 0

    client.put_summary(session, "S", 3, expected_through_seq=2)
    assert client.get_history(session, summary=True, limit=2).unsummarized is None


def test_range_reads_return_the_turns_to_fold(client: Client, session: str) -> None:
    todo = client.get_history(session, limit=1).unsummarized
    assert todo is not None
    turns = client.get_history(
        session, format="turns", after_seq=todo.after_seq, through_seq=todo.through_seq
    ).turns
    assert turns is not None and [t.seq for t in turns] == [1, 2, 3, 4]


def test_a_start_can_read_with_the_summary(client: Client, session: str) -> None:
    client.put_summary(session, "S", 4)
    started = client.start_turn(
        "question 6", session_id=session, history=HistoryOptions(summary=True, format="turns")
    )
    assert started.history is not None
    assert started.history.summary is not None and started.history.summary.through_seq == 4
    assert started.history.turns is not None and [t.seq for t in started.history.turns] == [5]


def test_clearing_the_session_deletes_the_summary(client: Client, session: str) -> None:
    client.put_summary(session, "S", 1)
    client.clear_session(session)
    with pytest.raises(NotFoundError):
        client.get_summary(session)


def test_a_history_carries_the_session_generation(client: Client, session: str) -> None:
    generation = client.get_session(session).generation
    assert isinstance(generation, str) and generation
    assert client.get_history(session).generation == generation
    assert client.get_history(session, summary=True, format="turns").generation == generation
    started = client.start_turn("question 6", session_id=session, history=HistoryOptions())
    assert started.history is not None and started.history.generation == generation
    # The same in every read of this incarnation, whatever was written since.
    client.finalize_turn(session, started.turn_id, "answer 6")
    client.put_summary(session, "S", 2)
    assert client.get_session(session).generation == generation
    assert client.get_history(session, summary=True).generation == generation
    # An unknown session has none.
    assert client.get_history(new_id()).generation is None


def test_a_session_started_again_has_another_generation(client: Client, session: str) -> None:
    before = client.get_session(session).generation
    client.clear_session(session)
    assert client.get_history(session).generation is None
    started = client.start_turn("question 1", session_id=session, history=HistoryOptions())
    after = client.get_session(session).generation
    assert after != before
    # The start that made the session again names its new generation.
    assert started.history is not None and started.history.generation == after
    assert client.get_history(session).generation == after


def test_a_summary_of_a_replaced_session_is_refused(client: Client, session: str) -> None:
    """A summary folded from one incarnation of a session id never lands on
    the next, even one with as many turns and no summary either."""
    read = client.get_history(session, summary=True, limit=2)
    assert read.unsummarized is not None and read.generation is not None
    assert (read.unsummarized.after_seq, read.unsummarized.through_seq) == (0, 3)
    client.clear_session(session)
    for n in range(1, 6):
        finished_turn(client, session, f"other question {n}", f"other answer {n}")
    again = client.get_history(session, summary=True, limit=2)
    assert again.unsummarized is not None and again.generation is not None
    shape = (again.unsummarized.after_seq, again.unsummarized.through_seq, again.unsummarized.turns)
    assert shape == (0, 3, 3)  # the same shape as the read's ...
    assert again.generation != read.generation  # ... but another conversation

    with pytest.raises(SummaryConflictError) as info:
        client.put_summary(
            session,
            "question 1 question 2 question 3",
            read.unsummarized.through_seq,
            expected_through_seq=read.unsummarized.after_seq,
            expected_generation=read.generation,
        )
    assert (info.value.status, info.value.code) == (409, "summary_conflict")
    assert "generation" in info.value.detail
    with pytest.raises(NotFoundError):
        client.get_summary(session)  # nothing was written

    written = client.put_summary(
        session,
        "other question 1 other question 2 other question 3",
        again.unsummarized.through_seq,
        expected_through_seq=again.unsummarized.after_seq,
        expected_generation=again.generation,
    )
    assert client.get_summary(session) == written
    assert client.get_session(session).generation == again.generation


def test_an_expected_generation_alone_is_checked(client: Client, session: str) -> None:
    generation = client.get_session(session).generation
    client.put_summary(session, "S", 2, expected_generation=generation)
    # Without expected_through_seq it is no compare-and-set on the coverage.
    assert client.put_summary(session, "S2", 3, expected_generation=generation).through_seq == 3
    with pytest.raises(SummaryConflictError):
        client.put_summary(session, "S3", 4, expected_generation="another-generation")
    assert client.get_summary(session).summary == "S2"
    with pytest.raises(ValidationError) as info:
        client.put_summary(session, "S3", 4, expected_generation="g" * 65)
    assert [e.field for e in info.value.errors] == ["expected_generation"]


def test_the_rolling_summary_loop(client: Client, session: str) -> None:
    """The loop of API.md and the README: fold the unsummarized turns when
    they pass a threshold, with compare-and-set on the coverage and the
    session's generation."""

    def fold(previous: str, texts: list[str]) -> str:
        return " ".join([previous, *texts]).strip()

    def update(threshold: int) -> int:
        writes = 0
        while True:
            history = client.get_history(session, summary=True, limit=1)
            todo = history.unsummarized
            if todo is None or todo.tokens is None or todo.tokens < threshold:
                return writes
            turns = client.get_history(
                session,
                format="turns",
                after_seq=todo.after_seq,
                through_seq=todo.through_seq,
                limit=10_000,
                max_tokens=10_000_000,
            ).turns
            assert turns is not None
            previous = client.get_summary(session).summary if todo.after_seq else ""
            try:
                client.put_summary(
                    session,
                    fold(previous, [t.user_query for t in turns]),
                    todo.through_seq,
                    expected_through_seq=todo.after_seq,
                    expected_generation=history.generation,
                )
                writes += 1
            except SummaryConflictError:
                continue

    assert update(threshold=1_000) == 0
    assert update(threshold=1) == 1
    assert client.get_summary(session).summary == "question 1 question 2 question 3 question 4"
    finished_turn(client, session, "question 6", "answer 6")
    assert update(threshold=1) == 1
    summary = client.get_summary(session)
    assert (summary.summary, summary.through_seq) == (
        "question 1 question 2 question 3 question 4 question 5",
        5,
    )
