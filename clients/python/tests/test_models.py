"""Parsing and option encoding, without a server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List

import httpx
import pytest

from turnstore import (
    Client,
    DroppedReport,
    ExportedMessage,
    ExportedSession,
    ExportedTranscript,
    ForkResult,
    History,
    HistoryOptions,
    ImportResult,
    Session,
    Summary,
    Unsummarized,
)
from turnstore.models import format_datetime, parse_datetime


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-01-02T03:04:05.678Z", datetime(2026, 1, 2, 3, 4, 5, 678000, timezone.utc)),
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, 0, timezone.utc)),
        ("2026-01-02T03:04:05.1234567Z", datetime(2026, 1, 2, 3, 4, 5, 123456, timezone.utc)),
        (
            "2026-01-02T04:04:05.5+01:00",
            datetime(2026, 1, 2, 4, 4, 5, 500000, timezone(timedelta(hours=1))),
        ),
    ],
)
def test_parse_datetime(text: str, expected: datetime) -> None:
    parsed = parse_datetime(text)
    assert parsed == expected and parsed.tzinfo is not None


def test_history_options_encoding() -> None:
    options = HistoryOptions(limit=0, keep_first=False, format="turns", encoding="cl100k_base")
    assert options.to_params() == {
        "limit": 0,
        "keep_first": "false",
        "format": "turns",
        "encoding": "cl100k_base",
    }
    assert options.to_json() == {
        "limit": 0,
        "keep_first": False,
        "format": "turns",
        "encoding": "cl100k_base",
    }
    assert HistoryOptions().to_params() == {}


def test_history_ignores_unknown_fields() -> None:
    history = History.from_json(
        {
            "session_id": "s",
            "user_id": None,
            "format": "messages",
            "encoding": "o200k_base",
            "token_count": 9,
            "total_turns": 1,
            "included_turns": 1,
            "omitted_turns": 0,
            "pending_turns": 0,
            "stopped_by": None,
            "unsummarized": None,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ],
        }
    )
    assert history.to_openai_messages(system="s") == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_v1_1_history_options_encoding() -> None:
    options = HistoryOptions(lang="en", summary=True, template="xml", after_seq=3)
    assert options.to_params() == {
        "after_seq": 3,
        "lang": "en",
        "summary": "true",
        "template": "xml",
    }
    assert options.to_json() == {"after_seq": 3, "lang": "en", "summary": True, "template": "xml"}
    assert HistoryOptions(summary=False).to_params() == {"summary": "false"}


def test_chat_template_options_encoding() -> None:
    options = HistoryOptions(encoding="chat", chat_template=True, prompt=False, system="Be brief.")
    assert options.to_params() == {
        "encoding": "chat",
        "chat_template": "true",
        "prompt": "false",
        "system": "Be brief.",
    }
    assert options.to_json() == {
        "encoding": "chat",
        "chat_template": True,
        "prompt": False,
        "system": "Be brief.",
    }


def test_a_history_with_its_prompt() -> None:
    data: Dict[str, Any] = {
        "session_id": "s",
        "user_id": None,
        "format": "messages",
        "encoding": "chat",
        "token_count": 12,
        "total_turns": 0,
        "included_turns": 0,
        "omitted_turns": 0,
        "pending_turns": 0,
        "stopped_by": None,
        "unsummarized": None,
        "messages": [{"role": "system", "content": "S"}],
        "prompt": "<|im_start|>system\nS<|im_end|>\n",
    }
    assert History.from_json(data).prompt == "<|im_start|>system\nS<|im_end|>\n"
    del data["prompt"]
    assert History.from_json(data).prompt is None


_TURN = {
    "turn_id": "0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b7a",
    "seq": 3,
    "user_query": "Wie?",
    "final_answer": "So.",
    "started_at": "2026-11-25T10:15:30.123Z",
    "finalized_at": "2026-11-25T10:15:32.456Z",
    "truncated": False,
}


def test_a_turns_history_with_its_summary_and_unsummarized() -> None:
    history = History.from_json(
        {
            "session_id": "s",
            "user_id": "alice",
            "format": "turns",
            "encoding": "o200k_base",
            "token_count": 30,
            "total_turns": 2,
            "included_turns": 1,
            "omitted_turns": 1,
            "pending_turns": 0,
            "stopped_by": "limit",
            "turns": [dict(_TURN, user_query_en="How?")],
            "summary": {
                "summary": "Earlier: greetings.",
                "through_seq": 1,
                "token_count": 4,
                "updated_at": "2026-11-25T10:20:41.210Z",
            },
            "unsummarized": {"after_seq": 1, "through_seq": 2, "turns": 1, "tokens": None},
        }
    )
    assert history.summary == Summary(
        "Earlier: greetings.", 1, 4, datetime(2026, 11, 25, 10, 20, 41, 210000, timezone.utc)
    )
    assert history.unsummarized == Unsummarized(after_seq=1, through_seq=2, turns=1, tokens=None)
    assert history.turns is not None
    assert (history.turns[0].user_query_en, history.turns[0].final_answer_en) == ("How?", None)
    assert history.chat_messages() == [
        {"role": "system", "content": "Summary of the conversation so far:\nEarlier: greetings."},
        {"role": "user", "content": "Wie?"},
        {"role": "assistant", "content": "So."},
    ]


def test_an_exported_session_line() -> None:
    session = ExportedSession.from_json(
        {
            "session_id": "chat-42",
            "created_at": "2026-11-25T10:15:30.123Z",
            "last_active_at": "2026-11-25T10:17:02.481Z",
            "turns": [_TURN],
            "future_field": 1,
        }
    )
    assert session.summary is None
    assert [t.seq for t in session.turns] == [3]
    assert session.created_at < session.last_active_at
    result = ImportResult.from_json(
        {"session_id": "s", "user_id": None, "imported_turns": 2, "first_seq": 4, "last_seq": 5}
    )
    assert (result.first_seq, result.last_seq, result.replayed) == (4, 5, False)
    assert result.dropped is None  # a strict import's
    distilled = ImportResult.from_json(
        {
            "session_id": "s",
            "user_id": "u",
            "imported_turns": 1,
            "first_seq": 1,
            "last_seq": 1,
            "dropped": [
                {"reason": "tool_call", "count": 2, "first_indexes": [3, 7]},
                {"reason": "some_new_reason", "count": 1, "first_indexes": [0], "more": True},
            ],
        },
        replayed=True,
    )
    assert distilled.replayed is True
    assert distilled.dropped == [
        DroppedReport(reason="tool_call", count=2, first_indexes=[3, 7]),
        DroppedReport(reason="some_new_reason", count=1, first_indexes=[0]),
    ]
    nothing = ImportResult.from_json(
        {
            "session_id": "s",
            "user_id": None,
            "imported_turns": 1,
            "first_seq": 1,
            "last_seq": 1,
            "dropped": [],
        }
    )
    assert nothing.dropped == []


def test_a_fork_result() -> None:
    result = ForkResult.from_json(
        {
            "session_id": "chat-42-b",
            "forked_from": "chat-42",
            "user_id": None,
            "through_seq": 6,
            "copied_turns": 5,
            "summary": True,
            "future_field": 1,
        },
        replayed=True,
    )
    assert result == ForkResult("chat-42-b", "chat-42", None, 6, 5, True, replayed=True)
    assert ForkResult.from_json({**result.__dict__, "user_id": "alice"}).replayed is False


def test_an_exported_transcript_line() -> None:
    transcript = ExportedTranscript.from_json(
        {
            "session_id": "chat-42",
            "created_at": "2026-11-25T10:15:30.123Z",
            "last_active_at": "2026-11-25T10:17:02.481Z",
            "summary": {
                "summary": "Greetings.",
                "through_seq": 1,
                "token_count": 3,
                "updated_at": "2026-11-25T10:16:00.000Z",
            },
            "messages": [
                {"role": "user", "content": "q", "timestamp": "2026-11-25T10:15:30.123Z"},
                {"role": "assistant", "content": "a", "timestamp": "2026-11-25T10:15:32.456Z"},
            ],
            "future_field": 1,
        }
    )
    assert transcript.summary is not None and transcript.summary.through_seq == 1
    assert transcript.messages == [
        ExportedMessage("user", "q", datetime(2026, 11, 25, 10, 15, 30, 123000, timezone.utc)),
        ExportedMessage(
            "assistant", "a", datetime(2026, 11, 25, 10, 15, 32, 456000, timezone.utc)
        ),
    ]
    # As an import takes them: the service's own timestamps, back unchanged.
    assert [m.to_json() for m in transcript.messages] == [
        {"role": "user", "content": "q", "timestamp": "2026-11-25T10:15:30.123Z"},
        {"role": "assistant", "content": "a", "timestamp": "2026-11-25T10:15:32.456Z"},
    ]
    empty = ExportedTranscript.from_json({**_TRANSCRIPT_TIMES, "messages": []})
    assert (empty.messages, empty.summary) == ([], None)


_TRANSCRIPT_TIMES = {
    "session_id": "s",
    "created_at": "2026-11-25T10:15:30.123Z",
    "last_active_at": "2026-11-25T10:15:30.123Z",
}


@pytest.mark.parametrize(
    "moment, text",
    [
        (datetime(2026, 1, 2, 3, 4, 5, 678000, timezone.utc), "2026-01-02T03:04:05.678Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 0, timezone.utc), "2026-01-02T03:04:05.000Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 123456, timezone.utc), "2026-01-02T03:04:05.123456Z"),
        (
            datetime(2026, 1, 2, 4, 4, 5, 500000, timezone(timedelta(hours=1))),
            "2026-01-02T03:04:05.500Z",
        ),
    ],
)
def test_format_datetime(moment: datetime, text: str) -> None:
    assert format_datetime(moment) == text
    assert parse_datetime(text) == moment


_HISTORY: Dict[str, Any] = {
    "session_id": "chat-42",
    "user_id": None,
    "format": "text",
    "encoding": "o200k_base",
    "token_count": 0,
    "total_turns": 0,
    "included_turns": 0,
    "omitted_turns": 0,
    "pending_turns": 0,
    "stopped_by": None,
    "rendered": "",
    "unsummarized": None,
}


def test_a_history_and_a_session_carry_the_generation() -> None:
    generation = "019abf1c-5e2a-7c3d-9a41-6b2f0e8d4c17"
    assert History.from_json(dict(_HISTORY, generation=generation)).generation == generation
    assert History.from_json(dict(_HISTORY, generation=None)).generation is None  # unknown
    assert History.from_json(_HISTORY).generation is None  # a server without generations
    session = Session.from_json(
        {
            "session_id": "chat-42",
            "user_id": "alice",
            "created_at": "2026-11-25T10:15:30.123Z",
            "last_active_at": "2026-11-25T10:17:02.481Z",
            "expires_at": "2026-12-02T10:17:02.481Z",
            "turn_count": 2,
            "pending_count": 0,
            "generation": generation,
        }
    )
    assert (session.turn_count, session.generation) == (2, generation)


def test_put_summary_sends_expected_generation_only_when_given() -> None:
    bodies: List[Dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "summary": "S",
                "through_seq": 2,
                "token_count": 1,
                "updated_at": "2026-11-25T10:20:41.210Z",
            },
        )

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        client.put_summary("chat-42", "S", 2, expected_through_seq=0, expected_generation="g-1")
        client.put_summary("chat-42", "S", 2)
    assert bodies == [
        {"summary": "S", "through_seq": 2, "expected_through_seq": 0, "expected_generation": "g-1"},
        {"summary": "S", "through_seq": 2},
    ]
