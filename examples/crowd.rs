//! A crowd for the demo: N bots (default 499, so the room holds 500 with
//! the viewer) walk and move freely in one room while headless Chromium
//! renders it at 1280x720, zoomed out so that every avatar is on screen.
//! Prints what the page measured, as JSON: frames per second and the
//! script time of each frame. A measuring tool, not a test:
//!
//! ```text
//! cargo run --release --example crowd -- [--bots 499] [--seconds 20]
//! cargo run --release --example crowd -- --plaza --bots 5000
//! ```
//!
//! `--plaza`: the bots are in `plaza`, a spatial room (the server's default
//! `--spatial-rooms plaza*`), crowded within `--spread-m` of its centre,
//! where the viewer appears: the page is in the densest part of the room
//! and renders those in its area of interest.
//!
//! The server runs in-process on 127.0.0.1:0 and the bots are WebSocket
//! clients in the same process; traffic stays on loopback. Needs Debian's
//! `chromium` and `chromium-driver` (the harness of the browser test,
//! tests/browser/driver.rs). The last frame is saved as
//! target/browser-artifacts/crowd/crowd.png. The whole run is bounded:
//! `--seconds` plus three minutes to start and stop.

use std::net::SocketAddr;
use std::time::Duration;

use amble::config::Config;
use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, Position, Walk, encode_client, move_body};
use clap::Parser;
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;

#[allow(dead_code)]
#[path = "../tests/browser/driver.rs"]
mod driver;

use driver::{Browser, Server, Viewport, WAIT, within};

const ROOM: &str = "crowd";
/// Bots connect this many at a time.
const BATCH: usize = 50;
/// Samples dropped at the start, while the page settles.
const WARM_UP: usize = 3;

/// Measures the demo's frame rate with a crowd in the room.
#[derive(Parser)]
struct Args {
    /// Bots in the room besides the viewer.
    #[arg(long, default_value_t = 499, value_parser = clap::value_parser!(u32).range(1..=9_999))]
    bots: u32,
    /// Seconds to sample the page, once a second (the first three are dropped).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(5..=3_600))]
    seconds: u32,
    /// In the spatial room `plaza`, crowded around its centre.
    #[arg(long)]
    plaza: bool,
    /// With --plaza: how far from the centre the bots stay, metres.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=250))]
    spread_m: u32,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    raise_open_file_limit();
    let limit = Duration::from_secs(u64::from(args.seconds) + 180);
    let report = within(limit, "the crowd measurement", run(&args)).await;
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("JSON report")
    );
}

/// Two sockets per bot in one process: more than the 1,024 open files many
/// systems give a process by default, so take what the hard limit allows.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(err) = setrlimit(Resource::Nofile, limit) {
            eprintln!("could not raise the open-file limit: {err}");
        }
    }
}

async fn run(args: &Args) -> Value {
    let mut config = Config::default();
    config.room.room_capacity = config.room.room_capacity.max(args.bots + 1);
    let server = Server::with(config).await;
    let mut bots: Vec<JoinHandle<()>> = Vec::new();
    let ids: Vec<u32> = (0..args.bots).collect();
    let (room, spread) = if args.plaza {
        ("plaza", Some(f64::from(args.spread_m) * 100.0))
    } else {
        (ROOM, None)
    };
    for chunk in ids.chunks(BATCH) {
        let joined = futures_util::future::join_all(
            chunk.iter().map(|&i| bot(server.addr, room, spread, i)),
        )
        .await;
        bots.extend(joined);
    }
    eprintln!("{} bots in room {room}", bots.len());

    let browser = Browser::start("crowd").await;
    let page = browser.open("viewer", Viewport::DESKTOP).await;
    page.goto(&server.url(&format!("/#{room}"))).await;
    page.fill("#name", "Viewer").await;
    page.click("#join").await;
    page.wait_for(
        "the viewer to join",
        "() => window.ambleDemo.state() === 'joined'",
        &[],
    )
    .await;
    // The whole room on screen; in a plaza, the area of interest.
    let zoom_outs = if args.plaza { 4 } else { 12 };
    for _ in 0..zoom_outs {
        page.eval::<Value>("() => window.ambleDemo.zoom(1 / 1.25)", &[])
            .await;
    }
    let mut samples = Vec::new();
    let mut every_second = tokio::time::interval(Duration::from_secs(1));
    every_second.tick().await;
    for _ in 0..args.seconds {
        every_second.tick().await;
        let sample: Value = page
            .eval(
                "() => ({ ...window.ambleDemo.frameStats(), \
                 members: window.ambleDemo.members().length, stats: window.ambleDemo.stats() })",
                &[],
            )
            .await;
        samples.push(sample);
    }
    let screenshot = page.screenshot("crowd").await;
    let errors = page.close().await;
    for bot in &bots {
        bot.abort();
    }
    server.stop().await;
    drop(browser);

    let steady = &samples[WARM_UP..];
    let num = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let (first, last) = (&steady[0]["stats"], &steady[steady.len() - 1]["stats"]);
    let secs = (steady.len() - 1) as f64;
    let n = steady.len() as f64;
    json!({
        "room": room,
        "bots": args.bots,
        "members": steady[steady.len() - 1]["members"],
        "fps_min": steady.iter().map(|s| num(s, "fps")).fold(f64::INFINITY, f64::min),
        "fps_avg": steady.iter().map(|s| num(s, "fps")).sum::<f64>() / n,
        "frame_script_ms_avg": steady.iter().map(|s| num(s, "workMsAvg")).sum::<f64>() / n,
        "frame_script_ms_max": steady.iter().map(|s| num(s, "workMsMax")).fold(0.0, f64::max),
        "updates_in_per_s": (num(last, "motionUpdatesIn") - num(first, "motionUpdatesIn")) / secs,
        "wire_bytes_in_per_s": (num(last, "wireBytesIn") - num(first, "wireBytesIn")) / secs,
        "page_errors": errors,
        "screenshot": screenshot,
    })
}

