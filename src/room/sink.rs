//! A room's fan-out: frames encoded once, written to every member.
//!
//! A room holds one [`Sink`] per member and hands each frame to all of
//! them, under the room lock, so every member receives the room's frames
//! in one order. A sink never blocks: the socket's is
//! [`Outbox`](crate::session::outbox::Outbox), which writes at once or queues, and
//! drops room frames for a member that stopped reading (it is then owed a
//! snapshot).
//!
//! A sink is always a local socket. Other nodes' members live in the room's
//! state like local ones (see `remote`), not behind a sink: a sink only
//! forwards encoded frames, so it could neither give a joiner the members
//! of other nodes nor remove a dead node's members.

use bytes::Bytes;

/// One encoded `ServerMessage`; every receiver shares the same bytes.
pub type Frame = Bytes;

/// Where one member's frames go.
pub trait Sink: Send + Sync + 'static {
    /// A room frame (a batch, `Joined`, `Left`, chat). Never blocks; may be
    /// dropped for a receiver that fell behind, which then gets a snapshot.
    fn send(&self, frame: &Frame);

    /// A snapshot (`Welcome`, `Resync`): never dropped, and it makes up for
    /// every room frame dropped before it.
    fn send_snapshot(&self, frame: Frame);

    /// The member left its room because the same user joined it from a
    /// newer connection: the room sends it nothing more, and its connection
    /// should end (`REPLACED`). Never blocks.
    fn replaced(&self) {}

    /// The member's place was taken back by a resume from a newer
    /// connection (its client gave this one up): the room sends it nothing
    /// more, and its connection should end quietly; the room saw nothing.
    /// Never blocks.
    fn superseded(&self) {}
}
