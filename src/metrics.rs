//! Counters and gauges rendered at `GET /metrics` in the Prometheus text
//! format. This module only counts; it decides nothing.

use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::protocol::ErrorCode;

/// Labels of `amble_rejected_total` and the other counters by reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// The protocol error code, e.g. `invalid_position`, or another reason.
    pub reason: String,
}

impl RejectLabels {
    /// `ERROR_CODE_INVALID_POSITION` is labelled `invalid_position`.
    fn of(code: ErrorCode) -> Self {
        let reason = code
            .as_str_name()
            .trim_start_matches("ERROR_CODE_")
            .to_ascii_lowercase();
        Self { reason }
    }
}

/// Labels of `amble_auth_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    /// Why, e.g. `expired` (see `auth::Refusal::reason`).
    pub reason: &'static str,
}

/// Labels of `amble_resumed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResumeLabels {
    /// `same_node` (the place was held here) or `other_node`.
    pub node: &'static str,
}

/// Labels of `amble_address_refusals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `connections` or `joins`.
    pub limit: String,
}

/// Labels of `amble_api_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// The operation, e.g. `kick` (`api::Op::label`), or `unknown`.
    pub op: &'static str,
    /// The HTTP status answered.
    pub status: u16,
}

/// Labels of `amble_accept_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Labels of `amble_webhook_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The event's `type`, e.g. `member.joined`.
    pub event: &'static str,
}

/// Labels of `amble_webhook_deliveries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Default)]
pub struct Metrics {
    pub connections: Gauge,
    pub connections_accepted: Counter,
    pub rooms: Gauge,
    pub members: Gauge,
    pub moves_received: Counter,
    pub moves_applied: Counter,
    pub moves_coalesced: Counter,
    pub chats_relayed: Counter,
    pub data_changes: Counter,
    pub frames_received: Counter,
    pub bytes_received: Counter,
    pub frames_sent: Counter,
    pub bytes_sent: Counter,
    pub batches: Counter,
    pub resyncs: Counter,
    pub timeouts: Counter,
    pub upgrades_refused: Family<RejectLabels, Counter<u64, AtomicU64>>,
    pub send_backlogs: Counter,
    pub frames_dropped: Counter,
    pub rejected: Family<RejectLabels, Counter<u64, AtomicU64>>,
    // ---- HTTP and accept ----
    /// Connections that are not (yet) WebSockets.
    pub http_connections: Gauge,
    /// Effective caps after the open-file limit, and that limit.
    pub connection_cap: Gauge,
    pub http_connection_cap: Gauge,
    pub open_files_limit: Gauge,
    pub http_header_timeouts: Counter,
    pub http_idle_timeouts: Counter,
    pub http_heads_too_large: Counter,
    pub http_bad_requests: Counter,
    pub http_evictions: Counter,
    pub http_refused_full: Counter,
    pub address_refusals: Family<LimitLabels, Counter<u64, AtomicU64>>,
    /// Forwarding-header hops that could not be read, by reason.
    pub forwarded_unreadable: Family<ReasonLabels, Counter<u64, AtomicU64>>,
    /// Requests refused for a `Host` that `--allowed-hosts` does not allow.
    pub host_refused: Counter,
    pub accept_errors: Family<ReasonLabels, Counter<u64, AtomicU64>>,
    pub metrics_refused: Family<RejectLabels, Counter<u64, AtomicU64>>,
    /// Server API calls answered, by operation and status.
    pub api_calls: Family<ApiLabels, Counter<u64, AtomicU64>>,
    /// Bans or mutes not stored because the store was full.
    pub api_sanctions_full: Counter,
    /// Users under a ban or a mute on this node.
    pub api_sanctioned: Gauge,
    pub auth_jwks_reload_failures: Counter,
    /// Fetches of --auth-jwks-url that failed, by reason.
    pub auth_jwks_fetch_failures: Family<AuthLabels, Counter<u64, AtomicU64>>,
    /// Good fetches of --auth-jwks-url.
    pub auth_jwks_fetches: Counter,
    /// Keys in the key set in use (--auth-jwks-url).
    pub auth_jwks_keys: Gauge,
    pub cors_refused: Family<RejectLabels, Counter<u64, AtomicU64>>,

    // ---- Client input budgets ----
    pub pings_over_budget: Counter,

