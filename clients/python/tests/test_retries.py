"""Retries against the real server, through transports that lose responses,
refuse connections or answer 503 on purpose."""

from __future__ import annotations

import json
import uuid
from typing import Callable, Iterator, List, Optional

import httpx
import pytest
from support import LOSE, REFUSE, UNAVAILABLE, ScriptedTransport, Server, finished_turn, new_id

from turnstore import (
    Client,
    ConnectionFailedError,
    NotFoundError,
    RetryPolicy,
    SummaryConflictError,
    UnavailableError,
    ValidationError,
)


@pytest.fixture
def transport() -> ScriptedTransport:
    return ScriptedTransport()


@pytest.fixture
def flaky(server: Server, transport: ScriptedTransport) -> Iterator[Client]:
    """A client whose requests go through ``transport``."""
    with Client(
        server.url, transport=transport, max_retries=3, initial_backoff=0.001, max_backoff=0.01
    ) as c:
        yield c


def _sent(transport: ScriptedTransport, header: str) -> List[str]:
    return [r.headers[header] for r in transport.requests]


def test_a_start_whose_response_was_lost_is_replayed(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    transport.script = [LOSE]
    started = flaky.start_turn("q", session_id=sid, user_id="alice")

    assert len(transport.requests) == 2
    keys = _sent(transport, "idempotency-key")
    assert keys[0] == keys[1] and uuid.UUID(keys[0]).version == 4
    assert len(set(_sent(transport, "x-request-id"))) == 1
    assert started.replayed is True
    assert started.seq == 1
    assert client.get_session(sid).pending_count == 1  # one turn, not two
    client.finalize_turn(sid, started.turn_id, "a")
    assert client.start_turn("next", session_id=sid).seq == 2


def test_a_start_without_session_id_is_retry_safe(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    transport.script = [LOSE, LOSE]
    started = flaky.start_turn("q")
    bodies = [json.loads(r.content) for r in transport.requests]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["session_id"] == started.session_id
    assert started.replayed is True
    assert client.get_session(started.session_id).pending_count == 1


def test_separate_starts_get_separate_keys(flaky: Client, transport: ScriptedTransport) -> None:
    sid = new_id()
    first = flaky.start_turn("same question", session_id=sid)
    second = flaky.start_turn("same question", session_id=sid)
    assert (first.seq, second.seq) == (1, 2)
    assert not second.replayed
    keys = _sent(transport, "idempotency-key")
    assert keys[0] != keys[1]


def test_a_lost_finalize_is_retried_to_the_same_turn(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    started = client.start_turn("q", session_id=sid)
    transport.script = [LOSE]
    turn = flaky.finalize_turn(sid, started.turn_id, "a")
    assert len(transport.requests) == 2
    assert (turn.turn_id, turn.seq, turn.final_answer) == (started.turn_id, 1, "a")
    assert client.get_history(sid).total_turns == 1


def test_a_lost_regenerate_is_retried_to_the_same_answer(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    (turn,) = client.get_history(sid, format="turns").turns or []
    transport.script = [LOSE]
    regenerated = flaky.regenerate_turn(sid, turn.turn_id, "b", final_answer_en="b (en)")
    assert [r.url.path.rsplit("/", 1)[-1] for r in transport.requests] == ["regenerate"] * 2
    assert transport.requests[0].content == transport.requests[1].content
    assert len(set(_sent(transport, "x-request-id"))) == 1
    assert (regenerated.seq, regenerated.final_answer, regenerated.final_answer_en) == (
        1,
        "b",
        "b (en)",
    )
    history = client.get_history(sid, format="turns")
    assert [t.final_answer for t in history.turns or []] == ["b"]


def test_a_lost_abort_counts_as_done(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    started = client.start_turn("q", session_id=sid)
    transport.script = [LOSE]
    flaky.abort_turn(sid, started.turn_id)  # the retry gets 404: already gone
    assert len(transport.requests) == 2
    assert client.get_session(sid).pending_count == 0


def test_an_abort_that_never_arrived_still_reports_unknown_turns(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    client.start_turn("q", session_id=sid)
    transport.script = [REFUSE]
    with pytest.raises(NotFoundError):
        flaky.abort_turn(sid, str(uuid.uuid4()))
    assert len(transport.requests) == 2


def test_refused_connections_and_503_are_retried(
    flaky: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    finished_turn(flaky, sid, "q", "a")
    transport.requests.clear()
    transport.script = [REFUSE, UNAVAILABLE]
    assert flaky.get_history(sid).total_turns == 1
    assert len(transport.requests) == 3


def test_retries_give_up_after_max_retries(server: Server) -> None:
    transport = ScriptedTransport([UNAVAILABLE] * 10)
    with Client(server.url, transport=transport, max_retries=2, initial_backoff=0.001) as c:
        with pytest.raises(UnavailableError) as info:
            c.clear_session(new_id())
    assert (info.value.status, info.value.code) == (503, "overloaded")
    assert len(transport.requests) == 3

    transport = ScriptedTransport([REFUSE] * 10)
    with Client(server.url, transport=transport, max_retries=0) as c:
        with pytest.raises(ConnectionFailedError):
            c.get_history(new_id())
    assert len(transport.requests) == 1


def test_errors_carry_the_request_id_the_client_sent(
    flaky: Client, transport: ScriptedTransport
) -> None:
    with pytest.raises(NotFoundError) as info:
        flaky.get_session(new_id())
    assert info.value.request_id == transport.requests[0].headers["x-request-id"]
    assert uuid.UUID(info.value.request_id).version == 4


def test_client_errors_are_never_retried(flaky: Client, transport: ScriptedTransport) -> None:
    with pytest.raises(ValidationError):
        flaky.start_turn("", session_id=new_id())
    with pytest.raises(NotFoundError):
        flaky.get_session(new_id())
    assert len(transport.requests) == 2


def test_backoff_is_jittered_and_bounded() -> None:
    policy = RetryPolicy(max_retries=5, initial_backoff=0.5, max_backoff=3.0)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (10, 3.0)]:
        waits = [policy.delay(retry) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1
    assert all(2.0 <= policy.delay(1, retry_after=2.0) <= 2.0 for _ in range(20))
    assert policy.delay(1, retry_after=60) == 3.0
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


def test_a_mocked_start_honours_replayed_header() -> None:
    # The replayed flag comes from the header alone, whatever the status.
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(
            200,
            headers={"Idempotent-Replayed": "true"},
            json={
                "session_id": body["session_id"],
                "turn_id": str(uuid.uuid4()),
                "seq": 7,
                "started_at": "2026-01-02T03:04:05.678Z",
            },
        )

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        started = client.start_turn("q", session_id="s-1")
    assert (started.seq, started.replayed, started.session_id) == (7, True, "s-1")


def test_a_lost_import_is_replayed_not_imported_twice(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    transport.script = [LOSE, LOSE]
    result = flaky.import_messages(sid, messages, user_id="alice")
    assert len(transport.requests) == 3
    keys = _sent(transport, "idempotency-key")
    assert len(set(keys)) == 1 and uuid.UUID(keys[0]).version == 4
    assert (result.replayed, result.imported_turns, result.first_seq) == (True, 1, 1)
    assert client.get_session(sid).turn_count == 1

    transport.requests.clear()
    flaky.import_messages(sid, messages)
    flaky.import_messages(sid, messages)
    assert len(set(_sent(transport, "idempotency-key"))) == 2
    assert client.get_session(sid).turn_count == 3


def test_a_lost_summary_write_is_recognised_by_its_retry(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    finished_turn(client, sid, "q2", "a2")
    transport.script = [LOSE]
    # The first try writes; its retry meets its own write as a conflict.
    written = flaky.put_summary(sid, "both", 2, expected_through_seq=0)
    assert [r.method for r in transport.requests] == ["PUT", "PUT", "GET"]
    assert (written.summary, written.through_seq) == ("both", 2)
    assert client.get_summary(sid) == written


def test_a_lost_write_to_a_generation_is_recognised_by_its_retry(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    finished_turn(client, sid, "q2", "a2")
    generation = client.get_history(sid).generation
    transport.script = [LOSE]
    written = flaky.put_summary(
        sid, "both", 2, expected_through_seq=0, expected_generation=generation
    )
    # The check reads the summary and the generation at once, from a history.
    assert [(r.method, r.url.path.rsplit("/", 1)[-1]) for r in transport.requests] == [
        ("PUT", "summary"),
        ("PUT", "summary"),
        ("GET", "history"),
    ]
    assert (written.summary, written.through_seq) == ("both", 2)
    assert client.get_summary(sid) == written


class _ReplacingTransport(ScriptedTransport):
    """Runs ``replace`` after the first lost response: the session is
    replaced between a write's try and its retry."""

    def __init__(self, replace: Callable[[], None]) -> None:
        super().__init__([LOSE])
        self.replace: Optional[Callable[[], None]] = replace

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except httpx.ReadError:
            if self.replace is not None:
                self.replace()
                self.replace = None
            raise


def test_a_lost_write_is_not_claimed_in_a_session_started_again(
    server: Server, client: Client
) -> None:
    """The try wrote; the session was cleared and started again, and the
    same summary written to it: not this write's, so the retry's conflict
    stands."""
    sid = new_id()
    for n in (1, 2):
        finished_turn(client, sid, f"q{n}", f"a{n}")
    generation = client.get_history(sid).generation

    def replace() -> None:
        client.clear_session(sid)
        for n in (1, 2):
            finished_turn(client, sid, f"q{n}", f"a{n}")
        client.put_summary(sid, "both", 2, expected_through_seq=0)

    transport = _ReplacingTransport(replace)
    with Client(server.url, transport=transport, initial_backoff=0.001) as flaky:
        with pytest.raises(SummaryConflictError) as info:
            flaky.put_summary(
                sid, "both", 2, expected_through_seq=0, expected_generation=generation
            )
    assert "generation" in info.value.detail
    assert [r.method for r in transport.requests] == ["PUT", "PUT", "GET"]
    assert client.get_history(sid).generation != generation


def test_a_real_conflict_survives_the_retry(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = new_id()
    finished_turn(client, sid, "q1", "a1")
    finished_turn(client, sid, "q2", "a2")
    client.put_summary(sid, "someone else's", 1)
    # The first try reached the server and lost the race; so did the retry.
    transport.script = [LOSE]
    with pytest.raises(SummaryConflictError):
        flaky.put_summary(sid, "mine", 2, expected_through_seq=0)
    assert [r.method for r in transport.requests] == ["PUT", "PUT", "GET"]
    # A try that never reached the server makes no such check.
    transport.requests.clear()
    transport.script = [REFUSE]
    with pytest.raises(SummaryConflictError):
        flaky.put_summary(sid, "mine", 2, expected_through_seq=0)
    assert [r.method for r in transport.requests] == ["PUT", "PUT"]
    assert client.get_summary(sid).summary == "someone else's"


def test_an_export_is_retried_before_its_body(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    user = new_id("user")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    client.import_messages(new_id(), messages, user_id=user)
    transport.script = [REFUSE, UNAVAILABLE]
    sessions = list(flaky.export_user(user))
    assert len(sessions) == 1 and len(transport.requests) == 3
    assert len(set(_sent(transport, "x-request-id"))) == 1
