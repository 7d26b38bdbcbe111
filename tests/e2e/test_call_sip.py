"""Real calls over SIP (/sip, SIP over WebSocket with WebRTC media) against the real app and models on loopback:
the SIP web phone in headless Chromium on JsSIP (the page as served) and on SIP.js (the same page with SIP.js
as its engine), both through one scenario; and a Python SIP client for the protocol's edge cases.

One server serves the module: digest auth on (user alice), a short idle timeout so that the agent hangs up a
quiet call within seconds, short replies, and an agent `desk` whose every reply transfers the caller to `sales`.
"""

from __future__ import annotations

import asyncio
import re
import time
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
from tests.sip_helpers import SipSocket, digest_credentials, new_branch, request
from voicepipe.caller.sip import SipPeerClient
from voicepipe.transports.connection import Connection
from voicepipe.transports.events import Dtmf
from voicepipe.transports.sip import hang_up_sip_calls

pytestmark = pytest.mark.e2e

USER, PASSWORD = "alice", "wonderland"
IDLE_TIMEOUT_S = 8.0
SIPJS_DIR = Path(__file__).resolve().parents[1] / "browser" / "sipjs"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    desk = {"greeting": "", "tools": ["transfer_call"], "tool_choice": "transfer_call", "transfer_target": "sales"}
    settings = call_settings(tmp_path_factory.mktemp("sip-server"), calls={"idle_timeout_s": IDLE_TIMEOUT_S},
                             sip={"users": {USER: PASSWORD}, "max_calls": 3,
                                  "agents": {"agent": {}, "desk": desk}})  # the web phone dials the first
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


# -- the protocol's edge cases, with a SIP client written by hand -------------------------------------------------
def offer_sdp() -> str:
    """A real WebRTC offer (aiortc's): the server answers it, though no media will follow."""
    from aiortc import RTCPeerConnection

    async def make() -> str:
        pc = RTCPeerConnection()
        pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return asyncio.run(make())


class Caller:
    """A hand-written SIP caller on one socket: digest credentials from one challenge, counted per request."""

    def __init__(self, sock: SipSocket) -> None:
        self.sock = sock
        sock.send(request("REGISTER", "sip:127.0.0.1"))
        self.challenge = sock.receive().header("WWW-Authenticate")
        self.nc = 0

    def invite(self, call_id: str, branch: str, *, cseq: int = 1, headers: tuple = (), sdp: str = "") -> str:
        self.nc += 1
        auth = digest_credentials(self.challenge, "INVITE", "sip:agent@127.0.0.1", USER, PASSWORD, nc=self.nc)
        return request("INVITE", call_id=call_id, branch=branch, cseq=cseq, body=sdp,
                       headers=(("Contact", "<sip:alice@test.invalid;transport=ws>"),
                                ("Content-Type", "application/sdp"), ("Authorization", auth), *headers))


def sip_calls(app, call_id: str) -> list:
    return [c for c in list(app.state.sip.calls) if c.invite.call_id == call_id]


