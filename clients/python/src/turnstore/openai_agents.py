"""OpenAI Agents SDK integration (``pip install './clients/python[openai-agents]'``
from a clone).

:class:`TurnstoreSession` implements the SDK's ``Session`` protocol
(``agents.memory.Session``) over turnstore, keeping turnstore's principle: a
session holds each exchange's question and final answer, nothing else.

- ``add_items``: the user's input items **start** a turn (their texts, joined
  by a blank line, are the question; an input without text raises
  ``ValueError``); the assistant's output message that
  ends the run **finalizes** it. Tool calls and their outputs, reasoning
  items, handoffs, system and developer messages, refusals, images and files
  are **not stored**: they never reach the history, and an assistant message
  followed by a tool call in the same batch is an interim message, not the
  answer. A later assistant message in the same exchange replaces the answer
  (``regenerate_turn``). A new question while the last one is still
  unanswered aborts the unanswered turn: the run that asked it failed.
- ``get_items``: the **bounded history** turnstore returns (``history``: the
  server's limits unless set; ``max_tokens`` with ``model``/``encoding`` for
  an exact budget) as input items, ``{"role": "user" | "assistant",
  "content": text}`` (and a ``system`` item for the summary when read with
  ``summary=True``); ``limit`` keeps the newest that many items. A question
  whose turn is still pending is not history, and is not returned.
- ``pop_item``: an unanswered question is removed (its turn aborted); an
  answer removes its whole exchange from turnstore (the turn aborted) and
  the question is held by this object, for the next ``pop_item`` to return
  (the SDK's "correct the last question" recipe pops both) or for a new
  answer to record again.
- ``clear_session``: deletes the session.

The SDK tells a session nothing when a run fails, so wrap the run in
``async with session.guard():`` to abort the turn it started if it raises
(also a streamed run: keep the ``stream_events()`` loop inside the block).
Without it, the unanswered turn is aborted by the next question, or expires
after the server's pending TTL. The state of the current exchange lives in
the object: use one ``TurnstoreSession`` per conversation at a time (they
are cheap: make one per request).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, List, Optional, Tuple, Union

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnstore.openai_agents needs the OpenAI Agents SDK: pip install 'openai-agents>=0.24' "
        "(or install the client with its [openai-agents] extra)"
    ) from exc

from ._frameworks import Exchanges, Plan, TurnGuard, call, run_async
from .async_client import AsyncClient
from .client import Client
from .models import History, HistoryOptions

__all__ = ["TurnstoreSession"]

_MESSAGES = HistoryOptions(format="messages")


class TurnstoreSession:
    """A turnstore session behind the Agents SDK's ``Session`` protocol
    (see the module doc for what each method does).

    Args:
        session_id: the turnstore session id.
        client: an :class:`~turnstore.AsyncClient`, or a
            :class:`~turnstore.Client` (its calls then run in a worker thread).
        user_id: the user the session belongs to (claims it on the first turn).
        history: which history ``get_items`` returns (``limit``,
            ``max_tokens``, ``model``/``encoding``, ``summary``, ...); the
            format is always ``messages``.
        session_settings: the SDK's settings (its ``limit`` is passed to
            ``get_items`` by the runner).
    """

    session_settings: Optional[SessionSettings] = None

    def __init__(
        self,
        session_id: str,
        client: Union[Client, AsyncClient],
        *,
        user_id: Optional[str] = None,
        history: HistoryOptions = _MESSAGES,
        session_settings: Optional[SessionSettings] = None,
    ) -> None:
        self.session_id = session_id
        self.client = client
        self.user_id = user_id
        self.history = replace(history, format="messages")
        self.session_settings = session_settings
        self._exchanges = Exchanges(user_id=user_id)

    # --- the Session protocol ---------------------------------------------

    async def get_items(self, limit: Optional[int] = None) -> List[TResponseInputItem]:
        if limit is not None and limit <= 0:
            return []
        options = self.history if limit is None else replace(self.history, limit=(limit + 1) // 2)
        history: History = await run_async(self.client, _read(self.session_id, options))
        items = [_item(m["role"], m["content"]) for m in history.chat_messages()]
        return items if limit is None else items[-limit:]

    async def add_items(self, items: List[TResponseInputItem]) -> None:
        await run_async(self.client, self._record(items))

    async def pop_item(self) -> Optional[TResponseInputItem]:
        popped = await run_async(self.client, self._exchanges.pop(self.session_id))
        return None if popped is None else _item(*popped)

    async def clear_session(self) -> None:
        await run_async(self.client, self._exchanges.clear(self.session_id))

    # --- turnstore's own -------------------------------------------------

    def guard(self) -> TurnGuard:
        """``async with session.guard():`` around a run: if it raises, the turn
        it started is aborted (pending, or finalized already) and the error
        propagates. A run that returns normally keeps its turn (one paused on
        an interruption stays pending until the resumed run answers)."""
        return TurnGuard(self.client, self._exchanges, self.session_id)

    def _record(self, items: Iterable[Any]) -> Plan[None]:
        question: List[str] = []
        answer: Optional[str] = None
        for item in items:
            kind, text = _classify(item)
            if kind == "user":
                if answer is not None:
                    yield from self._exchanges.answer(self.session_id, answer)
                    answer = None
                if not text:
                    raise ValueError(
                        "a user input item without text: turnstore keeps text questions "
                        "(images and files are not stored)"
                    )
                question.append(text)
                continue
            if kind in ("assistant", "tool_call") and question:
                yield from self._exchanges.ask(self.session_id, "\n\n".join(question))
                question = []
            if kind == "assistant" and text:
                answer = text
            elif kind == "tool_call":
                answer = None  # the message before it was an interim one
        if question:
            yield from self._exchanges.ask(self.session_id, "\n\n".join(question))
        if answer is not None:
            yield from self._exchanges.answer(self.session_id, answer)


def _read(session_id: str, options: HistoryOptions) -> Plan[History]:
    history: History = yield call("get_history", session_id, options)
    return history


def _item(role: str, text: str) -> TResponseInputItem:
    if role == "user":
        return {"role": "user", "content": text}
    if role == "assistant":
        return {"role": "assistant", "content": text}
    return {"role": "system", "content": text}


def _classify(item: Any) -> Tuple[str, str]:
    """What an input item is to turnstore: ``("user", question text)``,
    ``("assistant", answer text)``, ``("tool_call", "")`` (a call the run
    goes on after), or ``("other", "")`` (not stored)."""
    if not isinstance(item, dict):
        dump = getattr(item, "model_dump", None)
        if dump is None:
            return "other", ""
        item = dump(exclude_unset=True)
    kind = item.get("type")
    role = item.get("role")
    if kind in (None, "message") and role in ("user", "assistant"):
        return role, _text(item.get("content"))
    if isinstance(kind, str) and kind.endswith("_call"):
        return "tool_call", ""
    return "other", ""


def _text(content: Any) -> str:
    """The text of a message's content: a string, or its text parts joined
    (``input_text``, ``output_text``; refusals, images and files left out)."""
    if isinstance(content, str):
        return content
    parts: List[str] = []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
            parts.append(str(part.get("text", "")))
    return "".join(parts)
