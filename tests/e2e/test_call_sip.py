"""Real calls over SIP (/sip, SIP over WebSocket with WebRTC media) against the real app and models on loopback:
the SIP web phone in headless Chromium on JsSIP (the page as served) and on SIP.js (the same page with SIP.js
as its engine), both through one scenario; and a Python SIP client for the protocol's edge cases.

One server serves the module: digest auth on (user alice), a short idle timeout so that the agent hangs up a
quiet call within seconds, and short replies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.browser_helpers import chromium
from tests.call_helpers import call_settings
from tests.e2e.test_call_transports import speak
from tests.e2e.test_call_webrtc import caller_wav, wait_until
from tests.e2e.test_observability import stored_call
from tests.net_helpers import in_process_server
from voicepipe.transports.connection import Connection
from voicepipe.transports.events import Dtmf

pytestmark = pytest.mark.e2e

USER, PASSWORD = "alice", "wonderland"
IDLE_TIMEOUT_S = 8.0
SIPJS_DIR = Path(__file__).resolve().parents[1] / "browser" / "sipjs"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("sip-server"), calls={"idle_timeout_s": IDLE_TIMEOUT_S},
                             sip={"users": {USER: PASSWORD}, "max_calls": 3})
    with in_process_server(settings) as (base, app):
        yield base, app


@pytest.fixture
def keys_seen(monkeypatch) -> list[tuple[str, str]]:
    """(call id, digit) of every `Dtmf` event a SIP call's `Connection` decodes: what reaches the call today (the
    conversation's use of the digits is another part's business)."""
    seen: list[tuple[str, str]] = []
    original = Connection._on_event

    async def spy(self, event):
        if isinstance(event, Dtmf) and self.transport == "sip" and self.call is not None:
            seen.append((self.call.call_id, event.digit))
        return await original(self, event)

    monkeypatch.setattr(Connection, "_on_event", spy)
    return seen


# -- the web phone in Chromium --------------------------------------------------------------------------------------
INBOUND_AUDIO_JS = """async () => {
  const pc = window.sipphone.pc;
  if (!pc) return null;
  for (const s of (await pc.getStats()).values()) {
    if (s.type === "inbound-rtp" && s.kind === "audio")
      return {bytes: s.bytesReceived, energy: s.totalAudioEnergy || 0};
  }
  return null;
}"""


def open_jssip_page(page, base: str) -> None:
    page.goto(f"{base}/sipphone")


def open_sipjs_page(page, base: str) -> None:
    """The SIP phone page as served, its two JsSIP scripts answered with SIP.js and its engine instead (from
    tests/browser/sipjs/). The page itself must come from the server: Chromium refuses a WebSocket to loopback
    from a document that Playwright made up."""
    def answer_with(name: str):
        return lambda route: route.fulfill(body=(SIPJS_DIR / name).read_bytes(), content_type="text/javascript")

    page.route(f"{base}/static/sipphone/vendor/jssip.min.js", answer_with("sip.min.js"))
    page.route(f"{base}/static/sipphone/jssip-engine.js", answer_with("sipjs-engine.js"))
    page.goto(f"{base}/sipphone")


def wait_for_page(page, js: str, timeout_s: float, what: str):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return page.wait_for_function(js, timeout=timeout_s * 1000).json_value()
    except PlaywrightTimeout:
        state = page.evaluate("({state: sipphone.state, registration: sipphone.registration, "
                              "endedBy: sipphone.endedBy, cause: sipphone.cause, log: sipphone.log})")
        console = "\n".join(getattr(page, "console_lines", [])[-30:])
        raise AssertionError(f"the page never showed {what}: {state}\nconsole:\n{console}") from None


def answered_turn(app, call_id: str, key: str):
    """The turn of the call whose words hold `key`, once the agent has answered it (None before)."""
    record = app.state.calls.get(call_id)
    turns = [t for t in record.turns if key in (t.user_text or "").lower()] if record else []
    return turns[0] if turns and (turns[0].agent_text or "").strip() else None


def phone_scenario(base: str, app, voice_dir: Path, keys_seen: list, open_page: Callable) -> dict:
    """Register, call, hear the greeting, say a sentence that gets an answer, press two keys, hang up; then call
    again, stay quiet, and let the agent hang up. Returns what the checks need."""
    wav = caller_wav(voice_dir, speak("What is the capital of France?", voice_dir), lead_s=3.5, tail_s=1.0)
    flags = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required")
    out: dict = {}
    with chromium(*flags) as browser:
        page = browser.new_page()
        console: list[str] = []  # the page's console, in a failure's message
        page.on("console", lambda message: console.append(f"{message.type}: {message.text}"[:300]))
        page.console_lines = console
        open_page(page, base)
        wait_for_page(page, "window.sipphone && window.sipphone.ready", 15, "the page ready")
        out["engine"] = page.evaluate("window.sipphone.engine")
        page.fill("#user", USER)
        page.fill("#password", PASSWORD)
        page.click("#register")
        wait_for_page(page, "window.sipphone.registration === 'registered'", 15, "the registration")

        page.click("#call")
        wait_for_page(page, "window.sipphone.state === 'in call'", 20, "the call answered")
        call_id = out["call_id"] = page.evaluate("window.sipphone.callId")
        wait_until(lambda: call_id in app.state.calls.active, 10, "the call to start on the server")
        # The greeting reaches the page's audio pipeline (the server sends silence otherwise).
        out["greeting"] = greeting = {}

        def greeting_heard() -> bool:  # polled here: wait_for_function does not await a promise
            greeting.update(page.evaluate(INBOUND_AUDIO_JS) or {})
            return greeting.get("energy", 0) > 0.005

        wait_until(greeting_heard, 15, "the greeting's audio at the page")
        wait_until(lambda: answered_turn(app, call_id, "capital") is not None, 60, "the answer to the caller")
        wait_until(lambda: app.state.calls.active[call_id].state.value == "listening", 60, "the reply to play out")
        out["after_reply"] = page.evaluate(INBOUND_AUDIO_JS)
        for digit in "42":
            page.click(f"#keypad button[data-digit='{digit}']")
        wait_until(lambda: [d for c, d in keys_seen if c == call_id] == ["4", "2"], 10, "the keys to reach the call")
        page.click("#hangup")
        wait_for_page(page, "window.sipphone.state === 'ended'", 10, "the hang-up")
        out["hangup_by"] = page.evaluate("window.sipphone.endedBy")
        wait_until(lambda: call_id not in app.state.calls.active, 10, "the call to end on the server")

        page.click("#call")
        wait_for_page(page, "window.sipphone.state === 'in call'", 20, "the second call answered")
        page.click("#mute")
        quiet_id = out["quiet_call_id"] = page.evaluate("window.sipphone.callId")
        wait_for_page(page, "window.sipphone.state === 'ended'", IDLE_TIMEOUT_S + 20, "the agent's hang-up")
        out["quiet_by"] = page.evaluate("window.sipphone.endedBy")
        wait_until(lambda: quiet_id not in app.state.calls.active, 10, "the quiet call to end on the server")
    return out


def check_scenario(base: str, app, out: dict, engine: str) -> None:
    assert out["engine"].startswith(engine), out["engine"]
    call = app.state.calls.get(out["call_id"])
    assert call.transport == "sip" and call.end_reason == "hangup", (call.transport, call.end_reason)
    assert out["hangup_by"] == "local"
    assert out["greeting"]["energy"] > 0.005
    assert out["after_reply"]["energy"] > out["greeting"]["energy"], out  # the answer's audio reached the page
    turn = answered_turn(app, out["call_id"], "capital")
    print(f"{engine}: caller {turn.user_text!r}, agent {turn.agent_text!r}")
    assert call.metadata["metadata"]["sip_from"] == f"sip:{USER}@127.0.0.1", call.metadata  # as native metadata
    quiet = app.state.calls.get(out["quiet_call_id"])
    assert quiet.end_reason == "idle_timeout", quiet.end_reason  # the agent's side ended it: BYE from voicepipe
    assert out["quiet_by"] == "remote"
    # The calls are in the store and the dashboard like any other, with transport sip.
    for call_id in (out["call_id"], out["quiet_call_id"]):
        stored = stored_call(base, call_id)
        assert stored["transport"] == "sip", stored
    listed = httpx.get(f"{base}/dashboard", params={"transport": "sip"}, timeout=10).text
    assert out["call_id"] in listed and out["quiet_call_id"] in listed


@pytest.mark.parametrize(("engine", "open_page"), [("JsSIP 3.", open_jssip_page), ("SIP.js 0.21", open_sipjs_page)],
                         ids=["jssip", "sipjs"])
def test_the_sip_phone_in_chromium(server, voice_dir: Path, keys_seen, engine: str, open_page) -> None:
    base, app = server
    out = phone_scenario(base, app, voice_dir, keys_seen, open_page)
    check_scenario(base, app, out, engine)
