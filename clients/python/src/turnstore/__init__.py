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
retried, starts and imports included (see :class:`RetryPolicy`). The LangChain
integration is in :mod:`turnstore.langchain` (from the root of a clone:
``pip install './clients/python[langchain]'``).
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
from .export import AsyncExportStream, ExportStream
from .messages import Message, Role, build_chat_messages
from .models import (
    AnthropicHistory,
    AnthropicMessage,
    Breakpoint,
    CacheControl,
    Erasure,
    ExportedSession,
    History,
    HistoryFormat,
    HistoryOptions,
    HistoryText,
    HistoryWindow,
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
    "AsyncTurnContext",
    "Breakpoint",
    "CacheControl",
    "Client",
    "ConflictError",
    "ConnectionFailedError",
    "Erasure",
    "ExportIncompleteError",
    "ExportStream",
    "ExportedSession",
    "FieldError",
    "ForbiddenError",
    "History",
    "HistoryFormat",
    "HistoryOptions",
    "HistoryText",
    "HistoryWindow",
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
