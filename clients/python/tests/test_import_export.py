"""Import of transcripts and streamed export of a user's sessions, against
the real server; the stream's edge cases (cuts, chunking, endless bodies)
also against stand-in transports."""

from __future__ import annotations

import json
import socket
import time
from typing import Dict, Iterator, List, Optional

import httpx
import pytest
from support import Server, finished_turn, new_id

from turnstore import (
    Client,
    ExportedSession,
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


def test_an_export_is_retried_until_its_answer_begins() -> None:
    with _client(Body(iter([_line("s-1")])), statuses=[503, 503]) as client:
        assert [s.session_id for s in client.export_user("u-1")] == ["s-1"]