/// One bot: joins, then walks (half of them) or moves freely, at most one
/// move a second, reading and dropping what the room sends. Returns once
/// it is in the room.
async fn bot(addr: SocketAddr, room: &str, spread: Option<f64>, i: u32) -> JoinHandle<()> {
    let mut req = format!("ws://{addr}/ws")
        .into_client_request()
        .expect("a request");
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(amble::protocol::SUBPROTOCOL),
    );
    let (ws, _) = within(
        WAIT,
        "a bot to connect",
        tokio_tungstenite::connect_async(req),
    )
    .await
    .unwrap_or_else(|err| panic!("bot {i}: {err}"));
    let (mut tx, mut rx) = ws.split();
    let join = C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: room.into(),
        name: format!("bot {i}"),
        ..Default::default()
    });
    tx.send(Message::Binary(encode_client(join).into()))
        .await
        .expect("send join");
    let limits = within(WAIT, "a bot's welcome", async {
        while let Some(frame) = rx.next().await {
            let Ok(Message::Binary(bytes)) = frame else {
                continue;
            };
            match pb::ServerMessage::decode(bytes).map(|m| m.body) {
                Ok(Some(S::Welcome(w))) => return w.limits.expect("limits"),
                Ok(Some(S::Error(e))) => panic!("bot {i}: {}", e.message),
                _ => {}
            }
        }
        panic!("bot {i}: closed before the welcome")
    })
    .await;
    // Only the page's figures matter: the rest is read and dropped.
    tokio::spawn(async move { while let Some(Ok(_)) = rx.next().await {} });

    tokio::spawn(async move {
        let mut rng = fastrand::Rng::with_seed(u64::from(i));
        let (w, h) = (
            f64::from(limits.world_width),
            f64::from(limits.world_height),
        );
        let walker = i.is_multiple_of(2);
        // Anywhere, or (a plaza) within `spread` of the centre.
        let (lo_x, hi_x, lo_y, hi_y) = match spread {
            Some(s) => (w / 2.0 - s, w / 2.0 + s, h / 2.0 - s, h / 2.0 + s),
            None => (0.0, w, 0.0, h),
        };
        let (lo_x, hi_x) = (lo_x.max(0.0), hi_x.min(w));
        let (lo_y, hi_y) = (lo_y.max(0.0), hi_y.min(h));
        let mut x = lo_x + rng.f64() * (hi_x - lo_x);
        let mut y = lo_y + rng.f64() * (hi_y - lo_y);
        let mut heading = rng.f64() * std::f64::consts::TAU;
        let mut seq = 0u32;
        let mut motion = Motion::standing(at(x, y));
        let mut pause = Duration::from_millis(rng.u64(1_000..2_000));
        loop {
            seq += 1;
            let msg = Message::Binary(encode_client(move_body(motion, seq, 0)).into());
            if tx.send(msg).await.is_err() {
                return;
            }
            tokio::time::sleep(pause).await;
            if walker {
                let tx_ = (x + rng.f64() * 1_600.0 - 800.0).clamp(lo_x, hi_x);
                let ty = (y + rng.f64() * 1_600.0 - 800.0).clamp(lo_y, hi_y);
                let speed = rng.u32(110..220);
                motion = Motion {
                    position: at(x, y),
                    walk: Some(Walk {
                        target: at(tx_, ty),
                        speed,
                    }),
                };
                let walk_ms = (tx_ - x).hypot(ty - y) / f64::from(speed) * 1_000.0;
                pause = Duration::from_millis(walk_ms as u64 + rng.u64(300..2_500));
                (x, y) = (tx_, ty);
            } else {
                heading += rng.f64() * 1.2 - 0.6;
                let d = 150.0 + rng.f64() * 100.0; // cm in this second
                let (nx, ny) = (x + heading.cos() * d, y + heading.sin() * d);
                if nx < lo_x || nx > hi_x || ny < lo_y || ny > hi_y {
                    heading += std::f64::consts::PI;
                }
                (x, y) = (nx.clamp(lo_x, hi_x), ny.clamp(lo_y, hi_y));
                motion = Motion::standing(at(x, y));
                pause = Duration::from_millis(rng.u64(1_000..1_150));
            }
        }
    })
}

fn at(x: f64, y: f64) -> Position {
    Position {
        x: x.round() as u32,
        y: y.round() as u32,
    }
}
