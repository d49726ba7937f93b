//! The socket under a WebSocket, out of the HTTP layer's wrapper.
//!
//! hyper hands an upgraded connection over as its own `Upgraded`, a boxed
//! stream behind a rewind buffer, with the edge's deadline watch under it:
//! every read and write of the WebSocket would pass through all of them
//! for the socket's whole life. [`Io::Tcp`] is the TCP socket itself, with
//! the bytes hyper read past the request head (served first) and the
//! socket's [`Admission`]; [`Io::Upgraded`] keeps hyper's wrapper for any
//! other stream (the tests' in-memory pipes).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::access::addresses::Lease;

/// What a socket holds beyond itself: its slot under the server's socket
/// budget and its place under its address's cap. Both are released when
/// the socket closes, after an upgrade too.
#[derive(Debug, Default)]
pub struct Admission {
    #[expect(dead_code, reason = "held, never read: dropping it frees the slot")]
    pub socket: Option<OwnedSemaphorePermit>,
    #[expect(dead_code, reason = "held, never read: dropping it frees the place")]
    pub address: Option<Lease>,
}

/// An upgraded connection's byte stream.
#[derive(Debug)]
pub enum Io {
    /// The TCP socket itself.
    Tcp(Tcp),
    /// Any other stream, through hyper's wrapper.
    Upgraded(TokioIo<Upgraded>),
}

/// A TCP socket taken back from hyper after an upgrade.
#[derive(Debug)]
pub struct Tcp {
    /// What hyper had read past the request head: read before the socket.
    ahead: Bytes,
    stream: TcpStream,
    _admission: Admission,
}

impl Tcp {
    /// `ahead` is copied: as hyper hands it over, it shares (and would keep
    /// alive for the socket's life) hyper's whole read buffer, even when
    /// empty. Empty, it is not allocated at all.
    pub fn new(stream: TcpStream, ahead: Bytes, admission: Admission) -> Self {
        Self {
            ahead: Bytes::copy_from_slice(&ahead),
            stream,
            _admission: admission,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(tcp) => {
                if tcp.ahead.is_empty() {
                    return Pin::new(&mut tcp.stream).poll_read(cx, buf);
                }
                let n = tcp.ahead.len().min(buf.remaining());
                buf.put_slice(&tcp.ahead[..n]);
                if n == tcp.ahead.len() {
                    tcp.ahead = Bytes::new();
                } else {
                    tcp.ahead.advance(n);
                }
                Poll::Ready(Ok(()))
            }
            Self::Upgraded(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(tcp) => Pin::new(&mut tcp.stream).poll_write(cx, buf),
            Self::Upgraded(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(tcp) => Pin::new(&mut tcp.stream).poll_write_vectored(cx, bufs),
            Self::Upgraded(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(tcp) => tcp.stream.is_write_vectored(),
            Self::Upgraded(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(tcp) => Pin::new(&mut tcp.stream).poll_flush(cx),
            Self::Upgraded(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(tcp) => Pin::new(&mut tcp.stream).poll_shutdown(cx),
            Self::Upgraded(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// Bytes hyper read past the head come first, then the socket's, in
    /// order, whatever the size of the reads.
    #[tokio::test]
    async fn reads_ahead_bytes_before_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut io = Io::Tcp(Tcp::new(
            server,
            Bytes::from_static(b"abcde"),
            Admission::default(),
        ));
        client.write_all(b"fgh").await.unwrap();
        let mut two = [0u8; 2];
        io.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ab");
        let mut six = [0u8; 6];
        io.read_exact(&mut six).await.unwrap();
        assert_eq!(&six, b"cdefgh");
        io.write_all(b"ok").await.unwrap();
        client.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"ok");
    }
}
