//! The server API across the cluster: an [`Op`] as the `ApiCall` every
//! peer runs, and their `ApiAnswer`s back as one [`Answer`]. What a peer
//! sends is checked here as a client's input would be (room names, sizes);
//! a call that fails a check is answered empty and counted.

use std::sync::Arc;

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;

use crate::access::sanctions::Sanction;
use crate::cluster::ApiSide;
use crate::cluster::wire::cpb;
use crate::protocol::{MemberId, Position, Rules, validate_room};
use crate::room::admin::Listed;

use super::{Answer, Api, Op, Who};

/// `op`'s call, as peers run it.
pub fn call_of(op: &Op) -> cpb::ApiCall {
    let mut call = cpb::ApiCall::default();
    match op {
        Op::Members { room } => {
            call.op = 1;
            call.room = room.to_string();
        }
        Op::User { user } => {
            call.op = 2;
            call.user = user.to_string();
        }
        Op::Kick { room, who, reason } => {
            call.op = 3;
            call.room = room.to_string();
            match who {
                Who::Member(id) => {
                    call.by_member = true;
                    call.member_id = id.0;
                }
                Who::User(user) => call.user = user.to_string(),
            }
            call.text = reason.to_string();
        }
        Op::Ban {
            user,
            until_ms,
            reason,
        } => {
            call.op = 4;
            call.user = user.to_string();
            call.until_ms = *until_ms;
            call.text = reason.to_string();
        }
        Op::Mute { user, until_ms } => {
            call.op = 5;
            call.user = user.to_string();
            call.until_ms = *until_ms;
        }
        Op::Tell { room, user, text } => {
            call.op = 6;
            call.room = room.as_deref().unwrap_or_default().to_owned();
            call.user = user.as_deref().unwrap_or_default().to_owned();
            call.text = text.to_string();
        }
        Op::Close { room } => {
            call.op = 7;
            call.room = room.to_string();
        }
        Op::Sanctions => call.op = 8,
    }
    call
}

/// A peer's call as an [`Op`]; `None` when it breaks a rule.
pub fn op_of(call: cpb::ApiCall, rules: &Rules) -> Option<Op> {
    let room = |room: String| validate_room(room, rules).ok().map(Arc::<str>::from);
    let user = |user: String| {
        (!user.is_empty() && user.len() <= super::MAX_SUB_BYTES).then(|| Arc::<str>::from(user))
    };
    let text: Arc<str> = call.text.into();
    Some(match call.op {
        1 => Op::Members {
            room: room(call.room)?,
        },
        2 => Op::User {
            user: user(call.user)?,
        },
        3 => Op::Kick {
            room: room(call.room)?,
            who: if call.by_member {
                Who::Member(MemberId(call.member_id))
            } else {
                Who::User(user(call.user)?)
            },
            reason: text,
        },
        4 => Op::Ban {
            user: user(call.user)?,
            until_ms: call.until_ms,
            reason: text,
        },
        5 => Op::Mute {
            user: user(call.user)?,
            until_ms: call.until_ms,
        },
        6 => Op::Tell {
            room: if call.room.is_empty() {
                None
            } else {
                Some(room(call.room)?)
            },
            user: if call.user.is_empty() {
                None
            } else {
                Some(user(call.user)?)
            },
            text,
        },
        7 => Op::Close {
            room: room(call.room)?,
        },
        8 => Op::Sanctions,
        _ => return None,
    })
}

/// This node's answer, as a peer reads it.
pub fn answer_pb(answer: Answer) -> cpb::ApiAnswer {
    cpb::ApiAnswer {
        origin: None,
        members: answer
            .members
            .into_iter()
            .map(|(l, _)| cpb::ApiMember {
                room: l.room.to_string(),
                id: l.id.0,
                name: l.name,
                user: l.user.as_deref().unwrap_or_default().to_owned(),
                x: l.position.x,
                y: l.position.y,
                joined_at_ms: l.joined_at_ms,
            })
            .collect(),
        reached: u32::try_from(answer.reached).unwrap_or(u32::MAX),
        sanctions: answer
            .sanctions
            .into_iter()
            .map(|(user, s)| cpb::ApiSanction {
                user: user.to_string(),
                ban_until_ms: s.ban_until_ms,
                ban_reason: s.ban_reason.to_string(),
                mute_until_ms: s.mute_until_ms,
            })
            .collect(),
    }
}

