"""The SIP endpoint (/sip) through a real WebSocket, with a test client that writes SIP by hand: registration and
digest auth, retransmissions, unknown dialogs and transactions, malformed and oversized messages, methods and
extensions it does not serve, keep-alives. The app runs without models here (a call's media is what
tests/e2e/test_call_sip.py covers): an INVITE the endpoint can check gets its refusal, one it would answer
gets 503 while the models are not loaded."""

from __future__ import annotations

import re

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.call_helpers import call_settings
from tests.sip_helpers import SipSocket, app_on_loopback, digest_credentials, new_branch, request
from voicepipe.server import create_app

USER, PASSWORD = "alice", "wonderland"
SDP = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
       "a=rtpmap:111 opus/48000/2\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdef0123456789\r\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("sip-endpoint"),
                             sip={"users": {USER: PASSWORD}, "register_expires_s": 300,
                                  "agents": {"support": {"system_prompt": "You are support."}}})
    with app_on_loopback(create_app(settings, load_models=False)) as url:
        yield url


@pytest.fixture
def sip(base):
    with SipSocket(base) as sock:
        yield sock


def register_with_credentials(sip: SipSocket, branch: str, challenge: str, nc: int = 1) -> str:
    auth = digest_credentials(challenge, "REGISTER", "sip:127.0.0.1", USER, PASSWORD, nc=nc)
    contact = '<sip:x7@abc.invalid;transport=ws>;+sip.ice;reg-id=1;+sip.instance="<urn:uuid:0001>";expires=600'
    return request("REGISTER", "sip:127.0.0.1", call_id="reg-1", branch=branch, cseq=2,
                   headers=(("Contact", contact), ("Authorization", auth)))


def test_register_needs_digest_credentials_and_echoes_the_contact(sip) -> None:
    sip.send(request("REGISTER", "sip:127.0.0.1", call_id="reg-1",
                     headers=(("Contact", "<sip:x7@abc.invalid;transport=ws>;expires=600"),)))
    challenge = sip.receive()
    assert challenge.status == 401 and challenge.to_tag
    www = challenge.header("WWW-Authenticate")
    assert 'qop="auth"' in www and 'realm="voicepipe"' in www and "algorithm=MD5" in www

    branch = new_branch()
    sip.send(register_with_credentials(sip, branch, www))
    ok = sip.receive()
    assert ok.status == 200, ok.text
    # The binding comes back as sent, its expires capped by sip.register_expires_s.
    assert ok.header("Contact") == \
        '<sip:x7@abc.invalid;transport=ws>;+sip.ice;reg-id=1;+sip.instance="<urn:uuid:0001>";expires=300'
    # A retransmission (same branch) is absorbed: the same answer, byte for byte, and not processed again (its
    # nonce count, seen once, would now be refused as a replay).
    sip.send(register_with_credentials(sip, branch, www))
    assert sip.receive().text == ok.text
    # The same credentials in a new transaction are a replay.
    sip.send(register_with_credentials(sip, new_branch(), www))
    assert sip.receive().status == 401


def test_a_wrong_password_is_challenged_again_with_a_fresh_nonce(sip) -> None:
    sip.send(request("REGISTER", "sip:127.0.0.1"))
    first = sip.receive().header("WWW-Authenticate")
    auth = digest_credentials(first, "REGISTER", "sip:127.0.0.1", USER, "not-it")
    sip.send(request("REGISTER", "sip:127.0.0.1", cseq=2, headers=(("Authorization", auth),)))
    again = sip.receive()
    assert again.status == 401
    nonce = re.compile(r'nonce="([^"]+)"')
    assert nonce.search(again.header("WWW-Authenticate"))[1] != nonce.search(first)[1]


def test_an_invite_without_credentials_is_challenged(sip) -> None:
    sip.send(request("INVITE", headers=(("Content-Type", "application/sdp"),), body=SDP))
    assert sip.receive().status == 401


def invite_with_credentials(sip: SipSocket, *, headers: tuple = (), body: str = SDP,
                            uri: str = "sip:agent@127.0.0.1") -> None:
    """INVITE, read its 401, INVITE again with credentials (the answer to that is left to read)."""
    call_id = new_branch()
    sip.send(request("INVITE", uri, call_id=call_id, headers=headers, body=body))
    challenge = sip.final()
    assert challenge.status == 401, challenge.text
    auth = digest_credentials(challenge.header("WWW-Authenticate"), "INVITE", uri, USER, PASSWORD)
    sip.send(request("INVITE", uri, call_id=call_id, cseq=2, headers=(*headers, ("Authorization", auth)),
                     body=body))


