"""The dashboard pages: `/dashboard` (recent calls with p50/p95 voice-to-voice) and `/dashboard/calls/{id}`
(the per-turn waterfall, the recording, the transcript and, for a call that cancelled echo, its echo figures and
what the echo gate took out of the caller's words, in the transcript where it was said).

Rendered on the server from the call store into the templates under `voicepipe/web/dashboard/`; the pages
load one stylesheet from `/static/dashboard` and nothing from any other host. A `?token=` in the page's URL
is carried into its links for servers with `calls.auth_token` set.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from string import Template
from typing import Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from voicepipe.auth import CallIdPath
from voicepipe.http_errors import error_responses
from voicepipe.observability.api import MAX_LIMIT, Outcome, call_store, recording_path
from voicepipe.observability.records import ECHO_METADATA
from voicepipe.observability.store import LIVE, OUTCOMES
from voicepipe.observability.waterfall import decision_summary, legend_html, waterfall_svg

WEB_DIR = Path(__file__).resolve().parent.parent / "web" / "dashboard"
STATIC_PREFIX = "/static/dashboard"
RANGES = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0, "all": None}
RANGE_LABELS = {"1h": "in the last hour", "24h": "in the last 24 h", "7d": "in the last 7 days",
                "30d": "in the last 30 days", "all": "any time"}


def install_dashboard(app: FastAPI) -> None:
    """Mount the pages and their stylesheet."""
    app.mount(STATIC_PREFIX, StaticFiles(directory=WEB_DIR), name="dashboard-static")
    app.include_router(_router())


def _template(name: str) -> Template:
    return Template((WEB_DIR / name).read_text(encoding="utf-8"))


def _utc(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts is not None else "–"


def _parse_utc(name: str, value: str) -> float:
    """A `datetime-local` value (YYYY-MM-DDTHH:MM[:SS]) read as UTC, in unix seconds; 400 when it is not one."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(400, f"{name}: expected a UTC date and time like 2026-01-31T18:00, got {value!r}") from None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _ms(value: float | None) -> str:
    return f"{value:.0f} ms" if value is not None else "–"


def _duration(call: dict[str, Any]) -> str:
    return f"{call['ended'] - call['started']:.1f} s" if call.get("ended") else "live"


def _with_token(url: str, request: Request, **params: Any) -> str:
    """`url` with `params` and the page's own token (if any) as its query."""
    query = {k: v for k, v in params.items() if v not in (None, "")}
    if request.query_params.get("token"):
        query["token"] = request.query_params["token"]
    return f"{url}?{urlencode(query)}" if query else url


def _options(values: list[tuple[str, str]], selected: str) -> str:
    return "".join(f'<option value="{escape(v)}"{" selected" if v == selected else ""}>{escape(label)}</option>'
                   for v, label in values)


def _call_row(call: dict[str, Any], request: Request) -> str:
    v2v = call["voice_to_voice_ms"]
    link = _with_token(f"/dashboard/calls/{quote(call['id'], safe='')}", request)
    outcome = call.get("outcome") or "live"
    return (f'<tr class="call" data-call-id="{escape(call["id"])}"><td>{_utc(call["started"])}</td>'
            f'<td><a href="{escape(link)}">{escape(call["id"])}</a></td><td>{escape(call["transport"])}</td>'
            f'<td class="outcome-{escape(outcome)}">{escape(outcome)}</td><td class="num">{_duration(call)}</td>'
            f'<td class="num">{call["turn_count"]}</td><td class="num p50">{_ms(v2v["p50"])}</td>'
            f'<td class="num p95">{_ms(v2v["p95"])}</td><td class="num">{call["barge_ins"]}</td>'
            f'<td class="replica">{escape(call.get("replica") or "–")}</td></tr>')


def _echo(call: dict[str, Any]) -> dict[str, Any]:
    """The call's echo figures (`CallEcho.figures`); {} for a call that did not cancel echo."""
    echo = (call.get("metadata") or {}).get(ECHO_METADATA)
    return echo if isinstance(echo, dict) else {}


def _db(value: Any) -> str:
    return f"{value:.1f} dB" if isinstance(value, int | float) else "–"


def _echo_facts(echo: dict[str, Any]) -> list[tuple[str, str]]:
    delay = echo.get("delay_ms")
    skew = echo.get("clock_skew_ppm")
    clock = f" · loudspeaker clock {skew:+g} ppm" if isinstance(skew, int | float) and skew else ""
    found = (f"delay {_ms(delay)} · ERL {_db(echo.get('erl_db'))} · ERLE {_db(echo.get('erle_db'))}{clock}"
             if isinstance(delay, int | float) else "none found")
    gated = (f"audio {echo.get('gated_audio_s', 0)} s · segments {echo.get('gated_segments', 0)} · "
             f"words {echo.get('gated_words', 0)} · gate openings {echo.get('gate_openings', 0)}")
    return [("echo", found), ("gated as echo", gated)]


