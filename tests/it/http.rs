//! HTTP before the WebSocket: deadlines, sizes, caps, origins, the strict handshake.
