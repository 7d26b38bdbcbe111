"""The pure parts of the SIP endpoint: messages, digest authentication, DTMF bodies and server transactions."""

from __future__ import annotations

import pytest

from voicepipe.transports.sip.dialog import transfer_uri
from voicepipe.transports.sip.digest import DigestServer, authorization, parse_digest
from voicepipe.transports.sip.dtmf import BadDtmf, info_digit
from voicepipe.transports.sip.message import (
    Request,
    Response,
    SipError,
    parse,
    parse_address,
    parse_uri,
    response_to,
)
from voicepipe.transports.sip.transactions import TransactionTable

MAX = 65536

INVITE = (
    "INVITE sip:support@voicepipe.test SIP/2.0\r\n"
    "v: SIP/2.0/WSS df7jal23ls0d.invalid;branch=z9hG4bKnashds7;rport\r\n"
    "Via: SIP/2.0/WSS proxy.invalid;branch=z9hG4bKp1, SIP/2.0/TCP edge.invalid;branch=z9hG4bKe1\r\n"
    "Max-Forwards: 69\r\n"
    'f: "Alice" <sip:alice@voicepipe.test>;tag=9fxced76sl\r\n'
    "t: <sip:support@voicepipe.test>\r\n"
    "i: 3848276298220188511@atlanta.test\r\n"
    "CSeq: 314159 INVITE\r\n"
    "m: <sip:alice@df7jal23ls0d.invalid;transport=ws;ob>\r\n"
    "Subject: a header folded\r\n over two lines\r\n"
    "c: application/sdp\r\n"
    "l: 5\r\n"
    "\r\n"
    "v=0\r\nextra bytes past Content-Length"
)


def test_a_request_parses_with_compact_forms_folding_and_comma_lists() -> None:
    request = parse(INVITE, MAX)
    assert isinstance(request, Request)
    assert (request.method, request.uri) == ("INVITE", "sip:support@voicepipe.test")
    assert request.values("Via") == ["SIP/2.0/WSS df7jal23ls0d.invalid;branch=z9hG4bKnashds7;rport",
                                     "SIP/2.0/WSS proxy.invalid;branch=z9hG4bKp1",
                                     "SIP/2.0/TCP edge.invalid;branch=z9hG4bKe1"]
    assert request.top_via.branch == "z9hG4bKnashds7" and request.top_via.sent_by == "df7jal23ls0d.invalid"
    assert request.call_id == "3848276298220188511@atlanta.test"
    assert request.cseq == (314159, "INVITE")
    assert request.from_tag == "9fxced76sl" and request.to_tag is None
    assert request.get("Subject") == "a header folded over two lines"
    assert request.body == "v=0\r\n"  # as long as Content-Length says
    contact = parse_address(request.get("Contact"))
    assert contact.uri == "sip:alice@df7jal23ls0d.invalid;transport=ws;ob"
    uri = parse_uri(request.uri)
    assert (uri.scheme, uri.user, uri.host, uri.port) == ("sip", "support", "voicepipe.test", None)


def test_a_response_copies_via_from_to_call_id_and_cseq_and_tags_to() -> None:
    request = parse(INVITE, MAX)
    response = response_to(request, 486, to_tag="srv1", headers=[("Retry-After", "5")])
    text = response.serialize()
    lines = text.split("\r\n")
    assert lines[0] == "SIP/2.0 486 Busy Here"
    assert lines[1:4] == ["Via: SIP/2.0/WSS df7jal23ls0d.invalid;branch=z9hG4bKnashds7;rport",
                          "Via: SIP/2.0/WSS proxy.invalid;branch=z9hG4bKp1",
                          "Via: SIP/2.0/TCP edge.invalid;branch=z9hG4bKe1"]
    assert lines[4] == 'From: "Alice" <sip:alice@voicepipe.test>;tag=9fxced76sl'
    assert lines[5] == "To: <sip:support@voicepipe.test>;tag=srv1"
    assert lines[6:8] == ["Call-ID: 3848276298220188511@atlanta.test", "CSeq: 314159 INVITE"]
    assert text.endswith("Retry-After: 5\r\nContent-Length: 0\r\n\r\n")
    # A To that already has a tag keeps it; the message reads back as it was written.
    tagged = parse(INVITE.replace("t: <sip:support@voicepipe.test>", "t: <sip:support@voicepipe.test>;tag=a"), MAX)
    assert response_to(tagged, 200, to_tag="srv1").get("To") == "<sip:support@voicepipe.test>;tag=a"
    again = parse(text, MAX)
    assert isinstance(again, Response) and again.status == 486 and again.get("Retry-After") == "5"


