//! The slot claim at start-up, before this node's first heartbeat: it
//! asks every live node on `P.v2.q.nodes` (a `Heartbeat{claiming}` with
//! its name, epoch and wanted slot) and gathers the answers (each node's
//! origin) for the snapshot timeout. Then ([`decide`], pure):
//!
//! - a node answering under this node's name is another live process of
//!   it: the start is refused (a killed previous run cannot answer, so a
//!   restart after `kill -9` is not refused);
//! - an explicit `--node-slot` held by a live node: the start is refused;
//! - a default slot held by a live node: the lowest free slot is taken
//!   instead; none free: the start is refused.
//!
//! Two nodes claiming at the same time hear each other (each is subscribed
//! to the claims before it asks, and answers with `claiming` set while its
//! own claim is open): of two claimers wanting one slot, the one with the
//! smaller name keeps it.

use std::time::Duration;

use async_nats::connection::State;
use async_nats::{Client, Subscriber};
use futures_util::StreamExt as _;
use tokio::time::Instant;
use tracing::warn;

use super::connection::StartError;
use crate::cluster::ClusterSettings;
use crate::cluster::subjects::Subjects;
use crate::cluster::wire::{self, Origin, cpb};

/// Another node heard during the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Heard {
    pub node: String,
    pub slot: u32,
    /// Its own claim was still open: it holds no slot yet.
    pub claiming: bool,
}

/// Why a claim is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    Name,
    Slot { holder: String },
    Full,
}

/// The slot this node takes, given what it heard: see the module's rules.
/// `me` is this node's name; `wanted` the slot it would take; `explicit`
/// whether that is the operator's `--node-slot`.
pub(super) fn decide(
    me: &str,
    wanted: u32,
    explicit: bool,
    slots: u32,
    heard: &[Heard],
) -> Result<u32, Refused> {
    if heard.iter().any(|h| h.node == me) {
        return Err(Refused::Name);
    }
    // Live nodes hold their slot; a claimer holds its wanted slot against
    // claimers with greater names.
    let holder = heard
        .iter()
        .filter(|h| h.slot == wanted && (!h.claiming || h.node.as_str() < me))
        .map(|h| h.node.clone())
        .min();
    match holder {
        None => Ok(wanted),
        Some(holder) if explicit => Err(Refused::Slot { holder }),
        Some(_) => (0..slots)
            .find(|s| heard.iter().all(|h| h.slot != *s))
            .ok_or(Refused::Full),
    }
}

