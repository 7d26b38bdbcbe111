"""SIP over WebSocket (RFC 7118): a user agent server at `/sip` that JsSIP, SIP.js and the web phones built on
them call directly; the media is WebRTC (RFC 8827), run by the same aiortc peer and `Connection` as
`/webrtc/offer`. The rooms inside, bottom up: message.py (parse and write SIP messages), digest.py (digest
authentication, both ends), dtmf.py (INFO bodies), transactions.py (server transactions), dialog.py (one INVITE
dialog bound to its peer and call), flow.py (one WebSocket connection's user agent server), service.py (the
endpoint and what its connections share). The caller's end is voicepipe/caller/sip.py."""

from voicepipe.transports.sip.service import create_sip_router, hang_up_sip_calls

__all__ = ["create_sip_router", "hang_up_sip_calls"]
