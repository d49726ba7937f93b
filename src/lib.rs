//! amble: a lightweight-presence server.
pub mod protocol;