/// Waits for the first NATS connection (the claim needs it), saying so
/// every few seconds.
async fn connected(client: &Client) {
    let start = Instant::now();
    let mut said = start;
    while client.connection_state() != State::Connected {
        if said.elapsed() >= Duration::from_secs(5) {
            said = Instant::now();
            warn!(
                waited_s = start.elapsed().as_secs(),
                "cluster: waiting for NATS to claim this node's slot; not serving until then"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn nats_error(err: impl std::fmt::Display) -> StartError {
    StartError::Claim(err.to_string())
}

/// Claims a slot for `me` (its `slot` the one wanted). Returns the slot
/// and the subscription to the claims of nodes starting later, which this
/// node answers from now on.
pub(super) async fn claim(
    client: &Client,
    subjects: &Subjects,
    settings: &ClusterSettings,
    me: &Origin,
) -> Result<(u32, Subscriber), StartError> {
    connected(client).await;
    let subject = subjects.nodes();
    let mut requests = client
        .subscribe(subject.clone())
        .await
        .map_err(nats_error)?;
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.map_err(nats_error)?;
    client.flush().await.map_err(nats_error)?;
    let ask = wire::encode_heartbeat(
        &me.to_pb(),
        cpb::Heartbeat {
            claiming: true,
            ..Default::default()
        },
    );
    client
        .publish_with_reply(subject, inbox, ask.clone())
        .await
        .map_err(nats_error)?;
    let deadline = Instant::now() + settings.snapshot_timeout;
    let mut heard = Vec::new();
    let mut note = |payload: &[u8], claiming: bool| {
        // A node of another --cluster-slots is dropped here as everywhere.
        if let Ok(beat) = wire::decode_heartbeat(payload, me.slots)
            && beat.origin.epoch != me.epoch
        {
            heard.push(Heard {
                node: beat.origin.node.to_string(),
                slot: beat.origin.slot,
                claiming: claiming || beat.claiming,
            });
        }
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => break,
            msg = answers.next() => match msg {
                // NATS's own "no responders" has a status and no payload.
                Some(msg) if msg.status.is_none() => note(&msg.payload, false),
                Some(_) => {}
                None => break,
            },
            msg = requests.next() => match msg {
                Some(msg) => {
                    // Another node claiming now: it hears this one too.
                    note(&msg.payload, true);
                    if let Some(reply) = msg.reply {
                        let _ = client.publish(reply, ask.clone()).await;
                    }
                }
                None => break,
            },
        }
    }
    drop(answers);
    let node = me.node.to_string();
    match decide(&node, me.slot, settings.slot_explicit, me.slots, &heard) {
        Ok(slot) => Ok((slot, requests)),
        Err(Refused::Name) => Err(StartError::NameTaken { node }),
        Err(Refused::Slot { holder }) => Err(StartError::SlotTaken {
            slot: me.slot,
            holder,
        }),
        Err(Refused::Full) => Err(StartError::NoFreeSlot {
            slots: me.slots,
            live: heard.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(node: &str, slot: u32) -> Heard {
        Heard {
            node: node.into(),
            slot,
            claiming: false,
        }
    }

    fn claiming(node: &str, slot: u32) -> Heard {
        Heard {
            claiming: true,
            ..live(node, slot)
        }
    }

    #[test]
    fn a_free_wanted_slot_is_taken() {
        assert_eq!(decide("n1", 1, false, 16, &[]), Ok(1));
        assert_eq!(decide("n1", 1, true, 16, &[live("n2", 2)]), Ok(1));
    }

    #[test]
    fn a_live_node_under_this_name_refuses_the_start() {
        assert_eq!(
            decide("n1", 1, false, 16, &[live("n2", 2), live("n1", 5)]),
            Err(Refused::Name)
        );
        assert_eq!(
            decide("n1", 1, true, 16, &[claiming("n1", 1)]),
            Err(Refused::Name)
        );
    }

    #[test]
    fn an_explicit_slot_held_by_a_live_node_refuses_the_start() {
        assert_eq!(
            decide("n9", 1, true, 16, &[live("n1", 1)]),
            Err(Refused::Slot {
                holder: "n1".into()
            })
        );
    }

    #[test]
    fn a_default_slot_held_moves_to_the_lowest_free_one() {
        let heard = [live("box-3000", 8), live("a", 0), live("b", 1)];
        assert_eq!(decide("box2-3000", 8, false, 16, &heard), Ok(2));
    }

    #[test]
    fn with_every_slot_held_the_start_is_refused() {
        let heard = [live("a", 0), live("b", 1)];
        assert_eq!(decide("c", 1, false, 2, &heard), Err(Refused::Full));
    }

    /// Two nodes claiming one slot at once: the smaller name keeps it, the
    /// other moves, and avoids the slots every other claimer wants.
    #[test]
    fn of_two_claimers_the_smaller_name_keeps_the_slot() {
        assert_eq!(decide("a", 3, false, 16, &[claiming("b", 3)]), Ok(3));
        assert_eq!(
            decide("b", 3, false, 16, &[claiming("a", 3), claiming("c", 0)]),
            Ok(1)
        );
        assert_eq!(
            decide("b", 3, true, 16, &[claiming("a", 3)]),
            Err(Refused::Slot { holder: "a".into() })
        );
    }
}
