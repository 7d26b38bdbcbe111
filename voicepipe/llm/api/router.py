"""The OpenAI-compatible endpoints, served by the same engine as the voice calls."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from voicepipe.http_errors import openai_error_responses
from voicepipe.llm.api.errors import (
    APIError,
    api_error_handler,
    bad_request,
    http_error_handler,
    overloaded,
    validation_error_handler,
)
from voicepipe.llm.api.logprobs import completion_logprobs
from voicepipe.llm.api.schemas import ChatCompletionRequest, CompletionRequest
from voicepipe.llm.constraints import GrammarTokenizer, constraint_for
from voicepipe.llm.errors import (
    ContextOverflowError,
    EngineStoppedError,
    InvalidRequestError,
    LLMError,
    OverloadedError,
)
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.tools import render_call

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
STREAMS = {200: {"description": "The completion; with `stream`, server-sent events",
                 "content": {"application/json": {}, "text/event-stream": {}}}}


def served_model_id(spec: str) -> str:
    """The id clients use: the default model name, or the last part of a path or hub id."""
    return PurePath(spec).name or spec


def create_openai_router(app: FastAPI) -> APIRouter:
    """Build the /v1 router and install OpenAI-shaped error handlers on ``app``."""
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    router = APIRouter(prefix="/v1", dependencies=[Depends(_check_api_key)],
                       responses=openai_error_responses(400, 401, 404, 503))
    router.add_api_route("/models", _list_models, methods=["GET"])
    router.add_api_route("/chat/completions", _chat_completions, methods=["POST"], responses=STREAMS)
    router.add_api_route("/completions", _completions, methods=["POST"], responses=STREAMS)
    return router


async def _check_api_key(request: Request, authorization: str | None = Header(None)) -> None:
    key = request.app.state.settings.server.api_key
    if key is None:
        return
    if authorization != f"Bearer {key.get_secret_value()}":
        raise APIError(401, "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key")


def _engine(request: Request):
    runtime = request.app.state.runtime
    engine = getattr(runtime, "engine", None)
    if engine is None:
        raise APIError(503, "the model is still loading.", "server_error", code="model_loading", retry_after=5)
    if getattr(engine, "backend", "local") != "local":  # llm.backend = "openai": this process runs no LLM
        raise APIError(501, "this voicepipe's LLM is remote (llm.backend); send OpenAI requests to that server "
                       "(llm.base_url).", "invalid_request_error", code="remote_backend")
    return engine


def _check_model(request: Request, model: str) -> str:
    served = served_model_id(request.app.state.settings.models.llm)
    if model != served:
        raise APIError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model",
                       "model_not_found")
    return served


async def _list_models(request: Request) -> dict:
    served = served_model_id(request.app.state.settings.models.llm)
    return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "voicepipe"}]}


def _tier(requested: str | None) -> str:
    return "default" if requested in (None, "auto") else requested


def _sampling(body, grammar: GrammarTokenizer | None, response_format: dict | None = None) -> SamplingParams:
    logprobs = body.logprobs if isinstance(body, CompletionRequest) else None
    limit = (body.token_limit() if isinstance(body, ChatCompletionRequest) else body.max_tokens) or DEFAULT_MAX_TOKENS
    return SamplingParams(
        max_tokens=limit,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=body.stop_list(),
        constraint=constraint_for(response_format, grammar, limit) if response_format else None,
        logprobs=logprobs,
    )


async def _chat_completions(body: ChatCompletionRequest, request: Request):
    engine = _engine(request)
    model = _check_model(request, body.model)
    messages = [_engine_message(m) for m in body.messages]
    response_format = None
    if body.response_format is not None:
        response_format = body.response_format.model_dump(by_alias=True)
        if body.response_format.json_schema is not None:
            response_format["schema"] = body.response_format.json_schema.schema_
    grammar = engine.grammar_tokenizer if response_format else None
    params = _with_errors(lambda: _sampling(body, grammar, response_format))
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    return await _respond(engine, messages, params, body, model, chat=True, tools=tools, tool_choice=choice)


def _engine_message(message) -> dict[str, str]:
    """A chat message as the engine takes it: an assistant's earlier tool calls are put back as the model writes
    them (after its text, if any); a tool's result is a message with role "tool"."""
    text = message.text()
    if message.role == "assistant" and message.tool_calls:
        calls = "".join(render_call(c.function.name, c.function.arguments) for c in message.tool_calls)
        text = f"{text}\n{calls}" if text else calls
    return {"role": message.role, "content": text}


async def _completions(body: CompletionRequest, request: Request):
    engine = _engine(request)
    model = _check_model(request, body.model)
    params = _with_errors(lambda: _sampling(body, None))
    return await _respond(engine, body.prompt_text(), params, body, model, chat=False)


def _with_errors(fn):
    try:
        return fn()
    except LLMError as exc:
        raise _api_error(exc) from None