/// A peer's answer; its members are on `node`.
pub fn answer_of(answer: cpb::ApiAnswer, node: &Arc<str>, rules: &Rules) -> Answer {
    Answer {
        members: answer
            .members
            .into_iter()
            .filter_map(|m| {
                let room = validate_room(m.room, rules).ok()?;
                Some((
                    Listed {
                        room: room.into(),
                        id: MemberId(m.id),
                        name: m.name,
                        user: (!m.user.is_empty()).then(|| m.user.into()),
                        position: Position { x: m.x, y: m.y },
                        joined_at_ms: m.joined_at_ms,
                    },
                    Arc::clone(node),
                ))
            })
            .collect(),
        reached: answer.reached as usize,
        sanctions: answer
            .sanctions
            .into_iter()
            .filter(|s| !s.user.is_empty())
            .map(|s| {
                (
                    Arc::from(s.user),
                    Sanction {
                        ban_until_ms: s.ban_until_ms,
                        ban_reason: s.ban_reason.into(),
                        mute_until_ms: s.mute_until_ms,
                    },
                )
            })
            .collect(),
    }
}

impl ApiSide for Api {
    fn answer(&self, call: cpb::ApiCall) -> BoxFuture<'_, cpb::ApiAnswer> {
        async move {
            let Some(op) = op_of(call, &self.rules) else {
                self.metrics.cluster_bad_messages.inc();
                return cpb::ApiAnswer::default();
            };
            answer_pb(self.local(&op).await)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_travels_to_a_peer_and_back_unchanged() {
        let rules = Rules::default();
        let ops = [
            Op::Members {
                room: "lobby".into(),
            },
            Op::User { user: "u-1".into() },
            Op::Kick {
                room: "lobby".into(),
                who: Who::Member(MemberId(7)),
                reason: "spam".into(),
            },
            Op::Kick {
                room: "lobby".into(),
                who: Who::User("u-2".into()),
                reason: "".into(),
            },
            Op::Ban {
                user: "u-3".into(),
                until_ms: 99,
                reason: "r".into(),
            },
            Op::Mute {
                user: "u-4".into(),
                until_ms: 5,
            },
            Op::Tell {
                room: Some("lobby".into()),
                user: None,
                text: "hi".into(),
            },
            Op::Tell {
                room: None,
                user: Some("u-5".into()),
                text: "hi".into(),
            },
            Op::Close {
                room: "lobby".into(),
            },
            Op::Sanctions,
        ];
        for op in ops {
            assert_eq!(op_of(call_of(&op), &rules), Some(op.clone()), "{op:?}");
        }
    }

    #[test]
    fn a_call_that_breaks_a_rule_is_no_op() {
        let rules = Rules::default();
        let bad_room = cpb::ApiCall {
            op: 1,
            room: "no spaces".into(),
            ..Default::default()
        };
        assert_eq!(op_of(bad_room, &rules), None);
        let no_user = cpb::ApiCall {
            op: 4,
            ..Default::default()
        };
        assert_eq!(op_of(no_user, &rules), None);
        let unknown = cpb::ApiCall {
            op: 99,
            ..Default::default()
        };
        assert_eq!(op_of(unknown, &rules), None);
    }

    #[test]
    fn an_answer_travels_with_its_node() {
        let node: Arc<str> = "b".into();
        let answer = Answer {
            members: vec![(
                Listed {
                    room: "lobby".into(),
                    id: MemberId(3),
                    name: "Ada".into(),
                    user: Some("u-1".into()),
                    position: Position { x: 1, y: 2 },
                    joined_at_ms: 9,
                },
                Arc::clone(&node),
            )],
            reached: 4,
            sanctions: vec![(
                "u-9".into(),
                Sanction {
                    ban_until_ms: 10,
                    ban_reason: "x".into(),
                    mute_until_ms: 0,
                },
            )],
        };
        assert_eq!(
            answer_of(answer_pb(answer.clone()), &node, &Rules::default()),
            answer
        );
    }
}
