//! The write side of one client socket, shared by its connection and its
//! room.
//!
//! A room writes its frames straight into every member's socket, under the
//! room lock, without waking the members' tasks: the socket write is a
//! non-blocking `send` with nobody waiting on it. What the socket does not
//! take at once queues here, in order, and the connection task writes it
//! when the socket drains. Past `limit` queued bytes a member stops
//! receiving room frames and is owed a `Resync` snapshot instead, so a slow
//! reader costs the room nothing and never holds memory without bound.
//!
//! The same queue carries what tungstenite writes for the connection task
//! (its own replies, pings, pongs, close frames), through [`WsIo`]. Every
//! write is taken whole, so the byte stream stays a sequence of complete
//! WebSocket frames whichever side wrote them.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::room::sink::{Frame, Removal, Sink};

/// Frames up to this size are written with one plain `send` of a copy;
/// larger ones as two slices, header and shared payload.
const SMALL_FRAME: usize = 512;

/// One socket's outgoing bytes.
pub struct Outbox<S> {
    state: Mutex<State<S>>,
    metrics: Arc<Metrics>,
    /// Queued bytes past which room frames are dropped (and a resync owed).
    limit: usize,
    /// Queued bytes past which the connection's own writes wait.
    hard_limit: usize,
}

struct State<S> {
    io: S,
    /// Accepted but unwritten bytes: whole frames, in order (the front one
    /// may be partly written).
    queue: VecDeque<Bytes>,
    /// Bytes ever queued and ever written from the queue; the difference
    /// is what waits now.
    enqueued: u64,
    written: u64,
    /// `enqueued` just after the newest snapshot: bytes up to here belong
    /// to snapshots or earlier and do not count against `limit`, so a big
    /// snapshot cannot make its own member lag again.
    snapshot_end: u64,
    /// Room frames were dropped; the next snapshot ends it.
    lagged: bool,
    /// The socket failed; nothing more is written.
    failed: bool,
    /// A whole snapshot did not fit under the hard limit: the peer is not
    /// reading, and the connection must end.
    overflowed: bool,
    /// A Close frame has been written: no room frame may follow it.
    sealed: bool,
    /// The room took this member out (a newer connection of its user, the
    /// server API).
    removed: Option<Removal>,
    /// A resume from a newer connection took this member's place.
    superseded: bool,
    /// When the current backlog began (`None` while the queue is empty),
    /// and the start of the backlog the connection task was last told of.
    backlog: Option<Instant>,
    reported: Option<Instant>,
    /// The connection task, while it waits for something to happen here.
    waker: Option<Waker>,
}

