//! The compose demo for real (issue 16): `scripts/demo-images` builds the
//! images from Debian's packages, docker-compose.yml starts NATS and two
//! amble nodes under a project name of its own on free host ports, and
//! headless Chromium drives the demo on both nodes while the test kills,
//! restarts, cuts off and pauses containers. Without a Docker engine and a
//! Compose tool it fails, saying what to install; it never skips.
//!
//! Every figure the test measures is printed and written to
//! target/browser-artifacts/compose_demo/timings.txt (docs/cluster.md
//! quotes them); screenshots go beside it, with every container's log
//! (compose-logs.txt) and the bots' report of the rolling restart.

mod project;
mod scenario;
mod view;

// The browser harness of tests/browser (its in-process server is not used).
#[allow(dead_code)]
#[path = "../browser/driver.rs"]
mod driver;
