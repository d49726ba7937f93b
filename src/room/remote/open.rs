//! A room's life in cluster mode on this node: cluster mode turned on, the
//! first join opening the room (subscribe, gather the other nodes' parts),
//! a join given up, and the linger and close after the last local member.

use std::sync::Arc;

use tokio::time::Instant;

use super::publish::publish_all;
use crate::cluster::wire::{Update, UpdateParts};
use crate::cluster::{Cluster, RoomSide};
use crate::room::{JoinError, Membership, Room, Rooms, State, fan_out};

impl Rooms {
    /// Turns cluster mode on: call once, before the first join.
    pub fn attach_cluster(self: &Arc<Self>, cluster: Arc<Cluster>) {
        let side: Arc<dyn RoomSide> = Arc::clone(self) as Arc<dyn RoomSide>;
        cluster.attach(Arc::downgrade(&side));
        let _ = self.cluster.set(cluster);
    }

    /// Joins in cluster mode: the first join of a room on this node opens
    /// it (subscribe, gather the other nodes' parts); the others wait for
    /// that and then join from the replica.
    pub(in crate::room) async fn join_clustered(
        self: &Arc<Self>,
        cluster: &Arc<Cluster>,
        room: &str,
        arrival: crate::room::Arrival,
        sink: Arc<dyn crate::room::sink::Sink>,
    ) -> Result<Membership, JoinError> {
        let mut args = Some((arrival, sink));
        loop {
            if self
                .shutting_down
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(JoinError::ShuttingDown);
            }
            let handle = self.handle(room);
            // Until the member is in: a join given up (its future dropped
            // during the opening) or refused leaves the room to linger.
            let mut abandoned = Abandoned {
                rooms: self,
                room: Some(Arc::clone(&handle)),
            };
            handle
                .opened
                .get_or_init(|| async {
                    let fulls = cluster.open(room).await;
                    fan_out(|| self.apply_opening(&handle, fulls)).await;
                })
                .await;
            let joined = fan_out(|| {
                let st = handle.state();
                if !st.open {
                    drop(st);
                    self.forget(&handle);
                    return None;
                }
                let (arrival, sink) = args.take()?;
                Some(self.join_locked(&handle, st, arrival, sink))
            })
            .await;
            match joined {
                Some(Err(refused)) => return Err(refused),
                Some(result) => {
                    abandoned.room = None;
                    return result;
                }
                // Closed meanwhile: nothing to linger for.
                None => abandoned.room = None,
            }
        }
    }

    /// A join that did not happen (refused as the room is full of other
    /// nodes' members, or given up during the opening): if this node has
    /// nobody there, the room lingers and closes like after a leave, rather
    /// than staying subscribed for ever.
    fn abandoned_join(&self, room: &Arc<Room>) {
        let generation = {
            let mut st = room.state();
            let Some(r) = st.remote.as_deref_mut() else {
                return;
            };
            if r.local > 0 {
                return;
            }
            r.linger += 1;
            r.linger
        };
        self.linger(room, generation);
    }

    /// Applies the full states gathered when this node opened `room`, then
    /// asks the nodes whose part is still missing.
    fn apply_opening(&self, room: &Arc<Room>, fulls: Vec<Update>) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut frames = Vec::new();
        let mut st = room.state();
        for u in fulls {
            // No local member yet: nothing to evict, nothing to linger for.
            let _ = self.apply_locked(&room.name, &mut st, u, &mut frames);
        }
        let mut ask = Vec::new();
        if let Some(r) = st.remote.as_deref_mut() {
            r.opened = true;
            let now = Instant::now().into_std();
            for (node, part) in &mut r.parts {
                if part.sequence.ask_again(now) {
                    ask.push(Arc::clone(node));
                }
            }
        }
        publish_all(room, st, &frames, &self.metrics);
        for node in ask {
            cluster.request_sync(&node, vec![room.name().to_owned()]);
        }
    }

    /// After the linger, closes `room` on this node if it still has no
    /// local member: tells the others, unsubscribes, forgets the replica.
    pub(in crate::room) fn linger(&self, room: &Arc<Room>, generation: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let delay = cluster.settings.linger;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if !delay.is_zero() => {
                let (rooms, room) = (self.this.clone(), Arc::clone(room));
                rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    if let Some(rooms) = rooms.upgrade() {
                        fan_out(|| rooms.close_idle(&room, generation)).await;
                    }
                });
            }
            _ => self.close_idle(room, generation),
        }
    }

    /// Closes `room` if it still has no local member and no join came
    /// since linger `generation` began.
    fn close_idle(&self, room: &Arc<Room>, generation: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut st = room.state();
        let State {
            members,
            remote,
            open,
            dirty,
            ..
        } = &mut *st;
        let Some(r) = remote.as_deref_mut() else {
            return;
        };
        if !*open || r.local > 0 || r.linger != generation {
            return;
        }
        r.publish(
            cluster,
            UpdateParts {
                closed: true,
                ..Default::default()
            },
        );
        // Nobody local is left, so every member is remote.
        self.metrics
            .cluster_remote_members
            .dec_by(members.len() as i64);
        members.clear();
        dirty.clear();
        r.parts.clear();
        // Unsubscribed before the room is marked closed, so a join that
        // reopens it subscribes afresh.
        cluster.close(room.name());
        *open = false;
        drop(st);
        self.forget(room);
    }

    /// The open rooms' handles (map guards dropped before any room lock).
    pub(super) fn open_handles(&self) -> Vec<Arc<Room>> {
        self.map.iter().map(|r| Arc::clone(r.value())).collect()
    }
}

/// A clustered join in progress; dropped with `room` set, the join did not
/// happen (see [`Rooms::abandoned_join`]).
struct Abandoned<'a> {
    rooms: &'a Rooms,
    room: Option<Arc<Room>>,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(room) = self.room.take() {
            self.rooms.abandoned_join(&room);
        }
    }
}
