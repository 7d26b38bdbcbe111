"""Errors the LLM engine raises for bad requests and overload; each says what went wrong and how to fix it."""

from __future__ import annotations

from voicepipe.errors import VoicepipeError


class LLMError(VoicepipeError):
    """Base class of every error the engine raises for one request; the engine keeps serving the others."""


class InvalidRequestError(LLMError):
    """The request itself is malformed (messages, roles, sampling values, tier)."""


class EmptyMessagesError(InvalidRequestError):
    """A request came with no messages."""


class UnknownRoleError(InvalidRequestError):
    """A message has a role the chat template does not know."""


class InvalidSamplingError(InvalidRequestError):
    """A sampling value is out of range (negative max_tokens, temperature < 0, top_p outside (0, 1], ...)."""


class UnknownTierError(InvalidRequestError):
    """A tier name other than priority, default or flex."""


class ContextOverflowError(LLMError):
    """The prompt (plus the reply budget) does not fit in the context and compaction is off or cannot help."""


class OverloadedError(LLMError):
    """The engine could not admit the request within the admission timeout."""


class SessionBusyError(LLMError):
    """The session already has a generation in flight (one at a time per session)."""


class SessionClosedError(LLMError):
    """The session was closed; open a new one."""


class EngineStoppedError(LLMError):
    """The engine thread is not running (not started, stopped, or it crashed)."""
