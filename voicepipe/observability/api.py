"""The call store on the app: opened in the lifespan, and served as JSON under `/api/calls`.

`GET /api/calls` (query: since, until as unix seconds, transport, outcome: one of the store's `OUTCOMES` or
"live", limit), `GET /api/calls/{id}` and
`GET /api/calls/{id}/recording.wav`; the same token as `/calls` (`calls.auth_token`) guards them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse

from voicepipe.auth import CallIdPath, check_http_token, check_path_call_id
from voicepipe.config import Settings
from voicepipe.http_errors import error_responses
from voicepipe.observability.recorder import recording_dir
from voicepipe.observability.store import LIVE, OUTCOMES, CallStore

Outcome = Literal[(*OUTCOMES, LIVE)]  # the outcome filter: how a call ended ("lost": its process died), or "live"

log = logging.getLogger(__name__)

MAX_LIMIT = 1000


def open_call_store(app: FastAPI) -> CallStore | None:
    """Open the store (blocking: run it off the loop) and register it as a call observer. A store that cannot
    open is logged and left off: calls matter more than their records."""
    settings: Settings = app.state.settings
    app.state.call_store = None
    if not settings.observability.store:
        return None
    try:
        store = CallStore.from_settings(settings)
    except Exception as exc:
        where = "observability.store_url" if settings.observability.store_url else settings.paths.data_dir
        log.error("call store at %s could not open, calls will not be stored: %s", where, exc)
        return None
    app.state.call_store = store
    app.state.observers.add(store)
    log.info("call store: %s (replica %s)", store.describe(), store.replica)
    return store


async def close_call_store(app: FastAPI) -> None:
    """Unregister the store, commit what is queued and close it."""
    store: CallStore | None = getattr(app.state, "call_store", None)
    if store is None:
        return
    observers = app.state.observers.observers
    if store in observers:
        observers.remove(store)
    app.state.call_store = None
    await asyncio.to_thread(store.close)


def call_store(request: Request, call_id: str | None = None) -> CallStore:
    """The app's store, after the token check (and the check of `call_id`, from the path); 503 when the store
    is off."""
    check_http_token(request)
    if call_id is not None:
        check_path_call_id(call_id)
    store = getattr(request.app.state, "call_store", None)
    if store is None:
        raise HTTPException(503, "the call store is off (observability.store) or could not open")
    return store


def recording_path(settings: Settings, call_id: str) -> Path | None:
    """The call's stereo WAV if it was recorded (where the recorder puts it: the id made a safe name, which
    cannot leave the recordings directory; checked again here, after links are followed)."""
    root = Path(settings.paths.recordings_dir).resolve()
    path = (recording_dir(root, call_id) / "call.wav").resolve()
    return path if path.is_relative_to(root) and path.is_file() else None


def create_calls_api_router() -> APIRouter:
    router = APIRouter(prefix="/api", responses=error_responses(400, 401, 404, 503))

    @router.get("/calls")
    async def list_calls(request: Request, since: float | None = None, until: float | None = None,
                         transport: str | None = None, outcome: Outcome | None = None,
                         limit: int = Query(100, ge=1, le=MAX_LIMIT)) -> dict:
        store = call_store(request)
        calls = await asyncio.to_thread(store.list_calls, since=since, until=until, transport=transport,
                                        outcome=outcome, limit=limit)
        return {"calls": calls}

    @router.get("/calls/{call_id}")
    async def get_call(call_id: CallIdPath, request: Request) -> dict:
        store = call_store(request, call_id)
        call = await asyncio.to_thread(store.get_call, call_id)
        if call is None:
            raise HTTPException(404, f"no call {call_id!r} in the store")
        call["recording"] = recording_path(request.app.state.settings, call_id) is not None
        return call

    @router.get("/calls/{call_id}/recording.wav", response_class=FileResponse,
                responses={200: {"description": "The stereo WAV", "content": {"audio/wav": {}}}})
    async def recording(call_id: CallIdPath, request: Request) -> FileResponse:
        check_http_token(request)
        check_path_call_id(call_id)
        path = recording_path(request.app.state.settings, call_id)
        if path is None:
            raise HTTPException(404, f"no recording of call {call_id!r}")
        return FileResponse(path, media_type="audio/wav", filename=f"{call_id}.wav")

    return router
