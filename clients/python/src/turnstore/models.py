"""Typed views of turnstore's requests and responses.

Responses are frozen dataclasses built from the JSON by ``from_json``
class methods, with timestamps parsed to timezone-aware ``datetime``
objects. Parsing ignores fields it does not know, so a newer server that
adds fields does not break an older client.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Tuple,
    TypedDict,
    Union,
)

from .messages import Message, build_chat_messages

if TYPE_CHECKING:  # openai is optional: see turnstore.messages
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "AnthropicHistory",
    "AnthropicMessage",
    "Breakpoint",
    "CacheControl",
    "DroppedReport",
    "Erasure",
    "ExportedMessage",
    "ExportedSession",
    "ExportedTranscript",
    "ForkResult",
    "History",
    "HistoryFormat",
    "HistoryOptions",
    "HistoryText",
    "HistoryWindow",
    "ImportMode",
    "ImportResult",
    "Language",
    "Session",
    "StartedTurn",
    "StopReason",
    "Summary",
    "TextBlock",
    "Turn",
    "Unsummarized",
    "UserSession",
    "UserSessionsPage",
    "WindowKind",
]

HistoryFormat = Literal["text", "messages", "turns", "anthropic"]
"""``text``: one rendered string; ``messages``: chat messages; ``turns``: Turn
objects; ``anthropic``: the ``system`` and ``messages`` of Anthropic's
Messages API (see :class:`AnthropicHistory`)."""

WindowKind = Literal["sliding", "stable"]
"""How a history's window moves as the conversation grows: ``sliding``
(the newest turns that fit) or ``stable`` (from a stride boundary on, so
that consecutive reads begin with the same turns)."""

StopReason = Literal["limit", "max_tokens", "max_bytes"]
"""The bound that left older turns out of a history."""

ImportMode = Literal["strict", "distill"]
"""How an import reads its messages: ``strict`` (user/assistant pairs with
string contents, nothing else) or ``distill`` (an agent loop's OpenAI or
Anthropic messages, each exchange kept as its question and final answer,
the rest dropped and reported: see :class:`DroppedReport`)."""

Language = Literal["en"]
"""The language of a rendering: ``en`` renders the English copies of the
turns that have them (see :attr:`Turn.user_query_en`)."""

SUMMARY_MESSAGE_PREFIX = "Summary of the conversation so far:\n"
"""How the ``messages`` format introduces a summary in its system message."""

_FRACTION = re.compile(r"\.(\d+)")


def format_datetime(value: datetime) -> str:
    """The service's own RFC 3339 form of a time: UTC, ``Z``, milliseconds
    (microseconds when the time has any), as :func:`parse_datetime` reads it
    back unchanged."""
    utc = value.astimezone(timezone.utc) if value.tzinfo is not None else value
    fraction = (
        f"{utc.microsecond // 1000:03d}"
        if utc.microsecond % 1000 == 0
        else f"{utc.microsecond:06d}"
    )
    return f"{utc.strftime('%Y-%m-%dT%H:%M:%S')}.{fraction}Z"


def parse_datetime(value: str) -> datetime:
    """Parses the service's RFC 3339 UTC timestamps (``2026-01-02T03:04:05.678Z``).

    ``datetime.fromisoformat`` accepts neither ``Z`` nor fractions other
    than 3 or 6 digits before Python 3.11, hence the normalisation.
    """
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    parsed = datetime.fromisoformat(text.replace("t", "T"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


@dataclass(frozen=True)
class HistoryOptions:
    """How to select and render a history; ``None`` leaves a server default.

    Used by :meth:`Client.get_history` (as query parameters) and by
    :meth:`Client.start_turn` (as the ``history`` body field, to get the
    history in the same round trip as the start).

    Attributes:
        limit: at most this many most recent finalized turns (0..=10000).
        max_tokens: the rendering fits in this many tokens (0..=10000000).
        format: ``text``, ``messages``, ``turns`` or ``anthropic``
            (budgeted as ``messages``; not with ``template`` nor
            ``chat_template``).
        model: count tokens with this model's encoding (``gpt-4o``, or a
            model in the server's ``TURNSTORE_MODELS`` table); an unknown
            model counts with the server's default encoding (the response's
            ``encoding`` says which), or raises :class:`ValidationError`
            (``unknown_model``) where the server refuses unknown models.
        encoding: the tokenizer (``o200k_base``, ``cl100k_base``, ..., or a
            tokenizer the server loaded from ``TURNSTORE_TOKENIZERS_DIR``,
            such as ``llama3``); wins over ``model``.
        max_query_chars: cut each question to this many characters first.
        max_answer_chars: cut each answer to this many characters first.
        keep_first: always keep the session's first turn (the original
            goal) when anything is kept.
        after_seq: only turns with ``seq > after_seq`` (range reads).
        through_seq: only turns with ``seq <= through_seq`` (range reads).
        lang: ``"en"`` renders the English copies (``user_query_en``,
            ``final_answer_en``) where turns have them, the originals elsewhere.
        summary: begin with the session's summary (if it has one); the
            candidates are then the turns it does not cover.
        template: render with this template (the built-ins ``xml`` and
            ``markdown``, or one of the server's ``TURNSTORE_TEMPLATES_DIR``)
            instead of the ``text`` layout; ``format`` must then be ``text``
            or unset.
        chat_template: budget and count the prompt the messages make
            through the chat template of the loaded tokenizer named by
            ``encoding`` (or by ``model`` in the server's model table),
            special tokens included: ``token_count`` is the prompt's. In a
            start the prompt ends with the new question and the template's
            generation prompt. ``format`` must then be ``messages`` or unset
            (unset means ``messages``); a tokenizer without a chat template
            raises :class:`ValidationError` (``validation_failed``), a
            template that raises on the conversation ``template_error``.
        prompt: with ``chat_template``, also return the rendered prompt
            (:attr:`History.prompt`).
        system: with ``chat_template``, a system message the prompt begins
            with (at most 64 KiB), counted in ``max_tokens``; with
            ``summary=True`` the summary joins it after a blank line. The
            returned ``messages`` then begin with it.
        window: ``sliding`` (the server's default: the newest turns that
            fit) or ``stable``: once the budget leaves turns out, only the
            turns from a stride boundary on (seqs 1, 1 + ``stride``, ...),
            so that consecutive reads of a growing conversation begin with
            the same turns and a provider's prompt cache keeps serving them
            (about one read in ``stride`` begins elsewhere). The summary
            and the ``keep_first`` turn stay in front. The history then
            has :attr:`History.window` and :attr:`History.breakpoint`.
        stride: with ``window="stable"``, the turns per block (1..=10000,
            the server's default 10); choose it well below the turns the
            budget holds.
        cache_control: with ``format="anthropic"``, mark the prompt-cache
            breakpoints (``cache_control: {"type": "ephemeral"}``) on the
            summary's system block and on the last block of the last
            message; the history then has :attr:`History.breakpoint`.
    """

    limit: Optional[int] = None
    max_tokens: Optional[int] = None
    format: Optional[HistoryFormat] = None
    model: Optional[str] = None
    encoding: Optional[str] = None
    max_query_chars: Optional[int] = None
    max_answer_chars: Optional[int] = None
    keep_first: Optional[bool] = None
    after_seq: Optional[int] = None
    through_seq: Optional[int] = None
    lang: Optional[Language] = None
    summary: Optional[bool] = None
    template: Optional[str] = None
    chat_template: Optional[bool] = None
    prompt: Optional[bool] = None
    system: Optional[str] = None
    window: Optional[WindowKind] = None
    stride: Optional[int] = None
    cache_control: Optional[bool] = None

    def to_json(self) -> Dict[str, Any]:
        """The set options, as the ``history`` object of a start request."""
        return {k: v for k, v in self._items() if v is not None}

    def to_params(self) -> Dict[str, Union[str, int]]:
        """The set options, as get_history query parameters (booleans as
        ``true``/``false``, which is what the server parses)."""
        params: Dict[str, Union[str, int]] = {}
        for key, value in self._items():
            if isinstance(value, bool):
                params[key] = "true" if value else "false"
            elif value is not None:
                params[key] = value
        return params

    def _items(self) -> List[Tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.__dataclass_fields__]


@dataclass(frozen=True)
class Turn:
    """A finalized turn: one question and its final answer.

    ``truncated`` is true when this copy was cut by ``max_query_chars`` or
    ``max_answer_chars`` (the stored turn is whole).

    ``user_query_en`` and ``final_answer_en`` are the English copies the
    turn was started or finalized with, ``None`` when it has none. In a
    history read with ``lang="en"`` they are always ``None``: ``user_query``
    and ``final_answer`` then hold the texts rendered (the English copy where
    there is one, the original elsewhere).
    """

    turn_id: str
    seq: int
    user_query: str
    final_answer: str
    started_at: datetime
    finalized_at: datetime
    truncated: bool
    user_query_en: Optional[str] = None
    final_answer_en: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Turn:
        return cls(
            turn_id=data["turn_id"],
            seq=data["seq"],
            user_query=data["user_query"],
            final_answer=data["final_answer"],
            started_at=parse_datetime(data["started_at"]),
            finalized_at=parse_datetime(data["finalized_at"]),
            truncated=data["truncated"],
            user_query_en=data.get("user_query_en"),
            final_answer_en=data.get("final_answer_en"),
        )


@dataclass(frozen=True)
class Summary:
    """A session's rolling summary: ``summary`` covers every turn with
    ``seq <= through_seq``.

    ``token_count`` counts the summary alone: in the encoding of the history
    it came with, or in the server's encoding (from :meth:`Client.get_summary`,
    :meth:`Client.put_summary` and exports).
    """

    summary: str
    through_seq: int
    token_count: int
    updated_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        return cls(
            summary=data["summary"],
            through_seq=data["through_seq"],
            token_count=data["token_count"],
            updated_at=parse_datetime(data["updated_at"]),
        )


@dataclass(frozen=True)
class Unsummarized:
    """The finalized turns a history neither returned nor covered with the
    session's summary: those with ``after_seq < seq <= through_seq``.

    ``after_seq`` is what the stored summary covers (0 without one). These
    are the turns a client folds into the next summary: read them with
    ``format="turns", after_seq=..., through_seq=...``. ``tokens`` counts
    them as the ``text`` rendering of their blocks would (without the header
    line), in the history's encoding and language; it is ``None`` only when
    counting them would take more than the read's budget allows (about 4
    bytes of text a token of its ``max_tokens``) and the server could not
    sum stored counts (a read in another encoding than the server's).
    """

    after_seq: int
    through_seq: int
    turns: int
    tokens: Optional[int]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Unsummarized:
        return cls(
            after_seq=data["after_seq"],
            through_seq=data["through_seq"],
            turns=data["turns"],
            tokens=data.get("tokens"),
        )


class CacheControl(TypedDict):
    """A prompt-cache breakpoint of the Messages API: ``{"type": "ephemeral"}``."""

    type: Literal["ephemeral"]


class _TextBlockFields(TypedDict):
    type: Literal["text"]
    text: str


class TextBlock(_TextBlockFields, total=False):
    """A text content block: ``{"type": "text", "text": str}``, with
    ``cache_control`` where a history read with ``cache_control=True``
    marks a breakpoint."""

    cache_control: CacheControl


class AnthropicMessage(TypedDict):
    """A message of the Messages API: ``user`` or ``assistant``, its content
    text blocks."""

    role: Literal["user", "assistant"]
    content: List[TextBlock]


class _AnthropicMessages(TypedDict):
    messages: List[AnthropicMessage]


class AnthropicHistory(_AnthropicMessages, total=False):
    """The ``system`` and ``messages`` of a request to Anthropic's Messages
    API, as ``format="anthropic"`` returns them (a user and an assistant
    message per turn, oldest first) and as
    :meth:`History.anthropic_request` builds them: keyword arguments of
    ``client.messages.create`` as they are. ``system`` (the summary's block,
    or your system prompt's) is absent when there is none.

    Plain dicts at run time; anthropic's own TypedDicts declare more keys,
    so a type checker may want a cast where they are expected (see
    :mod:`turnstore.messages` for the same with openai).
    """

    system: List[TextBlock]


def _text_block(data: Mapping[str, Any]) -> TextBlock:
    block: TextBlock = {"type": data["type"], "text": data["text"]}
    cache = data.get("cache_control")
    if cache is not None:
        block["cache_control"] = {"type": cache["type"]}
    return block


def _anthropic_history(data: Mapping[str, Any]) -> AnthropicHistory:
    history: AnthropicHistory = {
        "messages": [
            {"role": m["role"], "content": [_text_block(b) for b in m["content"]]}
            for m in data["messages"]
        ]
    }
    system = data.get("system")
    if system is not None:
        history["system"] = [_text_block(b) for b in system]
    return history


@dataclass(frozen=True)
class HistoryWindow:
    """Where a stable window (``window="stable"``) begins: ``from_seq`` is
    the oldest turn returned after the ``keep_first`` turn (``None`` when
    none is returned); consecutive reads of a growing conversation begin
    with the same turns as long as it stays. ``left_out`` counts the turns
    that fit the budget but the window leaves out (a sliding window would
    return them): at most ``stride - 1``."""

    stride: int
    from_seq: Optional[int]
    left_out: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HistoryWindow:
        return cls(stride=data["stride"], from_seq=data["from_seq"], left_out=data["left_out"])


@dataclass(frozen=True)
class Breakpoint:
    """The end of the stable part of a history, where a prompt cache's
    breakpoint goes: everything returned, which the next read begins with
    as long as the window's ``from_seq`` (and the summary) stay.

    ``seq`` is the newest turn in it (``None`` when only a summary is
    returned); ``bytes`` the bytes of ``rendered`` it takes (``text`` and
    templates); ``messages`` the messages it takes (``messages`` and
    ``chat_template``, a system message among them; for ``anthropic``, of
    its ``messages``).
    """

    seq: Optional[int]
    bytes: Optional[int] = None
    messages: Optional[int] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Breakpoint:
        return cls(seq=data["seq"], bytes=data.get("bytes"), messages=data.get("messages"))


@dataclass(frozen=True)
class History:
    """A session's history, budgeted and rendered in one format.

    Exactly one of ``rendered`` (format ``text``), ``messages`` (format
    ``messages``), ``turns`` (format ``turns``) and ``anthropic`` (format
    ``anthropic``) is set. ``token_count``
    is the exact count of what is returned, in ``encoding``;
    ``stopped_by`` names the bound that left older turns out, or is
    ``None`` when every candidate turn is included.

    ``unsummarized`` describes the finalized turns that are neither
    returned nor covered by the session's summary (``None`` when there are
    none): what a client folds into its next summary. ``summary`` is the
    summary a ``turns`` history read with ``summary=True`` begins with
    (``None`` without one, or when it did not fit); the ``text`` and
    ``messages`` formats carry it in ``rendered`` and in a first ``system``
    message instead.

    ``generation`` names the incarnation of the session this history was
    read from (``None`` for an unknown session; see :attr:`Session.generation`):
    a summary folded from this history is written with it, as
    ``put_summary(..., expected_generation=history.generation)``, so that it
    cannot land on a session cleared and started again under the same id.

    ``prompt`` is the prompt the chat template rendered (what
    ``token_count`` counts), for a completion endpoint as it is: set when
    the history was read with ``chat_template=True`` and ``prompt=True``,
    else ``None``.

    ``window`` says where a stable window begins and what it left out (read
    with ``window="stable"``, else ``None``). ``breakpoint`` says where the
    part that the next read begins with ends, for a prompt cache's
    breakpoint (read with ``window="stable"`` or ``cache_control=True``;
    ``None`` otherwise, and for an empty history).
    """

    session_id: str
    user_id: Optional[str]
    format: HistoryFormat
    encoding: str
    token_count: int
    total_turns: int
    included_turns: int
    omitted_turns: int
    pending_turns: int
    stopped_by: Optional[StopReason] = None
    rendered: Optional[str] = None
    messages: Optional[List[Message]] = None
    turns: Optional[List[Turn]] = None
    summary: Optional[Summary] = None
    unsummarized: Optional[Unsummarized] = None
    generation: Optional[str] = None
    prompt: Optional[str] = None
    anthropic: Optional[AnthropicHistory] = None
    window: Optional[HistoryWindow] = None
    breakpoint: Optional[Breakpoint] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> History:
        messages = data.get("messages")
        turns = data.get("turns")
        summary = data.get("summary")
        unsummarized = data.get("unsummarized")
        anthropic = data.get("anthropic")
        window = data.get("window")
        breakpoint = data.get("breakpoint")
        return cls(
            session_id=data["session_id"],
            user_id=data.get("user_id"),
            format=data["format"],
            encoding=data["encoding"],
            token_count=data["token_count"],
            total_turns=data["total_turns"],
            included_turns=data["included_turns"],
            omitted_turns=data["omitted_turns"],
            pending_turns=data["pending_turns"],
            stopped_by=data.get("stopped_by"),
            rendered=data.get("rendered"),
            messages=(
                None
                if messages is None
                else [{"role": m["role"], "content": m["content"]} for m in messages]
            ),
            turns=None if turns is None else [Turn.from_json(t) for t in turns],
            summary=None if summary is None else Summary.from_json(summary),
            unsummarized=None if unsummarized is None else Unsummarized.from_json(unsummarized),
            generation=data.get("generation"),
            prompt=data.get("prompt"),
            anthropic=None if anthropic is None else _anthropic_history(anthropic),
            window=None if window is None else HistoryWindow.from_json(window),
            breakpoint=None if breakpoint is None else Breakpoint.from_json(breakpoint),
        )

    def chat_messages(self) -> List[Message]:
        """The history as chat messages, oldest first: user/assistant pairs,
        after a ``system`` message holding the summary when the history
        begins with one (as the ``messages`` format renders it).

        Works for the ``messages`` and ``turns`` formats; a ``text`` history
        has no message structure left, so it raises ``ValueError`` (as an
        ``anthropic`` one does: see :meth:`anthropic_request`).
        """
        if self.messages is not None:
            return list(self.messages)
        if self.turns is not None:
            out: List[Message] = []
            if self.summary is not None:
                out.append(
                    {"role": "system", "content": SUMMARY_MESSAGE_PREFIX + self.summary.summary}
                )
            for turn in self.turns:
                out.append({"role": "user", "content": turn.user_query})
                out.append({"role": "assistant", "content": turn.final_answer})
            return out
        raise ValueError(
            f"a history in format {self.format!r} has no chat messages: "
            "ask for format='messages' (or 'turns')"
        )

    def to_openai_messages(
        self, system: Optional[str] = None, question: Optional[str] = None
    ) -> List[ChatCompletionMessageParam]:
        """The messages of a chat completion: ``system`` first (if given),
        then this history, then ``question`` as the last user message (if
        given). Typed for the OpenAI SDK; see :mod:`turnstore.messages`."""
        return build_chat_messages(self.chat_messages(), system=system, question=question)

    def anthropic_request(self, question: str, *, system: Optional[str] = None) -> AnthropicHistory:
        """The ``system`` and ``messages`` keyword arguments of Anthropic's
        ``client.messages.create``: ``system`` (if given, not empty) as a
        text block before the history's own (its summary's), then this
        history's messages and ``question`` as the last user message, as
        fresh dicts the caller may mutate. ``system`` is left out when there
        is none.

        The history's ``cache_control`` marks (read with
        ``cache_control=True``) stay where they are: on the summary's block
        and on the last block of the history, so the prompt up to the new
        question is what the provider caches. Works for the ``anthropic``
        format only; another raises ``ValueError``.
        """
        if self.anthropic is None:
            raise ValueError(
                f"a history in format {self.format!r} has no Messages API request: "
                "ask for format='anthropic'"
            )
        history = copy.deepcopy(self.anthropic)
        blocks: List[TextBlock] = [{"type": "text", "text": system}] if system else []
        blocks.extend(history.get("system", []))
        messages = history["messages"]
        messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
        if not blocks:
            return {"messages": messages}
        return {"system": blocks, "messages": messages}


@dataclass(frozen=True)
class HistoryText:
    """A history fetched as ``text/plain``: the rendering and its exact token count."""

    text: str
    token_count: int
    encoding: str


@dataclass(frozen=True)
class StartedTurn:
    """A turn that was started and is pending until finalized or aborted.

    ``history`` is the history as it stood before this turn, when the start
    asked for it. ``replayed`` is true when the service recognised a retry
    of an earlier start (same Idempotency-Key and body) and returned that
    start's turn instead of making another.
    """

    session_id: str
    user_id: Optional[str]
    turn_id: str
    seq: int
    started_at: datetime
    history: Optional[History] = None
    replayed: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, replayed: bool = False) -> StartedTurn:
        history = data.get("history")
        return cls(
            session_id=data["session_id"],
            user_id=data.get("user_id"),
            turn_id=data["turn_id"],
            seq=data["seq"],
            started_at=parse_datetime(data["started_at"]),
            history=None if history is None else History.from_json(history),
            replayed=replayed,
        )


@dataclass(frozen=True)
class Session:
    """A live session: its owner, times and counts of finalized and pending turns.

    ``expires_at`` is when the session expires unless written to again
    (starts and finalizes slide it; reads and aborts do not).

    ``generation`` names this incarnation of the session id (opaque, the
    same in every read of it): a session cleared, erased or expired and then
    started again under the same id has another. Summary writes can require
    it (``put_summary(..., expected_generation=...)``).
    """

    session_id: str
    user_id: Optional[str]
    created_at: datetime
    last_active_at: datetime
    expires_at: datetime
    turn_count: int
    pending_count: int
    generation: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Session:
        return cls(
            session_id=data["session_id"],
            user_id=data.get("user_id"),
            created_at=parse_datetime(data["created_at"]),
            last_active_at=parse_datetime(data["last_active_at"]),
            expires_at=parse_datetime(data["expires_at"]),
            turn_count=data["turn_count"],
            pending_count=data["pending_count"],
            generation=data["generation"],
        )


@dataclass(frozen=True)
class UserSession:
    """One entry of a user's session list."""

    session_id: str
    last_active_at: datetime
    turn_count: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UserSession:
        return cls(
            session_id=data["session_id"],
            last_active_at=parse_datetime(data["last_active_at"]),
            turn_count=data["turn_count"],
        )


