//! The peer directory: which other nodes are alive, by (name, epoch).
//!
//! Pure: the caller passes `now`, so every rule is tested at exact
//! instants. Any message from a peer counts as a sign of life. A peer
//! silent for the node timeout is down; a `bye` removes it at once; a new
//! epoch under a known name replaces the old one at once, and messages still
//! in flight from a replaced (or departed) epoch are recognised as stale and
//! ignored, so they cannot bring it back.
//!
//! Name clashes (two live processes under one name, or a forged message
//! with a live node's name): a message under this node's own name and
//! another epoch is [`Seen::OwnName`]. On a peer, the incumbent (the live
//! epoch of a name) is kept, and a newcomer under its name ignored
//! ([`Seen::Clashing`]) for as long as the incumbent keeps talking; once
//! the incumbent is down, the newcomer replaces it as any restart does:
//!
//! - A restarted node claims its slot first (`P.v2.q.nodes`), which a live
//!   incumbent would have answered, refusing the start. A new epoch whose
//!   claim was heard ([`Directory::announce`]) replaces the incumbent at
//!   once, as a restart after `kill -9` must. One never announced (a
//!   forged message, or a claim this node missed) is ignored until the
//!   incumbent is down (the node timeout). The incumbent heard after such a
//!   newcomer is a clash ([`Seen::Clash`]).
//! - A replaced epoch heard again more than one heartbeat period after its
//!   replacement (a killed process's messages in flight arrive well before
//!   that) is alive (it was frozen during the newcomer's claim): it is
//!   reinstated ([`Seen::NameClash`]) and the newcomer ignored.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::wire::Origin;

/// The most peers remembered; past it, the longest-down peer is forgotten.
pub const MAX_PEERS: usize = 4_096;
/// Retired epochs remembered per node name.
const RETIRED_PER_NODE: usize = 4;
/// Other epochs under this node's own name remembered.
const OWN_CLASHES: usize = 8;

/// One known peer.
#[derive(Clone, Debug)]
pub struct Peer {
    pub epoch: u64,
    pub slot: u32,
    pub last_seen: Instant,
    /// Declared down (silent for the timeout) and not heard since.
    pub down: bool,
    /// Retired epochs of this name: their messages are stale.
    retired: Vec<u64>,
    /// The epoch the current one replaced, and when.
    replaced: Option<(u64, Instant)>,
    /// A newcomer under this name ignored while the current epoch (the
    /// incumbent) is live.
    clash: Option<Clash>,
    /// New epochs under this name whose slot claim was heard: each
    /// replaces the incumbent at once.
    announced: Vec<u64>,
}

/// A newcomer under a live peer's name.
#[derive(Clone, Copy, Debug)]
struct Clash {
    epoch: u64,
    /// When the newcomer was last heard.
    heard: Instant,
    /// Whether the incumbent was heard after it (both alive: reported).
    both: bool,
}

/// What hearing from a peer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A message from a retired epoch (in flight from a replaced or
    /// departed run): ignore it.
    Stale,
    /// A message under our own name but another epoch: a second process
    /// runs under this node's name (or someone forges it). Ignore it;
    /// `first` the first time this epoch is heard (log it, count it).
    OwnName { first: bool },
    /// A live peer, as known.
    Known,
    /// A node not known before.
    New { slot_clash: bool },
    /// A peer declared down is heard again: take it back (full states).
    Returned,
    /// A known name with a new epoch: the old epoch's members go at once.
    Replaced { old_epoch: u64, slot_clash: bool },
    /// The epoch `reinstated`, replaced by `dropped` more than a heartbeat
    /// period ago, is heard again: two live processes share the name. The
    /// incumbent is reinstated (ask it for its full states); the
    /// newcomer's members go, and its messages are ignored while the
    /// incumbent is live.
    NameClash { reinstated: u64, dropped: u64 },
    /// A message of a newcomer under a live peer's name, while the
    /// incumbent is live: ignore it.
    Clashing,
    /// The incumbent is heard after a newcomer under its name was ignored:
    /// two processes (or a forger) use the name. Report it once; the
    /// message is the incumbent's, as known.
    Clash { newcomer: u64 },
}

