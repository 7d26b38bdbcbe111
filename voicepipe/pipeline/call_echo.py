"""Whether a call cancels the agent's echo in the caller's audio, and its canceller (`echo/path.py`): its transport's
default (`echo.enabled`), or the call's `echo` parameter (true or false) where `calls.allow_overrides`."""

from __future__ import annotations

import logging
from typing import Any

from voicepipe.config import Settings
from voicepipe.echo.canceller import EchoUnavailable, load_speexdsp
from voicepipe.echo.path import EchoPath
from voicepipe.observability.records import ECHO_METADATA

log = logging.getLogger(__name__)

_SAID = {True: True, False: False, "true": True, "false": False, "on": True, "off": False, "1": True, "0": False}


def wants_echo_cancelling(settings: Settings, transport: str, params: dict[str, Any]) -> bool:
    said = _said(params.get("echo")) if settings.calls.allow_overrides else None
    return settings.echo.enabled_for(transport) if said is None else said


def _said(value: Any) -> bool | None:
    """A call's `echo` parameter: a bool, or its text (providers pass custom parameters as strings)."""
    if isinstance(value, str):
        value = value.strip().lower()
    return _SAID.get(value) if isinstance(value, str | bool) else None


def open_echo_path(settings: Settings, transport: str, params: dict[str, Any], output: Any, rate: int,
                   call_id: str) -> EchoPath | None:
    """The call's echo canceller at `rate` (the caller's audio as the VAD takes it), over the reference `output`
    keeps of what it played; None when the call does not cancel echo or its transport keeps no reference."""
    if not wants_echo_cancelling(settings, transport, params):
        return None
    keep = getattr(output, "far_end_reference", None)
    if keep is None:
        return None
    try:
        load_speexdsp()
    except EchoUnavailable as exc:  # the call goes on as it would without echo cancelling
        log.error("call %s: no echo cancelling: %s", call_id, exc)
        return None
    cfg = settings.echo
    return EchoPath(keep(rate), cfg.filter_ms, cfg.min_delay_ms, cfg.max_delay_ms)


def keep_echo_figures(metadata: dict[str, Any], path: EchoPath | None) -> None:
    """The call record keeps its canceller's figures under `ECHO_METADATA` (and never a caller's value there)."""
    metadata.pop(ECHO_METADATA, None)
    if path is not None:
        delay = path.delay.delay_ms
        metadata[ECHO_METADATA] = {"delay_ms": None if delay is None else round(delay, 1), "erle_db": path.erle_db}
