"""Translations: English copies of questions and answers, and ``lang="en"``."""

from __future__ import annotations

from typing import cast

import pytest
from support import finished_turn, new_id

from turnstore import Client, ConflictError, HistoryOptions, Language, ValidationError


@pytest.fixture
def session(client: Client) -> str:
    """Three turns: both copies, an English answer only, no copy."""
    sid = new_id()
    both = client.start_turn(
        "Was ist ein Index?", session_id=sid, user_query_en="What is an index?"
    )
    client.finalize_turn(sid, both.turn_id, "Eine Struktur.", final_answer_en="A structure.")
    answer_only = client.start_turn("Und HNSW?", session_id=sid)
    client.finalize_turn(sid, answer_only.turn_id, "Ein Graph.", final_answer_en="A graph.")
    finished_turn(client, sid, "Danke", "Bitte")
    return sid


def test_turns_carry_their_english_copies(client: Client) -> None:
    sid = new_id()
    started = client.start_turn("Wie geht es?", session_id=sid, user_query_en="How are you?")
    turn = client.finalize_turn(sid, started.turn_id, "Gut.", final_answer_en="Fine.")
    assert (turn.user_query, turn.user_query_en) == ("Wie geht es?", "How are you?")
    assert (turn.final_answer, turn.final_answer_en) == ("Gut.", "Fine.")
    # The same finalize again (copy included) is a safe retry ...
    assert client.finalize_turn(sid, started.turn_id, "Gut.", final_answer_en="Fine.") == turn
    # ... another English copy is another answer.
    with pytest.raises(ConflictError) as info:
        client.finalize_turn(sid, started.turn_id, "Gut.", final_answer_en="Good.")
    assert info.value.code == "turn_already_finalized"

    plain = client.start_turn("Noch was?", session_id=sid)
    untranslated = client.finalize_turn(sid, plain.turn_id, "Nein.")
    assert (untranslated.user_query_en, untranslated.final_answer_en) == (None, None)


def test_a_turns_history_shows_the_copies_beside_the_originals(
    client: Client, session: str
) -> None:
    turns = client.get_history(session, format="turns").turns
    assert turns is not None
    assert [(t.user_query, t.user_query_en) for t in turns] == [
        ("Was ist ein Index?", "What is an index?"),
        ("Und HNSW?", None),
        ("Danke", None),
    ]
    assert [(t.final_answer, t.final_answer_en) for t in turns] == [
        ("Eine Struktur.", "A structure."),
        ("Ein Graph.", "A graph."),
        ("Bitte", None),
    ]


def test_lang_en_renders_the_english_copies_text_by_text(client: Client, session: str) -> None:
    english = client.get_history(session, format="messages", lang="en")
    assert english.messages == [
        {"role": "user", "content": "What is an index?"},
        {"role": "assistant", "content": "A structure."},
        {"role": "user", "content": "Und HNSW?"},
        {"role": "assistant", "content": "A graph."},
        {"role": "user", "content": "Danke"},
        {"role": "assistant", "content": "Bitte"},
    ]
    text = client.get_history_text(session, lang="en", limit=1)
    assert text.text == "### Conversation history:\nUser: Danke\nAssistant: Bitte"
    original = client.get_history(session)
    assert original.rendered is not None and "Was ist ein Index?" in original.rendered


def test_a_lang_en_turns_history_holds_the_rendered_texts(client: Client, session: str) -> None:
    turns = client.get_history(session, format="turns", lang="en").turns
    assert turns is not None
    assert [(t.user_query, t.final_answer) for t in turns[:2]] == [
        ("What is an index?", "A structure."),
        ("Und HNSW?", "A graph."),
    ]
    # The copies are carried too, where set: they tell what was translated.
    assert [(t.user_query_en, t.final_answer_en) for t in turns] == [
        ("What is an index?", "A structure."),
        (None, "A graph."),
        (None, None),
    ]


def test_copies_are_truncated_like_the_originals(client: Client, session: str) -> None:
    turns = client.get_history(session, format="turns", max_query_chars=4).turns
    assert turns is not None
    assert (turns[0].user_query, turns[0].user_query_en) == ("Was  [truncated]", "What [truncated]")
    assert turns[0].truncated


def test_lang_goes_into_a_starts_history(client: Client, session: str) -> None:
    started = client.start_turn(
        "Noch eine Frage",
        session_id=session,
        history=HistoryOptions(format="messages", lang="en", limit=1, keep_first=True),
    )
    assert started.history is not None
    assert started.history.messages is not None
    assert started.history.messages[0] == {"role": "user", "content": "What is an index?"}


def test_invalid_copies_and_languages_are_rejected(client: Client) -> None:
    with pytest.raises(ValidationError) as info:
        client.start_turn("Frage", session_id=new_id(), user_query_en="   ")
    assert [e.field for e in info.value.errors] == ["user_query_en"]
    with pytest.raises(ValidationError) as info:
        client.get_history(new_id(), lang=cast(Language, "de"))
    assert [e.field for e in info.value.errors] == ["lang"]


def test_the_turn_helper_speaks_english_to_the_model(client: Client, session: str) -> None:
    english = HistoryOptions(format="messages", lang="en", limit=1, keep_first=True)
    with client.turn(
        "Wie baue ich einen?",
        session_id=session,
        user_query_en="How do I build one?",
        history=english,
    ) as turn:
        assert turn.question == "How do I build one?"
        assert turn.prompt(system="Be brief.") == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is an index?"},
            {"role": "assistant", "content": "A structure."},
            {"role": "user", "content": "How do I build one?"},
        ]
        result = turn.finalize("Mit Einbettungen.", final_answer_en="With embeddings.")
    assert (result.user_query_en, result.final_answer_en) == (
        "How do I build one?",
        "With embeddings.",
    )
    # Without lang="en" the prompt keeps the user's language.
    with client.turn("Danke!", session_id=session, user_query_en="Thanks!") as turn:
        assert turn.question == "Danke!"
        assert turn.prompt()[-1] == {"role": "user", "content": "Danke!"}
        turn.finalize("Gern.")
