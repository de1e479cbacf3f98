"""Chat messages, as the ``messages`` history format returns them and as chat
APIs take them.

:class:`Message` is what turnstore sends: ``{"role": ..., "content": str}``
dicts, usable as-is by the OpenAI SDK and most chat APIs at run time. Static
typing is another matter: openai's ``ChatCompletionMessageParam`` TypedDicts
declare more keys and wider ``content`` types, and TypedDict keys are
invariant, so no TypedDict with ``content: str`` is assignable to them.
:func:`build_chat_messages` therefore returns ``list[ChatCompletionMessageParam]``
itself, naming openai's type only for type checkers: with openai installed
it is exact, without openai the annotation degrades to ``Any`` (the module
never imports openai at run time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, List, Literal, Optional, TypedDict, cast

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["Message", "Role", "build_chat_messages"]

Role = Literal["system", "user", "assistant"]
"""``user`` and ``assistant`` for turns; ``system`` for the conversation
summary a history read with ``summary=True`` begins with."""


class Message(TypedDict):
    """One chat message: ``{"role": "user" | "assistant" | "system", "content": str}``."""

    role: Role
    content: str


def build_chat_messages(
    history: Iterable[Message],
    *,
    system: Optional[str] = None,
    question: Optional[str] = None,
) -> List[ChatCompletionMessageParam]:
    """The full message list of a chat prompt: the system prompt (if any),
    the history, then the new question (if any), as fresh dicts the caller
    may mutate.

    The new question is passed separately because a started turn is pending:
    it is not part of the history the service returned for it.
    """
    messages: List[Message] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.extend({"role": m["role"], "content": m["content"]} for m in history)
    if question is not None:
        messages.append({"role": "user", "content": question})
    # Same dicts at run time; only the static type changes (see module doc).
    return cast("List[ChatCompletionMessageParam]", messages)
