"""Sessions and users: get_session, clear_session, listing, erasure."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import List

import httpx
import pytest
from support import finished_turn, new_id

from turnstore import Client, NotFoundError


def test_get_session(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    client.start_turn("pending", session_id=sid, user_id="owner-1")
    session = client.get_session(sid)
    assert session.session_id == sid
    assert session.user_id == "owner-1"
    assert (session.turn_count, session.pending_count) == (1, 1)
    assert session.created_at <= session.last_active_at < session.expires_at
    now = datetime.now(timezone.utc)
    assert abs((now - session.last_active_at).total_seconds()) < 60


def test_get_session_of_an_unknown_session_is_not_found(client: Client) -> None:
    with pytest.raises(NotFoundError) as info:
        client.get_session(new_id())
    assert info.value.code == "session_not_found"


def test_clear_session_is_idempotent(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    client.clear_session(sid)
    with pytest.raises(NotFoundError):
        client.get_session(sid)
    assert client.get_history(sid).total_turns == 0
    client.clear_session(sid)
    client.clear_session(new_id())


def test_user_sessions_are_paged_and_iterated(client: Client) -> None:
    user = new_id("user")
    sids = [new_id() for _ in range(5)]
    for sid in sids:
        client.start_turn("q", session_id=sid, user_id=user)
    finished_turn(client, sids[0], "again", "refresh")  # a turn count to check

    pages = []
    cursor = None
    while True:
        page = client.list_user_sessions(user, limit=2, cursor=cursor)
        assert page.user_id == user
        assert len(page.sessions) <= 2
        pages.append(page)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(pages) >= 3
    listed = [s.session_id for p in pages for s in p.sessions]
    assert sorted(listed) == sorted(sids)

    iterated = list(client.iter_user_sessions(user, page_size=2))
    assert sorted(s.session_id for s in iterated) == sorted(sids)
    counts = {s.session_id: s.turn_count for s in iterated}
    assert counts[sids[0]] == 1 and counts[sids[1]] == 0
    assert all(s.last_active_at.tzinfo is not None for s in iterated)


def test_an_unknown_user_has_no_sessions(client: Client) -> None:
    page = client.list_user_sessions(new_id("user"))
    assert page.sessions == [] and page.next_cursor is None


def test_erase_user_deletes_every_session(client: Client) -> None:
    user = new_id("user")
    sids = [new_id() for _ in range(3)]
    for sid in sids:
        finished_turn(client, sid, "claim", "owner")
        client.start_turn("q", session_id=sid, user_id=user)
    kept = new_id()
    client.start_turn("q", session_id=kept, user_id=new_id("other"))

    erasure = client.erase_user(user)
    assert (erasure.user_id, erasure.deleted_sessions, erasure.complete) == (user, 3, True)
    for sid in sids:
        with pytest.raises(NotFoundError):
            client.get_session(sid)
    assert list(client.iter_user_sessions(user)) == []
    assert client.get_session(kept).pending_count == 1
    assert client.erase_user_completely(user).deleted_sessions == 0


def test_erase_user_completely_calls_until_complete() -> None:
    # The real server only answers complete=false past its request timeout
    # with thousands of sessions, so the loop is checked against a stand-in.
    answers = [(4, False), (3, False), (2, True)]
    paths: List[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(f"{request.method} {request.url.path}")
        deleted, complete = answers.pop(0)
        body = {"user_id": "u-1", "deleted_sessions": deleted, "complete": complete}
        return httpx.Response(200, content=json.dumps(body))

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        erasure = client.erase_user_completely("u-1")
    assert (erasure.deleted_sessions, erasure.complete) == (9, True)
    assert paths == ["DELETE /v1/users/u-1"] * 3
