//! The webhook queue, pure: no clock (callers pass `now`), no I/O.
//!
//! Events wait in order; the sender asks [`Queue::next`] what to do at
//! `now` and reports each attempt's [`Outcome`] to [`Queue::done`]. One
//! batch (up to `batch` events, oldest first, encoded once) is in flight
//! at a time: it is retried until it is delivered or refused, after
//! `first_retry`, then twice as long each time up to `max_retry`; new
//! events wait behind it.
//!
//! The queue holds at most `capacity` events, the batch in flight
//! included. A push into a full queue drops the OLDEST waiting event (the
//! batch in flight is kept whole): the newest events describe the present,
//! which an app most needs, and the gap shows in the ids' counters. Only
//! when the batch in flight holds every place is the new event dropped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::event::{Event, batch_body};

/// The queue's bounds and its retry schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most events held, the batch in flight included (at least 1).
    pub capacity: usize,
    /// Most events in one delivery (at least 1).
    pub batch: usize,
    /// The wait after a batch's first failed attempt.
    pub first_retry: Duration,
    /// The longest wait between attempts.
    pub max_retry: Duration,
}

/// What a push did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// The event waits its turn.
    Queued,
    /// The queue was full: its oldest waiting event was dropped for it.
    DroppedOldest,
    /// The queue was full with the batch in flight: the event was dropped.
    DroppedNew,
}

/// One delivery to attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// `{"events":[...]}`, the same bytes on every attempt.
    pub body: Bytes,
    /// Events in it.
    pub events: usize,
    /// 1 for the first attempt, 2 for the first retry, ...
    pub attempt: u32,
}

/// What the sender should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send this, then report to [`Queue::done`].
    Send(Delivery),
    /// The batch in flight is waiting to be retried at this instant.
    RetryAt(Instant),
    /// A delivery is being attempted (its outcome not yet reported).
    Busy,
    /// Nothing to send.
    Idle,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx: the batch is done.
    Delivered,
    /// A 4xx other than 408 and 429: the receiver will not take it, so it
    /// is dropped.
    Refused,
    /// A 5xx, 408, 429, a timeout or no connection: tried again later.
    Failed,
}

/// What [`Queue::done`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// The batch of this many events left the queue, delivered.
    Delivered(usize),
    /// The batch of this many events was dropped, refused.
    Dropped(usize),
    /// The batch is retried after this long.
    RetryIn(Duration),
}

struct Flight {
    body: Bytes,
    events: usize,
    /// Attempts made so far.
    attempts: u32,
    /// Not before this instant (after a failure).
    retry_at: Option<Instant>,
    /// An attempt is under way.
    sending: bool,
}

/// The events waiting for delivery and the batch in flight.
pub struct Queue {
    limits: Limits,
    waiting: VecDeque<Event>,
    flight: Option<Flight>,
}