@pytest.mark.parametrize(("edit", "problem"), [
    (("CSeq: 314159 INVITE", "CSeq: x INVITE"), "Bad CSeq"),
    (("CSeq: 314159 INVITE", "CSeq: 1 BYE"), "CSeq method"),
    (("i: 3848276298220188511@atlanta.test\r\n", ""), "Missing Call-ID"),
    (("l: 5", "l: 500"), "shorter than its Content-Length"),
    (("l: 5", "l: -1"), "Bad Content-Length"),
    (("Max-Forwards: 69", "Max-Forwards: lots"), "Bad Max-Forwards"),
    (("Max-Forwards: 69", "this line has no colon"), "Malformed header line"),
    (("t: <sip:support@voicepipe.test>", "t: <sip:support@voicepipe.test"), "Bad To"),
])
def test_a_malformed_request_is_a_400_that_can_still_be_answered(edit, problem) -> None:
    with pytest.raises(SipError) as caught:
        parse(INVITE.replace(*edit), MAX)
    assert caught.value.status == 400 and problem in caught.value.reason
    if problem != "Missing Call-ID":
        assert caught.value.request is not None and caught.value.request.top_via.branch == "z9hG4bKnashds7"


@pytest.mark.parametrize("text", ["", "hello", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "SIP/2.0 abc OK\r\n\r\n",
                                  "INVITE  SIP/2.0\r\n\r\n", "\x00\xff" * 50])
def test_garbage_is_refused_without_a_request_to_answer(text) -> None:
    with pytest.raises(SipError) as caught:
        parse(text, MAX)
    assert caught.value.status == 400 and caught.value.request is None


def test_an_oversized_message_is_a_513_with_its_head_to_answer() -> None:
    big = INVITE.replace("l: 5", f"l: {200_000}").replace("v=0\r\n", "a" * 200_000)
    with pytest.raises(SipError) as caught:
        parse(big, MAX)
    assert caught.value.status == 513 and caught.value.request.method == "INVITE"
    with pytest.raises(SipError) as caught:
        parse("x" * (MAX + 1), MAX)
    assert caught.value.status == 513 and caught.value.request is None


def test_addresses_keep_their_parameters() -> None:
    value = '<sip:x@y.invalid;transport=ws>;+sip.ice;reg-id=1;+sip.instance="<urn:uuid:a-b>";expires=600'
    address = parse_address(value)
    assert address.uri == "sip:x@y.invalid;transport=ws"
    assert address.params == {"+sip.ice": None, "reg-id": "1", "+sip.instance": '"<urn:uuid:a-b>"', "expires": "600"}
    assert address.with_params(expires="300") == \
        '<sip:x@y.invalid;transport=ws>;+sip.ice;reg-id=1;+sip.instance="<urn:uuid:a-b>";expires=300'
    assert parse_address("sip:bob@b.test;tag=7").params == {"tag": "7"}
    assert parse_uri("tel:+15551234").scheme == "tel"
    assert parse_uri("not a uri") is None


