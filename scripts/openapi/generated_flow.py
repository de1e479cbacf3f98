"""A RAG flow through the Python client openapi-python-client generates from
the checked-in document, against the real binary: start with history,
finalize, read in every format, inspect the session and its user, and a
problem. Usage: generated_flow.py <turnstore binary>"""

from __future__ import annotations

import sys
import uuid

from server import turnstore
from turnstore_client import Client
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


def main(binary: str) -> None:
    with turnstore(binary) as base_url:
        client = Client(base_url=base_url, raise_on_unexpected_status=True)
        session = f"gen-{uuid.uuid4().hex[:12]}"
        asked = []
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

        bad = start_turn.sync_detailed(
            client=client, body=StartTurnRequest(user_query="   ", session_id=session)
        )
        assert bad.status_code == 422 and isinstance(bad.parsed, Problem), bad
        assert bad.parsed.code == ProblemCode.VALIDATION_FAILED
        assert bad.parsed.errors[0].field == "user_query"
        print("generated client: start, finalize, read, session, user list and a 422 all as documented")


if __name__ == "__main__":
    main(sys.argv[1])
