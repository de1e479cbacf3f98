"""Error responses become typed exceptions carrying the problem document."""

from __future__ import annotations

import pickle
import socket

import httpx
import pytest
from support import API_KEYS, ScriptedTransport, Server, new_id

from turnstore import (
    Client,
    ConnectionFailedError,
    HistoryOptions,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    TooManyRequestsError,
    TurnstoreError,
    UnauthorizedError,
    UnavailableError,
    ValidationError,
)


def test_validation_errors_name_their_fields(client: Client) -> None:
    with pytest.raises(ValidationError) as info:
        client.start_turn("   ", session_id=new_id())
    error = info.value
    assert (error.status, error.code) == (422, "validation_failed")
    assert [e.field for e in error.errors] == ["user_query"]
    assert error.errors[0].message
    assert error.title and error.detail
    assert error.request_id

    with pytest.raises(ValidationError) as info:
        client.start_turn("q", session_id=new_id(), history=HistoryOptions(limit=-1))
    assert [e.field for e in info.value.errors] == ["history.limit"]

    with pytest.raises(ValidationError) as info:
        client.get_history(new_id(), max_query_chars=0)
    assert [e.field for e in info.value.errors] == ["max_query_chars"]


def test_invalid_ids_stay_one_path_segment(client: Client) -> None:
    with pytest.raises(ValidationError) as info:
        client.get_session("a/b")
    assert [e.field for e in info.value.errors] == ["session_id"]
    with pytest.raises(ValidationError):
        client.finalize_turn(new_id(), "not-a-uuid", "a")


def test_the_server_request_id_is_reported(client: Client) -> None:
    with pytest.raises(NotFoundError) as info:
        client.get_session(new_id())
    assert info.value.request_id
    assert info.value.request_id in str(info.value)


def test_payload_too_large(client: Client) -> None:
    with pytest.raises(PayloadTooLargeError) as info:
        client.start_turn("x" * 40_000, session_id=new_id())
    assert (info.value.status, info.value.code) == (413, "payload_too_large")


def test_api_keys(auth_server: Server) -> None:
    with Client(auth_server.url) as anonymous:
        with pytest.raises(UnauthorizedError) as info:
            anonymous.get_history(new_id())
        assert (info.value.status, info.value.code) == (401, "unauthorized")
    with Client(auth_server.url, api_key="wrong") as wrong:
        with pytest.raises(UnauthorizedError):
            wrong.start_turn("q")
    for key in API_KEYS:
        with Client(auth_server.url, api_key=key) as client:
            started = client.start_turn("q")
            client.finalize_turn(started.session_id, started.turn_id, "a")
            assert client.get_history(started.session_id).total_turns == 1


def test_the_pending_cap_is_not_retried_but_replays_pass(capped_server: Server) -> None:
    transport = ScriptedTransport()
    with Client(capped_server.url, transport=transport, initial_backoff=0.001) as client:
        sid, key = new_id(), new_id("key")
        first = client.start_turn("q1", session_id=sid, idempotency_key=key)
        client.start_turn("q2", session_id=sid)
        transport.requests.clear()
        with pytest.raises(TooManyRequestsError) as info:
            client.start_turn("q3", session_id=sid)
        assert (info.value.status, info.value.code) == (429, "too_many_pending_turns")
        assert info.value.retry_after is not None and info.value.retry_after > 0
        assert len(transport.requests) == 1
        replay = client.start_turn("q1", session_id=sid, idempotency_key=key)
        assert (replay.turn_id, replay.replayed) == (first.turn_id, True)


def test_timeouts_are_reported_as_such() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("injected", request=request)

    transport = httpx.MockTransport(handler)
    with Client("http://turnstore.test", transport=transport, initial_backoff=0.001) as c:
        with pytest.raises(ConnectionFailedError) as info:
            c.get_history("s")
    assert (info.value.status, info.value.code) == (0, "timeout")


def test_connection_failures_after_retries() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    with Client(f"http://127.0.0.1:{closed_port}", max_retries=2, initial_backoff=0.001) as c:
        with pytest.raises(ConnectionFailedError) as info:
            c.get_history("s")
    error = info.value
    assert (error.status, error.code) == (0, "connection_error")
    assert isinstance(error, UnavailableError) and isinstance(error, TurnstoreError)
    assert isinstance(error.__cause__, httpx.ConnectError)
    assert error.request_id


def test_a_non_problem_error_body_still_maps_by_status() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="<html>proxy error</html>")

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ServerError) as info:
            client.get_session("s")
    assert (info.value.status, info.value.code) == (500, "unexpected_response")
    assert "proxy error" in info.value.detail
    assert not isinstance(info.value, UnavailableError)


def test_a_success_body_that_is_not_turnstore_is_an_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"hello": "world"})

    with Client("http://turnstore.test", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(TurnstoreError) as info:
            client.get_session("s")
    assert info.value.code == "unexpected_response"


def test_errors_survive_pickling(client: Client) -> None:
    with pytest.raises(ValidationError) as info:
        client.start_turn("", session_id=new_id())
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is ValidationError
    assert (copy.status, copy.code, copy.errors, copy.request_id) == (
        422,
        "validation_failed",
        info.value.errors,
        info.value.request_id,
    )
    assert str(copy) == str(info.value)
