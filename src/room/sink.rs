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

use std::sync::Arc;

use bytes::Bytes;

use crate::protocol::LeaveReason;

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

    /// The room took the member out without its asking (see [`Removal`]):
    /// the room sends it nothing more, and its connection should tell it
    /// why and end. Never blocks.
    fn removed(&self, _removal: Removal) {}

    /// The member's place was taken back by a resume from a newer
    /// connection (its client gave this one up): the room sends it nothing
    /// more, and its connection should end quietly; the room saw nothing.
    /// Never blocks.
    fn superseded(&self) {}
}

/// Why the room took a member out: each ends its connection with its own
/// `Error` code and close code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The same user joined the room from a newer connection (`REPLACED`).
    Replaced,
    /// The app removed the member through the server API (`KICKED`), for
    /// this reason.
    Kicked { reason: Arc<str> },
    /// The app banned the member's user until `until_ms` (ms since the
    /// Unix epoch) for this reason (`BANNED`).
    Banned { until_ms: u64, reason: Arc<str> },
    /// The app closed the room (`ROOM_CLOSED`).
    RoomClosed,
}

impl Removal {
    /// What the room sees: the `Left` reason sent to the other members.
    pub fn leave_reason(&self) -> LeaveReason {
        match self {
            Self::Replaced => LeaveReason::Replaced,
            Self::Kicked { .. } | Self::Banned { .. } => LeaveReason::Kicked,
            Self::RoomClosed => LeaveReason::RoomClosed,
        }
    }
}
