//! How many sockets the open-file limit allows, fitted once at start.
//!
//! Each connection is an open file. [`Capacity::fit`] lowers the configured
//! caps (WebSockets, HTTP pool) when they and [`RESERVED_FILES`] do not fit
//! under the process's limit, so the server degrades to fewer connections
//! instead of failing `accept` at random.

use tracing::{info, warn};

/// Descriptors kept for the server itself: standard streams, listeners,
/// the runtime's own, `/proc` reads for /metrics, one being accepted.
pub const RESERVED_FILES: u64 = 32;

/// Raises the soft open-file limit to the hard limit (each connection is
/// an open file), saying so when it changed.
pub fn raise_open_files_limit() {
    let before = open_files_limit();
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(after) if before.is_some_and(|b| after > b) => {
            info!(
                before = before.unwrap_or_default(),
                after, "raised the open-file limit"
            );
        }
        Ok(_) => {}
        Err(err) => warn!(%err, "cannot raise the open-file limit"),
    }
}

/// The soft open-file limit in force.
pub fn open_files_limit() -> Option<u64> {
    rlimit::Resource::NOFILE.get().ok().map(|(soft, _)| soft)
}

/// The caps the server runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Open WebSocket connections.
    pub websockets: u32,
    /// Open connections that are not WebSockets.
    pub http: u32,
    /// Whether the open-file limit lowered either.
    pub lowered: bool,
}

impl Capacity {
    /// What fits under `open_files` (`None`: no limit known): the
    /// configured caps, or, when they and [`RESERVED_FILES`] do not fit,
    /// lower ones. The HTTP pool keeps at least a quarter of what there is,
    /// so the server stays reachable; WebSockets get the rest.
    pub fn fit(open_files: Option<u64>, websockets: u32, http: u32) -> Self {
        let wanted = u64::from(websockets) + u64::from(http) + RESERVED_FILES;
        let Some(limit) = open_files.filter(|&l| l < wanted) else {
            return Self {
                websockets,
                http,
                lowered: false,
            };
        };
        let available = limit.saturating_sub(RESERVED_FILES).max(2);
        let http_fit = (available / 4).max(available.saturating_sub(u64::from(websockets)));
        let http = u64::from(http).min(http_fit).max(1);
        let websockets = u64::from(websockets).min(available - http).max(1);
        Self {
            websockets: u32::try_from(websockets).unwrap_or(u32::MAX),
            http: u32::try_from(http).unwrap_or(u32::MAX),
            lowered: true,
        }
    }

    /// Sockets of both kinds.
    pub fn sockets(&self) -> usize {
        self.websockets as usize + self.http as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_that_fit_are_kept() {
        let c = Capacity::fit(Some(20_000), 19_000, 900);
        assert_eq!((c.websockets, c.http, c.lowered), (19_000, 900, false));
        assert!(!Capacity::fit(None, 5, 5).lowered);
    }

    #[test]
    fn a_small_limit_lowers_both_and_keeps_http_reachable() {
        // 256 files: 224 after the reserve, a quarter of it for HTTP.
        let c = Capacity::fit(Some(256), 19_000, 1_024);
        assert_eq!((c.websockets, c.http, c.lowered), (168, 56, true));
        assert!(c.sockets() as u64 + RESERVED_FILES <= 256);
        // Few WebSockets asked for: HTTP takes what they leave.
        let c = Capacity::fit(Some(1_024), 100, 1_024);
        assert_eq!((c.websockets, c.http), (100, 892));
        // A limit below the reserve still serves one of each.
        let c = Capacity::fit(Some(10), 19_000, 1_024);
        assert_eq!((c.websockets, c.http), (1, 1));
    }
}