    // ---- Authentication ----
    /// Joins refused for their token, by reason (`missing`, `expired`, ...).
    pub auth_refused: Family<AuthLabels, Counter<u64, AtomicU64>>,
    /// Joins admitted with a valid token.
    pub auth_admitted: Counter,
    /// Members replaced by a newer connection of the same user.
    pub auth_replaced: Counter,
    /// `RefreshToken`s accepted (`TokenRefreshed`).
    pub auth_refreshed: Counter,
    /// `RefreshToken`s refused, by reason (a Join's, or `other_user`).
    pub auth_refresh_refused: Family<AuthLabels, Counter<u64, AtomicU64>>,
    /// Sessions ended because their token expired unrefreshed.
    pub auth_expired: Counter,

    // ---- Resume (--resume-grace-ms) ----
    /// Places held now for members whose connection dropped.
    pub resume_held: Gauge,
    /// Places taken back by a resume, by where they were held.
    pub resumed: Family<ResumeLabels, Counter<u64, AtomicU64>>,
    /// Held places whose grace ran out (the room saw `Left`).
    pub resume_expired: Counter,
    /// Resume tokens not honoured (the Join joined afresh), by reason.
    pub resume_refused: Family<AuthLabels, Counter<u64, AtomicU64>>,
    /// Drops that left at once because the node held its cap of places.
    pub resume_hold_refused: Counter,

    // ---- Cluster (NATS) ----
    /// Registered only in cluster mode (see [`Metrics::enable_cluster`]).
    pub cluster_on: std::sync::atomic::AtomicBool,
    pub cluster_connected: Gauge,
    pub cluster_peers: Gauge,
    pub cluster_remote_members: Gauge,
    pub cluster_rooms_subscribed: Gauge,
    pub cluster_messages_published: Counter,
    pub cluster_bytes_published: Counter,
    pub cluster_messages_received: Counter,
    pub cluster_bytes_received: Counter,
    pub cluster_resyncs: Counter,
    pub cluster_subscribe_retries: Counter,
    pub cluster_remote_moves: Counter,
    pub cluster_remote_moves_late: Counter,
    pub cluster_dropped: Counter,
    pub cluster_bad_messages: Counter,
    pub cluster_nodes_lost: Counter,
    pub cluster_id_conflicts: Counter,
    pub cluster_name_clashes: Counter,
    pub cluster_slots_exhausted: Counter,

    // ---- Webhooks (--webhook-url) ----
    /// Registered only with webhooks (see [`Metrics::enable_webhooks`]).
    pub webhooks_on: std::sync::atomic::AtomicBool,
    /// Events queued, by type (`member.joined`, ...).
    pub webhook_events: Family<EventLabels, Counter<u64, AtomicU64>>,
    /// Events dropped, by reason (`queue_full`, `refused`).
    pub webhook_dropped: Family<ReasonLabels, Counter<u64, AtomicU64>>,
    /// Delivery attempts, by outcome (`ok`, `status`, `timeout`, `connect`, `http`).
    pub webhook_deliveries: Family<OutcomeLabels, Counter<u64, AtomicU64>>,
    /// Attempts that were retries of a batch.
    pub webhook_retries: Counter,
    /// Events waiting or in flight.
    pub webhook_queue_depth: Gauge,

    registry: std::sync::OnceLock<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counts one refused input under its error code.
    pub fn reject(&self, code: ErrorCode) {
        self.rejected.get_or_create(&RejectLabels::of(code)).inc();
    }

    /// Counts one refused WebSocket handshake under its reason.
    pub fn refuse_upgrade(&self, reason: &str) {
        let labels = RejectLabels {
            reason: reason.to_owned(),
        };
        self.upgrades_refused.get_or_create(&labels).inc();
    }

    /// Counts one refused request for `/metrics` under its reason.
    /// Counts one server API call under its operation and status.
    pub fn api_call(&self, op: &'static str, status: u16) {
        self.api_calls
            .get_or_create(&ApiLabels { op, status })
            .inc();
    }

    pub fn refuse_metrics(&self, reason: &str) {
        let labels = RejectLabels {
            reason: reason.to_owned(),
        };
        self.metrics_refused.get_or_create(&labels).inc();
    }

    /// Counts one refused cross-origin preflight under its reason.
    pub fn refuse_cors(&self, reason: &str) {
        let labels = RejectLabels {
            reason: reason.to_owned(),
        };
        self.cors_refused.get_or_create(&labels).inc();
    }

