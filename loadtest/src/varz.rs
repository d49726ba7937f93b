//! The NATS server's monitoring endpoint (`nats-server -m PORT`): its
//! `/varz` read every second of the measured window, for what nats-server
//! spent and carried beside the nodes' own figures.
//!
//! `/varz` gives `cpu` as the percentage of one core over nats-server's
//! last second (not since its start), so CPU time over the window is the
//! sum of each reading times the time since the one before; the other
//! fields are gauges (`mem`, bytes) or counters since start (`in_msgs`,
//! `out_msgs`, `in_bytes`, `out_bytes`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::{Deserialize, Serialize};

use crate::plan::{Schedule, Target};

/// Bound on one read of `/varz`.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// Time between readings in the window (nats-server's `cpu` covers its
/// last second).
const EVERY: Duration = Duration::from_secs(1);

/// Where nats-server's monitoring answers: `http://HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Monitor {
    target: Target,
}

impl Monitor {
    /// Parses `http://HOST:PORT[/]`; refuses hosts that are not loopback
    /// unless `allow_remote`.
    pub fn parse(url: &str, allow_remote: bool) -> anyhow::Result<Self> {
        let what = "--nats-monitor takes the NATS server's monitoring URL, http://HOST:PORT \
                    (nats-server -m PORT), e.g. http://127.0.0.1:8222";
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("--nats-monitor {url:?}: {what}"))?;
        let authority = rest.trim_end_matches('/');
        ensure!(
            !authority.is_empty() && !authority.contains('/'),
            "--nats-monitor {url:?}: {what}"
        );
        let (host, port) = authority
            .rsplit_once(':')
            .with_context(|| format!("--nats-monitor {url:?}: no port; {what}"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .with_context(|| format!("--nats-monitor {url:?}: bad port; {what}"))?;
        ensure!(!host.is_empty(), "--nats-monitor {url:?}: no host; {what}");
        let target = Target {
            url: url.to_string(),
            host: host.to_string(),
            port,
            path: "/varz".into(),
            allow_remote,
        };
        ensure!(
            allow_remote || target.loopback_ip().is_some(),
            "--nats-monitor {url}: {host} is not a loopback address; this tool only targets this \
             machine (pass --allow-remote to override)"
        );
        Ok(Self { target })
    }

    pub fn url(&self) -> &str {
        &self.target.url
    }

    /// Reads `/varz` once.
    pub async fn read(&self) -> anyhow::Result<Varz> {
        let addr = self.target.resolve().await?;
        let body = tokio::time::timeout(
            READ_TIMEOUT,
            crate::scrape::get(addr, &self.target.authority(), "/varz"),
        )
        .await
        .context("GET /varz timed out")??;
        let mut varz = Varz::parse(&body)?;
        varz.at = Some(Instant::now());
        Ok(varz)
    }
}

/// The fields of `/varz` used here.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Varz {
    /// Percent of one core over nats-server's last second.
    pub cpu: f64,
    /// Resident memory, bytes.
    pub mem: u64,
    pub in_msgs: u64,
    pub out_msgs: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    #[serde(skip)]
    pub at: Option<Instant>,
}

impl Varz {
    pub fn parse(json: &str) -> anyhow::Result<Self> {
        serde_json::from_str(json).context(
            "/varz is not nats-server's (expected cpu, mem, in_msgs, out_msgs, in_bytes, out_bytes)",
        )
    }
}

/// What nats-server spent and carried over the measured window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NatsUsage {
    pub url: String,
    /// CPU time over the window (each second's `cpu` reading times the
    /// time it covers), comparable with the nodes' CPU seconds.
    pub cpu_seconds: f64,
    /// `cpu_seconds` over the window's wall time; 100 is one core.
    pub cpu_percent: f64,
    /// Resident memory at the end of the window, and the most seen in it.
    pub mem_bytes: u64,
    pub mem_peak_bytes: u64,
    /// Counter deltas over the window.
    pub in_msgs: u64,
    pub out_msgs: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Readings of `/varz` the figures come from.
    pub readings: u32,
}