def _facts(call: dict[str, Any]) -> str:
    v2v = call["voice_to_voice_ms"]
    facts = [("transport", call["transport"]), ("started (UTC)", _utc(call["started"])),
             ("duration", _duration(call)), ("outcome", call.get("outcome") or "live"),
             ("end reason", call.get("end_reason") or "–"), ("turns", str(call["turn_count"])),
             ("voice-to-voice", f"p50 {_ms(v2v['p50'])} · p95 {_ms(v2v['p95'])}"),
             ("barge-ins", str(call["barge_ins"])), ("replica", call.get("replica") or "–")]
    if call.get("error"):
        facts.append(("error", call["error"]))
    echo = _echo(call)
    if echo:
        facts += _echo_facts(echo)
    metadata = {k: v for k, v in (call.get("metadata") or {}).items() if k != ECHO_METADATA}
    if metadata:
        facts.append(("caller metadata", json.dumps(metadata, ensure_ascii=False)))
    if call.get("system_prompt"):
        facts.append(("system prompt", call["system_prompt"]))
    return "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)


def _agent_line(text: str, heard: str | None, interrupted: bool) -> str:
    """The agent's words; for an interrupted reply, what was heard, then what was not (struck through)."""
    if not interrupted or heard is None:
        return escape(text)
    said = heard.strip()
    unheard = text.strip()[len(said):] if text.strip().startswith(said) else text
    out = escape(said) + ' <span class="barge-in" title="the caller talked over the agent">⚡ barge-in</span>'
    if unheard.strip():
        out += f' <span class="unheard" title="generated, not heard">{escape(unheard.strip())}</span>'
    return out


def _reopened(turn: dict[str, Any]) -> str:
    """A mark for the decisions the caller's speech reopened, each in its tooltip."""
    reopened = turn.get("reopened") or []
    if not reopened:
        return ""
    earlier = []
    for d in reopened:
        t = d.get("t")
        earlier.append((f"at {t:.1f} s: " if isinstance(t, int | float) else "") + decision_summary(d))
    tooltip = "ended, then the caller went on: " + "; ".join(earlier)
    return (f' <span class="reopened" title="{escape(tooltip)}">'
            f'↺ reopened ×{len(reopened)}</span>')


def _backchannels(turn: dict[str, Any]) -> str:
    said = turn.get("backchannels") or []
    if not said:
        return ""
    words = " · ".join(f"“{escape(str(w))}”" for w in said)
    return f' <span class="backchannel" title="the caller said this over the reply without stopping it">{words}</span>'


def _keypad(turn: dict[str, Any]) -> str:
    """A keypad turn's mark: the keys the caller pressed."""
    keys = turn.get("dtmf")
    if not keys:
        return ""
    return f' <span class="keypad" title="a keypad entry (DTMF), what the model read">⌨ {escape(" ".join(keys))}</span>'


def _tool_calls(turn: dict[str, Any]) -> str:
    """Each tool call of the reply: name, arguments, latency, result size or error."""
    rows = []
    for c in turn.get("tool_calls") or []:
        latency = f"{c['latency_ms']:.0f} ms" if isinstance(c.get("latency_ms"), int | float) else "-"
        outcome = (f'<span class="tool-error">error: {escape(str(c["error"]))}</span>' if c.get("error")
                   else f"{int(c.get('result_chars') or 0)} chars back")
        rows.append(f'<div class="tool-call"><span class="who">tool</span><code>{escape(str(c.get("name")))}'
                    f'({escape(str(c.get("arguments", "")))})</code> · {latency} · {outcome}</div>')
    return "".join(rows)


