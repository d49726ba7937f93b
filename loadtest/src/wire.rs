//! The WebSocket side: opening a bot's connection from a chosen source
//! address, and counting bytes as they are on the wire.
//!
//! tungstenite hands over payloads, not frames, so the frame header is
//! computed from the payload length (RFC 6455 §5.2): 2 bytes, plus 2 or 8 for
//! an extended length, plus the 4-byte mask that every client→server frame
//! carries. Every message here fits one frame (the server sends no
//! fragments). TCP/IP headers and the HTTP upgrade are not counted.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{WebSocketStream, client_async_with_config};

use crate::plan::Target;
use crate::stats::ErrorKind;

/// A bot's socket.
pub type Socket = WebSocketStream<TcpStream>;

/// Bound on a TCP connect and on the WebSocket handshake, each.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes a frame with `payload` bytes takes on the wire; `masked` for
/// client→server frames.
pub const fn frame_bytes(payload: usize, masked: bool) -> u64 {
    let length = if payload < 126 {
        0
    } else if payload <= 0xffff {
        2
    } else {
        8
    };
    let mask = if masked { 4 } else { 0 };
    (2 + length + mask + payload) as u64
}

/// Small buffers: thousands of bots each hold one socket, and every frame is
/// a few bytes (tungstenite's default is 128 KiB each way).
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        // Write each message at once: latency is what is being measured.
        .write_buffer_size(0)
        .max_write_buffer_size(256 * 1024)
        .max_message_size(Some(4 << 20))
        .max_frame_size(Some(4 << 20))
}

/// Opens a WebSocket to `target` (resolved to `addr`) from `source` (or an
/// address the kernel picks), asking for the `amble.v1` subprotocol.
pub async fn connect(
    target: &Target,
    addr: SocketAddr,
    source: Option<IpAddr>,
) -> Result<Socket, (ErrorKind, anyhow::Error)> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| (ErrorKind::ConnectOther, e.into()))?;
    if let Some(ip) = source {
        socket
            .bind(SocketAddr::new(ip, 0))
            .with_context(|| format!("binding source address {ip}"))
            .map_err(|e| (ErrorKind::ConnectOther, e))?;
    }
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
        Err(_) => {
            return Err((
                ErrorKind::ConnectTimeout,
                anyhow::anyhow!("connect timed out"),
            ));
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err((ErrorKind::ConnectRefused, e.into()));
        }
        Ok(Err(e)) => return Err((ErrorKind::ConnectOther, e.into())),
        Ok(Ok(stream)) => stream,
    };
    // Small frames must not wait for Nagle.
    stream
        .set_nodelay(true)
        .map_err(|e| (ErrorKind::ConnectOther, e.into()))?;

    let mut request = format!("ws://{}{}", target.authority(), target.path)
        .into_client_request()
        .map_err(|e| (ErrorKind::Handshake, e.into()))?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(amble::protocol::SUBPROTOCOL),
    );
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        client_async_with_config(request, stream, Some(config())),
    )
    .await
    {
        Err(_) => Err((
            ErrorKind::HandshakeTimeout,
            anyhow::anyhow!("handshake timed out"),
        )),
        Ok(Err(e)) => Err((ErrorKind::Handshake, e.into())),
        Ok(Ok((socket, _response))) => Ok(socket),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_sizes() {
        // Server to client: unmasked.
        assert_eq!(frame_bytes(0, false), 2);
        assert_eq!(frame_bytes(5, false), 7);
        assert_eq!(frame_bytes(125, false), 127);
        assert_eq!(frame_bytes(126, false), 126 + 4);
        assert_eq!(frame_bytes(65_535, false), 65_535 + 4);
        assert_eq!(frame_bytes(65_536, false), 65_536 + 10);
        // Client to server: a 4-byte mask on every frame.
        assert_eq!(frame_bytes(5, true), 11);
        assert_eq!(frame_bytes(200, true), 208);
        assert_eq!(frame_bytes(70_000, true), 70_014);
    }

    #[test]
    fn header_formula_matches_tungstenite() {
        use tokio_tungstenite::tungstenite::protocol::frame::{
            Frame, coding::Data, coding::OpCode,
        };
        for len in [0usize, 1, 125, 126, 127, 65_535, 65_536] {
            for masked in [false, true] {
                let mut frame = Frame::message(vec![0u8; len], OpCode::Data(Data::Binary), true);
                if masked {
                    frame.header_mut().mask = Some([1, 2, 3, 4]);
                }
                let mut out = Vec::new();
                frame.format(&mut out).unwrap();
                assert_eq!(
                    out.len() as u64,
                    frame_bytes(len, masked),
                    "len {len} masked {masked}"
                );
            }
        }
    }
}
