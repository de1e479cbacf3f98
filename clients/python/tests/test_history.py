"""get_history and get_history_text: every query parameter, every format."""

from __future__ import annotations

import pytest
from support import finished_turn, new_id

from turnstore import Client, HistoryOptions


@pytest.fixture
def session(client: Client) -> str:
    """A session of three finalized turns."""
    sid = new_id()
    for n in (1, 2, 3):
        finished_turn(client, sid, f"question {n}", f"answer {n}")
    return sid


def test_text_format_renders_the_contract_layout(client: Client, session: str) -> None:
    history = client.get_history(session)
    assert history.format == "text"
    assert history.rendered == (
        "### Conversation history:\n"
        "User: question 1\nAssistant: answer 1\n\n"
        "User: question 2\nAssistant: answer 2\n\n"
        "User: question 3\nAssistant: answer 3"
    )
    assert history.messages is None and history.turns is None
    assert (history.total_turns, history.included_turns, history.omitted_turns) == (3, 3, 0)
    assert history.pending_turns == 0
    assert history.stopped_by is None
    assert history.encoding == "o200k_base"
    assert history.token_count > 0


def test_messages_and_turns_formats(client: Client, session: str) -> None:
    messages = client.get_history(session, format="messages")
    assert messages.messages is not None and len(messages.messages) == 6
    assert messages.messages[-2:] == [
        {"role": "user", "content": "question 3"},
        {"role": "assistant", "content": "answer 3"},
    ]
    turns = client.get_history(session, format="turns")
    assert turns.turns is not None
    assert [t.user_query for t in turns.turns] == ["question 1", "question 2", "question 3"]
    assert turns.chat_messages() == messages.chat_messages()


def test_limit_keeps_the_newest_turns(client: Client, session: str) -> None:
    history = client.get_history(session, limit=2, format="turns")
    assert history.turns is not None
    assert [t.seq for t in history.turns] == [2, 3]
    assert (history.included_turns, history.omitted_turns) == (2, 1)
    assert history.stopped_by == "limit"


def test_max_tokens_bounds_the_count(client: Client, session: str) -> None:
    whole = client.get_history(session)
    budget = whole.token_count - 1
    history = client.get_history(session, max_tokens=budget)
    assert history.token_count <= budget
    assert history.included_turns == 2
    assert history.stopped_by == "max_tokens"


def test_model_and_encoding_choose_the_tokenizer(client: Client, session: str) -> None:
    assert client.get_history(session, model="gpt-4").encoding == "cl100k_base"
    assert client.get_history(session, encoding="p50k_base").encoding == "p50k_base"
    assert client.get_history(session, model="no-such-model").encoding == "o200k_base"
    both = client.get_history(session, model="gpt-4", encoding="r50k_base")
    assert both.encoding == "r50k_base"


def test_truncation_marks_cut_contents(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "a long question", "a very long answer")
    history = client.get_history(sid, format="turns", max_query_chars=6, max_answer_chars=6)
    assert history.turns is not None
    turn = history.turns[0]
    assert (turn.user_query, turn.final_answer) == ("a long [truncated]", "a very [truncated]")
    assert turn.truncated is True
    stored = client.get_history(sid, format="turns").turns
    assert stored is not None and stored[0].truncated is False


def test_keep_first_keeps_the_original_goal(client: Client, session: str) -> None:
    history = client.get_history(session, limit=2, keep_first=True, format="turns")
    assert history.turns is not None
    assert [t.seq for t in history.turns] == [1, 3]
    plain = client.get_history(session, limit=2, keep_first=False, format="turns")
    assert plain.turns is not None and [t.seq for t in plain.turns] == [2, 3]


def test_range_reads(client: Client, session: str) -> None:
    history = client.get_history(session, after_seq=1, through_seq=2, format="turns")
    assert history.turns is not None
    assert [t.seq for t in history.turns] == [2]
    assert history.total_turns == 1
    assert client.get_history(session, after_seq=2, through_seq=2).total_turns == 0


def test_keyword_arguments_override_options(client: Client, session: str) -> None:
    options = HistoryOptions(limit=1, format="turns")
    history = client.get_history(session, options, limit=2)
    assert history.format == "turns" and history.included_turns == 2


def test_text_plain_variant_carries_its_token_count(client: Client, session: str) -> None:
    text = client.get_history_text(session, limit=2, encoding="cl100k_base")
    json_view = client.get_history(session, limit=2, encoding="cl100k_base")
    assert text.text == json_view.rendered
    assert text.token_count == json_view.token_count
    assert text.encoding == "cl100k_base"


def test_unknown_session_has_an_empty_history(client: Client) -> None:
    history = client.get_history(new_id())
    assert history.rendered == ""
    assert (history.total_turns, history.token_count) == (0, 0)
    assert client.get_history_text(new_id()).text == ""


def test_pending_turns_are_counted_not_shown(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    client.start_turn("in flight", session_id=sid)
    history = client.get_history(sid, format="messages")
    assert history.pending_turns == 1
    assert history.messages is not None and len(history.messages) == 2


def test_a_text_history_has_no_chat_messages(client: Client, session: str) -> None:
    with pytest.raises(ValueError, match="format='messages'"):
        client.get_history(session).to_openai_messages()