/// The directory of peers.
#[derive(Debug)]
pub struct Directory {
    me: Origin,
    timeout: Duration,
    /// The heartbeat period: a replaced epoch heard more than this after
    /// its replacement is alive.
    period: Duration,
    peers: HashMap<Arc<str>, Peer>,
    /// Other epochs heard under our own name, and when last.
    own_clashes: Vec<(u64, Instant)>,
}

impl Directory {
    pub fn new(me: Origin, timeout: Duration, period: Duration) -> Self {
        Self {
            me,
            timeout,
            period,
            peers: HashMap::new(),
            own_clashes: Vec::new(),
        }
    }

    /// Records a message from `from` at `now`.
    pub fn seen(&mut self, from: &Origin, now: Instant) -> Seen {
        if from.node == self.me.node {
            return self.own_name(from.epoch, now);
        }
        let clash = self.slot_clash(from);
        let period = self.period;
        if let Some(peer) = self.peers.get_mut(&from.node) {
            if peer.epoch == from.epoch {
                peer.last_seen = now;
                peer.slot = from.slot;
                if peer.down {
                    peer.down = false;
                    return Seen::Returned;
                }
                if let Some(clash) = &mut peer.clash
                    && !clash.both
                {
                    clash.both = true;
                    return Seen::Clash {
                        newcomer: clash.epoch,
                    };
                }
                return Seen::Known;
            }
            if let Some(clash) = &mut peer.clash
                && clash.epoch == from.epoch
                && !peer.down
            {
                clash.heard = now;
                return Seen::Clashing;
            }
            if let Some((old, at)) = peer.replaced
                && old == from.epoch
                && !peer.down
                && now.saturating_duration_since(at) > period
            {
                // The replaced run is alive: reinstate it, ignore the
                // newcomer while the incumbent talks.
                let dropped = peer.epoch;
                peer.retired.retain(|&e| e != old);
                peer.epoch = old;
                peer.slot = from.slot;
                peer.last_seen = now;
                peer.replaced = None;
                peer.clash = Some(Clash {
                    epoch: dropped,
                    heard: now,
                    both: true,
                });
                return Seen::NameClash {
                    reinstated: old,
                    dropped,
                };
            }
            if peer.retired.contains(&from.epoch) {
                return Seen::Stale;
            }
            let live = !peer.down && peer.epoch != 0;
            if live && !peer.announced.contains(&from.epoch) {
                // Never claimed a slot: not a restart. Ignored while the
                // incumbent talks.
                peer.clash = Some(Clash {
                    epoch: from.epoch,
                    heard: now,
                    both: false,
                });
                return Seen::Clashing;
            }
            peer.announced.retain(|&e| e != from.epoch);
            let old_epoch = peer.epoch;
            if peer.retired.len() == RETIRED_PER_NODE {
                peer.retired.remove(0);
            }
            peer.retired.push(old_epoch);
            // After a `bye` (epoch 0) or a drop there is no run to clash
            // with.
            peer.replaced = live.then_some((old_epoch, now));
            peer.clash = None;
            peer.epoch = from.epoch;
            peer.slot = from.slot;
            peer.last_seen = now;
            peer.down = false;
            return Seen::Replaced {
                old_epoch,
                slot_clash: clash,
            };
        }
        if self.peers.len() >= MAX_PEERS {
            self.forget_one();
        }
        self.peers.insert(
            Arc::clone(&from.node),
            Peer {
                epoch: from.epoch,
                slot: from.slot,
                last_seen: now,
                down: false,
                retired: Vec::new(),
                replaced: None,
                clash: None,
                announced: Vec::new(),
            },
        );
        Seen::New { slot_clash: clash }
    }

