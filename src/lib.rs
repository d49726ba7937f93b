//! amble: a lightweight-presence server.
//!
//! Clients join rooms over WebSocket, send their position at most about
//! once a second (or one walk for a whole click-to-move path), and see
//! everyone else in the room move, interpolating locally. No physics runs
//! here: the server validates, throttles, batches and fans out.
//!
//! # Layout
//!
//! Each module is a noun; a module uses only those listed after it.
//!
//! - `server`: [`serve`], the shared state every connection sees, and the
//!   socket budget fitted to the open-file limit.
//! - `edge`: everything before a WebSocket exists: the accept loop, HTTP/1.1,
//!   routes, the upgrade, the handshake, Origin, the metrics token, the
//!   embedded web files.
//! - `api`: the server API's operations (list, kick, ban, mute, speak,
//!   close), run on this node's members and, in a cluster, on every node's.
//! - `session`: one WebSocket: the connection loop, close codes, the outbox
//!   (the only code that touches a socket).
//! - [`room`]: rooms and members, the sink seam, the tick, other nodes'
//!   parts of a room.
//! - [`hooks`]: webhooks (`--webhook-url`): events queued, signed, POSTed.
//! - [`cluster`]: cluster mode (`--nats`): the NATS link, the peer directory,
//!   the node-to-node wire format.
//! - `access`: who may do what, how often: tokens ([`auth`]), client
//!   addresses and their caps, rate budgets.
//! - `outbound`: connections to other servers (a key set, a webhook
//!   receiver): URLs accepted, TCP and TLS.
//! - [`protocol`]: the `amble.v1` wire types, validation, encoding. No I/O.
//! - [`config`]: every setting, as a flag and an `AMBLE_*` variable.
//! - [`metrics`], [`clock`]: counters in Prometheus text; server time.
//!
//! [`serve`] runs the whole server on a listener until a shutdown future
//! completes, which is how both `main` and the tests start it;
//! [`serve_started`] also hands an in-process caller (the test harness,
//! `testkit`) what it may await, such as the cluster forming.

mod access;
mod api;
pub mod clock;
pub mod cluster;
pub mod config;
mod edge;
pub mod hooks;
pub mod metrics;
mod outbound;
pub mod protocol;
pub mod room;
mod server;
mod session;

pub use access::auth;
pub use edge::origin;
pub use server::capacity::raise_open_files_limit;
pub use server::{StartError, Started, serve, serve_started};
