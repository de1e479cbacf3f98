"""The defaults and the client's own error codes, as clients/conventions.json
states them for both clients (the TypeScript client's
test/conventions.test.ts holds it to the same file): they cannot drift
apart again. Also: a client built with no arguments reads the environment."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import pytest
from support import API_KEYS, Server, new_id

from turnstore import (
    AsyncClient,
    Client,
    ConnectionFailedError,
    ExportIncompleteError,
    RetryPolicy,
    TurnstoreError,
)

CONVENTIONS: Dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "conventions.json").read_text()
)
CODES: Dict[str, str] = CONVENTIONS["codes"]


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONVENTIONS["environment"].values():
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_the_shared_ones() -> None:
    expected = RetryPolicy(
        max_retries=CONVENTIONS["max_retries"],
        initial_backoff=CONVENTIONS["initial_backoff_seconds"],
        max_backoff=CONVENTIONS["max_backoff_seconds"],
    )
    assert RetryPolicy() == expected
    timeout = httpx.Timeout(float(CONVENTIONS["timeout_seconds"]))
    with Client() as client:
        assert client.retry_policy == expected
        assert client.base_url == CONVENTIONS["default_base_url"]
        assert client._http.timeout == timeout
    aclient = AsyncClient()
    assert aclient.retry_policy == expected
    assert aclient.base_url == CONVENTIONS["default_base_url"]
    assert aclient._http.timeout == timeout


def test_backoff_is_full_jitter_raised_to_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = RetryPolicy()
    first = CONVENTIONS["initial_backoff_seconds"]
    ceiling = CONVENTIONS["max_backoff_seconds"]
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    assert [policy.delay(n) for n in (1, 2, 3)] == [first, first * 2, first * 4]
    assert policy.delay(30) == ceiling
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    assert policy.delay(1) == 0
    assert policy.delay(1, retry_after=1.0) == 1.0
    assert policy.delay(1, retry_after=60.0) == ceiling


def _failing(exc: Exception, calls: List[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise exc

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (httpx.ConnectError("refused"), CODES["no_response"]),
        (httpx.ReadTimeout("slow"), CODES["no_response_in_time"]),
    ],
)
def test_no_response_after_the_default_retries(exc: Exception, code: str) -> None:
    calls: List[httpx.Request] = []
    # Only the backoff is shortened: the number of tries is the default's.
    with Client(transport=_failing(exc, calls), initial_backoff=0.001) as client:
        with pytest.raises(ConnectionFailedError) as info:
            client.get_session("s-1")
    assert (info.value.status, info.value.code) == (0, code)
    assert len(calls) == CONVENTIONS["max_retries"] + 1


def test_a_fork_told_to_come_back_is_retried_and_a_taken_id_is_not() -> None:
    busy = CONVENTIONS["retried_conflicts"]["fork"]
    calls: List[httpx.Request] = []
    retry_after = ["1"]

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        headers = {"retry-after": retry_after[0]} if retry_after else {}
        return httpx.Response(
            busy["status"],
            json={
                "type": "t",
                "title": "t",
                "status": busy["status"],
                "detail": "d",
                "code": busy["code"],
            },
            headers=headers,
        )

    with Client(transport=httpx.MockTransport(handler), max_backoff=0.001) as client:
        with pytest.raises(TurnstoreError) as info:
            client.fork_session("s-1", "s-2")
        assert (info.value.code, info.value.retry_after) == (busy["code"], 1.0)
        assert len(calls) == CONVENTIONS["max_retries"] + 1
        assert len({r.headers["idempotency-key"] for r in calls}) == 1
        # The same answer to another operation, or without Retry-After: not retried.
        calls.clear()
        with pytest.raises(TurnstoreError):
            client.get_session("s-1")
        retry_after.clear()
        with pytest.raises(TurnstoreError):
            client.fork_session("s-1", "s-2")
        assert len(calls) == 2


def test_a_cut_export_is_export_incomplete() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b'{"session_id": "s-1"', headers={"content-type": "application/x-ndjson"}
        )

    with Client(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ExportIncompleteError) as info:
            list(client.export_user("u-1"))
    assert (info.value.status, info.value.code) == (200, CODES["export_cut"])


def test_an_answer_off_the_contract_is_unexpected_response() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/history"):
            return httpx.Response(200, text="hello")  # no x-token-count
        if request.url.path.endswith("/s-1"):
            return httpx.Response(200, text="<html>not json</html>")
        return httpx.Response(500, text="<html>proxy error</html>")

    with Client(transport=httpx.MockTransport(handler)) as client:
        for call in (
            lambda: client.get_session("s-1"),
            lambda: client.get_session("s-2"),
            lambda: client.get_history_text("s-1"),
        ):
            with pytest.raises(TurnstoreError) as info:
                call()
            assert info.value.code == CODES["not_the_contract"], info.value


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, auth_server: Server) -> Iterator[None]:
    names = CONVENTIONS["environment"]
    monkeypatch.setenv(names["base_url"], auth_server.url)
    monkeypatch.setenv(names["api_key"], API_KEYS[0])
    yield


def test_a_client_without_arguments_reads_the_environment(environment: None) -> None:
    with Client() as client:
        started = client.start_turn("From the environment?", session_id=new_id())
        client.finalize_turn(started.session_id, started.turn_id, "Yes.")
        assert client.get_session(started.session_id).turn_count == 1


async def test_an_async_client_without_arguments_reads_the_environment(environment: None) -> None:
    async with AsyncClient() as client:
        started = await client.start_turn("From the environment?", session_id=new_id())
        await client.finalize_turn(started.session_id, started.turn_id, "Yes.")
        assert (await client.get_session(started.session_id)).turn_count == 1


def test_arguments_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, auth_server: Server
) -> None:
    monkeypatch.setenv(CONVENTIONS["environment"]["base_url"], "http://127.0.0.1:9")
    monkeypatch.setenv(CONVENTIONS["environment"]["api_key"], "not-a-key")
    with Client(auth_server.url, api_key=API_KEYS[0], max_retries=0) as client:
        assert client.get_history(new_id()).included_turns == 0
