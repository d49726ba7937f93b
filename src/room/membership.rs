//! `Membership`: one connection's place in a room, and every way it acts
//! there (moves, chat, data, find, resync, leave). Dropping it leaves.

use super::*;

/// One connection's place in a room. Dropping it leaves the room (reason
/// DISCONNECTED), so no member outlives its connection.
pub struct Membership {
    pub(super) rooms: Arc<Rooms>,
    pub(super) room: Arc<Room>,
    pub(super) id: MemberId,
    pub(super) seat: u64,
    /// The entries the token's `data` claim set, which SetData cannot change.
    pub(super) claimed: Data,
    pub(super) left: bool,
    /// This membership took back a held place (a resume).
    pub(super) resumed: bool,
}

impl Membership {
    /// The world of this member's room, cm: moves must stay within it.
    pub fn world(&self) -> Position {
        self.room.world
    }

    pub fn id(&self) -> MemberId {
        self.id
    }

    pub fn room(&self) -> &str {
        self.room.name()
    }

    /// Queues a move (already throttled) for the next tick; with a zero
    /// tick it is sent at once.
    pub async fn submit(&self, motion: Motion) {
        fan_out(|| self.rooms.submit(&self.room, self.id, self.seat, motion)).await;
    }

    /// Relays a chat message to the room, sender included.
    pub async fn chat(&self, text: String) {
        let chat = pb::ChatMessage {
            member_id: self.id.0,
            text,
            server_time_ms: self.rooms.clock.now_ms(),
        };
        let cluster = self.rooms.cluster.get();
        let op = cluster.map(|_| chat.clone());
        let frame = encode_server(Body::Chat(chat));
        fan_out(|| {
            let mut st = self.room.state();
            if self.is_in(&st) {
                if let (Some(cluster), Some(op)) = (cluster, op) {
                    remote::published_chat(cluster, &mut st, op);
                }
                // In a spatial room, chat is heard by those in view.
                self.room
                    .publish_about(st, self.id, &frame, &self.rooms.metrics);
            }
        })
        .await;
    }

    /// Applies SetData `changes` to this member's data and, when the data
    /// changed, sends the room (the member included) its whole data in a
    /// `MemberData`. Refused, and nothing changes, when a change touches a
    /// key the token set or the data after it breaks the limits of `rules`.
    pub async fn set_data(&self, changes: &Changes, rules: &Rules) -> Result<(), DataError> {
        let cluster = self.rooms.cluster.get();
        fan_out(|| {
            let mut st = self.room.state();
            let Some(member) = st.members.get_mut(&self.id).filter(|m| self.owns(m)) else {
                return Ok(());
            };
            let data = member.data.merged(changes, &self.claimed, rules)?;
            if data == member.data {
                return Ok(());
            }
            let msg = pb::MemberData {
                member_id: self.id.0,
                data: data.to_pb(),
            };
            member.data = data;
            if let Some(cluster) = cluster {
                remote::published_data(cluster, &mut st, msg.clone());
            }
            let frame = encode_server(Body::MemberData(msg));
            self.room
                .publish_about(st, self.id, &frame, &self.rooms.metrics);
            self.rooms.metrics.data_changes.inc();
            Ok(())
        })
        .await
    }

    /// Sends this member a `Resync` snapshot of the room as it is now, for
    /// a receiver that missed frames. In order with the room's frames.
    pub async fn resync(&self) {
        fan_out(|| {
            let st = self.room.state();
            if !self.is_in(&st) {
                return;
            }
            let snapshot = encode_server(Body::Resync(
                st.snapshot_for(self.id, self.rooms.clock.now_ms()),
            ));
            let out = self.room.out();
            drop(st);
            if let Some(sink) = out.sink(self.id) {
                self.rooms.metrics.sent_to(1, snapshot.len());
                sink.send_snapshot(snapshot);
            }
        })
        .await;
    }

    /// Sends this member a `Found`: a page of the room's members whose
    /// name starts with `prefix` (ignoring case), by id, after `cursor`.
    /// False, sending nothing, when the room's own find budget is spent.
    pub async fn find(&self, prefix: &str, cursor: u32) -> bool {
        let now = tokio::time::Instant::now();
        fan_out(|| {
            let mut st = self.room.state();
            if !self.is_in(&st) {
                return true;
            }
            let budget = st.finds.get_or_insert_with(|| {
                Box::new(crate::access::throttle::Gcra::new(
                    ROOM_FIND_INTERVAL,
                    ROOM_FIND_BURST,
                ))
            });
            if budget.admit(now) != crate::access::throttle::Admit::Now {
                return false;
            }
            let found = find_page(&st.members, prefix, cursor);
            let frame = encode_server(Body::Found(found));
            let out = self.room.out();
            drop(st);
            if let Some(sink) = out.sink(self.id) {
                self.rooms.metrics.sent_to(1, frame.len());
                sink.send(&frame);
            }
            true
        })
        .await
    }

    /// Whether this membership took back a held place (`Welcome.resumed`).
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// Leaves the room; the others get `Left` with `reason`.
    pub async fn leave(mut self, reason: LeaveReason) {
        self.left = true;
        fan_out(|| self.rooms.remove(&self.room, self.id, self.seat, reason)).await;
    }

    /// Whether this member is still in the room (not replaced, and its
    /// place not taken by a resume).
    fn is_in(&self, st: &State) -> bool {
        st.members.get(&self.id).is_some_and(|m| self.owns(m))
    }

    fn owns(&self, m: &Member) -> bool {
        m.seat == self.seat
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if !self.left {
            self.rooms
                .remove(&self.room, self.id, self.seat, LeaveReason::Disconnected);
        }
    }
}
