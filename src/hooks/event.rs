//! The webhook events and their JSON, pure.
//!
//! An [`Event`] is what happened ([`What`]) to which room, with an id
//! unique across the cluster and its restarts (`<source>-<seq>`: the
//! node's name, or `amble` alone, and the process's start in hex, then a
//! counter) and the server time it happened at. A delivery's body is one
//! [`batch_body`]: `{"events":[...]}`, oldest first.

use std::sync::Arc;

use serde::Serialize;

/// One event, as the receiver reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Unique per event: `<source>-<seq>` (see [`Source::id`]).
    pub id: String,
    /// Server time of the change, ms since the Unix epoch.
    pub timestamp_ms: u64,
    pub room: Arc<str>,
    /// The node that sent it (its `--node-name` in a cluster, else absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Arc<str>>,
    #[serde(flatten)]
    pub what: What,
}

/// What happened, with its own fields; `type` in the JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub enum What {
    /// A member of this node was admitted to the room.
    #[serde(rename = "member.joined")]
    Joined {
        member_id: u32,
        name: String,
        /// The app's user (the token's `sub`), `null` without a token.
        user: Option<Arc<str>>,
    },
    /// A member of this node left the room.
    #[serde(rename = "member.left")]
    Left {
        member_id: u32,
        name: String,
        user: Option<Arc<str>>,
        /// The protocol's `LeaveReason` in lower snake case: `left`,
        /// `disconnected`, `timed_out`, `kicked`, `shutdown`, `replaced`.
        reason: String,
        /// How long the member was in the room, ms.
        duration_ms: u64,
    },
    /// A member was removed by the server API.
    #[serde(rename = "member.kicked")]
    Kicked {
        member_id: u32,
        user: Option<Arc<str>>,
        /// Which call: `kick`, `ban` (the user was banned) or `close` (the
        /// room was closed).
        action: &'static str,
        /// The text the caller gave (none for `close`).
        reason: String,
        /// Who removed it: `api`.
        by: &'static str,
    },
    /// The room's first member arrived (anywhere in the cluster).
    #[serde(rename = "room.occupied")]
    Occupied,
    /// The room's last member left (everywhere in the cluster).
    #[serde(rename = "room.vacated")]
    Vacated,
}

impl What {
    /// The `type` field, also the `type` label of the emitted counter.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Joined { .. } => "member.joined",
            Self::Left { .. } => "member.left",
            Self::Kicked { .. } => "member.kicked",
            Self::Occupied => "room.occupied",
            Self::Vacated => "room.vacated",
        }
    }
}

/// Where ids come from: one per process.
#[derive(Debug)]
pub struct Source {
    node: Option<Arc<str>>,
    /// `<node or "amble">-<start ms in hex>`.
    prefix: String,
}

impl Source {
    /// The source of a process started at `start_ms` (server time) on
    /// node `node` (`None` outside a cluster).
    pub fn new(node: Option<Arc<str>>, start_ms: u64) -> Self {
        let prefix = format!("{}-{start_ms:x}", node.as_deref().unwrap_or("amble"));
        Self { node, prefix }
    }

    /// The id of this process's event number `seq`.
    pub fn id(&self, seq: u64) -> String {
        format!("{}-{seq}", self.prefix)
    }

    /// Event number `seq`, of `room`, at `timestamp_ms`.
    pub fn event(&self, seq: u64, timestamp_ms: u64, room: Arc<str>, what: What) -> Event {
        Event {
            id: self.id(seq),
            timestamp_ms,
            room,
            node: self.node.clone(),
            what,
        }
    }
}

/// The body of one delivery: `{"events":[...]}`, in the order given.
pub fn batch_body<'a>(events: impl IntoIterator<Item = &'a Event>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Batch<'a> {
        events: Vec<&'a Event>,
    }
    let batch = Batch {
        events: events.into_iter().collect(),
    };
    // Strings, integers and options of them: serializing cannot fail.
    serde_json::to_vec(&batch).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_their_documented_shape() {
        let src = Source::new(Some(Arc::from("n1")), 0x1_0000);
        let joined = src.event(
            7,
            1_700_000_000_123,
            Arc::from("lobby"),
            What::Joined {
                member_id: 3,
                name: "Ada".into(),
                user: Some(Arc::from("u-1")),
            },
        );
        assert_eq!(
            serde_json::to_string(&joined).expect("json"),
            r#"{"id":"n1-10000-7","timestamp_ms":1700000000123,"room":"lobby","node":"n1","type":"member.joined","member_id":3,"name":"Ada","user":"u-1"}"#
        );
        let alone = Source::new(None, 255);
        let left = alone.event(
            8,
            5,
            Arc::from("r"),
            What::Left {
                member_id: 0,
                name: "Bo".into(),
                user: None,
                reason: "timed_out".into(),
                duration_ms: 42,
            },
        );
        assert_eq!(
            serde_json::to_string(&left).expect("json"),
            r#"{"id":"amble-ff-8","timestamp_ms":5,"room":"r","type":"member.left","member_id":0,"name":"Bo","user":null,"reason":"timed_out","duration_ms":42}"#
        );
        let kicked = alone.event(
            9,
            6,
            Arc::from("r"),
            What::Kicked {
                member_id: 1,
                user: Some(Arc::from("u")),
                action: "kick",
                reason: "spam".into(),
                by: "api",
            },
        );
        assert_eq!(
            serde_json::to_string(&kicked).expect("json"),
            r#"{"id":"amble-ff-9","timestamp_ms":6,"room":"r","type":"member.kicked","member_id":1,"user":"u","action":"kick","reason":"spam","by":"api"}"#
        );
        let occupied = alone.event(10, 7, Arc::from("r"), What::Occupied);
        let vacated = alone.event(11, 8, Arc::from("r"), What::Vacated);
        assert_eq!(
            String::from_utf8(batch_body([&occupied, &vacated])).expect("utf-8"),
            r#"{"events":[{"id":"amble-ff-10","timestamp_ms":7,"room":"r","type":"room.occupied"},{"id":"amble-ff-11","timestamp_ms":8,"room":"r","type":"room.vacated"}]}"#
        );
        assert_eq!(occupied.what.kind(), "room.occupied");
    }
}
