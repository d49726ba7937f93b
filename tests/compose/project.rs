//! One run of docker-compose.yml under a project name of its own: the
//! Compose tool the machine has (`docker compose`, else `docker-compose`),
//! the host ports it publishes on, and the `docker` commands the scenarios
//! need (health, networks). Every command is bounded in time and fails the
//! test with its output. Dropping the [`Project`] takes it down (unpause,
//! `down --volumes --remove-orphans`), also when the test panics.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What to install when Docker or a Compose tool is missing.
pub const INSTALL: &str = "the compose test needs a Docker engine that answers and a Compose tool: \
    on Debian or Ubuntu `sudo apt-get install docker.io docker-compose debootstrap`, start the \
    engine (`sudo systemctl start docker`), and run the tests as root or as a member of the \
    `docker` group; this test never skips";

/// How long one docker or compose command may take (a `stop` waits up to
/// the compose file's 10 s grace period; `up` creates networks and containers).
const COMMAND: Duration = Duration::from_secs(90);

/// The Compose command line this machine has.
#[derive(Clone, Debug)]
pub struct Tool {
    program: &'static str,
    prefix: &'static [&'static str],
}

impl Tool {
    /// `docker compose` (v2) when the plugin answers, else `docker-compose`;
    /// panics with what to install when neither does, or when the engine
    /// does not answer.
    pub fn find() -> Self {
        let engine = Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdin(Stdio::null())
            .output();
        match engine {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "the Docker engine does not answer (`docker info`: {}); {INSTALL}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => panic!("no `docker` command ({err}); {INSTALL}"),
        }
        let answers = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if answers("docker", &["compose", "version"]) {
            Self {
                program: "docker",
                prefix: &["compose"],
            }
        } else if answers("docker-compose", &["version"]) {
            Self {
                program: "docker-compose",
                prefix: &[],
            }
        } else {
            panic!("neither `docker compose` nor `docker-compose` runs; {INSTALL}")
        }
    }

    /// How the tool is called, for messages.
    pub fn name(&self) -> String {
        std::iter::once(self.program)
            .chain(self.prefix.iter().copied())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The host ports a project publishes on 127.0.0.1.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub amble_1: u16,
    pub amble_2: u16,
    pub nats_monitor: u16,
}

impl Ports {
    /// Three ports that were free a moment ago (the kernel's choice, so no
    /// clash with a server someone runs on 3000, or with the other tests).
    pub fn free() -> Self {
        let listeners: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
            .collect();
        let port = |i: usize| listeners[i].local_addr().expect("local address").port();
        Self {
            amble_1: port(0),
            amble_2: port(1),
            nats_monitor: port(2),
        }
    }
}

/// A service of the compose file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Nats,
    Amble1,
    Amble2,
    Bots,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Amble1 => "amble-1",
            Self::Amble2 => "amble-2",
            Self::Bots => "bots",
        }
    }
}

/// Every project of this test is named this, then the test's process id.
const PREFIX: &str = "amble-compose-test-";

