"""WebRTC calls (aiortc): `POST /webrtc/offer` signalling, a peer connection driven as the gateway's socket,
and the media tracks; see signalling.py, link.py and media.py. The caller's end is voicepipe/caller/webrtc.py."""

from voicepipe.transports.webrtc.signalling import create_webrtc_router, hang_up_webrtc_calls

__all__ = ["create_webrtc_router", "hang_up_webrtc_calls"]