impl Queue {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                capacity: limits.capacity.max(1),
                batch: limits.batch.max(1),
                ..limits
            },
            waiting: VecDeque::new(),
            flight: None,
        }
    }

    /// Events held: waiting and in flight.
    pub fn len(&self) -> usize {
        self.waiting.len() + self.flight.as_ref().map_or(0, |f| f.events)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `event` behind the others; O(1), never waits.
    pub fn push(&mut self, event: Event) -> Pushed {
        if self.len() < self.limits.capacity {
            self.waiting.push_back(event);
            return Pushed::Queued;
        }
        if self.waiting.pop_front().is_some() {
            self.waiting.push_back(event);
            Pushed::DroppedOldest
        } else {
            Pushed::DroppedNew
        }
    }

    /// What to do at `now`: the batch in flight when its retry is due, else
    /// a new batch of the oldest waiting events.
    pub fn next(&mut self, now: Instant) -> Next {
        if self.flight.is_none() {
            if self.waiting.is_empty() {
                return Next::Idle;
            }
            let n = self.waiting.len().min(self.limits.batch);
            let body = Bytes::from(batch_body(
                self.waiting.drain(..n).collect::<Vec<_>>().iter(),
            ));
            self.flight = Some(Flight {
                body,
                events: n,
                attempts: 0,
                retry_at: None,
                sending: false,
            });
        }
        let Some(flight) = self.flight.as_mut() else {
            return Next::Idle;
        };
        if flight.sending {
            return Next::Busy;
        }
        if let Some(at) = flight.retry_at
            && at > now
        {
            return Next::RetryAt(at);
        }
        flight.sending = true;
        flight.attempts += 1;
        Next::Send(Delivery {
            body: flight.body.clone(),
            events: flight.events,
            attempt: flight.attempts,
        })
    }

    /// Takes the outcome of the attempt [`next`](Self::next) handed out.
    pub fn done(&mut self, now: Instant, outcome: Outcome) -> Done {
        let Some(flight) = self.flight.as_mut() else {
            return Done::Dropped(0);
        };
        flight.sending = false;
        match outcome {
            Outcome::Delivered => Done::Delivered(self.flight.take().map_or(0, |f| f.events)),
            Outcome::Refused => Done::Dropped(self.flight.take().map_or(0, |f| f.events)),
            Outcome::Failed => {
                let attempts = flight.attempts;
                let wait = self.backoff(attempts);
                if let Some(flight) = self.flight.as_mut() {
                    flight.retry_at = Some(now + wait);
                }
                Done::RetryIn(wait)
            }
        }
    }

    /// The wait after `failures` failed attempts in a row (at least 1):
    /// `first_retry` doubled each time, at most `max_retry`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.limits
            .first_retry
            .saturating_mul(1 << doublings)
            .min(self.limits.max_retry)
    }
}

impl Outcome {
    /// The outcome of an HTTP status.
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => Self::Delivered,
            408 | 429 => Self::Failed,
            400..=499 => Self::Refused,
            _ => Self::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hooks::event::{Source, What};

    fn limits(capacity: usize, batch: usize) -> Limits {
        Limits {
            capacity,
            batch,
            first_retry: Duration::from_millis(500),
            max_retry: Duration::from_secs(30),
        }
    }

    fn event(seq: u64) -> Event {
        Source::new(None, 0).event(seq, seq, Arc::from("r"), What::Occupied)
    }

