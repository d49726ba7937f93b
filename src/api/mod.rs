//! The server API: what the app that hosts the world asks of it from its
//! backend (docs/api.md). The HTTP side (routes, the key, JSON, statuses)
//! is `edge::api`; this module owns the operations.
//!
//! Every operation is an [`Op`]: this node runs it on its own members
//! ([`Api::local`]), and in cluster mode every live peer runs it on theirs
//! (asked over NATS, `cluster::Cluster::api_gather`), so a call works on any
//! node and acts where the member is connected. The [`Answer`]s are merged
//! into one.

use std::sync::Arc;
use std::time::Duration;

use crate::access::sanctions::{Sanction, Sanctions};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::protocol::{MemberId, Rules};
use crate::room::Rooms;
use crate::room::admin::{Listed, Select};
use crate::room::sink::Removal;

pub mod remote;

/// The server API's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ApiConfig {
    /// File holding the server API's key (at least 16 visible ASCII
    /// characters; for example `openssl rand -hex 32 > api.key`). With it,
    /// `/api/v1/...` answers callers that send `Authorization: Bearer KEY`
    /// (docs/api.md); without it the server API answers 404. Read once at
    /// start.
    #[arg(
        long,
        display_order = 110,
        env = "AMBLE_API_KEY_FILE",
        value_name = "PATH"
    )]
    pub api_key_file: Option<std::path::PathBuf>,

    /// Server API calls per second, all callers together (a burst of
    /// twice as many); over it, 429 with Retry-After.
    #[arg(
        long,
        display_order = 111,
        env = "AMBLE_API_CALLS_PER_SEC",
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..=10_000)
    )]
    pub api_calls_per_sec: u32,
}

/// The longest user id (`sub`) the API takes, bytes.
pub const MAX_SUB_BYTES: usize = 256;
/// The longest system message, in characters.
pub const MAX_SYSTEM_TEXT_CHARS: usize = 1_000;
/// The longest ban or mute, in seconds (a year).
pub const MAX_SANCTION_SECS: u64 = 366 * 24 * 3600;
/// The longest wait for the other nodes' answers.
pub const GATHER_TIMEOUT: Duration = Duration::from_secs(2);

/// Who in a room a kick is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    Member(MemberId),
    User(Arc<str>),
}

/// One operation of the server API, as every node runs it on its own
/// members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// The members of a room.
    Members { room: Arc<str> },
    /// Where a user's members are.
    User { user: Arc<str> },
    /// Takes a member (or a user's) out of a room (`KICKED`).
    Kick {
        room: Arc<str>,
        who: Who,
        reason: Arc<str>,
    },
    /// Bans (or, with `until_ms` in the past, lifts the ban on) a user and
    /// takes its members out of every room.
    Ban {
        user: Arc<str>,
        until_ms: u64,
        reason: Arc<str>,
    },
    /// Mutes (or lifts the mute on) a user.
    Mute { user: Arc<str>, until_ms: u64 },
    /// A system message to a room, or to a user (in every room, or in one).
    Tell {
        room: Option<Arc<str>>,
        user: Option<Arc<str>>,
        text: Arc<str>,
    },
    /// Takes everyone out of a room (`ROOM_CLOSED`).
    Close { room: Arc<str> },
    /// Every sanction in force (a starting node learns them).
    Sanctions,
}

/// What one node (or, merged, the cluster) answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Members listed, or taken out, each with the node it is on.
    pub members: Vec<(Listed, Arc<str>)>,
    /// Members a system message reached.
    pub reached: usize,
    /// Sanctions in force (`Op::Sanctions`).
    pub sanctions: Vec<(Arc<str>, Sanction)>,
}

impl Answer {
    /// Adds `other`'s answer to this one.
    pub fn merge(&mut self, other: Answer) {
        self.members.extend(other.members);
        self.reached += other.reached;
        self.sanctions.extend(other.sanctions);
    }
}

/// Runs the server API's operations on this node's rooms.
pub struct Api {
    rooms: Arc<Rooms>,
    sanctions: Arc<Sanctions>,
    clock: Clock,
    metrics: Arc<Metrics>,
    rules: Rules,
    /// This node's name, as answers give it: set when the cluster starts;
    /// `local` on a single node.
    node: std::sync::OnceLock<Arc<str>>,
}

impl Api {
    pub fn new(
        rooms: Arc<Rooms>,
        sanctions: Arc<Sanctions>,
        clock: Clock,
        metrics: Arc<Metrics>,
        rules: Rules,
    ) -> Self {
        Self {
            rooms,
            sanctions,
            clock,
            metrics,
            rules,
            node: std::sync::OnceLock::new(),
        }
    }

    /// Names this node in answers (cluster mode, once at start).
    pub fn set_node(&self, name: Arc<str>) {
        let _ = self.node.set(name);
    }

    fn node(&self) -> Arc<str> {
        self.node.get().cloned().unwrap_or_else(|| "local".into())
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Runs `op` on this node's members. A ban or mute is stored here
    /// first, so a join that races the call is refused.
    pub async fn local(&self, op: &Op) -> Answer {
        let now_ms = self.clock.now_ms();
        let node = self.node();
        let mine = |listed: Vec<Listed>| -> Vec<(Listed, Arc<str>)> {
            listed.into_iter().map(|l| (l, Arc::clone(&node))).collect()
        };
        match op {
            Op::Members { room } => Answer {
                members: mine(self.rooms.local_members(room)),
                ..Answer::default()
            },
            Op::User { user } => Answer {
                members: mine(self.rooms.local_members_of(user)),
                ..Answer::default()
            },
            Op::Kick { room, who, reason } => {
                let select = match who {
                    Who::Member(id) => Select::Id(*id),
                    Who::User(user) => Select::User(user),
                };
                let removal = Removal::Kicked {
                    reason: Arc::clone(reason),
                };
                let taken = self.rooms.take_out(Some(room), select, removal).await;
                Answer {
                    members: mine(taken),
                    ..Answer::default()
                }
            }
            Op::Ban {
                user,
                until_ms,
                reason,
            } => {
                if self.sanctions.ban(user, *until_ms, reason, now_ms).is_err() {
                    self.metrics.api_sanctions_full.inc();
                }
                if *until_ms <= now_ms {
                    return Answer::default();
                }
                let removal = Removal::Banned {
                    until_ms: *until_ms,
                    reason: Arc::clone(reason),
                };
                let taken = self.rooms.take_out(None, Select::User(user), removal).await;
                Answer {
                    members: mine(taken),
                    ..Answer::default()
                }
            }
            Op::Mute { user, until_ms } => {
                if self.sanctions.mute(user, *until_ms, now_ms).is_err() {
                    self.metrics.api_sanctions_full.inc();
                }
                Answer::default()
            }
            Op::Tell { room, user, text } => {
                let reached = match (room, user) {
                    (Some(room), user) => self.rooms.tell(room, user.as_deref(), text).await,
                    (None, Some(user)) => self.rooms.tell_user(user, text).await,
                    (None, None) => 0,
                };
                Answer {
                    reached,
                    ..Answer::default()
                }
            }
            Op::Close { room } => {
                let taken = self
                    .rooms
                    .take_out(Some(room), Select::All, Removal::RoomClosed)
                    .await;
                Answer {
                    members: mine(taken),
                    ..Answer::default()
                }
            }
            Op::Sanctions => Answer {
                sanctions: self.sanctions.list(now_ms),
                ..Answer::default()
            },
        }
    }
}