@dataclass(frozen=True)
class UserSessionsPage:
    """One page of a user's sessions, most recently active first.

    A page may hold fewer sessions than asked for, even none, and still
    have a ``next_cursor``: only ``next_cursor is None`` marks the end.
    """

    user_id: str
    sessions: List[UserSession] = field(default_factory=list)
    next_cursor: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UserSessionsPage:
        return cls(
            user_id=data["user_id"],
            sessions=[UserSession.from_json(s) for s in data["sessions"]],
            next_cursor=data.get("next_cursor"),
        )


@dataclass(frozen=True)
class Erasure:
    """The outcome of erasing a user's sessions.

    ``complete`` false means the server stopped at its request timeout;
    calling again continues where it stopped.
    """

    user_id: str
    deleted_sessions: int
    complete: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Erasure:
        return cls(
            user_id=data["user_id"],
            deleted_sessions=data["deleted_sessions"],
            complete=data["complete"],
        )


@dataclass(frozen=True)
class DroppedReport:
    """What a distilled import (``mode="distill"``) dropped for one reason:
    ``count`` messages or parts of messages (a message with two image parts
    counts twice), the first five at the indexes ``first_indexes`` of the
    messages sent.

    ``reason`` is one of ``instructions`` (system and developer messages),
    ``tool_result`` (tool and function messages, ``tool_result`` blocks),
    ``tool_call`` (``tool_calls``, ``tool_use`` blocks), ``thinking``,
    ``refusal``, ``non_text`` (images, audio, files), ``superseded`` (an
    assistant text a later one of the same exchange replaced) or
    ``unanswered`` (a last question without an answer); a newer server may
    add others.
    """

    reason: str
    count: int
    first_indexes: List[int]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DroppedReport:
        return cls(
            reason=data["reason"],
            count=data["count"],
            first_indexes=list(data["first_indexes"]),
        )


