"""Static browser pages served by the app: the softphone at `/` (calls the agent over WebRTC) and the SIP phone at
`/sipphone` (calls it over SIP, JsSIP in the page)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parent
SOFTPHONE_DIR = WEB_DIR / "softphone"
SIPPHONE_DIR = WEB_DIR / "sipphone"


def mount_softphone(app: FastAPI) -> None:
    """`/` is the softphone page; its script and style live under `/static/softphone/` (like the dashboard's)."""
    app.mount("/static/softphone", StaticFiles(directory=SOFTPHONE_DIR), name="softphone")

    @app.get("/", include_in_schema=False)
    async def softphone() -> FileResponse:
        return FileResponse(SOFTPHONE_DIR / "index.html")


def mount_sipphone(app: FastAPI) -> None:
    """`/sipphone` is the SIP web phone; its scripts (JsSIP bundled in `vendor/`) live under `/static/sipphone/`."""
    app.mount("/static/sipphone", StaticFiles(directory=SIPPHONE_DIR), name="sipphone")

    @app.get("/sipphone", include_in_schema=False)
    async def sipphone() -> FileResponse:
        return FileResponse(SIPPHONE_DIR / "index.html")