/// What the connection task must act on (see [`Outbox::poll_event`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The socket stopped taking bytes at this instant; the backlog is
    /// being written as it drains.
    Backlog(Instant),
    /// The backlog is written.
    Drained,
    /// Room frames were dropped: the member needs a `Resync`.
    Lagged,
    /// A snapshot could not be queued within the hard limit: the peer has
    /// stopped reading.
    Overflowed,
    /// A write failed: the peer is gone.
    Failed,
    /// The room took the member out: a newer connection of the same user
    /// took its place, or the app removed it.
    Removed(Removal),
    /// A resume (the same client, from a newer connection) took this
    /// member's place.
    Superseded,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Outbox<S> {
    /// `limit`: queued bytes a member may have before it misses room
    /// frames. `largest_frame`: the largest frame the server writes.
    pub fn new(io: S, metrics: Arc<Metrics>, limit: usize, largest_frame: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                io,
                queue: VecDeque::new(),
                enqueued: 0,
                written: 0,
                snapshot_end: 0,
                lagged: false,
                failed: false,
                removed: None,
                superseded: false,
                overflowed: false,
                sealed: false,
                backlog: None,
                reported: None,
                waker: None,
            }),
            metrics,
            limit,
            hard_limit: limit.saturating_add(largest_frame.saturating_mul(2)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        // Every critical section leaves the queue whole; a panic in one
        // cannot leave it torn, so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, frame: &Frame, snapshot: bool) {
        let mut st = self.lock();
        if st.failed || st.overflowed || st.sealed {
            return;
        }
        let (head, head_len) = header(frame.len());
        let total = head_len + frame.len();
        if snapshot {
            if st.queued() + total > self.hard_limit {
                // Snapshot after snapshot into a socket nobody reads.
                st.overflowed = true;
                st.wake();
                return;
            }
            // A snapshot supersedes every frame dropped before it.
            st.lagged = false;
        } else if st.lagged {
            self.metrics.frames_dropped.inc();
            return;
        } else {
            // A frame larger than the limit still goes to a reader that is
            // keeping up; the limit is on what waits.
            let waiting = st.room_backlog();
            if waiting > 0 && waiting + total > self.limit {
                self.metrics.frames_dropped.inc();
                st.lagged = true;
                st.wake();
                return;
            }
        }
        self.write_or_queue(&mut st, &head[..head_len], frame);
        if snapshot {
            st.snapshot_end = st.enqueued;
        }
    }

    fn write_or_queue(&self, st: &mut State<S>, head: &[u8], frame: &Frame) {
        let head_len = head.len();
        let total = head_len + frame.len();
        if st.queue.is_empty() {
            let written = match st.write_now(head, frame) {
                Ok(n) if n == total => return,
                Ok(n) => n,
                Err(_) => {
                    st.failed = true;
                    st.wake();
                    return;
                }
            };
            let metrics = &self.metrics;
            if written < head_len {
                st.enqueue(Bytes::copy_from_slice(&head[written..]), metrics);
                st.enqueue(frame.clone(), metrics);
            } else {
                st.enqueue(frame.slice(written - head_len..), metrics);
            }
        } else {
            st.enqueue(Bytes::copy_from_slice(head), &self.metrics);
            st.enqueue(frame.clone(), &self.metrics);
        }
    }

    /// Whether room frames were dropped since the last snapshot.
    #[cfg(test)]
    fn is_lagged(&self) -> bool {
        self.lock().lagged
    }

    /// Forgets a lag: the member left its room, so no snapshot is owed.
    pub fn clear_lag(&self) {
        self.lock().lagged = false;
    }

    /// Writes what is queued as far as the socket takes it, and reports
    /// what the connection task must act on; `Pending` when nothing.
    pub fn poll_event(&self, cx: &mut Context<'_>) -> Poll<Event> {
        let mut st = self.lock();
        if st.failed {
            return Poll::Ready(Event::Failed);
        }
        if st.overflowed {
            return Poll::Ready(Event::Overflowed);
        }
        if let Some(removal) = &st.removed {
            return Poll::Ready(Event::Removed(removal.clone()));
        }
        if st.superseded {
            return Poll::Ready(Event::Superseded);
        }
        match st.drain(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => {
                st.failed = true;
                return Poll::Ready(Event::Failed);
            }
            Poll::Pending => {
                // The socket will wake this task when it drains.
                if st.backlog != st.reported {
                    st.reported = st.backlog;
                    if let Some(since) = st.backlog {
                        return Poll::Ready(Event::Backlog(since));
                    }
                }
                return Poll::Pending;
            }
        }
        // Empty now (whoever wrote it last): a backlog we reported is over.
        if st.reported.take().is_some() {
            return Poll::Ready(Event::Drained);
        }
        if st.lagged {
            return Poll::Ready(Event::Lagged);
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next [`Event`].
    pub async fn event(&self) -> Event {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Sink for Outbox<S> {
    fn send(&self, frame: &Frame) {
        self.push(frame, false);
    }

    fn send_snapshot(&self, frame: Frame) {
        self.push(&frame, true);
    }

    fn removed(&self, removal: Removal) {
        let mut st = self.lock();
        st.removed = Some(removal);
        st.wake();
    }

    fn superseded(&self) {
        let mut st = self.lock();
        st.superseded = true;
        st.wake();
    }
}

impl<S: AsyncWrite + Unpin> State<S> {
    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    fn enqueue(&mut self, bytes: Bytes, metrics: &Metrics) {
        if self.queue.is_empty() {
            self.backlog = Some(Instant::now());
            metrics.send_backlogs.inc();
            self.wake();
        }
        self.enqueued += bytes.len() as u64;
        self.queue.push_back(bytes);
    }

    /// Bytes waiting now.
    fn queued(&self) -> usize {
        usize::try_from(self.enqueued - self.written).unwrap_or(usize::MAX)
    }

    /// Bytes waiting now that were queued after the newest snapshot.
    fn room_backlog(&self) -> usize {
        let from = self.written.max(self.snapshot_end);
        usize::try_from(self.enqueued.saturating_sub(from)).unwrap_or(usize::MAX)
    }

    /// One non-blocking write of a whole frame, nobody to wake: returns how
    /// many bytes the socket took (0 when it would block).
    fn write_now(&mut self, head: &[u8], payload: &[u8]) -> io::Result<usize> {
        let mut cx = Context::from_waker(Waker::noop());
        let io = Pin::new(&mut self.io);
        let total = head.len() + payload.len();
        let polled = if total <= SMALL_FRAME {
            let mut buf = [0u8; SMALL_FRAME];
            buf[..head.len()].copy_from_slice(head);
            buf[head.len()..total].copy_from_slice(payload);
            io.poll_write(&mut cx, &buf[..total])
        } else {
            io.poll_write_vectored(&mut cx, &[IoSlice::new(head), IoSlice::new(payload)])
        };
        match polled {
            Poll::Ready(Ok(0)) if total > 0 => Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(result) => result,
            Poll::Pending => Ok(0),
        }
    }

    /// Writes the queue until it is empty or the socket would block (then
    /// `cx` is woken when it drains).
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(front) = self.queue.front_mut() {
            match Pin::new(&mut self.io).poll_write(cx, front) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.written += n as u64;
                    if n == front.len() {
                        self.queue.pop_front();
                    } else {
                        front.advance(n);
                    }
                }
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.backlog = None;
        Poll::Ready(Ok(()))
    }
}

/// The header of an unmasked, final, binary WebSocket frame of `len`
/// payload bytes (RFC 6455 section 5.2), and how long it is.
fn header(len: usize) -> ([u8; 10], usize) {
    let mut head = [0u8; 10];
    head[0] = 0x82;
    if len < 126 {
        head[1] = len as u8;
        (head, 2)
    } else if let Ok(short) = u16::try_from(len) {
        head[1] = 126;
        head[2..4].copy_from_slice(&short.to_be_bytes());
        (head, 4)
    } else {
        head[1] = 127;
        head[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (head, 10)
    }
}

/// Whether `buf`, a run of whole server frames, holds a Close frame.
fn has_close_frame(mut buf: &[u8]) -> bool {
    while let [first, second, rest @ ..] = buf {
        if first & 0x0f == 0x8 {
            return true;
        }
        let (ext, len) = match second & 0x7f {
            126 if rest.len() >= 2 => (2, u64::from(u16::from_be_bytes([rest[0], rest[1]]))),
            127 if rest.len() >= 8 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&rest[..8]);
                (8, u64::from_be_bytes(n))
            }
            126 | 127 => return false,
            n => (0, u64::from(n)),
        };
        let mask = if second & 0x80 != 0 { 4 } else { 0 };
        let Ok(skip) = usize::try_from(len.saturating_add(ext + mask)) else {
            return false;
        };
        buf = rest.get(skip..).unwrap_or_default();
    }
    false
}

/// The socket as tungstenite sees it: reads go to the socket, writes
/// through the outbox queue, so they keep their place among room frames.
pub struct WsIo<S>(pub Arc<Outbox<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.lock().io).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outbox = &self.0;
        let mut st = outbox.lock();
        if st.failed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        // tungstenite hands over whole frames (it writes at once and every
        // write is taken whole); after a Close, room frames must stop.
        if has_close_frame(buf) {
            st.sealed = true;
        }
        if st.queue.is_empty() {
            match Pin::new(&mut st.io).poll_write(cx, buf) {
                Poll::Ready(Ok(n)) if n == buf.len() => return Poll::Ready(Ok(n)),
                Poll::Ready(Ok(n)) => {
                    st.enqueue(Bytes::copy_from_slice(&buf[n..]), &outbox.metrics)
                }
                Poll::Ready(Err(err)) => {
                    st.failed = true;
                    return Poll::Ready(Err(err));
                }
                Poll::Pending => st.enqueue(Bytes::copy_from_slice(buf), &outbox.metrics),
            }
            return Poll::Ready(Ok(buf.len()));
        }
        if let Poll::Ready(Err(err)) = st.drain(cx) {
            st.failed = true;
            return Poll::Ready(Err(err));
        }
        if !st.queue.is_empty() && st.queued() + buf.len() > outbox.hard_limit {
            // `drain` left this task registered for when the socket drains.
            return Poll::Pending;
        }
        st.enqueue(Bytes::copy_from_slice(buf), &outbox.metrics);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.lock();
        match st.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut st.io).poll_flush(cx),
            Poll::Ready(Err(err)) => {
                st.failed = true;
                Poll::Ready(Err(err))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.lock();
        match st.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut st.io).poll_shutdown(cx),
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
