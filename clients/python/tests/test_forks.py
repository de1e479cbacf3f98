"""fork_session against the real server: a new session made of another's
turns through a seq (a chat UI's "edit question N" is a fork through N - 1,
then a start in the fork), retry-safe with an Idempotency-Key."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Iterator, List, Optional, Tuple

import httpx
import pytest
from support import (
    BUSY,
    LOSE,
    AsyncScriptedTransport,
    ScriptedTransport,
    Server,
    finished_turn,
    new_id,
    redis_command,
    start_turnstore,
)

from turnstore import (
    AsyncClient,
    Client,
    ConflictError,
    ForbiddenError,
    ForkResult,
    NotFoundError,
    Turn,
    ValidationError,
)

def all_turns(client: Client, session_id: str) -> List[Turn]:
    """Every finalized turn of the session, whole."""
    history = client.get_history(session_id, format="turns", limit=1000, max_tokens=10_000_000)
    return history.turns or []


def owned_session(client: Client, user: str, turns: int) -> str:
    """A session of ``user`` with ``turns`` finalized turns, English copies included."""
    sid = new_id()
    for n in range(1, turns + 1):
        started = client.start_turn(
            f"Frage {n}?", session_id=sid, user_id=user, user_query_en=f"Question {n}?"
        )
        client.finalize_turn(sid, started.turn_id, f"Antwort {n}.", final_answer_en=f"Answer {n}.")
    return sid


def test_a_fork_copies_the_turns_through_a_seq(client: Client) -> None:
    user = new_id("user")
    sid = owned_session(client, user, 4)
    client.put_summary(sid, "The first two.", 2)
    client.start_turn("pending, not copied", session_id=sid)
    source = all_turns(client, sid)

    fork = new_id()
    result = client.fork_session(sid, fork, through_seq=3, user_id=user)
    assert result == ForkResult(
        session_id=fork,
        forked_from=sid,
        user_id=user,
        through_seq=3,
        copied_turns=3,
        summary=True,
        replayed=False,
    )
    # The same turns: seqs, ids, texts, English copies, times.
    assert all_turns(client, fork) == source[:3]
    assert client.get_summary(fork) == client.get_summary(sid)
    info = client.get_session(fork)
    assert (info.user_id, info.turn_count, info.pending_count) == (user, 3, 0)
    assert info.generation != client.get_session(sid).generation
    assert fork in [s.session_id for s in client.iter_user_sessions(user)]
    # "Edit question 4": the fork goes on at seq 4; the source is as it was.
    assert client.start_turn("Frage 4, bearbeitet?", session_id=fork).seq == 4
    assert all_turns(client, sid) == source
    assert client.get_session(sid).pending_count == 1

    # Through 1, the summary (through 2) stays behind; with no through_seq,
    # through the newest finalized turn.
    early = client.fork_session(sid, new_id(), through_seq=1)
    assert (early.copied_turns, early.summary, early.user_id) == (1, False, user)
    assert client.get_history(early.session_id, summary=True).summary is None
    whole = client.fork_session(sid, new_id())
    assert (whole.through_seq, whole.copied_turns, whole.summary) == (4, 4, True)
    assert all_turns(client, whole.session_id) == source


def test_an_unowned_sessions_fork_belongs_to_the_user_given(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    user = new_id("user")
    result = client.fork_session(sid, new_id(), user_id=user)
    assert result.user_id == user
    assert client.get_session(result.session_id).user_id == user
    assert client.get_session(sid).user_id is None
    # Without one, the fork is unowned too.
    assert client.fork_session(sid, new_id()).user_id is None


def test_a_fork_is_replayed_with_its_idempotency_key(client: Client) -> None:
    sid = owned_session(client, new_id("user"), 3)
    fork, key = new_id(), new_id("key")
    first = client.fork_session(sid, fork, through_seq=2, idempotency_key=key)
    again = client.fork_session(sid, fork, through_seq=2, idempotency_key=key)
    assert (first.replayed, again.replayed) == (False, True)
    assert again == dataclasses.replace(first, replayed=True)
    # Even once the source is gone.
    client.clear_session(sid)
    gone = client.fork_session(sid, fork, through_seq=2, idempotency_key=key)
    assert gone == again
    assert client.get_session(fork).turn_count == 2
    # The key with another body; another key: the id is taken.
    with pytest.raises(ValidationError) as reused:
        client.fork_session(sid, fork, through_seq=1, idempotency_key=key)
    assert reused.value.code == "idempotency_key_reused"
    with pytest.raises(ConflictError) as taken:
        client.fork_session(sid, fork, through_seq=2)
    assert (taken.value.status, taken.value.code, taken.value.retry_after) == (
        409,
        "session_exists",
        None,
    )


def test_a_fork_refuses_what_it_cannot_make_and_makes_nothing(client: Client) -> None:
    user = new_id("user")
    sid = owned_session(client, user, 2)
    taken = new_id()
    finished_turn(client, taken, "q", "a")
    fork = new_id()

    with pytest.raises(NotFoundError) as unknown:
        client.fork_session(new_id(), fork)
    assert (unknown.value.status, unknown.value.code) == (404, "session_not_found")
    with pytest.raises(ForbiddenError) as other:
        client.fork_session(sid, fork, user_id=new_id("user"))
    assert (other.value.status, other.value.code) == (403, "session_owner_mismatch")
    with pytest.raises(ConflictError) as exists:
        client.fork_session(sid, taken)
    assert (exists.value.status, exists.value.code) == (409, "session_exists")
    assert type(exists.value) is ConflictError and exists.value.retry_after is None
    cases: List[Tuple[str, Optional[int], str]] = [
        (fork, 0, "through_seq"),
        (fork, 3, "through_seq"),  # past the newest finalized turn (2)
        (sid, None, "new_session_id"),  # the source's own
        ("bad id!", None, "new_session_id"),
    ]
    for target, through, field in cases:
        with pytest.raises(ValidationError) as invalid:
            client.fork_session(sid, target, through_seq=through)
        assert invalid.value.code == "validation_failed"
        assert field in [e.field for e in invalid.value.errors], (target, through, invalid.value)
    # Below the oldest turn kept: nothing to copy.
    first = all_turns(client, sid)[0]
    client.abort_turn(sid, first.turn_id)
    with pytest.raises(ValidationError) as below:
        client.fork_session(sid, fork, through_seq=1)
    assert "oldest finalized seq (2)" in below.value.detail
    # None of these made the fork.
    with pytest.raises(NotFoundError):
        client.get_session(fork)
    assert [t.final_answer for t in all_turns(client, taken)] == ["a"]


def test_a_fork_sends_only_the_fields_given(server: Server) -> None:
    transport = ScriptedTransport()
    with Client(server.url, transport=transport) as c:
        sid = new_id()
        finished_turn(c, sid, "q", "a")
        transport.requests.clear()
        c.fork_session(sid, "fork-a-" + sid)
        c.fork_session(sid, "fork-b-" + sid, through_seq=1, user_id="u1", idempotency_key="k-1")
    bodies = [json.loads(r.content) for r in transport.requests]
    assert bodies == [
        {"new_session_id": "fork-a-" + sid},
        {"new_session_id": "fork-b-" + sid, "through_seq": 1, "user_id": "u1"},
    ]
    first, second = transport.requests
    assert first.url.path == f"/v1/sessions/{sid}/fork"
    assert uuid.UUID(first.headers["idempotency-key"]).version == 4
    assert second.headers["idempotency-key"] == "k-1"


# --- retries ------------------------------------------------------------------


@pytest.fixture
def transport() -> ScriptedTransport:
    return ScriptedTransport()


@pytest.fixture
def flaky(server: Server, transport: ScriptedTransport) -> Iterator[Client]:
    with Client(
        server.url, transport=transport, max_retries=3, initial_backoff=0.001, max_backoff=0.01
    ) as c:
        yield c


def test_a_lost_fork_is_replayed_not_failed_on_its_own_session(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = owned_session(client, new_id("user"), 2)
    fork = new_id()
    transport.script = [LOSE, LOSE]
    result = flaky.fork_session(sid, fork, through_seq=1)
    assert len(transport.requests) == 3
    keys = [r.headers["idempotency-key"] for r in transport.requests]
    assert len(set(keys)) == 1 and uuid.UUID(keys[0]).version == 4
    assert len({r.headers["x-request-id"] for r in transport.requests}) == 1
    assert (result.replayed, result.session_id, result.copied_turns) == (True, fork, 1)
    assert all_turns(client, fork) == all_turns(client, sid)[:1]


def test_a_fork_told_another_is_under_way_waits_and_tries_again(
    flaky: Client, client: Client, transport: ScriptedTransport
) -> None:
    sid = owned_session(client, new_id("user"), 2)
    fork = new_id()
    transport.script = [BUSY, BUSY]
    result = flaky.fork_session(sid, fork)
    assert [r.url.path for r in transport.requests] == [f"/v1/sessions/{sid}/fork"] * 3
    assert len({r.headers["idempotency-key"] for r in transport.requests}) == 1
    assert (result.replayed, result.copied_turns) == (False, 2)
    # Only a fork waits so: nothing else answers it, nor takes the wait.
    transport.requests.clear()
    transport.script = [BUSY]
    with pytest.raises(ConflictError):
        flaky.get_session(sid)
    assert len(transport.requests) == 1
    # The retries run out: the error says when to call again.
    transport.requests.clear()
    transport.script = [BUSY] * 4
    with pytest.raises(ConflictError) as busy:
        flaky.fork_session(sid, new_id())
    assert len(transport.requests) == 4
    assert (busy.value.code, busy.value.retry_after) == ("session_exists", 1.0)


async def test_the_async_client_forks_alike(server: Server, aclient: AsyncClient) -> None:
    sid = new_id()
    user = new_id("user")
    for n in (1, 2, 3):
        started = await aclient.start_turn(f"q{n}", session_id=sid, user_id=user)
        await aclient.finalize_turn(sid, started.turn_id, f"a{n}")
    fork, key = new_id(), new_id("key")
    result = await aclient.fork_session(sid, fork, through_seq=2, idempotency_key=key)
    assert (result.forked_from, result.user_id, result.copied_turns, result.summary) == (
        sid,
        user,
        2,
        False,
    )
    history = await aclient.get_history(fork, format="turns")
    source = await aclient.get_history(sid, format="turns")
    assert history.turns == (source.turns or [])[:2]
    assert (await aclient.start_turn("q3, edited", session_id=fork)).seq == 3
    again = await aclient.fork_session(sid, fork, through_seq=2, idempotency_key=key)
    assert again.replayed and again.copied_turns == 2
    with pytest.raises(ConflictError) as taken:
        await aclient.fork_session(sid, fork)
    assert taken.value.code == "session_exists"
    with pytest.raises(NotFoundError):
        await aclient.fork_session(new_id(), new_id())
    with pytest.raises(ValidationError):
        await aclient.fork_session(sid, new_id(), through_seq=0)

    # Lost and busy replies are retried with the one key.
    scripted = AsyncScriptedTransport([LOSE, BUSY])
    async with AsyncClient(
        server.url, transport=scripted, initial_backoff=0.001, max_backoff=0.01
    ) as flaky:
        retried = await flaky.fork_session(sid, new_id(), through_seq=1)
    assert retried.replayed and retried.copied_turns == 1
    assert len({r.headers["idempotency-key"] for r in scripted.requests}) == 1
    assert len(scripted.requests) == 3


# --- a stopped attempt, on Redis -------------------------------------------------


@pytest.fixture
def staged(redis_url: str) -> Iterator[Tuple[Server, str]]:
    """A Redis-backed turnstore whose key prefix the test knows, to leave
    behind what a fork attempt that stopped half way leaves."""
    prefix = f"pytest-fork-{uuid.uuid4().hex[:8]}"
    srv = start_turnstore(
        "redis", {"TURNSTORE_REDIS_URL": redis_url, "TURNSTORE_KEY_PREFIX": prefix}
    )
    yield srv, prefix
    srv.stop()


def test_a_fork_stopped_half_way_is_completed_by_the_retry(
    staged: Tuple[Server, str], redis_url: str
) -> None:
    server, prefix = staged
    with Client(server.url, initial_backoff=0.01, max_backoff=2.0) as client:
        sid = owned_session(client, new_id("user"), 3)
        fork = new_id()

        def stage(age_ms: int) -> None:
            # An attempt (another token) that wrote a page `age_ms` ago, then stopped.
            touched = str(int(time.time() * 1000) - age_ms)
            base = f"{prefix}:{{{fork}}}:"
            marker = ["token", "dead", "touched", touched, "n", "7", "top", "99"]
            redis_command(redis_url, "HSET", base + "fk", *marker)
            redis_command(redis_url, "HSET", base + "fr", "junk", "x")
            redis_command(redis_url, "ZADD", base + "fs", "99", "junk")

        # Without retries: told to come back, and nothing was made.
        stage(0)
        with Client(server.url, max_retries=0) as once:
            with pytest.raises(ConflictError) as busy:
                once.fork_session(sid, fork, idempotency_key="k-stopped")
        assert busy.value.code == "session_exists"
        assert busy.value.retry_after is not None and 1 <= busy.value.retry_after <= 5
        with pytest.raises(NotFoundError):
            client.get_session(fork)

        # With them: the client waits out the attempt that may still be
        # writing (1 s left of its 5), then its retry takes over and completes.
        stage(4_000)
        started = time.monotonic()
        result = client.fork_session(sid, fork, idempotency_key="k-stopped")
        assert time.monotonic() - started >= 0.9
        assert (result.replayed, result.copied_turns) == (False, 3)
        assert all_turns(client, fork) == all_turns(client, sid)
        assert client.get_session(fork).turn_count == 3
        # Nothing of the stopped attempt's staging is left.
        staging = [f"{prefix}:{{{fork}}}:{key}" for key in ("fk", "fr", "fs")]
        assert redis_command(redis_url, "EXISTS", *staging) == b":0\r\n"
