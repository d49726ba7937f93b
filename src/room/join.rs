//! Joining a room: the room made if need be, capacity, the user's older
//! member replaced, the id, the spawn point, `Welcome` and `Joined`, in one
//! step under the room's lock.

use super::remote::takeover;
use super::*;
use crate::cluster::wire;

impl Rooms {
    /// Joins `room` (creating it) as `name`, with `sink` for its frames. On
    /// success the member is in the room, the others have been sent
    /// `Joined`, and `sink` has the `Welcome` snapshot, followed by every
    /// room frame after it.
    pub async fn join(
        self: &Arc<Self>,
        room: &str,
        name: String,
        sink: Arc<dyn Sink>,
    ) -> Result<Membership, JoinError> {
        self.join_as(room, name, None, sink).await
    }

    /// As [`join`](Self::join), for a member that belongs to app user
    /// `user` (a token's `sub`). If the user is in the room already, that
    /// member leaves first (the others get `Left` with reason REPLACED,
    /// then `Joined`), and its sink is told it was
    /// [`removed`](Sink::removed), so its connection closes.
    pub async fn join_as(
        self: &Arc<Self>,
        room: &str,
        name: String,
        user: Option<Arc<str>>,
        sink: Arc<dyn Sink>,
    ) -> Result<Membership, JoinError> {
        let arrival = Arrival {
            name,
            user,
            ..Arrival::default()
        };
        self.arrive(room, arrival, sink).await
    }

    /// As [`join_as`](Self::join_as), the member appearing where
    /// `arrival.start` says (a point checked to be within the world), or by
    /// the spawn rule without one.
    pub async fn arrive(
        self: &Arc<Self>,
        room: &str,
        arrival: Arrival,
        sink: Arc<dyn Sink>,
    ) -> Result<Membership, JoinError> {
        if let Some(cluster) = self.cluster.get() {
            return self.join_clustered(cluster, room, arrival, sink).await;
        }
        fan_out(|| self.join_now(room, arrival, sink)).await
    }

    pub(super) fn join_now(
        self: &Arc<Self>,
        room: &str,
        arrival: Arrival,
        sink: Arc<dyn Sink>,
    ) -> Result<Membership, JoinError> {
        loop {
            if self.shutting_down.load(Ordering::Relaxed) {
                return Err(JoinError::ShuttingDown);
            }
            let handle = self.handle(room);
            let st = handle.state();
            if !st.open {
                // Its last member left between our lookup and our lock, and
                // it is leaving the map. Take it out ourselves (whoever gets
                // there first counts it) rather than spin, and look again.
                drop(st);
                self.forget(&handle);
                continue;
            }
            return self.join_locked(&handle, st, arrival, sink);
        }
    }

    /// The room named `room`, created if need be. The map guard is dropped
    /// before the room is locked.
    pub(super) fn handle(&self, room: &str) -> Arc<Room> {
        let entry = self.map.entry(Arc::from(room)).or_insert_with(|| {
            self.metrics.rooms.inc();
            Arc::new(Room {
                name: Arc::from(room),
                world: self.world_of(room),
                opened: tokio::sync::OnceCell::new(),
                state: Mutex::new(State {
                    members: BTreeMap::new(),
                    users: HashMap::new(),
                    dirty: Vec::new(),
                    local_since_ms: HashMap::new(),
                    open: true,
                    remote: self.cluster.get().map(|c| {
                        let opening = self.openings.fetch_add(1, Ordering::Relaxed) + 1;
                        Box::new(remote::Remote::new(c.room_subject(room), opening))
                    }),
                    places: Places::default(),
                    spatial: self
                        .spatial_settings(room)
                        .map(|s| Box::new(spatial::Spatial::new(s.grid()))),
                    finds: None,
                }),
                out: Mutex::new(Out { sinks: Vec::new() }),
            })
        });
        let handle = Arc::clone(entry.value());
        drop(entry);
        handle
    }

