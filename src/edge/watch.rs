//! A connection's deadlines before the WebSocket: its [`Phase`] and when
//! the phase began ([`Watch`]), told by the socket wrapper hyper reads and
//! writes through ([`Watched`]), and the way out of that wrapper once the
//! connection is upgraded ([`unwrap_upgraded`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::session::io::{Admission, Io, Tcp};

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expired {
    /// No whole request head in time.
    Head,
    /// Nothing started (or nothing read) for the idle timeout.
    Idle,
}

/// Where a connection is, for its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Phase {
    /// Upgraded: nothing watched.
    Upgraded = 0,
    /// Between requests, nothing received yet: the idle deadline.
    Idle = 1,
    /// Receiving a request head: the head deadline.
    Head = 2,
    /// A request is being answered: idle deadline, renewed by writes.
    Serving = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Idle,
            2 => Self::Head,
            3 => Self::Serving,
            _ => Self::Upgraded,
        }
    }
}

/// A connection's phase and when it began, shared by its socket wrapper,
/// its service and its driver (all on one task; atomics only to be `Sync`).
pub(super) struct Watch {
    epoch: Instant,
    phase: AtomicU8,
    /// Milliseconds from `epoch` to the start of the phase.
    since_ms: AtomicU64,
    writes: AtomicU64,
    writes_seen: AtomicU64,
}

impl Watch {
    pub(super) fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            // A new connection owes its first head from the start.
            phase: AtomicU8::new(Phase::Head as u8),
            since_ms: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            writes_seen: AtomicU64::new(0),
        }
    }

    pub(super) fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Relaxed))
    }

    pub(super) fn enter(&self, phase: Phase, now: Instant) {
        self.since_ms.store(self.ms(now), Relaxed);
        self.phase.store(phase as u8, Relaxed);
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.since_ms.load(Relaxed))
    }

    /// Bytes arrived: between requests, a head begins.
    fn on_read(&self) {
        // A plain load first: the compare-exchange is a locked instruction,
        // and an upgraded socket reads here for the rest of its life.
        if self.phase.load(Relaxed) == Phase::Idle as u8
            && self
                .phase
                .compare_exchange(Phase::Idle as u8, Phase::Head as u8, Relaxed, Relaxed)
                .is_ok()
        {
            self.since_ms.store(self.ms(Instant::now()), Relaxed);
        }
    }

    fn on_write(&self) {
        if self.phase() != Phase::Upgraded {
            self.writes.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn deadline(&self, head: Duration, idle: Duration) -> Instant {
        match self.phase() {
            Phase::Head => self.since() + head,
            Phase::Idle | Phase::Serving => self.since() + idle,
            // The connection completes at once; look again in a while.
            Phase::Upgraded => Instant::now() + idle,
        }
    }

    /// At `now`: the next deadline, or which one passed. Writes made while
    /// serving renew the idle deadline (a slow reader still reads).
    pub(super) fn check(
        &self,
        now: Instant,
        head: Duration,
        idle: Duration,
    ) -> Result<Instant, Expired> {
        let phase = self.phase();
        if phase == Phase::Serving {
            let writes = self.writes.load(Relaxed);
            if self.writes_seen.swap(writes, Relaxed) != writes {
                self.since_ms.store(self.ms(now), Relaxed);
            }
        }
        let deadline = self.deadline(head, idle);
        if now < deadline {
            return Ok(deadline);
        }
        match phase {
            Phase::Head => Err(Expired::Head),
            Phase::Idle | Phase::Serving => Err(Expired::Idle),
            Phase::Upgraded => Ok(deadline),
        }
    }
}

/// The socket as hyper sees it: reads and writes tell the [`Watch`]; the
/// socket's admission is released when it is dropped.
pub(super) struct Watched<I> {
    pub(super) io: I,
    pub(super) watch: Arc<Watch>,
    pub(super) _admission: Admission,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.on_read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.watch.on_write();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.watch.on_write();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An upgraded connection's stream, out of hyper's wrapper when it is a TCP
/// socket served here: the socket itself, the bytes hyper read past the
/// request head and the socket's admission, with the deadline watch (which
/// has nothing left to watch) dropped. Any other stream stays in hyper's
/// wrapper.
pub(super) fn unwrap_upgraded(upgraded: Upgraded) -> Io {
    match upgraded.downcast::<TokioIo<Watched<TcpStream>>>() {
        Ok(parts) => {
            let Watched { io, _admission, .. } = parts.io.into_inner();
            Io::Tcp(Tcp::new(io, parts.read_buf, _admission))
        }
        Err(upgraded) => Io::Upgraded(TokioIo::new(upgraded)),
    }
}