@dataclass(frozen=True)
class ImportResult:
    """What an import appended: ``imported_turns`` finalized turns, with the
    seqs ``first_seq`` to ``last_seq``.

    ``user_id`` is the session's owner (``None`` when it has none).
    ``replayed`` is true when the service recognised a retry of an earlier
    import (same Idempotency-Key and body) and returned that import's result
    instead of importing again.

    ``dropped`` is what a distilled import (``mode="distill"``) did not
    keep, a :class:`DroppedReport` per reason in the server's order (``[]``
    when it kept everything); ``None`` for a strict import.
    """

    session_id: str
    user_id: Optional[str]
    imported_turns: int
    first_seq: int
    last_seq: int
    replayed: bool = False
    dropped: Optional[List[DroppedReport]] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, replayed: bool = False) -> ImportResult:
        dropped = data.get("dropped")
        return cls(
            session_id=data["session_id"],
            user_id=data.get("user_id"),
            imported_turns=data["imported_turns"],
            first_seq=data["first_seq"],
            last_seq=data["last_seq"],
            replayed=replayed,
            dropped=None if dropped is None else [DroppedReport.from_json(d) for d in dropped],
        )


@dataclass(frozen=True)
class ForkResult:
    """What a fork made: the new session ``session_id``, a copy of
    ``forked_from``'s ``copied_turns`` finalized turns with ``seq <=
    through_seq`` (its next start takes ``through_seq + 1``).

    ``user_id`` is the new session's owner (the source's, or, when that had
    none, the ``user_id`` given; ``None`` when it has none). ``summary`` is
    true when the source's summary came along (it covered no turn past
    ``through_seq``). ``replayed`` is true when the service recognised a
    retry of an earlier fork (same Idempotency-Key and body) and returned
    that fork's result instead of forking again.
    """

    session_id: str
    forked_from: str
    user_id: Optional[str]
    through_seq: int
    copied_turns: int
    summary: bool
    replayed: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, replayed: bool = False) -> ForkResult:
        return cls(
            session_id=data["session_id"],
            forked_from=data["forked_from"],
            user_id=data.get("user_id"),
            through_seq=data["through_seq"],
            copied_turns=data["copied_turns"],
            summary=data["summary"],
            replayed=replayed,
        )


