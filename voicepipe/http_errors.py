"""The bodies of the HTTP API's error responses, for its OpenAPI description (`/openapi.json`), so that what a
route says it answers is what it answers (tests/e2e/test_hardening.py holds every route to it with schemathesis).

Two shapes: FastAPI's `{"detail": "..."}` (an `HTTPException`: the call, store, dashboard and WebRTC endpoints)
and OpenAI's `{"error": {...}}` (everything under `/v1`, and a request that fails validation on any route: the
app's one validation handler, llm/api/errors.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    detail: str


class OpenAIErrorFields(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorFields


WHAT = {400: "Bad request: a parameter, the body or a call id is not valid", 401: "Missing or wrong credentials",
        404: "Not found", 429: "Too many connections from this client", 503: "Not available now: the models are "
        "loading, the call store is off, or the engine is overloaded"}


def _inline(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its nested models written in place (no `$ref`s to resolve)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a FastAPI route or router answering `codes` with `{"detail"}` (400 also with OpenAI's shape,
    which request validation gives). JSON whatever the route's own media type (the dashboard's is HTML)."""
    detail, openai = _inline(ErrorDetail), _inline(OpenAIError)
    return {code: {"description": WHAT[code], "content": {"application/json": {
        "schema": {"anyOf": [detail, openai]} if code == 400 else detail}}} for code in codes}


def openai_error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for the OpenAI-compatible routes: every error in OpenAI's shape."""
    return {code: {"description": WHAT[code], "model": OpenAIError} for code in codes}