@pytest.mark.parametrize(("headers", "body", "status", "reason"), [
    ((("Content-Type", "application/sdp"),), "", 488, "without an SDP offer"),
    ((("Content-Type", "text/plain"),), SDP, 415, None),
    ((("Content-Type", "application/sdp"),), "v=0\r\nnonsense", 488, "no audio section"),
    ((("Content-Type", "application/sdp"), ("Supported", "timer"), ("Session-Expires", "30")), SDP, 422, None),
])
def test_an_invite_it_cannot_take_is_refused(sip, headers, body, status, reason) -> None:
    invite_with_credentials(sip, headers=headers, body=body)
    answer = sip.final()
    assert answer.status == status, answer.text
    if reason:
        assert reason in answer.reason
    if status == 422:
        assert answer.header("Min-SE") == "90"
    if status == 415:
        assert answer.header("Accept") == "application/sdp"


def test_an_invite_while_the_models_load_is_tried_then_refused_with_503(sip) -> None:
    invite_with_credentials(sip, headers=(("Content-Type", "application/sdp"),))
    trying = sip.receive()
    assert trying.status == 100 and trying.to_tag is None  # 100 Trying carries no To tag
    refused = sip.receive()
    assert refused.status == 503 and refused.header("Retry-After") == "5" and refused.to_tag


@pytest.mark.parametrize(("method", "to_tag"), [("BYE", "nope"), ("INFO", "nope"), ("UPDATE", "nope"),
                                                ("BYE", None), ("INFO", None)])
def test_a_request_for_an_unknown_dialog_is_481(sip, method, to_tag) -> None:
    sip.send(request(method, to_tag=to_tag))
    assert sip.receive().status == 481


def test_a_cancel_for_an_unknown_transaction_is_481(sip) -> None:
    sip.send(request("CANCEL"))
    assert sip.receive().status == 481


def test_an_ack_for_nothing_gets_no_answer(sip) -> None:
    sip.send(request("ACK", to_tag="nope"))
    assert sip.quiet(0.5) == []


@pytest.mark.parametrize(("text", "status", "header"), [
    (request("MESSAGE", body="hi", headers=(("Content-Type", "text/plain"),)), 405, ("Allow", "INVITE, ACK")),
    (request("SUBSCRIBE"), 405, None),
    (request("OPTIONS", "tel:+15551234"), 416, None),
    (request("OPTIONS", headers=(("Require", "100rel, timer"),)), 420, ("Unsupported", "100rel")),
    (request("INFO", to_tag="x").replace("Max-Forwards: 70", "Max-Forwards: 0"), 483, None),
    (request("OPTIONS").replace("branch=z9hG4bK", "branch="), 400, None),
])
def test_what_it_does_not_serve(sip, text, status, header) -> None:
    sip.send(text)
    answer = sip.receive()
    assert answer.status == status, answer.text
    if header:
        assert answer.header(header[0]).startswith(header[1])


def test_options_answers_with_what_it_allows_and_copies_the_dialog_fields(sip) -> None:
    text = request("OPTIONS", call_id="opt-1", from_tag="ft9", cseq=7)
    sip.send(text)
    answer = sip.receive()
    assert answer.status == 200
    sent = dict(line.split(": ", 1) for line in text.split("\r\n")[1:] if ": " in line)
    for name in ("Via", "From", "Call-ID", "CSeq"):
        assert answer.header(name) == sent[name]
    assert answer.header("To") == f"{sent['To']};tag={answer.to_tag}"
    assert {"INVITE", "BYE", "CANCEL", "INFO", "UPDATE"} <= set(answer.header("Allow").split(", "))


MALFORMED = [
    request("OPTIONS").replace("CSeq: 1 OPTIONS", "CSeq: one OPTIONS"),
    request("OPTIONS").replace("CSeq: 1 OPTIONS", "CSeq: 1 INVITE"),
    "\r\n".join(line for line in request("OPTIONS").split("\r\n") if not line.startswith("Call-ID")),
    request("INFO", to_tag="x", body="Signal=1").replace("Content-Length: 8", "Content-Length: 80"),
    request("OPTIONS").replace("Max-Forwards: 70", "no colon here"),
]


def test_malformed_messages_get_400_saying_why_and_the_connection_carries_on(sip) -> None:
    for text in MALFORMED:
        sip.send(text)
        answer = sip.receive()
        assert answer.status == 400 and answer.reason != "Bad Request", (text[:60], answer.text)
    for garbage in ("hello", "GET / HTTP/1.1\r\n\r\n", "\x00\x01\x02", "SIP/2.0 banana"):
        sip.send(garbage)
    sip.ws.send(b"\xff\xfe binary garbage")
    assert sip.quiet(0.5) == []  # nothing to answer: dropped with a log line
    sip.send(request("OPTIONS"))
    assert sip.receive().status == 200


@pytest.mark.parametrize("size", [70_000, 3_000_000])
def test_oversized_messages_get_513_and_the_connection_carries_on(sip, size) -> None:
    body = "Signal=1\r\n" + "x" * size
    sip.send(request("INFO", to_tag="x", body=body, headers=(("Content-Type", "application/dtmf-relay"),)))
    answer = sip.receive()
    assert answer.status == 513 and "at most 65536" in answer.reason
    sip.send(request("OPTIONS"))
    assert sip.receive().status == 200


def test_a_keepalive_gets_its_pong(sip) -> None:
    sip.send("\r\n\r\n")
    assert sip.receive_raw() == "\r\n"