@dataclass(frozen=True)
class ExportedSession:
    """One session of a user's export: its times, its summary (``None``
    when it has none) and every finalized turn, oldest first, with their
    English copies (pending turns are not exported)."""

    session_id: str
    created_at: datetime
    last_active_at: datetime
    turns: List[Turn] = field(default_factory=list)
    summary: Optional[Summary] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportedSession:
        summary = data.get("summary")
        return cls(
            session_id=data["session_id"],
            created_at=parse_datetime(data["created_at"]),
            last_active_at=parse_datetime(data["last_active_at"]),
            turns=[Turn.from_json(t) for t in data["turns"]],
            summary=None if summary is None else Summary.from_json(summary),
        )


@dataclass(frozen=True)
class ExportedMessage:
    """A message of an exported transcript (:class:`ExportedTranscript`): a
    turn's question (``role="user"``, at its ``started_at``) or its answer
    (``role="assistant"``, at its ``finalized_at``), the originals (not the
    English copies)."""

    role: Literal["user", "assistant"]
    content: str
    timestamp: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportedMessage:
        return cls(
            role=data["role"],
            content=data["content"],
            timestamp=parse_datetime(data["timestamp"]),
        )

    def to_json(self) -> Dict[str, str]:
        """The message as an import takes it: ``{"role", "content",
        "timestamp"}``, the timestamp in RFC 3339 as the service writes it,
        so that ``import_messages(..., mode="distill")`` makes the same turn
        at the same times. (``timestamp`` is no field of OpenAI's or
        Anthropic's messages: leave it out for a model.)"""
        return {
            "role": self.role,
            "content": self.content,
            "timestamp": format_datetime(self.timestamp),
        }


@dataclass(frozen=True)
class ExportedTranscript:
    """One session of a user's export as a chat transcript
    (:meth:`Client.export_transcripts`): its times, its summary (``None``
    when it has none) and its finalized turns as ``messages``, a user and
    an assistant :class:`ExportedMessage` each, oldest first (pending turns
    are not exported). Imported with ``mode="distill"``
    (``[m.to_json() for m in transcript.messages]``), the messages make the
    same turns at the same times."""

    session_id: str
    created_at: datetime
    last_active_at: datetime
    messages: List[ExportedMessage] = field(default_factory=list)
    summary: Optional[Summary] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportedTranscript:
        summary = data.get("summary")
        return cls(
            session_id=data["session_id"],
            created_at=parse_datetime(data["created_at"]),
            last_active_at=parse_datetime(data["last_active_at"]),
            messages=[ExportedMessage.from_json(m) for m in data["messages"]],
            summary=None if summary is None else Summary.from_json(summary),
        )
