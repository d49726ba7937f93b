//! Stopping a run before its end: Ctrl-C, SIGTERM (as `docker compose
//! down` sends), or, for a child of `--processes`, its parent closing the
//! child's stdin. Whatever the cause, the run stops, the bots close, and
//! the report of what was measured so far is printed, marked as
//! interrupted.

use std::sync::Arc;

use tokio::sync::watch;

/// Why a run was interrupted (`SIGINT`, `SIGTERM`, ...).
pub type Reason = &'static str;

/// A stop signal shared by everything in a run; cheap to clone.
#[derive(Clone, Debug)]
pub struct Stop {
    tx: Arc<watch::Sender<Option<Reason>>>,
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

impl Stop {
    /// A signal nothing has sent yet.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(None).0),
        }
    }

    /// Stops the run (the first reason wins).
    pub fn stop(&self, why: Reason) {
        self.tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// The reason, if stopped.
    pub fn reason(&self) -> Option<Reason> {
        *self.tx.borrow()
    }

    /// Resolves when the run is stopped, with the reason.
    pub async fn stopped(&self) -> Reason {
        let mut rx = self.tx.subscribe();
        let why = rx.wait_for(Option::is_some).await.map(|why| *why);
        match why {
            Ok(Some(why)) => why,
            // The sender lives in `self`: it cannot be dropped meanwhile.
            _ => std::future::pending().await,
        }
    }

    /// Stops on Ctrl-C (SIGINT) or SIGTERM; a second signal exits at once
    /// with the conventional status (130, 143).
    pub fn on_signals(&self) {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        async fn recv(term: &mut Option<Signal>) {
            if let Some(t) = term
                && t.recv().await.is_some()
            {
                return;
            }
            std::future::pending().await
        }
        let stop = self.clone();
        tokio::spawn(async move {
            let mut term = signal(SignalKind::terminate()).ok();
            let mut listening = true;
            loop {
                let why = tokio::select! {
                    r = tokio::signal::ctrl_c(), if listening => match r {
                        Ok(()) => "SIGINT",
                        Err(_) => {
                            listening = false;
                            continue;
                        }
                    },
                    () = recv(&mut term) => "SIGTERM",
                };
                if stop.reason().is_some() {
                    std::process::exit(i32::from(exit_status(why)));
                }
                stop.stop(why);
            }
        });
    }

    /// Child mode: stops when the parent closes (or loses) this process's
    /// stdin.
    pub fn on_stdin_closed(&self) {
        let stop = self.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
            stop.stop("the parent process stopped");
        });
    }
}

/// The exit status of a run stopped for `why`: 128 + the signal's number,
/// as shells report it.
pub fn exit_status(why: &str) -> u8 {
    match why {
        "SIGTERM" => 143,
        _ => 130,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_wakes_every_waiter() {
        let stop = Stop::new();
        assert_eq!(stop.reason(), None);
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.stopped().await }
        });
        stop.stop("SIGTERM");
        stop.stop("SIGINT");
        assert_eq!(waiter.await.unwrap(), "SIGTERM");
        assert_eq!(stop.reason(), Some("SIGTERM"));
        // A waiter that comes after the stop resolves at once.
        assert_eq!(stop.stopped().await, "SIGTERM");
        assert_eq!(exit_status("SIGTERM"), 143);
        assert_eq!(exit_status("SIGINT"), 130);
    }
}