def test_the_endpoint_needs_the_sip_subprotocol(base) -> None:
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as refused:
        connect(base.replace("http", "ws") + "/sip", open_timeout=10)
    assert refused.value.response.status_code == 403


def test_the_web_phone_and_its_config(base) -> None:
    page = httpx.get(f"{base}/sipphone", timeout=10)
    assert page.status_code == 200 and "/static/sipphone/vendor/jssip.min.js" in page.text
    bundle = httpx.get(f"{base}/static/sipphone/vendor/jssip.min.js", timeout=10)
    assert bundle.status_code == 200 and bundle.text.startswith("/*! jssip 3.")
    config = httpx.get(f"{base}/sip/config", timeout=10).json()
    assert config == {"domain": None, "auth": True, "agents": ["support"], "iceServers": []}


def test_a_domain_and_a_token_and_sip_off(tmp_path) -> None:
    settings = call_settings(tmp_path, calls={"auth_token": "s3cret"}, sip={"domain": "voicepipe.test"})
    with app_on_loopback(create_app(settings, load_models=False)) as url:
        with pytest.raises(InvalidStatus):
            SipSocket(url)
        with SipSocket(url, token="s3cret") as sock:
            sock.send(request("REGISTER", "sip:other.test"))
            answer = sock.receive()
            assert answer.status == 404 and "voicepipe.test" in answer.reason
            sock.send(request("REGISTER", "sip:voicepipe.test",
                              headers=(("Contact", "<sip:x@y.invalid;transport=ws>"),)))
            assert sock.receive().status == 200  # no sip.users: no digest
        assert httpx.get(f"{url}/sip/config", timeout=10).status_code == 401
    off = call_settings(tmp_path, sip={"enabled": False})
    with app_on_loopback(create_app(off, load_models=False)) as url:
        assert httpx.get(f"{url}/sipphone", timeout=10).status_code == 404
        with pytest.raises(InvalidStatus):
            SipSocket(url)


def test_sip_max_calls_zero_refuses_every_invite(tmp_path) -> None:
    settings = call_settings(tmp_path, sip={"max_calls": 0})
    with app_on_loopback(create_app(settings, load_models=False)) as url, SipSocket(url) as sock:
        sock.send(request("INVITE", headers=(("Content-Type", "application/sdp"),), body=SDP))
        answer = sock.receive()
        assert answer.status == 486 and answer.to_tag


def test_the_service_wide_call_limit_and_a_drain_refuse_an_invite_as_sip_expects(tmp_path) -> None:
    """calls.max_concurrent answers 486 Busy Here; a draining server 503 Service Unavailable (before 100 Trying)."""
    settings = call_settings(tmp_path, calls={"max_concurrent": 1})
    app = create_app(settings, load_models=False)
    taken = app.state.admission.admit("native")  # the one call it takes is live on another transport
    with app_on_loopback(app) as url, SipSocket(url) as sock:
        sock.send(request("INVITE", headers=(("Content-Type", "application/sdp"),), body=SDP))
        busy = sock.receive()
        assert busy.status == 486 and busy.to_tag and "max_concurrent" in busy.reason, busy.text
        taken.release()
        app.state.admission.drain()
        sock.send(request("INVITE", headers=(("Content-Type", "application/sdp"),), body=SDP))
        assert sock.receive().status == 503
    assert app.state.admission.refused == {("sip", "saturated"): 1, ("sip", "draining"): 1}


def test_a_client_address_over_its_connection_limit_gets_no_more_sip_sockets(tmp_path) -> None:
    from websockets.exceptions import ConnectionClosed

    settings = call_settings(tmp_path, calls={"max_connections_per_client": 1})
    with app_on_loopback(create_app(settings, load_models=False)) as url, SipSocket(url) as first:
        with SipSocket(url) as second, pytest.raises(ConnectionClosed) as closed:
            second.receive()
        assert closed.value.rcvd.code == 1013 and "too many connections" in closed.value.rcvd.reason
        first.send("\r\n\r\n")  # the first one still serves (a keep-alive gets its pong)
        assert first.receive_raw() == "\r\n"


def test_numbers_that_are_not_ascii_digits_are_no_numbers(tmp_path) -> None:
    """'²' passes str.isdigit and fails int(): an Expires or Session-Expires of it is ignored, not a 500."""
    with app_on_loopback(create_app(call_settings(tmp_path), load_models=False)) as url, SipSocket(url) as sock:
        sock.send(request("REGISTER", "sip:127.0.0.1", headers=(("Expires", "²"),
                                                              ("Contact", "<sip:x@y.invalid>;expires=²"))))
        ok = sock.receive()
        assert ok.status == 200 and ok.header("Contact") == "<sip:x@y.invalid>;expires=600"
        sock.send(request("INVITE", headers=(("Content-Type", "application/sdp"), ("Supported", "timer"),
                                             ("Session-Expires", "²")), body=SDP))
        assert [sock.receive().status, sock.receive().status] == [100, 503]  # past the timer check (no 422/500)
