//! What the app's backend (the server API) asks of this node's rooms: its
//! own members listed, taken out, or spoken to. Other nodes' members are
//! theirs to answer for: `api` asks every node, and each acts where its
//! members are connected.

use std::sync::Arc;

use crate::protocol::pb::server_message::Body;
use crate::protocol::{MemberId, Position, encode_server, pb};
use crate::room::sink::Removal;

use super::{Room, Rooms, fan_out};

/// One of this node's members, as the server API lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub room: Arc<str>,
    pub id: MemberId,
    pub name: String,
    /// The app's user (the token's `sub`), whether or not the room sees it.
    pub user: Option<Arc<str>>,
    /// Where it is now (along its walk, if it walks).
    pub position: Position,
    /// When it joined, ms since the Unix epoch (to the second).
    pub joined_at_ms: u64,
}

/// Which of a room's members.
#[derive(Clone, Copy, Debug)]
pub enum Select<'a> {
    Id(MemberId),
    User(&'a str),
    All,
}

impl Rooms {
    /// This node's members of `room`, by id.
    pub fn local_members(&self, room: &str) -> Vec<Listed> {
        let Some(handle) = self.map.get(room).map(|r| Arc::clone(r.value())) else {
            return Vec::new();
        };
        self.listed(&handle, Select::All)
    }

    /// This node's members of `user`, in every room, by room.
    pub fn local_members_of(&self, user: &str) -> Vec<Listed> {
        let mut found: Vec<Listed> = self
            .handles()
            .iter()
            .flat_map(|h| self.listed(h, Select::User(user)))
            .collect();
        found.sort_by(|a, b| a.room.cmp(&b.room));
        found
    }

    fn handles(&self) -> Vec<Arc<Room>> {
        self.map.iter().map(|r| Arc::clone(r.value())).collect()
    }

    fn listed(&self, handle: &Arc<Room>, select: Select<'_>) -> Vec<Listed> {
        let now_ms = self.clock.now_ms();
        let st = handle.state();
        st.members
            .iter()
            .filter(|(id, m)| m.origin.is_none() && selects(select, **id, m.user.as_deref()))
            .map(|(id, m)| Listed {
                room: Arc::clone(&handle.name),
                id: *id,
                name: m.name.to_string(),
                user: m.user.clone(),
                position: m.motion.at(now_ms.saturating_sub(m.moved_at_ms)),
                joined_at_ms: u64::from(m.joined_at_s) * 1000,
            })
            .collect()
    }

    /// Takes this node's members that `select` picks out of `room` (every
    /// room when `None`): the others see `Left` with the removal's reason,
    /// and each removed member's connection is told why and closes.
    /// Returns the members taken out.
    pub async fn take_out(
        self: &Arc<Self>,
        room: Option<&str>,
        select: Select<'_>,
        removal: Removal,
    ) -> Vec<Listed> {
        let handles = match room {
            Some(room) => self
                .map
                .get(room)
                .map(|r| vec![Arc::clone(r.value())])
                .unwrap_or_default(),
            None => self.handles(),
        };
        let mut taken = Vec::new();
        for handle in handles {
            for listed in self.listed(&handle, select) {
                // A held place (its connection dropped) has no sink, and
                // goes all the same.
                let found = {
                    let st = handle.state();
                    let seat = st.members.get(&listed.id).map(|m| m.seat);
                    let sink = handle.out().sink(listed.id).map(Arc::clone);
                    seat.map(|seat| (seat, sink))
                };
                let Some((seat, sink)) = found else { continue };
                // The app's own doing: `member.kicked` before its `member.left`.
                let kicked = match &removal {
                    Removal::Kicked { reason } => Some(("kick", &**reason)),
                    Removal::Banned { reason, .. } => Some(("ban", &**reason)),
                    Removal::RoomClosed => Some(("close", "")),
                    Removal::Replaced => None,
                };
                if let (Some(hooks), Some((action, text))) = (self.hooks.get(), kicked) {
                    hooks.kicked(&handle.name, listed.id.0, listed.user.clone(), action, text);
                }
                let reason = removal.leave_reason();
                fan_out(|| self.remove(&handle, listed.id, seat, reason)).await;
                if let Some(sink) = sink {
                    sink.removed(removal.clone());
                }
                taken.push(listed);
            }
        }
        taken
    }

    /// Writes a `SystemMessage` with `text` to this node's members of
    /// `room` (those of `user` only, `direct`, when given). Returns how
    /// many it reached.
    pub async fn tell(&self, room: &str, user: Option<&str>, text: &str) -> usize {
        let Some(handle) = self.map.get(room).map(|r| Arc::clone(r.value())) else {
            return 0;
        };
        let frame = encode_server(Body::System(pb::SystemMessage {
            text: text.to_owned(),
            server_time_ms: self.clock.now_ms(),
            direct: user.is_some(),
        }));
        let to: Vec<MemberId> = match user {
            Some(user) => self
                .listed(&handle, Select::User(user))
                .iter()
                .map(|l| l.id)
                .collect(),
            None => Vec::new(),
        };
        let metrics = &self.metrics;
        fan_out(|| {
            let out = handle.out();
            let mut reached = 0;
            for (id, sink) in &out.sinks {
                if user.is_none() || to.contains(id) {
                    sink.send(&frame);
                    reached += 1;
                }
            }
            metrics.sent_to(reached, frame.len());
            reached
        })
        .await
    }

    /// Writes a direct `SystemMessage` to `user`'s members on this node, in
    /// every room. Returns how many it reached.
    pub async fn tell_user(&self, user: &str, text: &str) -> usize {
        let mut rooms: Vec<Arc<str>> = self
            .local_members_of(user)
            .into_iter()
            .map(|l| l.room)
            .collect();
        rooms.dedup();
        let mut reached = 0;
        for room in rooms {
            reached += self.tell(&room, Some(user), text).await;
        }
        reached
    }
}

fn selects(select: Select<'_>, id: MemberId, user: Option<&str>) -> bool {
    match select {
        Select::All => true,
        Select::Id(want) => id == want,
        Select::User(want) => user == Some(want),
    }
}