def _api_error(exc: LLMError) -> APIError:
    if isinstance(exc, OverloadedError):
        return overloaded(exc.message)
    if isinstance(exc, EngineStoppedError):
        return APIError(503, exc.message, "server_error", code="engine_stopped", retry_after=5)
    if isinstance(exc, ContextOverflowError):
        return bad_request(exc.message, "messages", "context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return bad_request(exc.message)
    return APIError(500, exc.message, "server_error")


async def _respond(engine, prompt: list[dict] | str, params: SamplingParams, body, model: str, chat: bool,
                   tools: list[dict] | None = None, tool_choice: Any = None):
    tier = _tier(body.service_tier)
    try:
        generation = engine.generate(None, prompt, tier=tier, params=params, tools=tools, tool_choice=tool_choice) \
            if chat else engine.complete(prompt, tier=tier, params=params)
        pieces = aiter(generation)
        first = await anext(pieces, None)  # admission errors become HTTP errors, before any header is sent
    except LLMError as exc:
        raise _api_error(exc) from None
    meta = _Meta(model=model, tier=tier, chat=chat)
    if not chat and params.logprobs is not None:
        meta.tokenizer = engine.tokenizer
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(meta, generation, first, pieces, include_usage), media_type="text/event-stream")
    collected = [first] if first else []
    async for piece in pieces:
        collected.append(piece)
    return JSONResponse(meta.final(generation, "".join(p.text for p in collected), collected))


class _Meta:
    def __init__(self, model: str, tier: str, chat: bool) -> None:
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model, self.tier, self.chat = model, tier, chat
        self.tokenizer = None  # set when a completion asked for logprobs
        self.sent = 0  # text streamed so far (the logprobs' text offsets)

    def logprobs(self, pieces: list) -> dict | None:
        return None if self.tokenizer is None else completion_logprobs(self.tokenizer, pieces, self.sent)

    def envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "service_tier": self.tier, "system_fingerprint": "voicepipe", "choices": choices}

    def final(self, generation, text: str, pieces: list) -> dict[str, Any]:
        reason = _finish_reason(generation)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            calls = getattr(generation, "tool_calls", [])
            if calls:
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls]}
            choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": None}
            body = self.envelope("chat.completion", [choice])
        else:
            body = self.envelope("text_completion", [{"index": 0, "text": text, "finish_reason": reason,
                                                      "logprobs": self.logprobs(pieces)}])
        body["usage"] = usage(generation)
        return body

    def chunk(self, delta: dict | None = None, text: str | None = None, reason: str | None = None,
              piece=None) -> dict[str, Any]:
        if self.chat:
            return self.envelope("chat.completion.chunk", [{"index": 0, "delta": delta or {}, "finish_reason": reason,
                                                            "logprobs": None}])
        logprobs = self.logprobs([piece]) if piece is not None else None
        self.sent += len(text or "")
        return self.envelope("text_completion", [{"index": 0, "text": text or "", "finish_reason": reason,
                                                  "logprobs": logprobs}])


def _finish_reason(generation) -> str:
    if generation.finish_reason == "length":
        return "length"
    return "tool_calls" if getattr(generation, "tool_calls", []) else "stop"


def _delta(piece) -> dict[str, Any]:
    """A streamed piece as a chat chunk's delta: text, or a piece of a tool call."""
    call = piece.tool_call
    if call is None:
        return {"content": piece.text}
    entry: dict[str, Any] = {"index": call.index, "function": {"arguments": call.arguments}}
    if call.id is not None:
        entry.update(id=call.id, type="function")
        entry["function"]["name"] = call.name
    return {"tool_calls": [entry]}


def _worth_a_chunk(piece) -> bool:
    """Text, a piece of a tool call, or tokens whose logprobs were asked for (their text may still be empty)."""
    return bool(piece.text or piece.tool_call is not None or piece.logprobs)


def usage(generation) -> dict[str, Any]:
    stats = generation.stats
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.output_tokens,
            "total_tokens": stats.prompt_tokens + stats.output_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens}}


async def _sse(meta: _Meta, generation, first, pieces: AsyncIterator, include_usage: bool) -> AsyncIterator[str]:
    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    # Leaving this generator early (the client went away) closes `pieces`, which cancels the request.
    if meta.chat:
        yield event(meta.chunk(delta={"role": "assistant", "content": ""}))
    for piece in ([first] if first is not None else []):
        if _worth_a_chunk(piece):
            yield event(meta.chunk(delta=_delta(piece), text=piece.text, piece=piece))
    async for piece in pieces:
        if _worth_a_chunk(piece):
            yield event(meta.chunk(delta=_delta(piece), text=piece.text, piece=piece))
    yield event(meta.chunk(reason=_finish_reason(generation)))
    if include_usage:
        tail = meta.envelope("chat.completion.chunk" if meta.chat else "text_completion", [])
        tail["usage"] = usage(generation)
        yield event(tail)
    yield "data: [DONE]\n\n"
