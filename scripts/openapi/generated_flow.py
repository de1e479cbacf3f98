"""RAG flows through Python clients that openapi-python-client generates,
with its default settings, against the real binary.

1. The client generated from the checked-in document (a keyless server's,
   installed as ``turnstore_client``): start with history, finalize, read
   in every format, inspect the session and its user, export the user, and
   a problem, all with a plain ``Client``.
2. A server with API keys serves a document that requires the bearer key:
   the client generated from it (no warnings allowed) takes only an
   ``AuthenticatedClient``, which gets through, while a keyless call is
   refused with 401 ``unauthorized``. The client of step 1 takes an
   ``AuthenticatedClient`` as well.

Usage: generated_flow.py <turnstore binary>
(run from this folder with the venv that has openapi-python-client)"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import typing
import urllib.request
import uuid
from types import ModuleType

from server import turnstore
from turnstore_client import AuthenticatedClient, Client
from turnstore_client.api.import_export import export
from turnstore_client.api.sessions import get_history, get_session
from turnstore_client.api.turns import finalize_turn, start_turn
from turnstore_client.api.users import list_user_sessions
from turnstore_client.models import (
    FinalizeTurnRequest,
    HistoryFormat,
    HistoryParams,
    HistoryResponse,
    Problem,
    ProblemCode,
    Role,
    StartTurnRequest,
    StartTurnResponse,
)
from turnstore_client.types import File

KEY = "generated-flow-key"


def rag_flow(binary: str) -> None:
    with turnstore(binary) as base_url:
        client = Client(base_url=base_url, raise_on_unexpected_status=True)
        session = f"gen-{uuid.uuid4().hex[:12]}"
        asked: list[str] = []
        for i, question in enumerate(["What is a vector index?", "And how is it built?"]):
            started = start_turn.sync_detailed(
                client=client,
                body=StartTurnRequest(
                    user_query=question,
                    session_id=session,
                    user_id="alice",
                    history=HistoryParams(max_tokens=2000, format_=HistoryFormat.MESSAGES),
                ),
                idempotency_key=f"k-{i}",
            )
            assert started.status_code == 201, started
            turn = started.parsed
            assert isinstance(turn, StartTurnResponse), turn
            assert turn.seq == i + 1 and turn.user_id == "alice"
            history = turn.history
            assert isinstance(history, HistoryResponse)
            assert [m.content for m in history.messages] == asked, history.messages
            assert all(m.role in (Role.USER, Role.ASSISTANT) for m in history.messages)
            done = finalize_turn.sync_detailed(
                session,
                str(turn.turn_id),
                client=client,
                body=FinalizeTurnRequest(final_answer=f"Answer {i + 1}."),
            )
            assert done.status_code == 200, done
            asked += [question, f"Answer {i + 1}."]

        text = get_history.sync(session, client=client, max_tokens=1000)
        assert isinstance(text, HistoryResponse), text
        assert text.rendered.startswith("### Conversation history:\nUser: What is a vector index?")
        assert text.included_turns == 2 and text.stopped_by is None and text.token_count > 0
        turns = get_history.sync(session, client=client, format_=HistoryFormat.TURNS)
        assert isinstance(turns, HistoryResponse)
        assert [t.seq for t in turns.turns] == [1, 2]
        assert turns.turns[0].finalized_at >= turns.turns[0].started_at

        info = get_session.sync(session, client=client)
        assert info is not None and info.turn_count == 2 and info.pending_count == 0, info
        page = list_user_sessions.sync("alice", client=client)
        assert page is not None and [s.session_id for s in page.sessions] == [session], page

        # The export: the NDJSON bytes, one ExportedSession a line.
        exported = export.sync_detailed("alice", client=client)
        assert exported.status_code == 200, exported
        assert exported.headers["content-type"] == "application/x-ndjson", exported.headers
        assert isinstance(exported.parsed, File), exported.parsed
        lines = exported.parsed.payload.read().decode().splitlines()
        sessions = [json.loads(line) for line in lines]
        assert [s["session_id"] for s in sessions] == [session], sessions
        answers = [t["final_answer"] for t in sessions[0]["turns"]]
        assert answers == ["Answer 1.", "Answer 2."], answers

        bad = start_turn.sync_detailed(
            client=client, body=StartTurnRequest(user_query="   ", session_id=session)
        )
        assert bad.status_code == 422 and isinstance(bad.parsed, Problem), bad
        assert bad.parsed.code == ProblemCode.VALIDATION_FAILED
        assert bad.parsed.errors[0].field == "user_query"
    print(
        "generated client (checked-in document, plain Client): start, finalize, read, "
        "session, user list, export and a 422 all as documented"
    )


def generate_keyed(base_url: str, scratch: str) -> ModuleType:
    """Generates a client from the keyed server's own document (defaults,
    no warning allowed) and imports it as ``turnstore_keyed_client``."""
    with urllib.request.urlopen(f"{base_url}/openapi.json") as reply:
        document = reply.read()
    path = os.path.join(scratch, "keyed.json")
    with open(path, "wb") as f:
        f.write(document)
    generator = os.path.join(os.path.dirname(sys.executable), "openapi-python-client")
    out = os.path.join(scratch, "generated")
    run = subprocess.run(
        [generator, "generate", "--path", path, "--output-path", out, "--meta", "none",
         "--fail-on-warning"],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        sys.exit(f"openapi-python-client on the keyed document failed:\n{run.stdout}{run.stderr}")
    shutil.copytree(out, os.path.join(scratch, "turnstore_keyed_client"))
    sys.path.insert(0, scratch)
    return importlib.import_module("turnstore_keyed_client")


def keyed_flow(binary: str) -> None:
    with turnstore(binary, TURNSTORE_API_KEYS=KEY) as base_url, \
            tempfile.TemporaryDirectory() as scratch:
        keyed = generate_keyed(base_url, scratch)
        starts = importlib.import_module("turnstore_keyed_client.api.turns.start_turn")
        finalizes = importlib.import_module("turnstore_keyed_client.api.turns.finalize_turn")
        exports = importlib.import_module("turnstore_keyed_client.api.import_export.export")
        models = importlib.import_module("turnstore_keyed_client.models")
        # The keyed document requires the key: its calls take only an AuthenticatedClient.
        for call in (starts.sync, starts.sync_detailed, exports.sync_detailed):
            hint = typing.get_type_hints(call)["client"]
            assert hint is keyed.AuthenticatedClient, (call, hint)
        authed = keyed.AuthenticatedClient(base_url=base_url, token=KEY)
        session = f"gen-{uuid.uuid4().hex[:12]}"
        started = starts.sync(
            client=authed,
            body=models.StartTurnRequest(user_query="Who holds the key?", session_id=session,
                                         user_id="carol"),
        )
        assert isinstance(started, models.StartTurnResponse), started
        done = finalizes.sync_detailed(
            session, str(started.turn_id), client=authed,
            body=models.FinalizeTurnRequest(final_answer="You do."),
        )
        assert done.status_code == 200, done
        exported = exports.sync_detailed("carol", client=authed)
        assert exported.status_code == 200, exported
        assert json.loads(exported.content)["session_id"] == session, exported.content

        # No key: refused. (The annotation is not enforced at run time.)
        anonymous = keyed.Client(base_url=base_url)
        refused = starts.sync_detailed(
            client=anonymous, body=models.StartTurnRequest(user_query="And me?"),
        )
        assert refused.status_code == 401, refused
        assert isinstance(refused.parsed, models.Problem), refused.parsed
        assert refused.parsed.code == models.ProblemCode.UNAUTHORIZED

        # The checked-in document's client takes an AuthenticatedClient too.
        assert typing.get_type_hints(start_turn.sync)["client"] == AuthenticatedClient | Client
        info = get_session.sync(session, client=AuthenticatedClient(base_url=base_url, token=KEY))
        assert info is not None and info.turn_count == 1, info
    print(
        "generated client (keyed server's document): only AuthenticatedClient accepted; "
        "start, finalize, export with the key, 401 unauthorized without it"
    )


if __name__ == "__main__":
    rag_flow(sys.argv[1])
    keyed_flow(sys.argv[1])
