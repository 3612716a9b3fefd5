"""Recorded ``kubectl exec``/``attach`` sessions (issue 25 item 2), kas' half.

kas taps the raw bytes of an upgraded exec/attach connection it relays (``tool/http_grpc/proxy_call.py``) into a
bounded buffer (``recorder.py``); when the session ends the bytes are demultiplexed (WebSocket channels,
``websocket.py``, or SPDY/3.1 streams, ``spdy.py``) into an asciicast v2 file (``asciicast.py``) and sent to the hub
beside the session's audit event (``PUT /api/v4/internal/kubernetes/audit_events/{id}/recording``).
"""
