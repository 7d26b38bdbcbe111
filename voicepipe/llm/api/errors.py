"""OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, with the right status codes."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def overloaded(message: str, retry_after: int = 1) -> APIError:
    return APIError(503, message, "server_error", code="engine_overloaded", retry_after=retry_after)


async def api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    log.info("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
    return exc.response()


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's own HTTP errors (a body it cannot parse, an unknown path, a wrong method): in OpenAI's shape under
    /v1, where clients read `error.message`; as FastAPI gives them everywhere else."""
    if not request.url.path.startswith("/v1/"):
        return await http_exception_handler(request, exc)
    log.info("%s %s -> %d %s", request.method, request.url.path, exc.status_code, exc.detail)
    error = APIError(exc.status_code, str(exc.detail), "invalid_request_error")
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "malformed request body"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        message = "the request body is not valid JSON"
    err = bad_request(f"{message}" + (f" (param: {param})" if param else ""), param)
    return await api_error_handler(request, err)