    /// How many inputs were refused with `code` (for tests).
    pub fn rejected_count(&self, code: ErrorCode) -> u64 {
        self.rejected.get_or_create(&RejectLabels::of(code)).get()
    }

    /// Counts one Join refused for its token, under `reason`.
    pub fn auth_refuse(&self, reason: &'static str) {
        self.auth_refused
            .get_or_create(&AuthLabels { reason })
            .inc();
    }

    /// Counts one place taken back by a resume (`same_node`, `other_node`).
    pub fn resumed(&self, node: &'static str) {
        self.resumed.get_or_create(&ResumeLabels { node }).inc();
    }

    /// Counts one resume token not honoured, under `reason`.
    pub fn resume_refuse(&self, reason: &'static str) {
        self.resume_refused
            .get_or_create(&AuthLabels { reason })
            .inc();
    }

    /// Counts one `RefreshToken` refused, under `reason`.
    pub fn auth_refresh_refuse(&self, reason: &'static str) {
        self.auth_refresh_refused
            .get_or_create(&AuthLabels { reason })
            .inc();
    }

    /// Counts one refusal under a per-address limit.
    pub fn address_refused(&self, limit: &str) {
        self.address_refusals
            .get_or_create(&LimitLabels {
                limit: limit.to_owned(),
            })
            .inc();
    }

