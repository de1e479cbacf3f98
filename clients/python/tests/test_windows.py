"""Prompt-cache-friendly histories: stable windows (``window``, ``stride``),
breakpoints, the Anthropic Messages API format (``format="anthropic"``,
``cache_control``), :meth:`History.anthropic_request`, and their errors."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, cast

import pytest
from support import finished_turn, new_id

from turnstore import (
    AnthropicHistory,
    AsyncClient,
    Breakpoint,
    Client,
    History,
    HistoryOptions,
    HistoryWindow,
    ValidationError,
    WindowKind,
)
from turnstore.models import SUMMARY_MESSAGE_PREFIX

STABLE = HistoryOptions(format="turns", limit=5, window="stable", stride=3)


def seqs(client: Client, sid: str, options: HistoryOptions) -> List[int]:
    turns = client.get_history(sid, options).turns
    assert turns is not None
    return [t.seq for t in turns]


def test_a_stable_window_keeps_its_first_turn_until_the_boundary(client: Client) -> None:
    sid = new_id()
    firsts: List[int] = []
    previous: Optional[List[int]] = None
    for n in range(1, 15):
        finished_turn(client, sid, f"question {n}", f"answer {n}")
        history = client.get_history(sid, STABLE)
        assert history.turns is not None and history.window is not None
        shown = [t.seq for t in history.turns]
        sliding = seqs(client, sid, HistoryOptions(format="turns", limit=5))
        # The sliding window without its oldest turns: at most stride - 1 of them.
        left_out = history.window.left_out
        assert shown == sliding[left_out:] and left_out < 3
        assert history.window == HistoryWindow(stride=3, from_seq=shown[0], left_out=left_out)
        if left_out:
            assert (shown[0] - 1) % 3 == 0, shown
        # A read that begins where the last one did holds it whole, then the new turn.
        if previous is not None and previous[0] == shown[0]:
            assert shown == previous + [n]
        assert history.breakpoint == Breakpoint(seq=n)
        firsts.append(shown[0])
        previous = shown
    # Turns 1..5 all fit; then the first turn moves by a stride, every third read.
    assert firsts == [1, 1, 1, 1, 1, 4, 4, 4, 7, 7, 7, 10, 10, 10]
    # A sliding read says nothing of windows.
    sliding_history = client.get_history(sid, limit=5)
    assert sliding_history.window is None and sliding_history.breakpoint is None


def test_a_start_and_the_text_rendering_read_the_same_window(client: Client) -> None:
    sid = new_id()
    for n in range(1, 10):
        finished_turn(client, sid, f"question {n}", f"answer {n}")
    read = client.get_history(sid, STABLE)
    started = client.start_turn("question 10", session_id=sid, history=STABLE)
    assert started.history is not None and started.history.turns is not None
    assert [t.seq for t in started.history.turns] == [7, 8, 9]
    assert started.history.window == read.window == HistoryWindow(stride=3, from_seq=7, left_out=2)
    client.abort_turn(sid, started.turn_id)

    text = client.get_history(sid, limit=5, window="stable", stride=3)
    assert text.breakpoint is not None and text.rendered is not None
    assert text.breakpoint.bytes == len(text.rendered.encode("utf-8"))
    plain = client.get_history_text(sid, limit=5, window="stable", stride=3)
    assert plain.text == text.rendered and plain.token_count == text.token_count


def test_anthropic_format_with_cache_control(client: Client) -> None:
    sid = new_id()
    for n in (1, 2, 3):
        finished_turn(client, sid, f"question {n}", f"answer {n}")
    plain = client.get_history(sid, format="anthropic")
    assert plain.format == "anthropic" and plain.messages is None and plain.rendered is None
    assert plain.anthropic == {
        "messages": [
            {"role": role, "content": [{"type": "text", "text": f"{text} {n}"}]}
            for n in (1, 2, 3)
            for role, text in (("user", "question"), ("assistant", "answer"))
        ]
    }
    assert plain.breakpoint is None and plain.window is None
    # Budgeted as the messages format is.
    assert plain.token_count == client.get_history(sid, format="messages").token_count

    client.put_summary(sid, "Asked three questions.", 1)
    marked = client.get_history(sid, format="anthropic", summary=True, cache_control=True)
    assert marked.anthropic is not None
    assert marked.anthropic["system"] == [
        {
            "type": "text",
            "text": SUMMARY_MESSAGE_PREFIX + "Asked three questions.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    listed = marked.anthropic["messages"]
    assert [m["role"] for m in listed] == ["user", "assistant"] * 2
    # The one mark of the messages: on the last block of the last message.
    assert listed[-1]["content"] == [
        {"type": "text", "text": "answer 3", "cache_control": {"type": "ephemeral"}}
    ]
    assert all("cache_control" not in b for m in listed[:-1] for b in m["content"])
    assert marked.breakpoint == Breakpoint(seq=3, messages=4)

    # An empty history: no messages, no breakpoint.
    empty = client.get_history(new_id(), format="anthropic", cache_control=True)
    assert empty.anthropic == {"messages": []} and empty.breakpoint is None


def test_anthropic_request_appends_the_question(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "What is HNSW?", "A graph index.")
    history = client.get_history(sid, format="anthropic", cache_control=True)
    request = history.anthropic_request("And IVF?")
    assert request == {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is HNSW?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "text",
                        "text": "A graph index.",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "And IVF?"}]},
        ]
    }
    # Fresh dicts: changing the request leaves the history as it was.
    request["messages"][0]["content"][0]["text"] = "changed"
    assert history.anthropic is not None
    assert history.anthropic["messages"][0]["content"][0]["text"] == "What is HNSW?"
    assert len(history.anthropic["messages"]) == 2

    # A system prompt goes first, before the summary's block; "" is none.
    client.put_summary(sid, "Asked about HNSW.", 1)
    finished_turn(client, sid, "And IVF?", "Clusters.")
    started = client.start_turn(
        "Which is faster?",
        session_id=sid,
        history=HistoryOptions(format="anthropic", summary=True),
    )
    assert started.history is not None
    request = started.history.anthropic_request("Which is faster?", system="Be brief.")
    assert request["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": SUMMARY_MESSAGE_PREFIX + "Asked about HNSW."},
    ]
    assert [m["content"][0]["text"] for m in request["messages"]] == [
        "And IVF?",
        "Clusters.",
        "Which is faster?",
    ]
    no_summary = client.get_history(sid, format="anthropic")
    assert "system" not in no_summary.anthropic_request("q", system="")
    client.abort_turn(sid, started.turn_id)

    # Other formats have no request to build.
    with pytest.raises(ValueError, match="format='anthropic'"):
        client.get_history(sid, format="messages").anthropic_request("q")


def test_invalid_combinations_are_validation_errors(client: Client) -> None:
    sid = new_id()
    cases = [
        (HistoryOptions(stride=3), "stride"),
        (HistoryOptions(window="stable", stride=0), "stride"),
        (HistoryOptions(window="stable", stride=10_001), "stride"),
        (HistoryOptions(cache_control=True), "cache_control"),
        (HistoryOptions(format="messages", cache_control=True), "cache_control"),
        (HistoryOptions(format="anthropic", template="xml"), "format"),
        (HistoryOptions(window=cast(WindowKind, "fixed")), "window"),
    ]
    for options, field in cases:
        with pytest.raises(ValidationError) as info:
            client.get_history(sid, options)
        assert (info.value.status, info.value.code) == (422, "validation_failed")
        assert field in [e.field for e in info.value.errors], options

    # In a start the fields are named under `history.`, and nothing is written.
    with pytest.raises(ValidationError) as info:
        client.start_turn("q", session_id=sid, history=HistoryOptions(stride=2))
    assert [e.field for e in info.value.errors] == ["history.stride"]
    assert client.get_history(sid).total_turns == 0
    assert client.get_history(sid).pending_turns == 0


def test_options_encoding() -> None:
    options = HistoryOptions(format="anthropic", cache_control=True, window="stable", stride=4)
    assert options.to_params() == {
        "format": "anthropic",
        "cache_control": "true",
        "window": "stable",
        "stride": 4,
    }
    assert options.to_json() == {
        "format": "anthropic",
        "cache_control": True,
        "window": "stable",
        "stride": 4,
    }


def test_a_history_with_windows_and_blocks_parses() -> None:
    data: Dict[str, Any] = {
        "session_id": "s",
        "user_id": None,
        "format": "anthropic",
        "encoding": "o200k_base",
        "token_count": 9,
        "total_turns": 1,
        "included_turns": 1,
        "omitted_turns": 0,
        "pending_turns": 0,
        "stopped_by": None,
        "unsummarized": None,
        "generation": "g",
        "anthropic": {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "q", "extra": 1}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
                    ],
                },
            ]
        },
        "window": {"stride": 10, "from_seq": None, "left_out": 0},
        "breakpoint": {"seq": 1, "messages": 2},
    }
    history = History.from_json(data)
    assert history.anthropic == {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}],
            },
        ]
    }
    assert history.window == HistoryWindow(stride=10, from_seq=None, left_out=0)
    assert history.breakpoint == Breakpoint(seq=1, bytes=None, messages=2)
    for key in ("anthropic", "window", "breakpoint"):
        del data[key]
    bare = History.from_json({**data, "format": "text", "rendered": ""})
    assert (bare.anthropic, bare.window, bare.breakpoint) == (None, None, None)
    with pytest.raises(ValueError, match="format='anthropic'"):
        bare.anthropic_request("q")


async def test_the_async_client_reads_windows_and_requests(aclient: AsyncClient) -> None:
    sid = new_id()
    for n in range(1, 7):
        started = await aclient.start_turn(f"question {n}", session_id=sid)
        await aclient.finalize_turn(sid, started.turn_id, f"answer {n}")
    history = await aclient.get_history(
        sid, format="anthropic", limit=5, window="stable", stride=3, cache_control=True
    )
    assert history.window == HistoryWindow(stride=3, from_seq=4, left_out=2)
    assert history.breakpoint == Breakpoint(seq=6, messages=6)
    request: AnthropicHistory = history.anthropic_request("question 7")
    assert request["messages"][0]["content"][0]["text"] == "question 4"
    assert request["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "question 7"}],
    }
    text = await aclient.get_history_text(sid, limit=5, window="stable", stride=3)
    assert text.text.startswith("### Conversation history:\nUser: question 4\n")
    with pytest.raises(ValidationError) as info:
        await aclient.get_history(sid, cache_control=True)
    assert [e.field for e in info.value.errors] == ["cache_control"]