def test_retransmissions_the_200_until_the_ack_and_a_session_refresh(server) -> None:
    base, app = server
    sdp = offer_sdp()
    with SipSocket(base) as sock:
        caller = Caller(sock)
        branch, call_id = new_branch(), new_branch()
        invite = caller.invite(call_id, branch, sdp=sdp,
                               headers=(("Supported", "timer"), ("Session-Expires", "90")))
        sock.send(invite)
        sock.send(invite)  # retransmitted before the answer: the transaction repeats its 100 Trying
        got = [sock.receive(), sock.receive(), sock.receive()]
        assert [m.status for m in got] == [100, 100, 200], [m.text for m in got]
        ok = got[2]
        assert ok.header("Session-Expires") == "90;refresher=uac" and ok.header("Require") == "timer"
        assert ok.header("Content-Type") == "application/sdp" and "a=ice-ufrag" in ok.body
        assert ok.header("X-Voicepipe-Call-Id") == call_id
        assert len(sip_calls(app, call_id)) == 1  # one call, not two
        # No ACK yet: the 200 OK comes again (RFC 3261 13.3.1.4), the same message.
        assert sock.receive(timeout=2.0).text == ok.text
        tag = ok.to_tag
        sock.send(request("ACK", call_id=call_id, to_tag=tag, headers=(("Contact", "<sip:a@t.invalid>"),)))
        sock.send(invite)  # after the 2xx the INVITE's retransmission is absorbed (RFC 6026)
        assert sock.quiet(2.5) == []
        # A session refresh (RFC 4028) inside the dialog.
        sock.send(request("UPDATE", call_id=call_id, to_tag=tag, cseq=2, headers=(("Supported", "timer"),
                                                                                 ("Session-Expires", "120"))))
        refreshed = sock.receive()
        assert refreshed.status == 200 and refreshed.header("Session-Expires") == "120;refresher=uac"
        # A re-INVITE with the same offer gets the same answer; one that restarts ICE is refused, the call goes on.
        reinvite = request("INVITE", call_id=call_id, to_tag=tag, cseq=3, body=sdp,
                           headers=(("Content-Type", "application/sdp"), ("Contact", "<sip:a@t.invalid>")))
        sock.send(reinvite)
        again = sock.final()
        assert again.status == 200 and again.body == ok.body
        sock.send(request("ACK", call_id=call_id, to_tag=tag, cseq=3))
        restart = re.sub(r"a=ice-ufrag:\S+", "a=ice-ufrag:rest", sdp)
        sock.send(request("INVITE", call_id=call_id, to_tag=tag, cseq=4, body=restart,
                          headers=(("Content-Type", "application/sdp"),)))
        assert sock.final().status == 488
        assert len(sip_calls(app, call_id)) == 1
        sock.send(request("BYE", call_id=call_id, to_tag=tag, cseq=5))
        assert sock.receive().status == 200
        wait_until(lambda: not sip_calls(app, call_id), 10, "the call to go")


def test_cancel_before_the_answer(server) -> None:
    base, app = server
    sdp = offer_sdp()
    with SipSocket(base) as sock:
        caller = Caller(sock)
        branch, call_id = new_branch(), new_branch()
        sock.send(caller.invite(call_id, branch, sdp=sdp))
        sock.send(request("CANCEL", call_id=call_id, branch=branch))
        trying, cancelled, terminated = sock.receive(), sock.receive(), sock.receive()
        assert trying.status == 100
        assert cancelled.status == 200 and cancelled.header("CSeq") == "1 CANCEL"
        assert terminated.status == 487 and terminated.header("CSeq") == "1 INVITE"
        assert terminated.to_tag == cancelled.to_tag  # RFC 3261 9.2
        sock.send(request("ACK", call_id=call_id, branch=branch, to_tag=terminated.to_tag))  # absorbed
        assert sock.quiet(1.0) == []
        assert not sip_calls(app, call_id) and call_id not in app.state.calls.active


def test_over_sip_max_calls_an_invite_gets_486(server) -> None:
    base, app = server
    sdp = offer_sdp()
    with SipSocket(base) as sock:
        caller = Caller(sock)
        answered = []
        for _ in range(3):  # the fixture's sip.max_calls
            call_id = new_branch()
            sock.send(caller.invite(call_id, new_branch(), sdp=sdp))
            ok = sock.final()
            assert ok.status == 200, ok.text
            sock.send(request("ACK", call_id=call_id, to_tag=ok.to_tag))
            answered.append((call_id, ok.to_tag))
        sock.send(caller.invite(new_branch(), new_branch(), sdp=sdp))
        busy = sock.final()
        assert busy.status == 486 and busy.to_tag, busy.text
        for call_id, tag in answered:
            sock.send(request("BYE", call_id=call_id, to_tag=tag, cseq=2))
            assert sock.final().status == 200
    wait_until(lambda: not app.state.sip.calls, 10, "the calls to go")


GARBAGE = ["hello", "INVITE sip:agent@127.0.0.1 SIP/2.0\r\n\r\n", "\r\n".join(["OPTIONS sip:x SIP/2.0"] * 200),
           request("INFO", to_tag="x", body="y" * 200_000), request("OPTIONS").replace("CSeq: 1", "CSeq: -1"),
           request("BYE", to_tag="no-such-dialog")]