    /// Counts one unreadable forwarding hop under its reason.
    pub fn forwarded_unreadable(&self, reason: &str) {
        self.forwarded_unreadable
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one failed accept.
    pub fn accept_failed(&self, reason: &str) {
        self.accept_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Registers the cluster metrics: call before the first render.
    pub fn enable_cluster(&self) {
        self.cluster_on
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Registers the webhook metrics: call before the first render.
    pub fn enable_webhooks(&self) {
        self.webhooks_on
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one webhook event of type `event` queued.
    pub fn webhook_emitted(&self, event: &'static str) {
        self.webhook_events
            .get_or_create(&EventLabels { event })
            .inc();
    }

    /// Counts `n` webhook events dropped for `reason`.
    pub fn webhook_dropped(&self, reason: &str, n: u64) {
        self.webhook_dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts one webhook delivery attempt that ended in `outcome`.
    pub fn webhook_delivery(&self, outcome: &'static str) {
        self.webhook_deliveries
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts one frame sent to a client.
    pub fn sent(&self, bytes: usize) {
        self.frames_sent.inc();
        self.bytes_sent.inc_by(bytes as u64);
    }

    /// Counts one frame of `bytes` handed to `receivers` sockets.
    pub fn sent_to(&self, receivers: usize, bytes: usize) {
        self.frames_sent.inc_by(receivers as u64);
        self.bytes_sent.inc_by((receivers * bytes) as u64);
    }

    fn registry(&self) -> &Registry {
        self.registry.get_or_init(|| {
            let mut r = Registry::with_prefix("amble");
            r.register(
                "connections",
                "Open WebSocket connections",
                self.connections.clone(),
            );
            r.register(
                "connections_accepted",
                "WebSocket connections accepted",
                self.connections_accepted.clone(),
            );
            r.register(
                "rooms",
                "Rooms with at least one member",
                self.rooms.clone(),
            );
            r.register("members", "Members in all rooms", self.members.clone());
            r.register(
                "moves_received",
                "Move messages received",
                self.moves_received.clone(),
            );
            r.register(
                "moves_applied",
                "Moves applied to a room (after throttling and coalescing)",
                self.moves_applied.clone(),
            );
            r.register(
                "moves_coalesced",
                "Moves replaced by a newer one before they were applied",
                self.moves_coalesced.clone(),
            );
            r.register(
                "chats_relayed",
                "Chat messages relayed",
                self.chats_relayed.clone(),
            );
            r.register(
                "data_changes",
                "Member data changes (SetData) sent to a room",
                self.data_changes.clone(),
            );
            r.register(
                "frames_received",
                "Frames received from clients",
                self.frames_received.clone(),
            );
            r.register(
                "bytes_received",
                "Payload bytes received from clients",
                self.bytes_received.clone(),
            );
            r.register(
                "frames_sent",
                "Frames handed to client sockets (those dropped for a reader that fell behind are also in frames_dropped)",
                self.frames_sent.clone(),
            );
            r.register(
                "bytes_sent",
                "Payload bytes sent to clients",
                self.bytes_sent.clone(),
            );
            r.register(
                "motion_batches",
                "Room motion batches encoded",
                self.batches.clone(),
            );
            r.register(
                "resyncs",
                "Snapshots sent to receivers that fell behind their room",
                self.resyncs.clone(),
            );
            r.register(
                "send_backlogs",
                "Times a socket could not take a frame at once, so the rest waited in its queue",
                self.send_backlogs.clone(),
            );
            r.register(
                "frames_dropped",
                "Room frames not sent to members that stopped reading (they get a resync)",
                self.frames_dropped.clone(),
            );
            r.register(
                "upgrades_refused",
                "Requests to /ws refused before the WebSocket opened, by reason (bad handshake, foreign origin)",
                self.upgrades_refused.clone(),
            );
            r.register(
                "idle_timeouts",
                "Connections closed as idle",
                self.timeouts.clone(),
            );
            r.register(
                "rejected",
                "Client inputs refused, by protocol error code",
                self.rejected.clone(),
            );
            // ---- HTTP and accept ----
            r.register(
                "http_connections",
                "Open connections that are not (yet) WebSockets",
                self.http_connections.clone(),
            );
            r.register(
                "connection_cap",
                "WebSocket connections the server will hold (--max-connections, lowered to fit the open-file limit)",
                self.connection_cap.clone(),
            );
            r.register(
                "http_connection_cap",
                "Non-WebSocket connections the server will hold (--max-http-connections, lowered to fit the open-file limit)",
                self.http_connection_cap.clone(),
            );
            r.register(
                "open_files_limit",
                "The process's open-file limit (soft RLIMIT_NOFILE) at start",
                self.open_files_limit.clone(),
            );
            r.register(
                "http_header_timeouts",
                "Connections closed (408) for not sending a request head in time",
                self.http_header_timeouts.clone(),
            );
            r.register(
                "http_idle_timeouts",
                "Kept-alive HTTP connections closed as idle, or for not reading a response",
                self.http_idle_timeouts.clone(),
            );
            r.register(
                "http_heads_too_large",
                "Requests refused (431) for a head over --http-max-header-bytes",
                self.http_heads_too_large.clone(),
            );
            r.register(
                "http_bad_requests",
                "Connections closed for an unreadable request (400, HTTP/2 preface, broken framing)",
                self.http_bad_requests.clone(),
            );
            r.register(
                "http_evictions",
                "Connections closed to make room: the one waiting longest for a request head",
                self.http_evictions.clone(),
            );
            r.register(
                "http_refused_full",
                "Connections refused at accept (503): every socket slot held by WebSockets",
                self.http_refused_full.clone(),
            );
            r.register(
                "address_refusals",
                "Refusals under a per-address limit (connections: 429; joins: RATE_LIMITED)",
                self.address_refusals.clone(),
            );
            r.register(
                "forwarded_unreadable",
                "Upgrades whose client hop in a trusted proxy's forwarding header could not be read, by reason (garbage, unknown, obfuscated, too_many_hops); counted as an unknown client behind that proxy",
                self.forwarded_unreadable.clone(),
            );
            r.register(
                "host_refused",
                "Requests refused (421) for a Host that --allowed-hosts does not allow",
                self.host_refused.clone(),
            );
            r.register(
                "accept_errors",
                "Failed accepts, by reason (out_of_files: EMFILE/ENFILE, the server backs off)",
                self.accept_errors.clone(),
            );
            r.register(
                "api_calls",
                "Server API calls answered, by operation (op) and HTTP status (401: no or wrong key, 429: over --api-calls-per-sec)",
                self.api_calls.clone(),
            );
            r.register(
                "api_sanctions_full",
                "Bans or mutes not stored because 100,000 users were under one already",
                self.api_sanctions_full.clone(),
            );
            r.register(
                "api_sanctioned",
                "Users under a ban or a mute on this node",
                self.api_sanctioned.clone(),
            );
            r.register(
                "metrics_refused",
                "Requests for /metrics refused for a missing or wrong bearer token, by reason",
                self.metrics_refused.clone(),
            );
            r.register(
                "auth_jwks_reload_failures",
                "Versions of --auth-jwks-file that could not be read or parsed (the last good key set was kept)",
                self.auth_jwks_reload_failures.clone(),
            );
            r.register(
                "auth_jwks_fetch_failures",
                "Fetches of --auth-jwks-url that failed, by reason (connect, tls, timeout, http, status, too_large, json, keys); the last good key set was kept",
                self.auth_jwks_fetch_failures.clone(),
            );
            r.register(
                "auth_jwks_fetches",
                "Fetches of --auth-jwks-url that brought a usable key set (at start, on refresh, for an unknown kid)",
                self.auth_jwks_fetches.clone(),
            );
            r.register(
                "auth_jwks_keys",
                "Keys in the key set fetched from --auth-jwks-url",
                self.auth_jwks_keys.clone(),
            );
            r.register(
                "cors_refused",
                "Cross-origin preflights refused, by reason (origin: a page --allowed-origins does not admit; method: other than GET and HEAD)",
                self.cors_refused.clone(),
            );

            // ---- Client input budgets ----
            r.register(
                "pings_over_budget",
                "Client pings (protocol Ping, WebSocket ping or pong) over the ping budget; protocol Pings among them got no Pong",
                self.pings_over_budget.clone(),
            );

            // ---- Authentication ----
            r.register(
                "auth_refused",
                "Joins refused for their token, by reason",
                self.auth_refused.clone(),
            );
            r.register(
                "auth_admitted",
                "Joins admitted with a valid token",
                self.auth_admitted.clone(),
            );
            r.register(
                "auth_replaced",
                "Members replaced by a newer connection of the same user (token sub)",
                self.auth_replaced.clone(),
            );
            r.register(
                "auth_refreshed",
                "RefreshTokens accepted: the member's session now ends at the new token's expiry",
                self.auth_refreshed.clone(),
            );
            r.register(
                "auth_refresh_refused",
                "RefreshTokens refused, by reason (a Join's token reasons, or other_user for another sub)",
                self.auth_refresh_refused.clone(),
            );
            r.register(
                "auth_expired",
                "Connections closed (4003) because their member's token expired without a refresh",
                self.auth_expired.clone(),
            );

            // ---- Resume ----
            r.register(
                "resume_held",
                "Places held now for members whose connection dropped without a Leave (--resume-grace-ms)",
                self.resume_held.clone(),
            );
            r.register(
                "resumed",
                "Places taken back by a Join with their resume token, by where they were held (same_node, other_node)",
                self.resumed.clone(),
            );
            r.register(
                "resume_expired",
                "Held places whose grace ran out: the room saw the member leave",
                self.resume_expired.clone(),
            );
            r.register(
                "resume_refused",
                "Resume tokens not honoured (the Join joined afresh), by reason (malformed, unknown, other_user)",
                self.resume_refused.clone(),
            );
            r.register(
                "resume_hold_refused",
                "Dropped connections whose member left at once: the node held its cap of places (--max-connections)",
                self.resume_hold_refused.clone(),
            );

            // ---- Cluster (NATS) ----
            if self.cluster_on.load(std::sync::atomic::Ordering::Relaxed) {
                let gauges = [
                    ("cluster_connected", "1 while connected to NATS, else 0", &self.cluster_connected),
                    ("cluster_peers", "Other amble nodes alive in the cluster", &self.cluster_peers),
                    ("cluster_remote_members", "Members on other nodes in this node's rooms", &self.cluster_remote_members),
                    ("cluster_rooms_subscribed", "Rooms this node is subscribed to on NATS", &self.cluster_rooms_subscribed),
                ];
                for (name, help, gauge) in gauges {
                    r.register(name, help, gauge.clone());
                }
                let counters = [
                    ("cluster_messages_published", "Messages published to NATS", &self.cluster_messages_published),
                    ("cluster_bytes_published", "Payload bytes published to NATS", &self.cluster_bytes_published),
                    ("cluster_messages_received", "Messages received from NATS", &self.cluster_messages_received),
                    ("cluster_bytes_received", "Payload bytes received from NATS", &self.cluster_bytes_received),
                    ("cluster_resyncs", "Full states of another node's part of a room applied to repair a gap, an unknown part, a return or a reconnect", &self.cluster_resyncs),
                    ("cluster_remote_moves", "Moves of members on other nodes applied here", &self.cluster_remote_moves),
                    ("cluster_remote_moves_late", "Remote moves that missed the tick they were cut for (slipped a tick)", &self.cluster_remote_moves_late),
                    ("cluster_dropped", "Messages not published because the outgoing queue was full", &self.cluster_dropped),
                    ("cluster_bad_messages", "Cluster messages dropped as malformed or out of range", &self.cluster_bad_messages),
                    ("cluster_nodes_lost", "Peers declared down after the node timeout", &self.cluster_nodes_lost),
                    ("cluster_id_conflicts", "Remote members dropped because their id was taken, and slot clashes seen", &self.cluster_id_conflicts),
                    ("cluster_subscribe_retries", "Subscriptions (rooms and control subjects) made again after a failure or after their stream ended", &self.cluster_subscribe_retries),
                    ("cluster_name_clashes", "Two live processes seen under one node name (this node's, or a peer's): once per process heard", &self.cluster_name_clashes),
                    ("cluster_slots_exhausted", "Slot claims of starting nodes answered here while every slot was held (the node refuses to start)", &self.cluster_slots_exhausted),
                ];
                for (name, help, counter) in counters {
                    r.register(name, help, counter.clone());
                }
            }

            // ---- Webhooks ----
            if self.webhooks_on.load(std::sync::atomic::Ordering::Relaxed) {
                r.register(
                    "webhook_events",
                    "Webhook events queued for the receiver, by type",
                    self.webhook_events.clone(),
                );
                r.register(
                    "webhook_dropped",
                    "Webhook events dropped, by reason (queue_full: the oldest waiting event made way for a new one; refused: the receiver answered 4xx)",
                    self.webhook_dropped.clone(),
                );
                r.register(
                    "webhook_deliveries",
                    "Webhook POST attempts, by outcome (ok: 2xx; status: another status; timeout; connect: no connection or TLS; http: a broken exchange)",
                    self.webhook_deliveries.clone(),
                );
                r.register(
                    "webhook_retries",
                    "Webhook POST attempts that sent a batch again after a failure",
                    self.webhook_retries.clone(),
                );
                r.register(
                    "webhook_queue_depth",
                    "Webhook events waiting for delivery or in flight",
                    self.webhook_queue_depth.clone(),
                );
            }

            r.register_collector(Box::new(ProcessCollector));
            r
        })
    }

    /// Every metric in the OpenMetrics text format (served as
    /// `application/openmetrics-text`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, self.registry());
        out
    }
}

/// Process CPU time and resident memory, read from `/proc` at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(cpu) = process_cpu_seconds() {
            let c = ConstCounter::new(cpu);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time of the server process, seconds",
                None,
                c.metric_type(),
            )?;
            c.encode(e)?;
        }
        if let Some(rss) = process_resident_bytes() {
            let g = ConstGauge::new(rss as i64);
            let e = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory of the server process, bytes",
                None,
                g.metric_type(),
            )?;
            g.encode(e)?;
        }
        Ok(())
    }
}

