//! A ping flood against a running amble server, to measure what it costs
//! the server: `--clients` sockets each send pings as fast as the socket
//! takes them (not waiting for answers), reconnecting when the server
//! closes them, for `--secs` seconds. Prints what the flooders saw and the
//! server's CPU over the run, read from its `/metrics`.
//!
//! ```text
//! cargo run --release --bin amble -- --pings-per-sec 0 &   # or with the default budget
//! cargo run --release --example ping_flood -- --clients 2 --secs 10
//! ```
//!
//! Only for servers on this machine: the URL must be a loopback address.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use amble::protocol::encode_client;
use amble::protocol::pb::{self, client_message::Body as C};
use anyhow::{Context as _, bail};
use clap::Parser;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::Message;

/// Floods an amble server on this machine with pings.
#[derive(Debug, Parser)]
struct Opts {
    /// The server's address (loopback only).
    #[arg(long, default_value = "127.0.0.1:3000")]
    server: std::net::SocketAddr,
    /// Flooding sockets at once.
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// How long to flood, seconds.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Send WebSocket ping frames instead of protocol `Ping` messages.
    #[arg(long)]
    websocket: bool,
}

#[derive(Default)]
struct Tally {
    pings: AtomicU64,
    pongs: AtomicU64,
    connections: AtomicU64,
    closed_1008: AtomicU64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Opts::parse();
    if !opts.server.ip().is_loopback() {
        bail!("ping_flood only targets servers on this machine (a loopback address)");
    }
    let cpu_before = server_cpu_seconds(opts.server).await?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(opts.secs);
    let tally = Arc::new(Tally::default());
    let ping = if opts.websocket {
        Message::Ping(vec![0; 8].into())
    } else {
        Message::Binary(encode_client(C::Ping(pb::Ping { client_time_ms: 1 })).into())
    };
    let tasks: Vec<_> = (0..opts.clients)
        .map(|_| {
            tokio::spawn(flooder(
                opts.server,
                ping.clone(),
                deadline,
                Arc::clone(&tally),
            ))
        })
        .collect();
    for task in tasks {
        task.await.context("flooder")??;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = server_cpu_seconds(opts.server).await? - cpu_before;
    let per_s = |n: &AtomicU64| n.load(Relaxed) as f64 / wall;
    println!(
        "{} clients, {:.1} s: {:.0} pings/s sent, {:.0} answers/s back, {} connections ({} closed with 1008); server CPU {:.1}% of a core",
        opts.clients,
        wall,
        per_s(&tally.pings),
        per_s(&tally.pongs),
        tally.connections.load(Relaxed),
        tally.closed_1008.load(Relaxed),
        100.0 * cpu / wall,
    );
    Ok(())
}

/// One socket after another until `deadline`, each flooded until closed.
async fn flooder(
    server: std::net::SocketAddr,
    ping: Message,
    deadline: Instant,
    tally: Arc<Tally>,
) -> anyhow::Result<()> {
    let url = format!("ws://{server}/ws");
    while Instant::now() < deadline {
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .context("connect")?;
        tally.connections.fetch_add(1, Relaxed);
        let (mut tx, mut rx) = ws.split();
        let reader_tally = Arc::clone(&tally);
        let reader = tokio::spawn(async move {
            while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, rx.next()).await {
                match msg {
                    // Pongs, and the server's Error notices.
                    Message::Binary(_) | Message::Pong(_) => {
                        reader_tally.pongs.fetch_add(1, Relaxed);
                    }
                    Message::Close(Some(frame)) if u16::from(frame.code) == 1008 => {
                        reader_tally.closed_1008.fetch_add(1, Relaxed);
                        return;
                    }
                    Message::Close(_) => return,
                    _ => {}
                }
            }
        });
        let flood = async {
            while !reader.is_finished() {
                for _ in 0..64 {
                    tx.feed(ping.clone()).await?;
                    tally.pings.fetch_add(1, Relaxed);
                }
                tx.flush().await?;
            }
            Ok::<_, tokio_tungstenite::tungstenite::Error>(())
        };
        // Ends at the deadline, when the server closes, or when a write fails.
        let _ = tokio::time::timeout_at(deadline, flood).await;
        let _ = timeout(Duration::from_secs(2), reader).await;
    }
    Ok(())
}

/// The server's `amble_process_cpu_seconds_total`.
async fn server_cpu_seconds(server: std::net::SocketAddr) -> anyhow::Result<f64> {
    let mut tcp = TcpStream::connect(server)
        .await
        .context("connect for /metrics")?;
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = String::new();
    timeout(Duration::from_secs(5), tcp.read_to_string(&mut body))
        .await
        .context("/metrics timed out")??;
    body.lines()
        .find_map(|l| l.strip_prefix("amble_process_cpu_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .context("no amble_process_cpu_seconds_total in /metrics")
}
