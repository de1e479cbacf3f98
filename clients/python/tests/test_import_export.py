"""Import of transcripts and streamed export of a user's sessions, against
the real server; the stream's edge cases (cuts, chunking, endless bodies)
also against stand-in transports."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support import Server, finished_turn, new_id, transcript_fixture

from turnstore import (
    Client,
    DroppedReport,
    ExportedMessage,
    ExportedSession,
    ExportedTranscript,
    ExportIncompleteError,
    ForbiddenError,
    Message,
    NotFoundError,
    PayloadTooLargeError,
    TurnstoreError,
    ValidationError,
)


def transcript(pairs: int, prefix: str = "") -> List[Message]:
    messages: List[Message] = []
    for n in range(1, pairs + 1):
        messages.append({"role": "user", "content": f"{prefix}q{n}"})
        messages.append({"role": "assistant", "content": f"{prefix}a{n}"})
    return messages


# --- import ----------------------------------------------------------------


def test_an_import_appends_finalized_turns(client: Client) -> None:
    sid, user = new_id(), new_id("user")
    result = client.import_messages(sid, transcript(3), user_id=user)
    assert (result.session_id, result.user_id) == (sid, user)
    assert (result.imported_turns, result.first_seq, result.last_seq) == (3, 1, 3)
    assert result.replayed is False
    assert result.dropped is None  # a strict import reports no drops

    history = client.get_history(sid, format="turns")
    assert history.turns is not None
    assert [(t.seq, t.user_query, t.final_answer) for t in history.turns] == [
        (1, "q1", "a1"),
        (2, "q2", "a2"),
        (3, "q3", "a3"),
    ]
    assert history.user_id == user
    session = client.get_session(sid)
    assert (session.turn_count, session.pending_count) == (3, 0)


def test_an_import_takes_the_seqs_after_started_turns(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "live q", "live a")
    pending = client.start_turn("in flight", session_id=sid)
    result = client.import_messages(sid, transcript(2, "old "))
    assert (result.first_seq, result.last_seq) == (pending.seq + 1, pending.seq + 2)
    assert result.user_id is None
    client.finalize_turn(sid, pending.turn_id, "done")
    turns = client.get_history(sid, format="turns").turns
    assert turns is not None
    assert [t.user_query for t in turns] == ["live q", "in flight", "old q1", "old q2"]


def test_an_import_is_replayed_with_its_idempotency_key(client: Client) -> None:
    sid, key = new_id(), new_id("key")
    first = client.import_messages(sid, transcript(2), idempotency_key=key)
    again = client.import_messages(sid, transcript(2), idempotency_key=key)
    assert again.replayed is True and first.replayed is False
    assert (again.imported_turns, again.first_seq, again.last_seq) == (2, 1, 2)
    assert client.get_session(sid).turn_count == 2  # imported once

    with pytest.raises(ValidationError) as info:
        client.import_messages(sid, transcript(3), idempotency_key=key)
    assert info.value.code == "idempotency_key_reused"
    # A start's keys and an import's are apart.
    with pytest.raises(ValidationError) as info:
        client.start_turn("q", session_id=sid, idempotency_key=key)
    assert info.value.code == "idempotency_key_reused"
    # Without a key of their own, two imports are two imports.
    client.import_messages(sid, transcript(1))
    client.import_messages(sid, transcript(1))
    assert client.get_session(sid).turn_count == 4


def test_invalid_messages_are_named_by_their_index(client: Client) -> None:
    sid = new_id()
    messages: List[Dict[str, str]] = [
        {"role": "user", "content": "q1"},
        {"role": "system", "content": "You are a bot."},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "   "},
        {"role": "assistant", "content": "a3"},
        {"role": "assistant", "content": "a4"},
        {"role": "user", "content": "q5"},
    ]
    with pytest.raises(ValidationError) as info:
        client.import_messages(sid, messages)
    error = info.value
    assert (error.status, error.code) == (422, "validation_failed")
    fields = [e.field for e in error.errors]
    assert fields == [
        "messages[1].role",
        "messages[4].content",
        "messages[6].role",
        "messages[7].role",
    ]
    assert all(e.message for e in error.errors)
    with pytest.raises(NotFoundError):  # all or nothing
        client.get_session(sid)


def test_a_user_message_without_its_answer(client: Client) -> None:
    with pytest.raises(ValidationError) as info:
        client.import_messages(new_id(), [*transcript(2), {"role": "user", "content": "q3"}])
    assert [e.field for e in info.value.errors] == ["messages[4]"]


def test_messages_are_sent_as_given(client: Client) -> None:
    # The client does not filter messages: the server names what is wrong.
    with pytest.raises(ValidationError) as info:
        client.import_messages(
            new_id(), [{"role": "user", "content": "q"}, {"role": "assistant", "name": "bot"}]
        )
    assert [e.field for e in info.value.errors] == ["messages[1].name"]
    with pytest.raises(ValidationError) as info:
        client.import_messages(new_id(), [])
    assert [e.field for e in info.value.errors] == ["messages"]


def test_a_content_over_its_limit(client: Client) -> None:
    messages = [*transcript(1), {"role": "user", "content": "x" * 40_000}, *transcript(1)]
    with pytest.raises(PayloadTooLargeError) as info:
        client.import_messages(new_id(), messages)
    assert "messages[2].content" in info.value.detail


def test_an_import_claims_and_respects_the_owner(client: Client) -> None:
    sid = new_id()
    client.import_messages(sid, transcript(1), user_id="alice")
    with pytest.raises(ForbiddenError):
        client.import_messages(sid, transcript(1), user_id="mallory")
    assert client.import_messages(sid, transcript(1)).user_id == "alice"


# --- distilled import (mode="distill") ----------------------------------------

# Transcripts as the OpenAI and Anthropic SDKs' agent loops write them (the
# server's own fixtures: tests/api/distill.rs holds it to the same results).
OPENAI_LOOP = "openai_agent_loop.json"
ANTHROPIC_LOOP = "anthropic_tool_loop.json"

OPENAI_DROPPED = [
    DroppedReport("instructions", 2, [0, 1]),
    DroppedReport("tool_result", 4, [4, 9, 10, 14]),
    DroppedReport("tool_call", 2, [3, 8]),
    DroppedReport("refusal", 1, [13]),
    DroppedReport("non_text", 3, [2, 7, 16]),
    DroppedReport("unanswered", 1, [16]),
]
ANTHROPIC_DROPPED = [
    DroppedReport("tool_result", 2, [2, 5]),
    DroppedReport("tool_call", 2, [1, 5]),
    DroppedReport("thinking", 2, [1, 5]),
    DroppedReport("non_text", 1, [4]),
    DroppedReport("superseded", 1, [1]),
]


def kept(client: Client, session_id: str) -> List[Tuple[str, str]]:
    """Every turn of the session, as (question, answer)."""
    turns = client.get_history(session_id, format="turns", limit=1000).turns
    assert turns is not None
    return [(t.user_query, t.final_answer) for t in turns]


def test_an_openai_agent_loop_keeps_its_questions_and_final_answers(client: Client) -> None:
    sid, user = new_id(), new_id("user")
    result = client.import_messages(
        sid, transcript_fixture(OPENAI_LOOP), user_id=user, mode="distill"
    )
    assert (result.session_id, result.user_id) == (sid, user)
    assert (result.imported_turns, result.first_seq, result.last_seq) == (3, 1, 3)
    assert result.replayed is False
    assert result.dropped == OPENAI_DROPPED
    assert kept(client, sid) == [
        (
            "How do I rotate an API key?",
            "Open Settings > API keys and choose Rotate; the old key keeps working for 24 hours.",
        ),
        (
            "And if it leaked?\n\nIt was in a public repository.",
            "Revoke it at once (done),\n\nthen audit the usage log for the last 24 hours.",
        ),
        ("Can you show me the key?", "I can't show secrets; rotate it again to get a new one."),
    ]
    # Nothing else was kept: the unanswered last question is no pending turn.
    session = client.get_session(sid)
    assert (session.turn_count, session.pending_count) == (3, 0)


def test_an_anthropic_tool_loop_keeps_its_questions_and_final_answers(client: Client) -> None:
    sid = new_id()
    result = client.import_messages(sid, transcript_fixture(ANTHROPIC_LOOP), mode="distill")
    assert (result.imported_turns, result.first_seq, result.last_seq) == (2, 1, 2)
    assert result.dropped == ANTHROPIC_DROPPED
    assert kept(client, sid) == [
        ("What's the weather like in San Francisco?", "It's 15 °C in San Francisco, with fog."),
        (
            "Is this the Golden Gate Bridge?",
            "Yes: the Golden Gate Bridge, seen from the Marin side.",
        ),
    ]
    # Strict pairs distil to themselves, and nothing is dropped: [], not None.
    plain = client.import_messages(new_id(), transcript(2), mode="distill")
    assert (plain.imported_turns, plain.dropped) == (2, [])


def test_openai_sdk_messages_are_accepted_as_typed(client: Client) -> None:
    # The OpenAI SDK's own message type is a Mapping[str, object]: no cast.
    messages: List[ChatCompletionMessageParam] = [
        {"role": "developer", "content": "Answer in one sentence."},
        {"role": "user", "content": [{"type": "text", "text": "What is HNSW?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "HNSW"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a layered proximity graph"},
        {"role": "assistant", "content": "A layered graph for nearest-neighbour search."},
    ]
    sid = new_id()
    result = client.import_messages(sid, messages, mode="distill")
    assert result.dropped == [
        DroppedReport("instructions", 1, [0]),
        DroppedReport("tool_result", 1, [3]),
        DroppedReport("tool_call", 1, [2]),
    ]
    assert kept(client, sid) == [("What is HNSW?", "A layered graph for nearest-neighbour search.")]


def test_a_distilled_import_is_replayed_with_its_report(client: Client) -> None:
    sid, key = new_id(), new_id("key")
    messages = transcript_fixture(ANTHROPIC_LOOP)
    first = client.import_messages(sid, messages, idempotency_key=key, mode="distill")
    again = client.import_messages(sid, messages, idempotency_key=key, mode="distill")
    assert (first.replayed, again.replayed) == (False, True)
    assert again == dataclasses.replace(first, replayed=True)
    assert again.dropped == ANTHROPIC_DROPPED
    assert client.get_session(sid).turn_count == 2  # imported once
    # The same key with other messages is another request.
    with pytest.raises(ValidationError) as info:
        client.import_messages(sid, messages[:-1], idempotency_key=key, mode="distill")
    assert info.value.code == "idempotency_key_reused"


def test_a_strict_import_sends_no_mode() -> None:
    """What a strict import sends is what it sent before modes existed: no
    ``mode``; a distilled import sends ``mode: "distill"``."""
    bodies: List[Dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        answer = {"session_id": "s", "user_id": None, "imported_turns": 1, "first_seq": 1}
        return httpx.Response(201, json={**answer, "last_seq": 1})

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as mocked:
        assert mocked.import_messages("s", transcript(1)).dropped is None
        mocked.import_messages("s", transcript(1), user_id="u", mode="strict")
        mocked.import_messages("s", transcript(1), mode="distill")
    assert bodies == [
        {"messages": transcript(1)},
        {"messages": transcript(1), "user_id": "u"},
        {"messages": transcript(1), "mode": "distill"},
    ]


def test_timestamps_become_the_turns_times(client: Client) -> None:
    sid = new_id()
    messages = [
        {"role": "system", "content": "Be brief.", "timestamp": "2026-11-20T08:59:00Z"},
        {"role": "user", "content": "Hello?", "timestamp": "2026-11-20T09:00:00Z"},
        {"role": "assistant", "content": "Hi!", "timestamp": "2026-11-20T10:00:04.250+01:00"},
        {"role": "user", "content": "Bye.", "timestamp": "2026-11-20T09:05:00Z"},
        {"role": "assistant", "content": "Goodbye.", "timestamp": "2026-11-20T09:05:00.5Z"},
    ]
    result = client.import_messages(sid, messages, mode="distill")
    assert result.dropped == [DroppedReport("instructions", 1, [0])]
    turns = client.get_history(sid, format="turns").turns
    assert turns is not None

    def at(hour: int, minute: int, second: int, ms: int = 0) -> datetime:
        return datetime(2026, 11, 20, hour, minute, second, ms * 1000, tzinfo=timezone.utc)

    assert [(t.user_query, t.started_at, t.finalized_at) for t in turns] == [
        ("Hello?", at(9, 0, 0), at(9, 0, 4, 250)),
        ("Bye.", at(9, 5, 0), at(9, 5, 0, 500)),
    ]
    # Times given for one exchange only: named, and nothing is written.
    sid = new_id()
    with pytest.raises(ValidationError) as info:
        client.import_messages(
            sid,
            [
                {"role": "user", "content": "q1", "timestamp": "2026-11-20T09:00:00Z"},
                {"role": "assistant", "content": "a1", "timestamp": "2026-11-20T09:00:01Z"},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"},
            ],
            mode="distill",
        )
    assert "messages[2].timestamp" in [e.field for e in info.value.errors]
    with pytest.raises(NotFoundError):
        client.get_session(sid)


def test_a_malformed_distilled_transcript_is_named_by_index(client: Client) -> None:
    sid = new_id()
    with pytest.raises(ValidationError) as info:
        client.import_messages(
            sid,
            [
                {"content": "no role"},
                {"role": "user", "content": 42},
                {"role": "wizard", "content": "hi"},
                {"role": "user", "content": [{"text": "no type"}]},
                {"role": "user", "content": [{"type": "text"}]},
            ],
            mode="distill",
        )
    error = info.value
    assert (error.status, error.code) == (422, "validation_failed")
    assert [e.field for e in error.errors] == [
        "messages[0].role",
        "messages[1].content",
        "messages[2].role",
        "messages[3].content",
        "messages[4].content",
    ]
    assert all(e.message for e in error.errors)
    # Nothing to import (instructions, and a question without its answer).
    with pytest.raises(ValidationError) as info:
        client.import_messages(
            sid,
            [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            mode="distill",
        )
    assert [e.field for e in info.value.errors] == ["messages"]
    with pytest.raises(NotFoundError):  # all or nothing
        client.get_session(sid)
    # Strict mode still refuses what distill reads; an unknown mode is named.
    with pytest.raises(ValidationError) as info:
        client.import_messages(sid, transcript_fixture(ANTHROPIC_LOOP)[:2])
    assert [e.field for e in info.value.errors] == ["messages[1].content"]
    with pytest.raises(ValidationError) as info:
        client.import_messages(sid, transcript(1), mode="fuzzy")  # type: ignore[arg-type]
    assert [e.field for e in info.value.errors] == ["mode"]


# --- export ----------------------------------------------------------------


def test_an_export_holds_every_session_in_list_order(client: Client) -> None:
    user, other = new_id("user"), new_id("user")
    sids = [new_id() for _ in range(4)]
    client.import_messages(sids[0], transcript(3, "zero "), user_id=user)
    client.put_summary(sids[0], "the first two", 2)
    started = client.start_turn("Wie?", session_id=sids[1], user_id=user, user_query_en="How?")
    client.finalize_turn(sids[1], started.turn_id, "So.", final_answer_en="Like so.")
    client.start_turn("pending, not exported", session_id=sids[1])
    client.start_turn("only pending", session_id=sids[2], user_id=user)
    client.import_messages(sids[3], transcript(300, "big "), user_id=user)  # several pages
    client.import_messages(new_id(), transcript(1), user_id=other)

    with client.export_user(user) as export:
        sessions = list(export)
    assert export.sessions == 4
    listed = [s.session_id for s in client.iter_user_sessions(user)]
    assert [s.session_id for s in sessions] == listed
    assert sorted(listed) == sorted(sids)

    by_id = {s.session_id: s for s in sessions}
    first = by_id[sids[0]]
    assert [(t.seq, t.user_query, t.final_answer) for t in first.turns] == [
        (1, "zero q1", "zero a1"),
        (2, "zero q2", "zero a2"),
        (3, "zero q3", "zero a3"),
    ]
    assert first.summary is not None
    assert (first.summary.summary, first.summary.through_seq) == ("the first two", 2)
    second = by_id[sids[1]]
    assert [(t.user_query, t.user_query_en, t.final_answer_en) for t in second.turns] == [
        ("Wie?", "How?", "Like so.")
    ]
    assert second.summary is None
    assert by_id[sids[2]].turns == []
    big = by_id[sids[3]].turns
    assert [t.seq for t in big] == list(range(1, 301))
    assert big[-1].user_query == "big q300"
    info = client.get_session(sids[1])
    assert (second.created_at, second.last_active_at) == (info.created_at, info.last_active_at)


def test_an_unknown_user_has_an_empty_export(client: Client) -> None:
    assert list(client.export_user(new_id("user"))) == []


def test_export_errors_are_raised_when_the_stream_opens(client: Client) -> None:
    export = client.export_user("not/valid")
    with pytest.raises(ValidationError) as info:
        next(iter(export))
    assert [e.field for e in info.value.errors] == ["user_id"]
    with pytest.raises(ValidationError):
        with client.export_user("not/valid"):
            pass


def test_leaving_an_export_early_releases_it(client: Client) -> None:
    user = new_id("user")
    for _ in range(3):
        client.import_messages(new_id(), transcript(2), user_id=user)
    with client.export_user(user) as export:
        first = next(export)
    assert first.turns and export.sessions == 1
    assert list(export) == []  # closed
    assert len(list(client.export_user(user))) == 3


# --- export as transcripts (format=messages) ------------------------------------


def _at(minute: int, second: int, ms: int = 0) -> datetime:
    return datetime(2026, 11, 20, 9, minute, second, ms * 1000, tzinfo=timezone.utc)


def test_an_export_as_transcripts_holds_every_session_as_messages(client: Client) -> None:
    user = new_id("user")
    timed, live, pending_only = new_id(), new_id(), new_id()
    client.import_messages(
        timed,
        [
            {"role": "user", "content": "Hello?", "timestamp": "2026-11-20T09:00:00Z"},
            {"role": "assistant", "content": "Hi.", "timestamp": "2026-11-20T09:00:04.250Z"},
            {"role": "user", "content": "Bye.", "timestamp": "2026-11-20T10:05:00+01:00"},
            {"role": "assistant", "content": "Goodbye.", "timestamp": "2026-11-20T09:05:00.5Z"},
        ],
        user_id=user,
        mode="distill",
    )
    summary = client.put_summary(timed, "Greetings.", 1)
    started = client.start_turn("Wie?", session_id=live, user_id=user, user_query_en="How?")
    client.finalize_turn(live, started.turn_id, "So.", final_answer_en="Like so.")
    client.start_turn("pending, not exported", session_id=live)
    client.start_turn("only pending", session_id=pending_only, user_id=user)

    with client.export_transcripts(user) as export:
        transcripts = list(export)
    assert export.sessions == 3
    assert all(isinstance(t, ExportedTranscript) for t in transcripts)
    # The sessions of the default export, in its order, with the same times.
    sessions = list(client.export_user(user))
    assert [t.session_id for t in transcripts] == [s.session_id for s in sessions]
    for transcript, session in zip(transcripts, sessions):
        assert (transcript.created_at, transcript.last_active_at, transcript.summary) == (
            session.created_at,
            session.last_active_at,
            session.summary,
        )
        assert transcript.messages == [
            message
            for t in session.turns
            for message in (
                ExportedMessage("user", t.user_query, t.started_at),
                ExportedMessage("assistant", t.final_answer, t.finalized_at),
            )
        ]
    by_id = {t.session_id: t for t in transcripts}
    assert by_id[timed].summary == summary
    assert by_id[timed].messages == [
        ExportedMessage("user", "Hello?", _at(0, 0)),
        ExportedMessage("assistant", "Hi.", _at(0, 4, 250)),
        ExportedMessage("user", "Bye.", _at(5, 0)),
        ExportedMessage("assistant", "Goodbye.", _at(5, 0, 500)),
    ]
    assert by_id[timed].messages[1].to_json() == {
        "role": "assistant",
        "content": "Hi.",
        "timestamp": "2026-11-20T09:00:04.250Z",
    }
    # The originals, not the English copies; no summary, no messages.
    assert [(m.role, m.content) for m in by_id[live].messages] == [
        ("user", "Wie?"),
        ("assistant", "So."),
    ]
    assert by_id[live].summary is None
    assert by_id[pending_only].messages == []
    assert list(client.export_transcripts(new_id("user"))) == []


def test_a_transcript_export_imports_back_as_it_was(client: Client) -> None:
    user, copies = new_id("user"), new_id("user")
    originals = [new_id(), new_id()]
    client.import_messages(
        originals[0],
        [
            {"role": "user", "content": "q1", "timestamp": "2026-11-20T09:00:00Z"},
            {"role": "assistant", "content": "a1", "timestamp": "2026-11-20T09:00:01.5Z"},
            {"role": "user", "content": "q2", "timestamp": "2026-11-20T09:01:00.001Z"},
            {"role": "assistant", "content": "a2", "timestamp": "2026-11-20T09:01:00.001Z"},
        ],
        user_id=user,
        mode="distill",
    )
    for n in (1, 2, 3):  # live turns, one of them regenerated
        started = client.start_turn(f"live q{n}", session_id=originals[1], user_id=user)
        client.finalize_turn(originals[1], started.turn_id, f"live a{n}")
    client.regenerate_turn(originals[1], started.turn_id, "live a3, again")

    def turns(session_id: str) -> List[Tuple[str, str, datetime, datetime]]:
        found = client.get_history(session_id, format="turns", limit=1000).turns
        assert found is not None
        return [(t.user_query, t.final_answer, t.started_at, t.finalized_at) for t in found]

    copied: Dict[str, str] = {}
    with client.export_transcripts(user) as export:
        for transcript in export:
            copy = new_id()
            messages = [m.to_json() for m in transcript.messages]
            result = client.import_messages(copy, messages, user_id=copies, mode="distill")
            assert (result.imported_turns, result.dropped) == (len(messages) // 2, [])
            copied[transcript.session_id] = copy
    assert sorted(copied) == sorted(originals)
    for original, copy in copied.items():
        assert turns(copy) == turns(original)
    assert turns(copied[originals[1]])[-1][:2] == ("live q3", "live a3, again")


@pytest.fixture
def slow_reader(export_cut_server: Server) -> Iterator[Client]:
    """A client whose socket buffers little (so the server's writes block
    as soon as the client stops reading)."""
    transport = httpx.HTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)]
    )
    with Client(export_cut_server.url, transport=transport) as c:
        yield c


def test_an_export_cut_by_the_server_raises(slow_reader: Client) -> None:
    # 24 sessions of about 800 KiB: far more than the server's channel and
    # the sockets hold, so while the reader sleeps the export cannot end
    # before the server's TURNSTORE_EXPORT_TIMEOUT (300ms) and is cut.
    user = new_id("user")
    answer = " ".join(["vector index query answer"] * 650)  # ~16 KiB
    messages: List[Message] = []
    for n in range(48):
        messages.append({"role": "user", "content": f"q{n}"})
        messages.append({"role": "assistant", "content": answer})
    for _ in range(24):
        slow_reader.import_messages(new_id(), messages, user_id=user)

    received: List[ExportedSession] = []
    with pytest.raises(ExportIncompleteError) as info:
        with slow_reader.export_user(user) as export:
            for session in export:
                received.append(session)
                if len(received) == 1:
                    time.sleep(1.0)
    error = info.value
    assert 1 <= len(received) < 24
    assert all(len(s.turns) == 48 and s.turns[-1].final_answer == answer for s in received)
    assert (error.status, error.code, error.sessions) == (200, "export_incomplete", len(received))
    assert isinstance(error, TurnstoreError) and error.request_id
    assert isinstance(error.__cause__, httpx.TransportError)


# --- the stream's edge cases, against stand-in transports --------------------


def _line(sid: str, turns: int = 1) -> bytes:
    session = {
        "session_id": sid,
        "created_at": "2026-11-25T10:15:30.123Z",
        "last_active_at": "2026-11-25T10:17:02.481Z",
        "turns": [
            {
                "turn_id": f"0193a6f4-5c2e-7b1a-9a41-2f6d8e0c4b{n:02d}",
                "seq": n,
                "user_query": f"q{n}",
                "final_answer": f"a{n}",
                "started_at": "2026-11-25T10:15:30.123Z",
                "finalized_at": "2026-11-25T10:15:32.456Z",
                "truncated": False,
            }
            for n in range(1, turns + 1)
        ],
    }
    return json.dumps(session).encode() + b"\n"


class Body(httpx.SyncByteStream):
    """A response body sent in the given chunks, then failing with
    ``error`` (a cut connection) if given."""

    def __init__(self, chunks: Iterator[bytes], error: Optional[Exception] = None) -> None:
        self.chunks = chunks
        self.error = error
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True


def _client(*bodies: Body, statuses: Optional[List[int]] = None) -> Client:
    queue = list(bodies)
    codes = list(statuses or [])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/users/u-1/export"
        assert request.headers["accept"] == "application/x-ndjson"
        status = codes.pop(0) if codes else 200
        if status != 200:
            return httpx.Response(status, json={"code": "overloaded", "status": status})
        return httpx.Response(
            200, stream=queue.pop(0), headers={"content-type": "application/x-ndjson"}
        )

    return Client(
        "http://turnstore.test", transport=httpx.MockTransport(handler), initial_backoff=0.001
    )


def test_a_body_without_its_last_newline_is_a_cut_export() -> None:
    complete = _line("s-1") + _line("s-2")
    cut = _line("s-3")[:-20]
    with _client(Body(iter([complete + cut]))) as client:
        received: List[str] = []
        with pytest.raises(ExportIncompleteError) as info:
            for session in client.export_user("u-1"):
                received.append(session.session_id)
    assert received == ["s-1", "s-2"]
    assert info.value.sessions == 2
    assert "middle of a line" in info.value.detail
    assert info.value.__cause__ is None


def test_a_connection_broken_mid_body_is_a_cut_export() -> None:
    body = Body(iter([_line("s-1"), _line("s-2")[:30]]), httpx.ReadError("reset by peer"))
    with _client(body) as client:
        export = client.export_user("u-1")
        assert next(export).session_id == "s-1"
        with pytest.raises(ExportIncompleteError) as info:
            next(export)
    assert isinstance(info.value.__cause__, httpx.ReadError)
    assert info.value.sessions == 1
    assert body.closed
    assert list(export) == []


def test_lines_are_joined_across_chunks_of_any_size() -> None:
    data = _line("s-1", 3) + b"\n" + _line("s-2") + _line("s-3", 2)
    for size in (1, 7, 64, len(data)):
        chunks = iter([data[i : i + size] for i in range(0, len(data), size)])
        with _client(Body(chunks)) as client:
            sessions = list(client.export_user("u-1"))
        assert [s.session_id for s in sessions] == ["s-1", "s-2", "s-3"]
        assert [len(s.turns) for s in sessions] == [3, 1, 2]


def test_an_export_is_read_as_it_arrives() -> None:
    # An endless body: reading it whole would never return, so the body
    # fails the test if it is read far ahead of what was asked for.
    def endless() -> Iterator[bytes]:
        n = 0
        while True:
            n += 1
            assert n < 100, "the client reads ahead of its consumer"
            yield _line(f"s-{n}")

    body = Body(endless())
    with _client(body) as client:
        with client.export_user("u-1") as export:
            firsts = [next(export).session_id for _ in range(3)]
    assert firsts == ["s-1", "s-2", "s-3"]
    assert body.closed


def test_a_line_that_is_not_a_session_is_an_unexpected_response() -> None:
    with _client(Body(iter([_line("s-1"), b"<html>proxy</html>\n"]))) as client:
        with pytest.raises(TurnstoreError) as info:
            list(client.export_user("u-1"))
    assert info.value.code == "unexpected_response"
    assert not isinstance(info.value, ExportIncompleteError)


def _transcript_line(sid: str) -> bytes:
    at = "2026-11-25T10:15:30.123Z"
    message = {"role": "user", "content": "q1", "timestamp": at}
    answer = {"role": "assistant", "content": "a1", "timestamp": "2026-11-25T10:15:32.4567Z"}
    line = {
        "session_id": sid,
        "created_at": at,
        "last_active_at": at,
        "messages": [message, answer],
        "future_field": True,
    }
    return json.dumps(line).encode() + b"\n"


def test_an_export_asks_for_its_format_and_reads_its_own_lines() -> None:
    queries: List[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        queries.append(str(request.url.query, "ascii"))
        body = _transcript_line("s-1") if request.url.params.get("format") else _line("s-1")
        return httpx.Response(200, content=body, headers={"content-type": "application/x-ndjson"})

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        (session,) = list(client.export_user("u-1"))
        (transcript,) = list(client.export_transcripts("u-1"))
    # A session export is the request it was: no format parameter.
    assert queries == ["", "format=messages"]
    assert isinstance(session, ExportedSession) and isinstance(transcript, ExportedTranscript)
    contents = [(m.role, m.content) for m in transcript.messages]
    assert contents == [("user", "q1"), ("assistant", "a1")]
    assert transcript.messages[1].timestamp == datetime(
        2026, 11, 25, 10, 15, 32, 456700, tzinfo=timezone.utc
    )
    assert transcript.messages[1].to_json()["timestamp"] == "2026-11-25T10:15:32.456700Z"
    assert transcript.summary is None


def test_a_session_line_in_a_transcript_export_is_an_unexpected_response() -> None:
    with _client(Body(iter([_line("s-1")]))) as client:
        with pytest.raises(TurnstoreError) as info:
            list(client.export_transcripts("u-1"))
    assert info.value.code == "unexpected_response"
    assert "line 1" in info.value.detail and "transcript" in info.value.detail
    with _client(Body(iter([_transcript_line("s-1"), _transcript_line("s-2")[:-9]]))) as client:
        received: List[str] = []
        with pytest.raises(ExportIncompleteError) as cut:
            for transcript in client.export_transcripts("u-1"):
                received.append(transcript.session_id)
    assert (received, cut.value.sessions) == (["s-1"], 1)


def test_an_export_is_retried_until_its_answer_begins() -> None:
    with _client(Body(iter([_line("s-1")])), statuses=[503, 503]) as client:
        assert [s.session_id for s in client.export_user("u-1")] == ["s-1"]