/// Removes what earlier runs of this test left in Docker when they could not
/// clean up (killed, or a CI timeout): the containers and networks of every
/// `amble-compose-test-<pid>` project whose process is gone.
pub async fn remove_stale_projects() {
    let projects = docker(&[
        "ps",
        "--all",
        "--filter",
        "label=com.docker.compose.project",
        "--format",
        "{{.Label \"com.docker.compose.project\"}}",
    ])
    .await;
    let mut stale: Vec<&str> = projects
        .lines()
        .filter(|p| {
            p.strip_prefix(PREFIX)
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    stale.sort_unstable();
    stale.dedup();
    for project in stale {
        let label = format!("label=com.docker.compose.project={project}");
        let containers = docker(&["ps", "--all", "--quiet", "--filter", &label]).await;
        let containers: Vec<&str> = containers.split_whitespace().collect();
        if !containers.is_empty() {
            // A paused container cannot be removed until it is unpaused.
            let mut unpause = vec!["unpause"];
            unpause.extend(&containers);
            let mut cmd = Command::new("docker");
            cmd.args(&unpause)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let _ = cmd.status();
            let mut rm = vec!["rm", "--force", "--volumes"];
            rm.extend(&containers);
            docker(&rm).await;
        }
        let networks = docker(&["network", "ls", "--quiet", "--filter", &label]).await;
        for network in networks.split_whitespace() {
            docker(&["network", "rm", network]).await;
        }
        println!("compose test: removed project {project}, left by a run that is gone");
    }
}

/// docker-compose.yml run as project `name`.
pub struct Project {
    tool: Tool,
    root: PathBuf,
    pub name: String,
    pub ports: Ports,
    env: Vec<(&'static str, String)>,
    down: bool,
    /// Where `down` (or the drop, after a failure) saves every service's log.
    logs: Option<PathBuf>,
}

impl Project {
    /// A project named `amble-compose-test-<pid>` on free ports, running
    /// the images `amble_image` and `nats_image`. Nothing starts yet.
    pub fn new(tool: Tool, root: &Path, amble_image: &str, nats_image: &str) -> Self {
        let ports = Ports::free();
        let name = format!("{PREFIX}{}", std::process::id());
        // The environment beats a .env file, so a user's .env changes nothing here.
        let env = vec![
            ("AMBLE_IMAGE", amble_image.to_owned()),
            ("NATS_IMAGE", nats_image.to_owned()),
            ("AMBLE_PORT_1", ports.amble_1.to_string()),
            ("AMBLE_PORT_2", ports.amble_2.to_string()),
            ("NATS_MONITOR_PORT", ports.nats_monitor.to_string()),
        ];
        Self {
            tool,
            root: root.to_owned(),
            name,
            ports,
            env,
            down: false,
            logs: None,
        }
    }

    /// Saves every service's log to `path` when the project goes down.
    pub fn keep_logs(&mut self, path: PathBuf) {
        self.logs = Some(path);
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(self.tool.program);
        cmd.args(self.tool.prefix)
            .args(["--project-name", &self.name, "--file", "docker-compose.yml"])
            // Every command names the bots' profile, so that `down`, `ps` and
            // the others see the bots too.
            .args(["--profile", "bots"])
            .current_dir(&self.root)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `<compose> args` and returns its stdout; panics with its output
    /// when it fails or takes longer than [`COMMAND`].
    pub async fn compose(&self, args: &[&str]) -> String {
        let what = format!("{} {}", self.tool.name(), args.join(" "));
        let mut cmd = self.command();
        cmd.args(args);
        run(&what, cmd, COMMAND).await
    }

    /// The id of `service`'s container (running or not).
    pub async fn container(&self, service: Service) -> String {
        // `ps -a`: v2 lists only running containers without it; v1 lists all
        // and has no -a, so ask v2's way first.
        let id = if self.tool.program == "docker" {
            self.compose(&["ps", "-a", "-q", service.name()]).await
        } else {
            self.compose(&["ps", "-q", service.name()]).await
        };
        let id = id.trim().to_owned();
        assert!(
            !id.is_empty() && !id.contains('\n'),
            "one container for {}, got {id:?}",
            service.name()
        );
        id
    }

    /// `service`'s health as Docker sees it (`starting`, `healthy`, ...),
    /// or its state when it is not running.
    pub async fn health(&self, service: Service) -> String {
        let id = self.container(service).await;
        docker(&[
            "inspect",
            "--format",
            "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}",
            &id,
        ])
        .await
        .trim()
        .to_owned()
    }

    /// Waits until every service in `services` is running and healthy;
    /// panics after `limit` with each one's last health.
    pub async fn await_healthy(&self, services: &[Service], limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let mut last = Vec::new();
            for &s in services {
                last.push((s, self.health(s).await));
            }
            if last.iter().all(|(_, h)| h == "running/healthy") {
                return start.elapsed();
            }
            if start.elapsed() >= limit {
                let logs = self.compose(&["logs", "--tail", "20"]).await;
                panic!("not healthy within {limit:?}: {last:?}\nlast logs:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The Docker network the compose file calls `network` in this project.
    pub async fn network(&self, network: &str) -> String {
        let id = docker(&[
            "network",
            "ls",
            "--quiet",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.name),
            "--filter",
            &format!("label=com.docker.compose.network={network}"),
        ])
        .await;
        let id = id.trim().to_owned();
        assert!(
            !id.is_empty() && !id.contains('\n'),
            "one network {network} in project {}, got {id:?}",
            self.name
        );
        id
    }

    /// `http://127.0.0.1:<port>` of node 1 or 2.
    pub fn node_addr(&self, node: Service) -> SocketAddr {
        let port = match node {
            Service::Amble1 => self.ports.amble_1,
            Service::Amble2 => self.ports.amble_2,
            other => panic!("{} is not an amble node", other.name()),
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// What is left of the project in Docker: containers and networks.
    pub async fn leftovers(&self) -> String {
        let label = format!("label=com.docker.compose.project={}", self.name);
        let containers = docker(&["ps", "--all", "--quiet", "--filter", &label]).await;
        let networks = docker(&["network", "ls", "--quiet", "--filter", &label]).await;
        format!("{}{}", containers.trim(), networks.trim())
    }

    /// `down`: stops and removes the containers and networks; the drop does
    /// nothing more.
    pub async fn down(&mut self) {
        if let Some(path) = &self.logs {
            let logs = self.compose(&["logs", "--no-color", "--timestamps"]).await;
            let _ = std::fs::write(path, logs);
        }
        self.compose(&["down", "--volumes", "--remove-orphans", "--timeout", "10"])
            .await;
        self.down = true;
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if self.down {
            return;
        }
        // A test that failed: keep the logs, then take everything down,
        // whatever state it is in (a paused container cannot be stopped, so
        // unpause first).
        if let Some(path) = &self.logs {
            let mut cmd = self.command();
            cmd.args(["logs", "--no-color", "--timestamps"]);
            if let Ok(out) = cmd.output() {
                let _ = std::fs::write(path, out.stdout);
            }
        }
        for args in [
            &["unpause"][..],
            &["down", "--volumes", "--remove-orphans", "--timeout", "5"][..],
        ] {
            let mut cmd = self.command();
            cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
            let _ = cmd.status();
        }
    }
}

/// Runs `docker args`; see [`Project::compose`].
pub async fn docker(args: &[&str]) -> String {
    let mut cmd = Command::new("docker");
    cmd.args(args).stdin(Stdio::null());
    run(&format!("docker {}", args.join(" ")), cmd, COMMAND).await
}

/// Runs `cmd`, bounded by `limit`; returns stdout, panics with the output
/// when it fails.
pub async fn run(what: &str, cmd: Command, limit: Duration) -> String {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let out: Output = match tokio::time::timeout(limit, cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(err)) => panic!("{what}: could not run: {err}; {INSTALL}"),
        Err(_) => panic!("{what}: took longer than {limit:?}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `GET path` from `addr`: the status code and body, or `None` when the
/// node does not answer within 3 s.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let fetch = async {
        let mut tcp = TcpStream::connect(addr).await.ok()?;
        // HTTP/1.0: the body is never chunked and ends with the connection.
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await.ok()?;
        Some(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(3), fetch)
        .await
        .ok()??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}