def test_a_call_from_the_python_client_keys_by_info_and_bad_input_alongside(server, keys_seen) -> None:
    """A real call (aiortc media, SIP signalling) takes keys by INFO in both content types and refuses bad INFO
    bodies, while another connection sends garbage, oversized and malformed messages and a wrong password:
    each gets its answer or is dropped, and the call goes on to its hang-up."""
    base, app = server
    params = {"user": USER, "password": PASSWORD, "register": True}

    async def call() -> tuple[SipPeerClient, list[int]]:
        async with SipPeerClient(base, new_branch(), params) as phone:
            wait = time.monotonic() + 15
            while phone.call_id not in app.state.calls.active and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            statuses = [(await phone.send_dtmf("7")).status,
                        (await phone.send_dtmf("#", "application/dtmf")).status,
                        (await phone.send_dtmf("X", "application/dtmf")).status]
            statuses.append((await phone._transact(phone._in_dialog(
                "INFO", headers=[("Content-Type", "text/plain")], body="5"))).status)
            await asyncio.to_thread(bad_input_elsewhere)
            assert phone.call_id in app.state.calls.active, "the call did not survive the bad input"
            await phone.send('{"type": "stop"}')
        return phone, statuses

    def bad_input_elsewhere() -> None:
        with SipSocket(base) as sock:
            for text in GARBAGE:
                sock.send(text)
            answers = sock.quiet(1.5)
            assert sorted(m.status for m in answers) == [400, 481, 513], [m.text[:80] for m in answers]

    phone, statuses = asyncio.run(call())
    assert statuses == [200, 200, 400, 415]
    assert [digit for call_id, digit in keys_seen if call_id == phone.call_id] == ["7", "#"]
    assert phone.setup_ms is not None and phone.close_code == 1000
    wait_until(lambda: phone.call_id not in app.state.calls.active, 10, "the call to end")
    assert app.state.calls.get(phone.call_id).end_reason == "hangup"


def test_the_agent_transfers_a_sip_call_with_a_refer_then_hangs_up(server) -> None:
    """The desk agent answers a keypad entry by calling transfer_call: once its words have played the phone gets a
    REFER to the target (a blind transfer), then the BYE that says why, and the call ends as transferred."""
    base, app = server

    async def call() -> SipPeerClient:
        async with SipPeerClient(base, new_branch(), {"user": USER, "password": PASSWORD, "to": "desk"}) as phone:
            wait = time.monotonic() + 15
            while phone.call_id not in app.state.calls.active and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            for digit in "1#":
                assert (await phone.send_dtmf(digit)).status == 200
            await asyncio.wait_for(phone._closed.wait(), 120)
        return phone

    phone = asyncio.run(call())
    sent = [r for r in phone.received_requests if r.method != "ACK"]
    assert [r.method for r in sent] == ["REFER", "BYE"], [r.method for r in sent]
    refer, bye = sent
    assert re.fullmatch(r"<sip:sales@[^>]+>", refer.get("Refer-To") or ""), refer.get("Refer-To")
    assert "sip:desk@" in (refer.get("Referred-By") or "")
    assert refer.call_id == bye.call_id == phone.call_id and refer.to_tag == phone.local_tag
    assert (refer.cseq[0] + 1, "BYE") == bye.cseq
    assert bye.get("Reason") == 'Q.850;cause=16;text="transferred"'
    wait_until(lambda: phone.call_id not in app.state.calls.active, 10, "the call to end")
    record = app.state.calls.get(phone.call_id)
    assert record.end_reason == "transferred" and record.turns[0].tool_calls[0]["name"] == "transfer_call"


def test_a_wrong_password_gets_no_call(server) -> None:
    base, app = server

    async def call() -> None:
        async with SipPeerClient(base, new_branch(), {"user": USER, "password": "guess"}):
            pass

    with pytest.raises(ConnectionError, match="INVITE answered 401"):
        asyncio.run(call())


def test_the_server_stopping_hangs_up_with_a_bye(server) -> None:
    """What the app's shutdown does to a SIP call whose WebSocket is up: the call ends, and the phone gets a BYE
    that says why."""
    base, app = server

    async def call() -> SipPeerClient:
        async with SipPeerClient(base, new_branch(), {"user": USER, "password": PASSWORD}) as phone:
            wait = time.monotonic() + 15
            while phone.call_id not in app.state.calls.active and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            server_loop = next(iter(app.state.sip.tasks)).get_loop()
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(hang_up_sip_calls(app), server_loop))
            await asyncio.wait_for(phone._closed.wait(), 10)
        return phone

    phone = asyncio.run(call())
    assert (phone.close_code, phone.close_reason) == (1000, "shutdown")
    [bye] = [r for r in phone.received_requests if r.method == "BYE"]
    assert bye.get("Reason") == 'Q.850;cause=16;text="shutdown"'
    assert bye.to_tag == phone.local_tag and bye.call_id == phone.call_id
    assert app.state.calls.get(phone.call_id).end_reason == "shutdown"