# -- digest ---------------------------------------------------------------------------------------------------------
def register(uri: str = "sip:voicepipe.test", auth: str | None = None) -> Request:
    headers = [("Via", "SIP/2.0/WS h.invalid;branch=z9hG4bK1"), ("From", "<sip:alice@voicepipe.test>;tag=1"),
               ("To", "<sip:alice@voicepipe.test>"), ("Call-ID", "c"), ("CSeq", "1 REGISTER")]
    return Request(headers=headers + ([("Authorization", auth)] if auth else []), method="REGISTER", uri=uri)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_digest_accepts_the_right_password_once_per_nonce_count() -> None:
    clock = Clock()
    server = DigestServer("voicepipe.test", {"alice": "wonderland"}, clock=clock)
    challenge = server.challenge()
    assert parse_digest(challenge)["qop"] == "auth"
    auth = authorization(challenge, "REGISTER", "sip:voicepipe.test", "alice", "wonderland", nc=1)
    assert server.check(register(auth=auth)).user == "alice"
    assert server.check(register(auth=auth)).user is None  # the same nonce count again: a replay
    auth2 = authorization(challenge, "REGISTER", "sip:voicepipe.test", "alice", "wonderland", nc=2)
    assert server.check(register(auth=auth2)).user == "alice"


@pytest.mark.parametrize(("user", "password", "uri", "why"), [
    ("alice", "wrong", "sip:voicepipe.test", "wrong user or password"),
    ("mallory", "wonderland", "sip:voicepipe.test", "wrong user or password"),
    ("alice", "wonderland", "sip:other.test", "not the Request-URI"),
])
def test_digest_refuses_wrong_credentials(user, password, uri, why) -> None:
    server = DigestServer("voicepipe.test", {"alice": "wonderland"})
    auth = authorization(server.challenge(), "REGISTER", uri, user, password)
    result = server.check(register(auth=auth))
    assert result.user is None and why in result.why and not result.stale
    assert server.check(register()).why == "no credentials"


def test_digest_refuses_nonces_it_did_not_issue_and_marks_old_ones_stale() -> None:
    clock = Clock()
    server = DigestServer("voicepipe.test", {"alice": "wonderland"}, nonce_ttl_s=300, clock=clock)
    other = DigestServer("voicepipe.test", {"alice": "wonderland"}, clock=clock)
    foreign = authorization(other.challenge(), "REGISTER", "sip:voicepipe.test", "alice", "wonderland")
    assert "did not issue" in server.check(register(auth=foreign)).why
    old = authorization(server.challenge(), "REGISTER", "sip:voicepipe.test", "alice", "wonderland")
    clock.now += 301
    result = server.check(register(auth=old))
    assert result.user is None and result.stale
    assert "stale=true" in server.challenge(stale=True)


# -- DTMF -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("content_type", "body", "digit"), [
    ("application/dtmf-relay", "Signal=5\r\nDuration=160\r\n", "5"),
    ("Application/DTMF-Relay; charset=utf-8", "Signal= #\nDuration=100", "#"),
    ("application/dtmf-relay", "Signal=11\r\nDuration=100", "#"),
    ("application/dtmf-relay", "Signal=10\r\n", "*"),
    ("application/dtmf", "7", "7"),
    ("application/dtmf", " d\r\n", "D"),
])
def test_dtmf_bodies(content_type, body, digit) -> None:
    assert info_digit(content_type, body) == digit


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/dtmf-relay", "Duration=160"), ("application/dtmf-relay", "Signal=X"),
    ("application/dtmf", "12"), ("application/dtmf", ""), ("text/plain", "5"), (None, "5"),
])
def test_bad_dtmf_bodies(content_type, body) -> None:
    with pytest.raises(BadDtmf):
        info_digit(content_type, body)