def _at(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _turn_start(turn: dict[str, Any]) -> float | None:
    """When the turn began on the call's timeline (its earliest event); None when its timeline has none."""
    times = [t for t in map(_at, (turn.get("timeline") or {}).values()) if t is not None]
    return min(times) if times else None


def _echo_gated(gated: dict[str, Any]) -> str:
    """Caller speech the echo gate took words from, as its own transcript line."""
    kept = gated.get("kept")
    outcome = f"kept “{escape(str(kept))}”" if kept else "all the agent's own words"
    return (f'<li class="echo-gated" data-turn="{escape(str(gated.get("turn")))}"><span class="who">caller</span>'
            f'“{escape(str(gated.get("text", "")))}” <span class="echo-mark" title="the agent\'s own words heard '
            f'back: the echo gate took them out of the caller\'s">⟲ echo: {outcome}</span></li>')


def _transcript(call: dict[str, Any]) -> str:
    items = []
    # What the echo gate took out, in the transcript where it was said: before the first turn that began after it
    gated = [g for g in _echo(call).get("gated_speech") or [] if isinstance(g, dict) and _at(g.get("t")) is not None]
    gated.sort(key=lambda g: g["t"])
    if call.get("greeting"):
        heard = call.get("greeting_heard")
        items.append(f'<li class="greeting"><span class="who">agent</span>'
                     f'{_agent_line(call["greeting"], heard, heard is not None and heard != call["greeting"])}'
                     f'</li>')
    for t in call["turns"]:
        start = _turn_start(t)
        while gated and start is not None and gated[0]["t"] < start:
            items.append(_echo_gated(gated.pop(0)))
        figures = " · ".join(f"{k.replace('_', ' ')} {v:.0f} ms" for k, v in t["timings_ms"].items()
                             if isinstance(v, int | float))
        error = f'<div class="error">error: {escape(t["error"])}</div>' if t.get("error") else ""
        decided = decision_summary(t.get("decision") or {})
        decided = f'<div class="decision">end of turn: {escape(decided)}</div>' if decided else ""
        classes = "turn interrupted" if t["interrupted"] else "turn"
        items.append(f'<li class="{classes}" data-turn="{t["turn"]}">'
                     f'<div><span class="who">caller</span>{escape(t["user_text"])}{_keypad(t)}{_reopened(t)}</div>'
                     f'{decided}{_tool_calls(t)}<div><span class="who">agent</span>'
                     f'{_agent_line(t["agent_text"], t.get("heard_text"), t["interrupted"])}{_backchannels(t)}</div>'
                     f'<div class="figures">{escape(figures)} · tokens: prompt {t["prompt_tokens"]} '
                     f'(cached {t["cached_prompt_tokens"]}), output {t["output_tokens"]}</div>{error}</li>')
    items += [_echo_gated(g) for g in gated]
    return "\n".join(items) or "<li>no turns</li>"


def _router() -> APIRouter:
    router = APIRouter(responses=error_responses(400, 401, 404, 503))

    @router.get("/dashboard", response_class=HTMLResponse)
    async def calls_page(request: Request, range: Literal["1h", "24h", "7d", "30d", "all"] = "24h",  # noqa: A002
                         start: str = Query("", alias="from"), end: str = Query("", alias="to"),
                         transport: str = "", outcome: Outcome | Literal[""] = "",
                         limit: int = Query(100, ge=1, le=MAX_LIMIT)) -> HTMLResponse:
        store = call_store(request)
        window = RANGES[range]
        since = _parse_utc("from", start) if start else time.time() - window if window is not None else None
        until = _parse_utc("to", end) if end else None
        calls = await asyncio.to_thread(store.list_calls, since=since, until=until, transport=transport or None,
                                        outcome=outcome or None, limit=limit)
        known = await asyncio.to_thread(store.transports)
        token = request.query_params.get("token")
        when = RANGE_LABELS[range] if not start else f"from {_utc(since)}"
        when += f" until {_utc(until)}" if until is not None else ""
        page = _template("calls.html").substitute(
            token_field=f'<input type="hidden" name="token" value="{escape(token)}">' if token else "",
            range_options=_options(list(RANGE_LABELS.items()), range),
            start=escape(start), end=escape(end),
            transport_options=_options([("", "all"), *((t, t) for t in sorted({*known, transport} - {""}))],
                                       transport),
            outcome_options=_options([("", "all"), *((o, o) for o in (LIVE, *OUTCOMES))], outcome),
            limit=limit,
            summary=escape(f"{len(calls)} call{'s' if len(calls) != 1 else ''} started {when}"
                           + (f" over {transport}" if transport else "") + (f", {outcome}" if outcome else "")),
            rows="\n".join(_call_row(c, request) for c in calls)
            or '<tr><td colspan="9">no calls match</td></tr>')
        return HTMLResponse(page)

    @router.get("/dashboard/calls/{call_id}", response_class=HTMLResponse)
    async def call_page(call_id: CallIdPath, request: Request) -> HTMLResponse:
        store = call_store(request, call_id)
        call = await asyncio.to_thread(store.get_call, call_id)
        if call is None:
            raise HTTPException(404, f"no call {call_id!r} in the store")
        if recording_path(request.app.state.settings, call_id) is not None:
            src = _with_token(f"/api/calls/{quote(call_id, safe='')}/recording.wav", request)
            player = (f'<audio class="recording" controls preload="metadata" src="{escape(src)}"></audio>'
                      '<p class="hint">Left: the caller; right: the agent, as the caller heard it.</p>')
        else:
            player = '<p class="no-recording">This call was not recorded.</p>'
        page = _template("call.html").substitute(
            call_id=escape(call_id), back=escape(_with_token("/dashboard", request)), facts=_facts(call),
            waterfall=waterfall_svg(call["turns"]), legend=legend_html(), player=player,
            transcript=_transcript(call))
        return HTMLResponse(page)

    return router