/// utime + stime from `/proc/self/stat`, in seconds. The kernel reports
/// them in USER_HZ, which Linux fixes at 100 for user space.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// VmRSS from `/proc/self/status`, in bytes.
pub fn process_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_labels_and_process_figures() {
        let m = Metrics::default();
        m.moves_received.inc();
        m.sent(12);
        m.reject(ErrorCode::InvalidPosition);
        m.reject(ErrorCode::InvalidPosition);
        let text = m.render();
        assert!(text.contains("amble_moves_received_total 1\n"), "{text}");
        assert!(text.contains("amble_bytes_sent_total 12\n"), "{text}");
        assert!(
            text.contains("amble_rejected_total{reason=\"invalid_position\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("amble_process_cpu_seconds_total "), "{text}");
        assert!(
            text.contains("amble_process_resident_memory_bytes "),
            "{text}"
        );
        assert_eq!(m.rejected_count(ErrorCode::InvalidPosition), 2);
    }

    #[test]
    fn cluster_metrics_render_only_in_cluster_mode() {
        let alone = Metrics::default();
        assert!(!alone.render().contains("cluster"));
        let node = Metrics::default();
        node.enable_cluster();
        node.cluster_remote_moves_late.inc();
        let text = node.render();
        assert!(text.contains("amble_cluster_connected 0\n"), "{text}");
        assert!(
            text.contains("amble_cluster_remote_moves_late_total 1\n"),
            "{text}"
        );
    }
}