# -- transactions -----------------------------------------------------------------------------------------------
def sip_request(method: str, branch: str = "z9hG4bKa", to_tag: str | None = None) -> Request:
    to = "<sip:agent@x>" + (f";tag={to_tag}" if to_tag else "")
    cseq_method = "INVITE" if method == "ACK" else method
    return Request(headers=[("Via", f"SIP/2.0/WS h.invalid;branch={branch}"), ("From", "<sip:a@x>;tag=f"),
                            ("To", to), ("Call-ID", "c1"), ("CSeq", f"1 {cseq_method}")], method=method, uri="sip:x")


def test_a_retransmitted_invite_gets_the_provisional_again_then_is_absorbed_once_accepted() -> None:
    sent: list[Response] = []
    table = TransactionTable(sent.append, clock=Clock())
    tx = table.receive(sip_request("INVITE"))
    assert tx is not None
    assert table.receive(sip_request("INVITE")) is None and sent == []  # nothing to repeat yet
    trying = response_to(tx.request, 100)
    table.respond(tx, trying)
    assert table.receive(sip_request("INVITE")) is None and sent == [trying, trying]
    ok = response_to(tx.request, 200, to_tag=tx.to_tag)
    assert table.respond(tx, ok)
    assert not table.respond(tx, response_to(tx.request, 487, to_tag=tx.to_tag))  # one final answer only
    assert table.receive(sip_request("INVITE")) is None and sent == [trying, trying, ok]  # RFC 6026: absorbed
    ack = table.receive(sip_request("ACK", branch="z9hG4bKnew", to_tag=tx.to_tag))
    assert ack is not None and not ack.stored  # the ACK of a 2xx is the dialog's
    assert table.absorbed == 3


def test_a_non_invite_retransmission_gets_the_same_final_answer_and_lingers_32_s() -> None:
    sent: list[Response] = []
    clock = Clock()
    table = TransactionTable(sent.append, clock=clock)
    tx = table.receive(sip_request("REGISTER"))
    final = response_to(tx.request, 200, to_tag=tx.to_tag)
    table.respond(tx, final)
    assert table.receive(sip_request("REGISTER")) is None and sent == [final, final]
    clock.now += 33
    assert table.receive(sip_request("REGISTER")) is not None  # expired: a new transaction


def test_the_ack_of_a_refused_invite_ends_its_transaction_quietly() -> None:
    sent: list[Response] = []
    table = TransactionTable(sent.append, clock=Clock())
    tx = table.receive(sip_request("INVITE"))
    table.respond(tx, response_to(tx.request, 487, to_tag=tx.to_tag))
    assert table.receive(sip_request("ACK", to_tag=tx.to_tag)) is None
    assert table.receive(sip_request("ACK", to_tag=tx.to_tag)) is None
    assert len(sent) == 1


def test_the_table_is_bounded() -> None:
    table = TransactionTable(lambda r: None, clock=Clock(), limit=10)
    for i in range(50):
        table.receive(sip_request("OPTIONS", branch=f"z9hG4bK{i}"))
    assert len(table) == 10


def test_a_reason_phrase_stays_on_its_line() -> None:
    request = parse(INVITE, MAX)
    text = response_to(request, 488, "Not Acceptable Here (line one\r\nInjected: yes)").serialize()
    assert text.startswith("SIP/2.0 488 Not Acceptable Here (line one Injected: yes)\r\n")
    assert parse(text, MAX).get("Injected") is None


@pytest.mark.parametrize(("target", "uri"), [
    ("sales", "sip:sales@pbx.example"),
    ("billing department", "sip:billing-department@pbx.example"),
    ("+1 (555) 010-0100", "sip:+15550100100@pbx.example"),
    ("sip:bob@example.com", "sip:bob@example.com"),
    ("sips:desk@example.com;transport=ws", "sips:desk@example.com;transport=ws"),
    ("sip:x@y>\r\nEvil: 1", "sip:sip-x-y-Evil-1@pbx.example"),  # the model's words never break the header
    ("  ", "sip:operator@pbx.example"),
])
def test_a_transfer_target_becomes_the_refers_uri(target, uri) -> None:
    assert transfer_uri(target, "pbx.example") == uri
