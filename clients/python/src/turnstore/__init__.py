"""Python client for turnstore, the conversation-history service for RAG backends.

A backend calls turnstore twice per user request: start a turn with the
question (and get the history for the prompt in the same call), then
finalize it with the answer, or abort it when the pipeline fails::

    from turnstore import Client

    with Client("http://127.0.0.1:8080") as client:
        with client.turn("What is a vector index?", session_id="chat-42") as turn:
            answer = generate(turn.prompt(system="Answer briefly."))
            turn.finalize(answer)

:class:`Client` is synchronous, :class:`AsyncClient` the same API awaited.
Errors are :class:`TurnstoreError` subclasses; transient failures are
retried, starts, imports and forks included (see :class:`RetryPolicy`). The
framework integrations, each behind the extra of its name (from the root of a
clone: ``pip install './clients/python[langchain]'``), are
:mod:`turnstore.langchain`, :mod:`turnstore.langgraph`
(``[langgraph]``), :mod:`turnstore.llama_index` (``[llamaindex]``) and
:mod:`turnstore.openai_agents` (``[openai-agents]``).
"""

from ._core import VERSION as __version__
from ._core import RetryPolicy
from .async_client import AsyncClient
from .client import Client
from .errors import (
    ConflictError,
    ConnectionFailedError,
    ExportIncompleteError,
    FieldError,
    ForbiddenError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    SummaryConflictError,
    TooManyRequestsError,
    TurnstoreError,
    UnauthorizedError,
    UnavailableError,
    ValidationError,
)
from .export import AsyncExportStream, AsyncTranscriptStream, ExportStream, TranscriptStream
from .messages import Message, Role, build_chat_messages
from .models import (
    AnthropicHistory,
    AnthropicMessage,
    Breakpoint,
    CacheControl,
    DroppedReport,
    Erasure,
    ExportedMessage,
    ExportedSession,
    ExportedTranscript,
    ForkResult,
    History,
    HistoryFormat,
    HistoryOptions,
    HistoryText,
    HistoryWindow,
    ImportMode,
    ImportResult,
    Language,
    Session,
    StartedTurn,
    StopReason,
    Summary,
    TextBlock,
    Turn,
    Unsummarized,
    UserSession,
    UserSessionsPage,
    WindowKind,
)
from .turn import AsyncTurnContext, TurnContext

__all__ = [
    "AnthropicHistory",
    "AnthropicMessage",
    "AsyncClient",
    "AsyncExportStream",
    "AsyncTranscriptStream",
    "AsyncTurnContext",
    "Breakpoint",
    "CacheControl",
    "Client",
    "ConflictError",
    "ConnectionFailedError",
    "DroppedReport",
    "Erasure",
    "ExportIncompleteError",
    "ExportStream",
    "ExportedMessage",
    "ExportedSession",
    "ExportedTranscript",
    "FieldError",
    "ForbiddenError",
    "ForkResult",
    "History",
    "HistoryFormat",
    "HistoryOptions",
    "HistoryText",
    "HistoryWindow",
    "ImportMode",
    "ImportResult",
    "Language",
    "Message",
    "NotFoundError",
    "PayloadTooLargeError",
    "RetryPolicy",
    "Role",
    "ServerError",
    "Session",
    "StartedTurn",
    "StopReason",
    "Summary",
    "SummaryConflictError",
    "TextBlock",
    "TooManyRequestsError",
    "TranscriptStream",
    "Turn",
    "TurnContext",
    "TurnstoreError",
    "UnauthorizedError",
    "UnavailableError",
    "Unsummarized",
    "UserSession",
    "UserSessionsPage",
    "ValidationError",
    "WindowKind",
    "__version__",
    "build_chat_messages",
]
