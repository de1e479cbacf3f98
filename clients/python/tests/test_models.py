"""Parsing and option encoding, without a server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from turnstore import History, HistoryOptions
from turnstore.models import parse_datetime


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
