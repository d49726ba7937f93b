//! A room's fan-out: one publisher, many subscribers, frames encoded once.
//!
//! This is the seam for running rooms across several server nodes: the
//! room code publishes through [`Fanout`] and connections read a
//! [`Subscription`]; neither knows how frames travel. [`LocalFanout`] is a
//! tokio `broadcast` channel. A broker-backed fan-out (NATS) would publish
//! to the room's subject and feed a local channel from its subscriber, so
//! the connection code would not change.

use bytes::Bytes;
use tokio::sync::broadcast;

/// One encoded `ServerMessage`; every receiver shares the same bytes.
pub type Frame = Bytes;

/// Where a room sends its frames.
pub trait Fanout: Send + Sync + 'static {
    /// Sends `frame` to every current subscriber, in publication order.
    /// Never blocks: a subscriber that falls behind loses the oldest frames
    /// and is told so ([`Delivery::Lagged`]).
    fn publish(&self, frame: Frame);

    /// A subscription to frames published from now on.
    fn subscribe(&self) -> Subscription;
}

/// What a subscriber receives next.
#[derive(Debug)]
pub enum Delivery {
    Frame(Frame),
    /// The subscriber fell so far behind that `n` frames were dropped; it
    /// must resynchronise from a fresh snapshot.
    Lagged(u64),
    /// The room is gone.
    Closed,
}

/// A receiver of a room's frames.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Frame>,
}

impl Subscription {
    pub async fn recv(&mut self) -> Delivery {
        match self.rx.recv().await {
            Ok(frame) => Delivery::Frame(frame),
            Err(broadcast::error::RecvError::Lagged(n)) => Delivery::Lagged(n),
            Err(broadcast::error::RecvError::Closed) => Delivery::Closed,
        }
    }
}

/// Fan-out within this process: a bounded tokio broadcast channel.
#[derive(Debug)]
pub struct LocalFanout {
    tx: broadcast::Sender<Frame>,
}

impl LocalFanout {
    /// `capacity` frames are kept for the slowest subscriber.
    pub fn new(capacity: usize) -> Self {
        Self {
            tx: broadcast::Sender::new(capacity.max(1)),
        }
    }
}

impl Fanout for LocalFanout {
    fn publish(&self, frame: Frame) {
        // An error only means nobody is subscribed right now.
        let _ = self.tx.send(frame);
    }

    fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.tx.subscribe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_subscriber_is_told_it_lagged() {
        let fanout = LocalFanout::new(2);
        let mut fast = fanout.subscribe();
        let mut slow = fanout.subscribe();
        for i in 0..3u8 {
            fanout.publish(Bytes::from(vec![i]));
            assert!(matches!(fast.recv().await, Delivery::Frame(f) if f[0] == i));
        }
        assert!(matches!(slow.recv().await, Delivery::Lagged(1)));
        assert!(matches!(slow.recv().await, Delivery::Frame(f) if f[0] == 1));
    }
}