    /// Joins the open room `handle`, whose state `st` is locked.
    pub(super) fn join_locked(
        self: &Arc<Self>,
        handle: &Arc<Room>,
        mut st: MutexGuard<'_, State>,
        arrival: Arrival,
        sink: Arc<dyn Sink>,
    ) -> Result<Membership, JoinError> {
        let Arrival {
            name,
            user,
            start,
            data,
            claimed,
            share_user,
            token_expires_at_ms,
            resume,
        } = arrival;
        let room = handle.name();
        // A place of another node's that this join's resume token names:
        // the session goes on here (cluster mode).
        let mut adopt = None;
        if let Some(token) = resume {
            match self.resumable(&st, &token, user.as_ref()) {
                Ok(id) => {
                    let taker = hold::Taker {
                        token,
                        id,
                        claimed,
                        token_expires_at_ms,
                    };
                    return Ok(self.resume_locked(handle, st, taker, sink));
                }
                Err(resume::Refusal::Unknown) if st.remote.is_some() => {
                    match takeover::place_of_token(&st, &token, user.as_ref()) {
                        Ok(place) => adopt = Some(place),
                        Err(refusal) => self.metrics.resume_refuse(refusal.reason()),
                    }
                }
                Err(refusal) => self.metrics.resume_refuse(refusal.reason()),
            }
        }
        let spatial_settings = st
            .spatial
            .as_ref()
            .and_then(|_| self.settings.spatial.as_ref());
        let capacity = spatial_settings.map_or(self.settings.capacity, |s| s.capacity);
        let replacing = user.as_ref().and_then(|u| st.users.get(u).copied());
        // The user's member on another node, which this one replaces.
        let replacing_remote = match (&adopt, replacing, &user) {
            (None, None, Some(u)) if st.remote.is_some() => takeover::place_of_user(&st, u),
            _ => None,
        };
        let taking = adopt.is_some() || replacing_remote.is_some();
        if st.members.len() - usize::from(replacing.is_some() || taking) >= capacity {
            return Err(JoinError::RoomFull {
                room: room.to_owned(),
                capacity,
            });
        }
        // In a spatial room, those who saw the user's older member see it
        // leave.
        let replaced_audience = replacing.and_then(|old| st.audience(old));
        let now_ms = self.clock.now_ms();
        let hooks = self.hooks.get();
        let had_local = !st.local_since_ms.is_empty();
        // The user's older member leaves first (its id may be reused), held
        // or not.
        let replaced = match replacing.and_then(|old| Some((old, st.members.remove(&old)?))) {
            Some((old, gone)) => {
                // Held or not: a held place goes with its member.
                if st.places.forget(old) {
                    self.unheld();
                }
                let since = st.local_since_ms.remove(&old);
                if let Some(hooks) = hooks {
                    hooks.left(
                        &handle.name,
                        old.0,
                        &gone.name,
                        gone.user.clone(),
                        LeaveReason::Replaced,
                        since.map_or(0, |t| now_ms.saturating_sub(t)),
                    );
                }
                Some(old)
            }
            None => None,
        };
        if let (Some(old), Some(sp)) = (replaced, st.spatial.as_deref_mut()) {
            sp.forget(old);
        }
        // Another node's member whose place this one takes, out of the
        // room's state (nobody told yet), and whether it is this session's.
        let resumed = adopt.is_some();
        let taken = adopt
            .or(replacing_remote)
            .and_then(|place| Some((takeover::take(&mut st, &place, &self.metrics)?, place)));
        let resumed = resumed && taken.is_some();
        // This node's first member of the room (a replaced member was
        // one already): the webhooks decide whether the room is occupied.
        if let Some(hooks) = hooks
            && !had_local
        {
            hooks.local_occupied(&handle.name);
        }
        let (slot, slots) = self.cluster.get().map_or((0, 1), |c| (c.slot(), c.slots()));
        let id = st.lowest_free_id(slot, slots);
        if let Some(u) = &user {
            st.users.insert(Arc::clone(u), id);
        }
        let seat = self.seats.fetch_add(1, Ordering::Relaxed);
        let mut member = Member {
            seat,
            user,
            share_user,
            name: name.into_boxed_str(),
            data,
            motion: Motion::standing(start.unwrap_or_else(|| match spatial_settings {
                Some(s) => spawn_around(
                    Position {
                        x: s.world.x / 2,
                        y: s.world.y / 2,
                    },
                    s.world,
                    id,
                ),
                None => spawn_point(&self.settings, id),
            })),
            moved_at_ms: now_ms,
            pending: None,
            origin: None,
            joined_at_s: unix_secs(now_ms),
        };
        // A resumed session goes on as it was: where it stood or walked,
        // its name and data.
        if let Some((old, _)) = taken.as_ref().filter(|_| resumed) {
            member.name = old.name.clone();
            member.data = old.data.clone();
            member.motion = old.motion;
            member.moved_at_ms = old.moved_at_ms;
        }
        // Kept only for the webhooks: without them it would cost every
        // member an entry for nothing.
        if hooks.is_some() {
            st.local_since_ms.insert(id, now_ms);
        }
        // A resumed session neither joined nor left, for the app as for
        // the room.
        if let Some(hooks) = hooks.filter(|_| !resumed) {
            hooks.joined(&handle.name, id.0, &member.name, member.user.clone());
        }
        let joined_pb = member_pb(id, &member);
        if let Some(sp) = st.spatial.as_deref_mut() {
            sp.place(id, member.motion.position);
        }
        let sub = member.user.clone();
        st.members.insert(id, member);
        let audience = st.audience(id);
        let next = self.issue_token(&mut st, id);
        if let Some(cluster) = self.cluster.get() {
            let extra = wire::JoinedExtra {
                sub,
                resume_hash: next.map(|t| t.hash()),
                replaces: taken.as_ref().map(|(_, place)| wire::Replaces {
                    node: Arc::clone(&place.node),
                    id: place.id,
                    seat: place.seat,
                    resumed,
                }),
            };
            remote::published_join(cluster, &mut st, replaced, joined_pb.clone(), seat, extra);
        }
        // Moves cut for a tick not yet written: to the members here now,
        // not again to the joiner, whose snapshot shows them.
        let early_batch = self.batch_before_join(&mut st);
        // Those here see the place taken: one Renumbered for a session
        // that resumed, else a Left (REPLACED) of the older member first.
        let (joined, taken_left) = match &taken {
            Some((_, place)) if resumed => (
                encode_server(Body::Renumbered(pb::Renumbered {
                    old_id: place.id.0,
                    new_id: id.0,
                })),
                None,
            ),
            taken => (
                encode_server(Body::Joined(pb::Joined {
                    member: Some(joined_pb),
                })),
                taken.as_ref().map(|(_, place)| {
                    encode_server(Body::Left(pb::Left {
                        member_id: place.id.0,
                        reason: LeaveReason::Replaced as i32,
                    }))
                }),
            ),
        };
        let welcome = self.welcome(&st, room, id, token_expires_at_ms, next, resumed);
        // In order with every room frame: the first frame the new member
        // sees after its snapshot is the first one after it.
        let mut out = handle.out();
        drop(st);
        if let Some(batch) = early_batch {
            out.publish(&batch, &self.metrics);
        }
        // A held member has no sink, but the room still sees it go.
        let replaced_sink = replaced.and_then(|old| {
            let left = encode_server(Body::Left(pb::Left {
                member_id: old.0,
                reason: LeaveReason::Replaced as i32,
            }));
            let old_sink = out
                .sinks
                .iter()
                .position(|(m, _)| *m == old)
                .map(|at| out.sinks.remove(at).1);
            match &replaced_audience {
                None => out.publish(&left, &self.metrics),
                Some(to) => self.metrics.sent_to(out.write_to(&left, to), left.len()),
            }
            old_sink
        });
        if let Some(left) = &taken_left {
            out.publish(left, &self.metrics);
        }
        match &audience {
            None => out.publish(&joined, &self.metrics),
            Some(to) => self
                .metrics
                .sent_to(out.write_to(&joined, to), joined.len()),
        }
        self.metrics.sent_to(1, welcome.len());
        sink.send_snapshot(welcome);
        out.sinks.push((id, sink));
        drop(out);
        self.metrics.members.inc();
        if replaced.is_some() {
            self.metrics.members.dec();
            self.metrics.auth_replaced.inc();
        }
        if resumed {
            self.metrics.resumed("from_other_node");
        }
        if let Some(old_sink) = replaced_sink {
            old_sink.removed(Removal::Replaced);
        }
        Ok(Membership {
            rooms: Arc::clone(self),
            room: Arc::clone(handle),
            id,
            seat,
            claimed,
            left: false,
            resumed,
        })
    }

    /// The `Welcome` for member `id` of `room`, with the room's snapshot
    /// as it is under `st`.
    pub(super) fn welcome(
        &self,
        st: &State,
        room: &str,
        id: MemberId,
        token_expires_at_ms: u64,
        resume_token: Option<ResumeToken>,
        resumed: bool,
    ) -> Frame {
        let spatial = st.spatial.as_ref().and(self.settings.spatial.as_ref());
        encode_server(Body::Welcome(pb::Welcome {
            member_id: id.0,
            room: room.to_owned(),
            limits: Some(spatial.map_or(self.settings.limits, |s| s.limits)),
            snapshot: Some(st.snapshot_for(id, self.clock.now_ms())),
            server_version: crate::protocol::SERVER_VERSION.to_owned(),
            protocol_revision: crate::protocol::PROTOCOL_REVISION,
            token_expires_at_ms,
            resume_token: resume_token.map(|t| t.to_string()).unwrap_or_default(),
            resumed,
            population: u32::try_from(st.members.len()).unwrap_or(u32::MAX),
        }))
    }
}
