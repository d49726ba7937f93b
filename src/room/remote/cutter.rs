//! The cutter: this node's clock-driven side of a clustered room. Every
//! tick it cuts each room's local moves `--cluster-lead-ms` before the
//! tick and publishes them; once a second it sweeps each room, asking again
//! for missing full states and publishing a beacon in a quiet room.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::publish::publish_all;
use super::sequence::ASK_EVERY;
use super::takeover;
use crate::cluster::wire::{self, UpdateParts};
use crate::protocol::{MemberId, MotionRecord};
use crate::room::grid::TickGrid;
use crate::room::{Room, Rooms, State};

/// Sweeps (one a second) without an update from this node in a room with
/// local members before it publishes a beacon there.
const BEACON_AFTER_SWEEPS: u32 = 5;

impl Rooms {
    /// Cuts room `room`'s local moves for the tick at `tick_ms`: applies
    /// them, keeps them for that tick's batch, and publishes them.
    pub(in crate::room) fn cut(&self, room: &Room, tick_ms: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut st = room.state();
        let State {
            members,
            dirty,
            remote,
            ..
        } = &mut *st;
        let Some(r) = remote.as_deref_mut() else {
            return;
        };
        if dirty.is_empty() {
            return;
        }
        let cut = &mut r.cut;
        // Moves cut before a tick that has not come yet (a skipped tick),
        // by member: a newer move replaces the older. Usually none (no
        // allocation); looked up in O(1) either way.
        let earlier: HashMap<MemberId, usize> =
            cut.iter().enumerate().map(|(i, c)| (c.member, i)).collect();
        // What this cut adds: the whole cut, unless an earlier cut is still
        // waiting for its tick. Those moves went out with that cut, so only
        // the new ones are published (each move reaches each node once).
        let mut fresh = (!earlier.is_empty()).then(Vec::new);
        let mut changed = false;
        dirty.retain(|id| match members.get_mut(id) {
            Some(m) if m.origin.is_none() => {
                if let Some(motion) = m.pending.take() {
                    m.motion = motion;
                    m.moved_at_ms = tick_ms;
                    changed = true;
                    let record = MotionRecord {
                        member: *id,
                        motion,
                    };
                    match earlier.get(id) {
                        Some(&i) => cut[i].motion = motion,
                        None => cut.push(record),
                    }
                    if let Some(fresh) = fresh.as_mut() {
                        fresh.push(record);
                    }
                }
                false
            }
            Some(_) => true,
            None => false,
        });
        if !changed {
            return;
        }
        let records = match fresh {
            Some(fresh) => fresh,
            None => std::mem::take(&mut r.cut),
        };
        r.publish(
            cluster,
            UpdateParts {
                tick_ms,
                motion: &records,
                ..Default::default()
            },
        );
        if r.cut.is_empty() {
            r.cut = records;
        }
    }

    /// Once a second per room: asks again the nodes whose full state is
    /// still missing (a lost request or answer), and publishes a beacon when
    /// this node has members here and published nothing for a while.
    pub(in crate::room) fn sweep(&self, room: &Room) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut ask = Vec::new();
        {
            let mut st = room.state();
            if !st.open {
                return;
            }
            let expired = takeover::expire(&mut st, self.clock.now_ms(), &self.metrics);
            let Some(r) = st.remote.as_deref_mut().filter(|r| r.opened) else {
                publish_all(room, st, &expired, &self.metrics);
                return;
            };
            let now = Instant::now().into_std();
            for (node, part) in &mut r.parts {
                if part.sequence.ask_again(now) {
                    ask.push(Arc::clone(node));
                }
            }
            if std::mem::take(&mut r.published) || r.local == 0 {
                r.quiet_sweeps = 0;
            } else {
                r.quiet_sweeps += 1;
            }
            if r.quiet_sweeps >= BEACON_AFTER_SWEEPS {
                // The current seq again, not a new one: a node that missed
                // this node's last update in a quiet room sees the gap.
                r.quiet_sweeps = 0;
                cluster.publish(
                    r.subject.clone(),
                    wire::encode_update(
                        cluster.origin_pb(),
                        UpdateParts {
                            incarnation: r.incarnation,
                            seq: r.seq,
                            ..Default::default()
                        },
                    ),
                );
            }
            publish_all(room, st, &expired, &self.metrics);
        }
        for node in ask {
            cluster.request_sync(&node, vec![room.name().to_owned()]);
        }
    }

    /// Cuts every room's local moves `--cluster-lead-ms` before each tick,
    /// until `shutdown`, so other nodes get them in time for the same tick;
    /// and sweeps every room once a second ([`sweep`](Self::sweep)).
    pub async fn run_cutter(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let Ok(tick_ms) = u64::try_from(self.settings.tick.as_millis()) else {
            return;
        };
        let workers = self.tick_workers();
        if tick_ms == 0 {
            // Moves go out at once: only the sweeps.
            let mut interval = tokio::time::interval(ASK_EVERY);
            interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = interval.tick() => {
                        self.each_room_sharded(workers, |rooms, room| rooms.sweep(room)).await;
                    }
                }
            }
        }
        let sweep_every = (1_000 / tick_ms).max(1);
        let mut cuts: u64 = 0;
        let lead_ms = u64::try_from(cluster.settings.lead.as_millis()).unwrap_or(0);
        let Some(grid) = TickGrid::new(tick_ms, lead_ms) else {
            return;
        };
        let first = self
            .clock
            .instant_at(grid.cut_before(grid.next_tick(self.clock.now_ms())));
        let mut interval = tokio::time::interval_at(first, self.settings.tick);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                at = interval.tick() => {
                    let tick = grid.tick_after_cut(self.clock.ms_at(at));
                    cuts += 1;
                    let sweep = cuts.is_multiple_of(sweep_every);
                    self.each_room_sharded(workers, move |rooms, room| {
                        rooms.cut(room, tick);
                        if sweep {
                            rooms.sweep(room);
                        }
                    })
                    .await;
                }
            }
        }
    }
}