    /// The slot claim of `from` (a node starting) was heard: a new epoch
    /// of a known name, which replaces the incumbent at once when heard.
    pub fn announce(&mut self, from: &Origin) {
        if let Some(peer) = self.peers.get_mut(&from.node)
            && peer.epoch != from.epoch
            && !peer.announced.contains(&from.epoch)
        {
            if peer.announced.len() == RETIRED_PER_NODE {
                peer.announced.remove(0);
            }
            peer.announced.push(from.epoch);
        }
    }

    /// A message under our own name in `epoch`.
    fn own_name(&mut self, epoch: u64, now: Instant) -> Seen {
        if epoch == self.me.epoch {
            // Our own message (NATS does not echo them; harmless).
            return Seen::Stale;
        }
        if let Some((_, heard)) = self.own_clashes.iter_mut().find(|(e, _)| *e == epoch) {
            *heard = now;
            return Seen::OwnName { first: false };
        }
        if self.own_clashes.len() == OWN_CLASHES {
            self.own_clashes.remove(0);
        }
        self.own_clashes.push((epoch, now));
        Seen::OwnName { first: true }
    }

    /// Whether another process was heard under our own name within the
    /// node timeout before `now`.
    pub fn own_name_clash(&self, now: Instant) -> bool {
        self.own_clashes
            .iter()
            .any(|(_, heard)| now.saturating_duration_since(*heard) <= self.timeout)
    }

