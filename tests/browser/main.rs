//! Browser tests: the demo in Debian's headless Chromium, driven through
//! chromedriver (WebDriver), against the real server in-process on
//! 127.0.0.1:0. Part of `cargo test`; without `chromium` and
//! `chromium-driver` installed they fail, saying what to install.
//! The harness is in [`driver`]; screenshots go to
//! target/browser-artifacts/<test>/. [`demo`] is two people in a room;
//! [`ux`] is what a newcomer meets first (issue 10's browser items);
//! [`origin`] is the SDK in an app's own page on another origin, and
//! docs/client.md's minimal page run as written; [`bfcache`] is a page
//! that navigates away and comes back from the back/forward cache.

mod api;
mod bfcache;
mod cluster;
mod data;
mod demo;
mod origin;
mod spatial;
mod ux;
// Not every helper is used by every group of scenarios (the crowd example
// shares this file too).
#[allow(dead_code)]
mod driver;
