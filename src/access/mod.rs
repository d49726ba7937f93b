//! Who may do what, and how often: small deciders with no I/O.
//!
//! - [`auth`]: who may join which room under which name (signed tokens).
//! - [`addresses`]: who is behind a socket (forwarding headers from trusted
//!   proxies), and what one client address may hold (sockets, joins).
//! - [`sanctions`]: the app's bans and mutes of its users (server API), by
//!   token `sub`, with the time passed in.
//! - [`throttle`]: rate budgets with the clock passed in (moves, chat,
//!   joins, pings).

pub mod addresses;
pub mod auth;
pub mod sanctions;
pub mod throttle;