    /// Live peers whose name two live processes share (the newcomer heard
    /// within the node timeout before `now`), sorted.
    pub fn name_clashes(&self, now: Instant) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                !p.down
                    && p.clash.is_some_and(|c| {
                        c.both && now.saturating_duration_since(c.heard) <= self.timeout
                    })
            })
            .map(|(name, _)| Arc::clone(name))
            .collect();
        names.sort();
        names
    }

    /// The slots of the live peers other than `except`, and this node's.
    pub fn held_slots(&self, except: &str) -> std::collections::BTreeSet<u32> {
        self.peers
            .iter()
            .filter(|(name, p)| !p.down && ***name != *except)
            .map(|(_, p)| p.slot)
            .chain([self.me.slot])
            .collect()
    }

    /// Live peers holding this node's slot, sorted.
    pub fn slot_clashes(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .peers
            .iter()
            .filter(|(_, p)| !p.down && p.slot == self.me.slot)
            .map(|(name, _)| Arc::clone(name))
            .collect();
        names.sort();
        names
    }

    /// Whether another live node (this one included) holds `from`'s slot.
    fn slot_clash(&self, from: &Origin) -> bool {
        if from.slot == self.me.slot {
            return true;
        }
        self.peers
            .iter()
            .any(|(name, p)| **name != *from.node && !p.down && p.slot == from.slot)
    }

    fn forget_one(&mut self) {
        let oldest = self
            .peers
            .iter()
            .min_by_key(|(_, p)| (!p.down, p.last_seen))
            .map(|(name, _)| Arc::clone(name));
        if let Some(name) = oldest {
            self.peers.remove(&name);
        }
    }

    /// A graceful stop of `from`: true if it was a live peer, whose members
    /// must go now. Its epoch is retired, so late messages are stale.
    pub fn bye(&mut self, from: &Origin) -> bool {
        match self.peers.get_mut(&from.node) {
            Some(peer) if peer.epoch == from.epoch => {
                let was_live = !peer.down;
                peer.down = true;
                if peer.retired.len() == RETIRED_PER_NODE {
                    peer.retired.remove(0);
                }
                peer.retired.push(from.epoch);
                // Any new incarnation is a Replaced, never a Returned.
                peer.epoch = 0;
                peer.replaced = None;
                peer.clash = None;
                was_live
            }
            _ => false,
        }
    }

    /// Declares down every live peer silent for longer than the timeout,
    /// and returns them (name, epoch).
    pub fn expire(&mut self, now: Instant) -> Vec<(Arc<str>, u64)> {
        let mut lost = Vec::new();
        for (name, peer) in &mut self.peers {
            if !peer.down && now.saturating_duration_since(peer.last_seen) > self.timeout {
                peer.down = true;
                lost.push((Arc::clone(name), peer.epoch));
            }
        }
        lost
    }

    /// This node's heartbeat timer, due at `due` every `period`, fired at
    /// `now`. Later than half a period (1.5 periods after the previous
    /// beat) means this node was stalled (frozen, starved): what it did not
    /// hear meanwhile says nothing about its peers, so the delay does not
    /// count against them (each live peer's last sign of life moves on by
    /// it, never past `now`). Returns the delay when it was a stall.
    ///
    /// Measured against the timer rather than against the node timeout, a
    /// freeze just under the timeout is a stall too, and does not make
    /// this node drop peers whose messages are still in its socket. A dead
    /// peer still expires: only the delays are forgiven, not the time
    /// between them.
    pub fn beat(&mut self, due: Instant, now: Instant, period: Duration) -> Option<Duration> {
        let late = now.saturating_duration_since(due);
        if late <= period / 2 {
            return None;
        }
        for peer in self.peers.values_mut().filter(|p| !p.down) {
            peer.last_seen = (peer.last_seen + late).min(now);
        }
        Some(late)
    }

    /// The live peers' names.
    pub fn live_nodes(&self) -> Vec<Arc<str>> {
        self.peers
            .iter()
            .filter(|(_, p)| !p.down)
            .map(|(name, _)| Arc::clone(name))
            .collect()
    }

    /// Live peers, by name and epoch.
    pub fn live_peers(&self) -> impl Iterator<Item = (Arc<str>, u64)> + '_ {
        self.peers
            .iter()
            .filter(|(_, p)| !p.down)
            .map(|(name, p)| (Arc::clone(name), p.epoch))
    }

    /// Live peers.
    pub fn live(&self) -> usize {
        self.peers.values().filter(|p| !p.down).count()
    }

    /// Whether `(node, epoch)` is a live peer.
    pub fn is_live(&self, node: &str, epoch: u64) -> bool {
        self.peers
            .get(node)
            .is_some_and(|p| !p.down && p.epoch == epoch)
    }

    /// The current epoch of live peer `node`.
    pub fn live_epoch(&self, node: &str) -> Option<u64> {
        self.peers.get(node).filter(|p| !p.down).map(|p| p.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(node: &str, epoch: u64, slot: u32) -> Origin {
        Origin {
            node: Arc::from(node),
            epoch,
            slot,
            slots: 16,
        }
    }

    fn dir() -> Directory {
        Directory::new(origin("me", 1, 0), Duration::from_millis(3_000), PERIOD)
    }

    #[test]
    fn a_peer_is_new_then_known_then_down_after_the_timeout() {
        let mut d = dir();
        let t0 = Instant::now();
        let a = origin("a", 7, 1);
        assert_eq!(d.seen(&a, t0), Seen::New { slot_clash: false });
        assert_eq!(d.seen(&a, t0 + Duration::from_secs(1)), Seen::Known);
        assert_eq!(d.live(), 1);
        assert!(d.expire(t0 + Duration::from_millis(4_000)).is_empty());
        let lost = d.expire(t0 + Duration::from_millis(4_001));
        assert_eq!(lost, vec![(Arc::from("a"), 7)]);
        assert_eq!(d.live(), 0);
        assert!(!d.is_live("a", 7));
        // Declared once only.
        assert!(d.expire(t0 + Duration::from_secs(9)).is_empty());
        // Heard again: returned.
        assert_eq!(d.seen(&a, t0 + Duration::from_secs(10)), Seen::Returned);
        assert!(d.is_live("a", 7));
    }

    #[test]
    fn a_new_epoch_replaces_the_old_and_the_old_is_stale() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 7, 1), t0);
        d.announce(&origin("a", 8, 1));
        assert_eq!(
            d.seen(&origin("a", 8, 1), t0),
            Seen::Replaced {
                old_epoch: 7,
                slot_clash: false
            }
        );
        assert_eq!(d.seen(&origin("a", 7, 1), t0), Seen::Stale);
        assert_eq!(d.live_epoch("a"), Some(8));
    }

    #[test]
    fn bye_removes_at_once_and_late_messages_cannot_revive() {
        let mut d = dir();
        let t0 = Instant::now();
        let a = origin("a", 7, 1);
        d.seen(&a, t0);
        assert!(d.bye(&a));
        assert!(!d.bye(&a), "a second bye changes nothing");
        assert_eq!(d.live(), 0);
        assert_eq!(d.seen(&a, t0), Seen::Stale);
        assert!(d.expire(t0 + Duration::from_secs(10)).is_empty());
        // The restarted node is a replacement.
        assert!(matches!(
            d.seen(&origin("a", 9, 1), t0),
            Seen::Replaced { .. }
        ));
        assert!(d.is_live("a", 9));
    }

    #[test]
    fn our_own_name_is_never_a_peer_and_another_epoch_of_it_is_a_clash() {
        let mut d = dir();
        let t0 = Instant::now();
        assert_eq!(d.seen(&origin("me", 1, 0), t0), Seen::Stale);
        assert!(!d.own_name_clash(t0));
        assert_eq!(
            d.seen(&origin("me", 2, 0), t0),
            Seen::OwnName { first: true }
        );
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            d.seen(&origin("me", 2, 0), t1),
            Seen::OwnName { first: false }
        );
        assert_eq!(
            d.seen(&origin("me", 3, 5), t1),
            Seen::OwnName { first: true }
        );
        assert_eq!(d.live(), 0);
        // Said for the node timeout after the last one heard.
        assert!(d.own_name_clash(t1 + Duration::from_millis(3_000)));
        assert!(!d.own_name_clash(t1 + Duration::from_millis(3_001)));
    }

    #[test]
    fn slot_clashes_with_us_or_a_live_peer_are_reported() {
        let mut d = dir();
        let t0 = Instant::now();
        assert_eq!(
            d.seen(&origin("a", 1, 0), t0),
            Seen::New { slot_clash: true }
        );
        assert_eq!(
            d.seen(&origin("b", 1, 3), t0),
            Seen::New { slot_clash: false }
        );
        assert_eq!(
            d.seen(&origin("c", 1, 3), t0),
            Seen::New { slot_clash: true }
        );
    }

    const PERIOD: Duration = Duration::from_secs(1);

    /// Issue #15, finding 4: one message with a live node's name and
    /// another epoch (a forged heartbeat, a second process) replaced the
    /// node for good, its later messages stale. Now a newcomer that never
    /// claimed a slot is ignored while the incumbent talks, and the
    /// incumbent heard after it is a clash, reported once.
    #[test]
    fn a_newcomer_that_never_claimed_is_ignored_while_the_incumbent_talks() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 7, 1), t0);
        let forged = t0 + Duration::from_millis(100);
        assert_eq!(d.seen(&origin("a", 8, 1), forged), Seen::Clashing);
        assert!(d.is_live("a", 7));
        assert!(!d.is_live("a", 8));
        assert!(d.name_clashes(forged).is_empty(), "one side heard yet");
        let real = t0 + Duration::from_millis(1_000);
        assert_eq!(
            d.seen(&origin("a", 7, 1), real),
            Seen::Clash { newcomer: 8 }
        );
        assert_eq!(d.seen(&origin("a", 7, 1), real), Seen::Known, "once");
        assert_eq!(d.name_clashes(real), [Arc::<str>::from("a")]);
        // Said until the newcomer has been silent for the node timeout.
        assert_eq!(
            d.name_clashes(forged + Duration::from_millis(3_000)).len(),
            1
        );
        assert!(
            d.name_clashes(forged + Duration::from_millis(3_001))
                .is_empty()
        );
        let again = t0 + Duration::from_millis(1_500);
        assert_eq!(d.seen(&origin("a", 8, 1), again), Seen::Clashing);
        assert_eq!(
            d.name_clashes(again + Duration::from_millis(3_000)).len(),
            1
        );
        // The incumbent dies: the newcomer takes the name as any restart.
        assert_eq!(d.expire(real + Duration::from_millis(3_000)).len(), 0);
        assert_eq!(d.expire(real + Duration::from_millis(3_001)).len(), 1);
        assert_eq!(
            d.seen(&origin("a", 8, 1), real + Duration::from_millis(3_001)),
            Seen::Replaced {
                old_epoch: 7,
                slot_clash: false
            }
        );
        assert!(d.is_live("a", 8));
    }

    /// A newcomer that claimed its slot replaces at once (a restart), but
    /// the replaced epoch heard more than a heartbeat period later is alive
    /// (it was frozen while the newcomer claimed): it is reinstated, and
    /// the newcomer ignored while the incumbent talks.
    #[test]
    fn a_replaced_epoch_heard_after_a_period_is_reinstated_and_the_newcomer_ignored() {
        let mut d = dir();
        let t0 = Instant::now();
        assert_eq!(
            d.seen(&origin("a", 7, 1), t0),
            Seen::New { slot_clash: false }
        );
        d.announce(&origin("a", 8, 1));
        let forged = t0 + Duration::from_millis(100);
        assert_eq!(
            d.seen(&origin("a", 8, 1), forged),
            Seen::Replaced {
                old_epoch: 7,
                slot_clash: false
            }
        );
        // Within a period of the replacement: in flight from a killed run.
        assert_eq!(d.seen(&origin("a", 7, 1), forged + PERIOD), Seen::Stale);
        assert!(d.is_live("a", 8));
        assert!(d.name_clashes(forged + PERIOD).is_empty());
        // Past it: alive. The incumbent is back, the newcomer ignored.
        let heard = forged + PERIOD + Duration::from_millis(1);
        assert_eq!(
            d.seen(&origin("a", 7, 1), heard),
            Seen::NameClash {
                reinstated: 7,
                dropped: 8
            }
        );
        assert!(d.is_live("a", 7));
        assert!(!d.is_live("a", 8));
        assert_eq!(d.seen(&origin("a", 8, 1), heard), Seen::Clashing);
        assert_eq!(d.seen(&origin("a", 7, 1), heard), Seen::Known);
        assert_eq!(d.name_clashes(heard), [Arc::<str>::from("a")]);
        // Said until the newcomer has been silent for the node timeout.
        let later = heard + Duration::from_secs(2);
        assert_eq!(d.seen(&origin("a", 7, 1), later), Seen::Known);
        assert_eq!(
            d.name_clashes(heard + Duration::from_millis(3_000)).len(),
            1
        );
        assert!(
            d.name_clashes(heard + Duration::from_millis(3_001))
                .is_empty()
        );
        // The incumbent dies: the newcomer takes the name as any restart.
        assert_eq!(d.expire(later + Duration::from_millis(3_001)).len(), 1);
        assert_eq!(
            d.seen(&origin("a", 8, 1), later + Duration::from_secs(4)),
            Seen::Replaced {
                old_epoch: 7,
                slot_clash: false
            }
        );
        assert!(d.is_live("a", 8));
    }

    /// A restart after `kill -9` (or a stop) still replaces at once, and
    /// the old run's last messages, in flight, are stale.
    #[test]
    fn a_restart_replaces_at_once_and_the_old_runs_messages_in_flight_are_stale() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 7, 1), t0);
        d.announce(&origin("a", 8, 1));
        let restarted = t0 + Duration::from_millis(400);
        assert!(matches!(
            d.seen(&origin("a", 8, 1), restarted),
            Seen::Replaced { old_epoch: 7, .. }
        ));
        assert_eq!(d.seen(&origin("a", 7, 1), restarted), Seen::Stale);
        assert_eq!(d.seen(&origin("a", 7, 1), restarted + PERIOD), Seen::Stale);
        // A run that said bye, then a new one: the old never clashes.
        let a9 = origin("a", 9, 1);
        let t1 = restarted + PERIOD;
        d.announce(&a9);
        assert!(matches!(d.seen(&a9, t1), Seen::Replaced { .. }));
        assert!(d.bye(&a9));
        assert!(matches!(
            d.seen(&origin("a", 10, 1), t1),
            Seen::Replaced { .. }
        ));
        assert_eq!(d.seen(&a9, t1 + 5 * PERIOD), Seen::Stale);
        // A run already down (expired) is not an incumbent either.
        let t2 = t1 + 5 * PERIOD;
        assert_eq!(d.expire(t2 + Duration::from_millis(3_001)).len(), 1);
        let t3 = t2 + Duration::from_secs(4);
        assert!(matches!(
            d.seen(&origin("a", 11, 1), t3),
            Seen::Replaced { old_epoch: 10, .. }
        ));
        assert_eq!(d.seen(&origin("a", 10, 1), t3 + 5 * PERIOD), Seen::Stale);
        assert!(d.name_clashes(t3 + 5 * PERIOD).is_empty());
    }

    #[test]
    fn slot_clashes_and_held_slots_list_the_live_peers() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 1, 0), t0);
        d.seen(&origin("b", 1, 3), t0);
        assert_eq!(d.slot_clashes(), [Arc::<str>::from("a")]);
        assert_eq!(d.held_slots("x").into_iter().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(d.held_slots("b").into_iter().collect::<Vec<_>>(), [0]);
        d.expire(t0 + Duration::from_millis(3_001));
        assert!(d.slot_clashes().is_empty());
    }

    #[test]
    fn a_long_stall_gives_every_live_peer_a_fresh_timeout() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 1, 1), t0);
        let late = t0 + Duration::from_secs(20);
        assert_eq!(
            d.beat(t0 + PERIOD, late, PERIOD),
            Some(Duration::from_secs(19))
        );
        assert!(d.expire(late + Duration::from_secs(2)).is_empty());
        assert_eq!(d.expire(late + Duration::from_secs(4)).len(), 1);
    }

    /// A freeze just under the node timeout: the peer's last beat came at
    /// 0.1 s, ours at 1 s, and the next of ours (due at 2 s) fires at
    /// 3.5 s. Compared with the timeout (3.5 - 1 < 3 s) it was no stall, and
    /// the peer (silent since 0.1 s, 3.4 s ago) was dropped on resuming.
    #[test]
    fn a_freeze_just_under_the_timeout_is_a_stall_and_drops_nobody() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 1, 1), t0 + Duration::from_millis(100));
        assert_eq!(d.beat(t0 + PERIOD, t0 + PERIOD, PERIOD), None);
        assert!(d.expire(t0 + PERIOD).is_empty());
        let resumed = t0 + Duration::from_millis(3_500);
        assert_eq!(
            d.beat(t0 + 2 * PERIOD, resumed, PERIOD),
            Some(Duration::from_millis(1_500))
        );
        assert!(d.expire(resumed).is_empty(), "nobody dropped on resuming");
        assert_eq!(d.live_nodes(), [Arc::<str>::from("a")]);
        // A beat on time forgives nothing: the peer, really silent, expires
        // 3 s after its last beat plus the stall.
        assert_eq!(d.beat(resumed + PERIOD, resumed + PERIOD, PERIOD), None);
        assert!(d.expire(t0 + Duration::from_millis(4_600)).is_empty());
        assert_eq!(d.expire(t0 + Duration::from_millis(4_601)).len(), 1);
    }

    #[test]
    fn a_beat_late_by_half_a_period_or_less_is_no_stall() {
        let mut d = dir();
        let t0 = Instant::now();
        d.seen(&origin("a", 1, 1), t0);
        assert_eq!(d.beat(t0, t0 + PERIOD / 2, PERIOD), None);
        assert_eq!(d.expire(t0 + Duration::from_millis(3_001)).len(), 1);
    }

    #[test]
    fn the_directory_is_bounded() {
        let mut d = dir();
        let t0 = Instant::now();
        for i in 0..MAX_PEERS + 10 {
            d.seen(&origin(&format!("n{i}"), 1, 1), t0);
        }
        assert_eq!(d.peers.len(), MAX_PEERS);
    }
}
