"""Templates: the built-ins, an operator's (TURNSTORE_TEMPLATES_DIR), their
errors, and the budget rule under them."""

from __future__ import annotations

from typing import Iterator

import pytest
from support import Server, new_id

from turnstore import Client, HistoryOptions, NotFoundError, ValidationError


@pytest.fixture
def tclient(templates_server: Server) -> Iterator[Client]:
    with Client(templates_server.url, initial_backoff=0.01, max_backoff=0.05) as c:
        yield c


@pytest.fixture
def session(tclient: Client) -> str:
    """Two turns, the first with text to escape."""
    sid = new_id()
    tclient.import_messages(
        sid,
        [
            {"role": "user", "content": 'Is 1 < 2 & "true"?'},
            {"role": "assistant", "content": "Yes, it's true."},
            {"role": "user", "content": "And markdown?"},
            {"role": "assistant", "content": "Also."},
        ],
        user_id="alice",
    )
    return sid


def test_the_xml_builtin(tclient: Client, session: str) -> None:
    history = tclient.get_history(session, template="xml")
    assert history.format == "text"
    assert history.rendered == (
        '<history><turn role="user">Is 1 &lt; 2 &amp; &quot;true&quot;?</turn>'
        '<turn role="assistant">Yes, it&apos;s true.</turn>'
        '<turn role="user">And markdown?</turn><turn role="assistant">Also.</turn></history>'
    )
    assert history.included_turns == 2 and history.token_count > 0

    tclient.put_summary(session, "S & more", 1)
    summarized = tclient.get_history(session, template="xml", summary=True)
    assert summarized.rendered == (
        "<summary>S &amp; more</summary><history>"
        '<turn role="user">And markdown?</turn><turn role="assistant">Also.</turn></history>'
    )


def test_the_markdown_builtin(tclient: Client, session: str) -> None:
    history = tclient.get_history(session, template="markdown", limit=1)
    assert history.rendered == (
        "## Conversation history\n\n**User:** And markdown?\n\n**Assistant:** Also."
    )
    tclient.put_summary(session, "S", 1)
    summarized = tclient.get_history(session, template="markdown", summary=True)
    assert summarized.rendered == (
        "## Conversation summary\n\nS\n\n"
        "## Conversation history\n\n**User:** And markdown?\n\n**Assistant:** Also."
    )


def test_an_operator_template(tclient: Client, session: str) -> None:
    history = tclient.get_history(session, template="conv")
    assert history.rendered == (
        f'<conversation id="{session}">'
        '<q n="1">Is 1 < 2 & "true"?</q><a>Yes, it\'s true.</a>\n'
        '<q n="2">And markdown?</q><a>Also.</a></conversation>'
    )
    tclient.put_summary(session, "S", 1)
    summarized = tclient.get_history(session, template="conv", summary=True)
    assert summarized.rendered == (
        '<summary upto="1">S</summary>'
        f'<conversation id="{session}"><q n="2">And markdown?</q><a>Also.</a></conversation>'
    )


def test_text_plain_and_json_agree(tclient: Client, session: str) -> None:
    text = tclient.get_history_text(session, template="conv", encoding="cl100k_base")
    json_view = tclient.get_history(session, template="conv", encoding="cl100k_base")
    assert text.text == json_view.rendered
    assert text.token_count == json_view.token_count
    assert text.encoding == "cl100k_base"


def test_the_budget_rule_holds(tclient: Client, session: str) -> None:
    whole = tclient.get_history(session, template="xml")
    history = tclient.get_history(session, template="xml", max_tokens=whole.token_count - 1)
    assert history.token_count <= whole.token_count - 1
    assert history.included_turns == 1 and history.stopped_by == "max_tokens"
    assert history.rendered is not None and "And markdown?" in history.rendered


def test_a_start_renders_its_history_with_a_template(tclient: Client, session: str) -> None:
    started = tclient.start_turn(
        "next", session_id=session, history=HistoryOptions(template="markdown", limit=1)
    )
    assert started.history is not None
    assert started.history.rendered == (
        "## Conversation history\n\n**User:** And markdown?\n\n**Assistant:** Also."
    )


def test_an_unknown_template_is_not_found(tclient: Client, session: str) -> None:
    with pytest.raises(NotFoundError) as info:
        tclient.get_history(session, template="no-such-template")
    assert (info.value.status, info.value.code) == (404, "template_not_found")
    with pytest.raises(NotFoundError) as info:
        tclient.get_history_text(session, template="no-such-template")
    assert info.value.code == "template_not_found"
    with pytest.raises(NotFoundError) as info:
        tclient.start_turn("q", session_id=session, history=HistoryOptions(template="nope"))
    assert info.value.code == "template_not_found"
    assert tclient.get_session(session).pending_count == 0


def test_a_template_renders_text_only(tclient: Client, session: str) -> None:
    for fmt in ("messages", "turns"):
        with pytest.raises(ValidationError) as info:
            tclient.get_history(session, template="xml", format=fmt)
        assert info.value.code == "validation_failed"
        assert [e.field for e in info.value.errors] == ["format"]
    with pytest.raises(ValidationError) as info:
        tclient.start_turn(
            "q", session_id=session, history=HistoryOptions(template="xml", format="turns")
        )
    assert [e.field for e in info.value.errors] == ["history.format"]
    assert tclient.get_history(session, template="xml", format="text").format == "text"


def test_a_failing_template_is_a_template_error(tclient: Client, session: str) -> None:
    with pytest.raises(ValidationError) as info:
        tclient.get_history(session, template="broken")
    error = info.value
    assert (error.status, error.code) == (422, "template_error")
    assert "line 2" in error.detail
    assert error.errors == []

    # A start whose history fails leaves no turn behind.
    with pytest.raises(ValidationError) as info:
        tclient.start_turn("q", session_id=session, history=HistoryOptions(template="broken"))
    assert info.value.code == "template_error"
    session_info = tclient.get_session(session)
    assert (session_info.turn_count, session_info.pending_count) == (2, 0)


def test_a_summary_needs_the_summary_macro(tclient: Client, session: str) -> None:
    assert tclient.get_history(session, template="plain").rendered == (
        '[Is 1 < 2 & "true"?|Yes, it\'s true.][And markdown?|Also.]'
    )
    tclient.put_summary(session, "S", 1)
    with pytest.raises(ValidationError) as info:
        tclient.get_history(session, template="plain", summary=True)
    assert info.value.code == "template_error"
