//! The NATS subjects of one deployment (`--cluster-prefix P`).
//!
//! Every subject is the prefix and exactly three tokens: the wire version
//! (`v2`), a kind, and a name. Two deployments on one NATS therefore never
//! share a subject, even when one prefix extends the other (`P` and `P.r`):
//! their subjects have different numbers of tokens, and a NATS `*` matches
//! one token. The version token keeps nodes of another wire format (the
//! first had `P.hb` and `P.r.<room>`) off these subjects.
//!
//! | subject | message |
//! |---|---|
//! | `P.v2.r.<room>` | a node's `RoomUpdate`s for a room |
//! | `P.v2.s.<room>` | `SnapshotRequest` (request/reply) |
//! | `P.v2.n.<node>` | `SyncRequest` to that node |
//! | `P.v2.hb.all` | `Heartbeat` |
//! | `P.v2.q.rooms` | `RoomCounts` (request/reply) |
//! | `P.v2.q.api` | `ApiCall`, answered by `ApiAnswer` (the server API) |
//! | `P.v2.q.nodes` | `Heartbeat{claiming}`: the slot claim at start-up (request/reply) |
//! | `P.v2.o.all` | `Occupancy`: a node's rooms with members (webhooks) |

use async_nats::Subject;

use super::wire::room_token;

/// The wire version's token: a node of another version never reads these
/// subjects.
pub const VERSION: &str = "v2";

/// The subjects of the deployment whose prefix is `prefix`.
#[derive(Clone, Debug)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// `prefix` is a checked `--cluster-prefix` (tokens separated by dots).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    fn make(&self, kind: &str, name: &str) -> Subject {
        Subject::from(format!("{}.{VERSION}.{kind}.{name}", self.prefix))
    }

    /// Where the nodes with members in `room` publish their updates.
    pub fn room(&self, room: &str) -> Subject {
        self.make("r", &room_token(room))
    }

    /// Where a node opening `room` asks the others for their parts.
    pub fn snapshot(&self, room: &str) -> Subject {
        self.make("s", &room_token(room))
    }

    /// Every room's snapshot subject (a subscription).
    pub fn snapshots(&self) -> Subject {
        self.make("s", "*")
    }

    /// Where `node` hears sync requests.
    pub fn node(&self, node: &str) -> Subject {
        self.make("n", node)
    }

    /// The heartbeats.
    pub fn heartbeats(&self) -> Subject {
        self.make("hb", "all")
    }

    /// The room-count requests (`/api/rooms`).
    pub fn counts(&self) -> Subject {
        self.make("q", "rooms")
    }

    /// Where nodes tell which rooms they have members in (webhooks'
    /// `room.occupied` and `room.vacated`).
    pub fn occupancy(&self) -> Subject {
        self.make("o", "all")
    }

    /// The server API's calls (every node runs each on its members).
    pub fn api(&self) -> Subject {
        self.make("q", "api")
    }

    /// The slot claims of starting nodes: every live node answers with its
    /// name, epoch and slot.
    pub fn nodes(&self) -> Subject {
        self.make("q", "nodes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NATS subject matching: `*` is one token, `>` the rest (one or more).
    fn matches(pattern: &str, subject: &str) -> bool {
        let mut p = pattern.split('.');
        let mut s = subject.split('.');
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    /// Everything a deployment subscribes to and publishes on, with rooms
    /// and nodes named like the other deployment's kinds and names.
    fn all(s: &Subjects) -> (Vec<Subject>, Vec<Subject>) {
        let names = [
            "hb", "all", "r", "s", "n", "q", "o", "rooms", "v2", "lobby", "a.b",
        ];
        let mut published = vec![
            s.heartbeats(),
            s.counts(),
            s.nodes(),
            s.api(),
            s.occupancy(),
        ];
        let mut subscribed = vec![
            s.heartbeats(),
            s.counts(),
            s.nodes(),
            s.snapshots(),
            s.api(),
            s.occupancy(),
        ];
        for name in names {
            published.extend([s.room(name), s.snapshot(name)]);
            subscribed.push(s.room(name));
            if !name.contains('.') {
                published.push(s.node(name));
                subscribed.push(s.node(name));
            }
        }
        (subscribed, published)
    }

    #[test]
    fn subjects_have_the_prefix_and_three_tokens() {
        let s = Subjects::new("amble");
        assert_eq!(s.room("lobby").as_str(), "amble.v2.r.lobby");
        assert_eq!(s.room("a.b").as_str(), "amble.v2.r.a~b");
        assert_eq!(s.snapshot("a.b").as_str(), "amble.v2.s.a~b");
        assert_eq!(s.snapshots().as_str(), "amble.v2.s.*");
        assert_eq!(s.node("n1").as_str(), "amble.v2.n.n1");
        assert_eq!(s.heartbeats().as_str(), "amble.v2.hb.all");
        assert_eq!(s.counts().as_str(), "amble.v2.q.rooms");
        assert_eq!(s.nodes().as_str(), "amble.v2.q.nodes");
    }

    /// Issue #15, finding 8: with prefixes `P` and `P.r`, a client joining
    /// room `hb` in `P` published on `P.r.hb`, the heartbeat subject of
    /// `P.r`. No subject of one deployment may match a subscription of
    /// another, whatever the two prefixes.
    #[test]
    fn nested_and_distinct_prefixes_never_meet() {
        let prefixes = [
            "P", "P.r", "P.s", "P.n", "P.q", "P.hb", "P.v2", "P.v2.r", "P.r.r", "Q", "P.v1",
        ];
        for a in prefixes {
            for b in prefixes {
                if a == b {
                    continue;
                }
                let (subscribed, _) = all(&Subjects::new(a));
                let (_, published) = all(&Subjects::new(b));
                for sub in &subscribed {
                    for publ in &published {
                        assert!(
                            !matches(sub.as_str(), publ.as_str()),
                            "{b} publishes {publ}, which {a} reads on {sub}"
                        );
                    }
                }
            }
        }
    }

    /// The first wire format's subjects (`P.hb`, `P.r.<room>`, `P.s.*`,
    /// `P.n.<node>`, `P.q.rooms`) never meet this one's, so nodes of the
    /// two versions do not decode each other's messages.
    #[test]
    fn the_first_wire_formats_subjects_never_meet() {
        let old_subscribed = [
            "P.hb",
            "P.s.*",
            "P.n.n1",
            "P.q.rooms",
            "P.r.lobby",
            "P.r.hb",
        ];
        let old_published = ["P.hb", "P.s.lobby", "P.n.n1", "P.q.rooms", "P.r.lobby"];
        let (subscribed, published) = all(&Subjects::new("P"));
        for old in old_subscribed {
            for new in &published {
                assert!(!matches(old, new.as_str()), "{old} reads {new}");
            }
        }
        for old in old_published {
            for new in &subscribed {
                assert!(!matches(new.as_str(), old), "{new} reads {old}");
            }
        }
    }
}