    /// The event numbers in a body, in order.
    fn seqs(d: &Delivery) -> Vec<u64> {
        let v: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        v["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| {
                let id = e["id"].as_str().expect("id");
                id.rsplit('-')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("seq")
            })
            .collect()
    }

    fn send(q: &mut Queue, now: Instant) -> Delivery {
        match q.next(now) {
            Next::Send(d) => d,
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    #[test]
    fn batches_in_order_up_to_the_batch_size() {
        let t0 = Instant::now();
        let mut q = Queue::new(limits(100, 3));
        assert_eq!(q.next(t0), Next::Idle);
        for seq in 1..=7 {
            assert_eq!(q.push(event(seq)), Pushed::Queued);
        }
        let d = send(&mut q, t0);
        assert_eq!((seqs(&d), d.events, d.attempt), (vec![1, 2, 3], 3, 1));
        assert_eq!(q.next(t0), Next::Busy, "one batch in flight");
        q.push(event(8));
        assert_eq!(q.done(t0, Outcome::Delivered), Done::Delivered(3));
        assert_eq!(seqs(&send(&mut q, t0)), [4, 5, 6]);
        assert_eq!(q.done(t0, Outcome::Delivered), Done::Delivered(3));
        assert_eq!(seqs(&send(&mut q, t0)), [7, 8]);
        assert_eq!(q.done(t0, Outcome::Delivered), Done::Delivered(2));
        assert_eq!(q.next(t0), Next::Idle);
        assert!(q.is_empty());
    }

    #[test]
    fn a_failed_batch_is_retried_whole_with_exponential_backoff() {
        let t0 = Instant::now();
        let mut q = Queue::new(limits(100, 2));
        for seq in 1..=3 {
            q.push(event(seq));
        }
        let first = send(&mut q, t0);
        let mut now = t0;
        let waits_ms = [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000];
        for (i, ms) in waits_ms.into_iter().enumerate() {
            assert_eq!(
                q.done(now, Outcome::Failed),
                Done::RetryIn(Duration::from_millis(ms))
            );
            let due = now + Duration::from_millis(ms);
            assert_eq!(q.next(due - Duration::from_millis(1)), Next::RetryAt(due));
            now = due;
            let again = send(&mut q, now);
            assert_eq!(again.body, first.body, "the same bytes, the same ids");
            assert_eq!(again.attempt, i as u32 + 2);
        }
        assert_eq!(q.done(now, Outcome::Delivered), Done::Delivered(2));
        let third = send(&mut q, now);
        assert_eq!((seqs(&third), third.attempt), (vec![3], 1));
        assert_eq!(
            q.done(now, Outcome::Failed),
            Done::RetryIn(Duration::from_millis(500)),
            "each batch's schedule starts again"
        );
    }

    #[test]
    fn refused_batches_are_dropped_and_statuses_map_to_outcomes() {
        let t0 = Instant::now();
        let mut q = Queue::new(limits(10, 2));
        for seq in 1..=3 {
            q.push(event(seq));
        }
        send(&mut q, t0);
        assert_eq!(q.done(t0, Outcome::Refused), Done::Dropped(2));
        assert_eq!(seqs(&send(&mut q, t0)), [3]);
        let outcomes: Vec<Outcome> = [200, 204, 299, 400, 401, 404, 408, 413, 429, 500, 503, 301]
            .into_iter()
            .map(Outcome::of_status)
            .collect();
        use Outcome::*;
        assert_eq!(
            outcomes,
            [
                Delivered, Delivered, Delivered, Refused, Refused, Refused, Failed, Refused,
                Failed, Failed, Failed, Failed
            ]
        );
    }

    #[test]
    fn a_full_queue_drops_the_oldest_waiting_and_keeps_the_batch_in_flight() {
        let t0 = Instant::now();
        let mut q = Queue::new(limits(5, 2));
        for seq in 1..=5 {
            assert_eq!(q.push(event(seq)), Pushed::Queued);
        }
        assert_eq!(q.push(event(6)), Pushed::DroppedOldest);
        assert_eq!(q.len(), 5);
        let d = send(&mut q, t0);
        assert_eq!(seqs(&d), [2, 3]);
        q.done(t0, Outcome::Failed);
        assert_eq!(q.push(event(7)), Pushed::DroppedOldest);
        assert_eq!(q.push(event(8)), Pushed::DroppedOldest);
        assert_eq!(q.len(), 5);
        let retry = send(&mut q, t0 + Duration::from_millis(500));
        assert_eq!(seqs(&retry), [2, 3], "the batch in flight is kept whole");
        q.done(t0, Outcome::Delivered);
        assert_eq!(seqs(&send(&mut q, t0)), [6, 7]);
        q.done(t0, Outcome::Delivered);
        assert_eq!(seqs(&send(&mut q, t0)), [8]);
    }

    #[test]
    fn a_queue_filled_by_its_batch_in_flight_drops_the_new_event() {
        let t0 = Instant::now();
        let mut q = Queue::new(limits(2, 2));
        q.push(event(1));
        q.push(event(2));
        send(&mut q, t0);
        assert_eq!(q.push(event(3)), Pushed::DroppedNew);
        assert_eq!(q.len(), 2);
        assert_eq!(q.done(t0, Outcome::Delivered), Done::Delivered(2));
        assert_eq!(q.push(event(4)), Pushed::Queued);
    }
}