impl NatsUsage {
    /// From the readings of one window, oldest first; `None` with fewer
    /// than two.
    pub fn of(url: &str, readings: &[Varz]) -> Option<Self> {
        let (first, last) = (readings.first()?, readings.last()?);
        if readings.len() < 2 {
            return None;
        }
        let mut cpu_seconds = 0.0;
        for pair in readings.windows(2) {
            if let (Some(a), Some(b)) = (pair[0].at, pair[1].at) {
                cpu_seconds += pair[1].cpu.max(0.0) / 100.0 * b.duration_since(a).as_secs_f64();
            }
        }
        let wall = match (first.at, last.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        Some(Self {
            url: url.to_string(),
            cpu_seconds,
            cpu_percent: if wall > 0.0 {
                100.0 * cpu_seconds / wall
            } else {
                0.0
            },
            mem_bytes: last.mem,
            mem_peak_bytes: readings.iter().map(|v| v.mem).max().unwrap_or(0),
            in_msgs: last.in_msgs.saturating_sub(first.in_msgs),
            out_msgs: last.out_msgs.saturating_sub(first.out_msgs),
            in_bytes: last.in_bytes.saturating_sub(first.in_bytes),
            out_bytes: last.out_bytes.saturating_sub(first.out_bytes),
            readings: readings.len() as u32,
        })
    }
}

/// Reads `/varz` every second from the window's start to its end (or an
/// earlier end of the run).
pub struct Watch {
    end: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(Vec<Varz>, Option<String>)>,
}

/// Most readings kept (a day of seconds).
const MAX_READINGS: usize = 86_400;

impl Watch {
    pub fn start(monitor: Monitor, schedule: Schedule) -> Self {
        let (end, mut ended) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut readings = Vec::new();
            let mut failed = None;
            let mut read = async |readings: &mut Vec<Varz>| match monitor.read().await {
                Ok(v) if readings.len() < MAX_READINGS => readings.push(v),
                Ok(_) => {}
                Err(e) => {
                    if failed.is_none() {
                        let what = format!(
                            "the NATS monitor {} did not answer ({e:#}); the nats-server \
                             figures leave those seconds out",
                            monitor.url()
                        );
                        eprintln!("warning: {what}");
                        failed = Some(what);
                    }
                }
            };
            tokio::select! {
                () = async { drop(ended.wait_for(|e| *e).await) } => return (readings, failed),
                () = tokio::time::sleep_until(schedule.window_start.into()) => {}
            }
            read(&mut readings).await;
            let mut next = Instant::now() + EVERY;
            loop {
                let at_end = tokio::select! {
                    biased;
                    () = async { drop(ended.wait_for(|e| *e).await) } => true,
                    () = tokio::time::sleep_until(schedule.window_end.into()) => true,
                    () = tokio::time::sleep_until(next.into()) => false,
                };
                read(&mut readings).await;
                if at_end {
                    return (readings, failed);
                }
                next += EVERY;
            }
        });
        Self { end, task }
    }

    /// Ends the window now: the run ended early.
    pub fn end_now(&self) {
        self.end.send_replace(true);
    }

    /// Ends the window (if not yet) and returns the readings and the first
    /// failure to read, if any.
    pub async fn finish(self) -> (Vec<Varz>, Option<String>) {
        self.end.send_replace(true);
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `curl -s 127.0.0.1:8222/varz` from Debian's nats-server 2.9.10
    /// (`nats-server -a 127.0.0.1 -p -1 -m -1`) while a client published.
    const SAMPLE: &str = include_str!("../tests/data/varz-nats-server-2.9.10.json");

    #[test]
    fn reads_real_varz() {
        let v = Varz::parse(SAMPLE).unwrap();
        assert_eq!(v.cpu, 86.0);
        assert_eq!(v.mem, 18_104_320);
        assert_eq!((v.in_msgs, v.out_msgs), (7_011_632, 20));
        assert_eq!((v.in_bytes, v.out_bytes), (35_058_160, 100));
        let err = Varz::parse(r#"{"server_id": "x"}"#).unwrap_err();
        assert!(format!("{err:#}").contains("in_msgs"), "{err:#}");
        assert!(Varz::parse("not json").is_err());
    }

    #[test]
    fn usage_integrates_cpu_over_the_window() {
        let t0 = Instant::now();
        let at = |s: u64, cpu: f64, mem: u64, msgs: u64| Varz {
            cpu,
            mem,
            in_msgs: msgs,
            out_msgs: 2 * msgs,
            in_bytes: 100 * msgs,
            out_bytes: 200 * msgs,
            at: Some(t0 + Duration::from_secs(s)),
        };
        // The first reading's cpu covers the second before the window.
        let readings = [
            at(0, 90.0, 10, 1_000),
            at(1, 50.0, 30, 1_500),
            at(2, 30.0, 20, 2_000),
            at(4, 10.0, 20, 3_000),
        ];
        let u = NatsUsage::of("http://127.0.0.1:8222", &readings).unwrap();
        assert!((u.cpu_seconds - (0.5 + 0.3 + 0.2)).abs() < 1e-9, "{u:?}");
        assert!((u.cpu_percent - 25.0).abs() < 1e-9, "{u:?}");
        assert_eq!((u.mem_bytes, u.mem_peak_bytes), (20, 30));
        assert_eq!((u.in_msgs, u.out_msgs), (2_000, 4_000));
        assert_eq!((u.in_bytes, u.out_bytes), (200_000, 400_000));
        assert_eq!(u.readings, 4);
        assert_eq!(NatsUsage::of("x", &readings[..1]), None);
    }

    #[test]
    fn monitor_urls() {
        let m = Monitor::parse("http://127.0.0.1:8222", false).unwrap();
        assert_eq!((m.target.host.as_str(), m.target.port), ("127.0.0.1", 8222));
        assert!(Monitor::parse("http://localhost:8222/", false).is_ok());
        for bad in [
            "127.0.0.1:8222",
            "https://127.0.0.1:8222",
            "http://127.0.0.1",
            "http://127.0.0.1:x",
            "http://127.0.0.1:8222/varz",
        ] {
            let err = Monitor::parse(bad, false).unwrap_err().to_string();
            assert!(err.contains("http://HOST:PORT"), "{bad}: {err}");
        }
        let err = Monitor::parse("http://10.1.2.3:8222", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--allow-remote"), "{err}");
        assert!(Monitor::parse("http://10.1.2.3:8222", true).is_ok());
    }

    /// A real nats-server, started here: its /varz reads, and its counters
    /// move when a client publishes.
    #[tokio::test]
    async fn reads_a_running_nats_server() {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
        let mut server = tokio::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", "-1", "-m", "-1"])
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed (Debian package nats-server)");
        let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
        let (mut client, mut monitor) = (None, None);
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let port = || line.rsplit(':').next().map(|p| p.trim().to_string());
                if line.contains("Listening for client connections on") {
                    client = port();
                } else if line.contains("Starting http monitor on") {
                    monitor = port();
                }
                if client.is_some() && monitor.is_some() {
                    break;
                }
            }
        })
        .await
        .expect("nats-server says where it listens within 10 s");
        let (client, monitor) = (client.unwrap(), monitor.unwrap());
        let monitor = Monitor::parse(&format!("http://127.0.0.1:{monitor}"), false).unwrap();
        let before = monitor.read().await.unwrap();
        let mut nats = tokio::net::TcpStream::connect(format!("127.0.0.1:{client}"))
            .await
            .unwrap();
        let mut info = [0u8; 4096];
        let _ = nats.read(&mut info).await.unwrap();
        nats.write_all(b"CONNECT {\"verbose\":false}\r\nPUB lt.x 5\r\nhello\r\nPING\r\n")
            .await
            .unwrap();
        let mut pong = [0u8; 64];
        tokio::time::timeout(Duration::from_secs(5), nats.read(&mut pong))
            .await
            .unwrap()
            .unwrap();
        let after = monitor.read().await.unwrap();
        assert_eq!(after.in_msgs - before.in_msgs, 1);
        assert_eq!(after.in_bytes - before.in_bytes, 5);
        assert!(after.mem > 0);
        let u = NatsUsage::of(monitor.url(), &[before, after]).unwrap();
        assert_eq!(u.in_msgs, 1);
    }
}
