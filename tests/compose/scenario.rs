//! The scenario, in the order a person trying the demo meets it: the images,
//! `up` (NATS wanting a password), two pages on two nodes, a node killed and started again, the bots,
//! a rolling restart, then what only containers can show: a node cut off
//! from NATS, NATS restarted, NATS stopped past the node timeout, a node
//! paused; and `down`.
//!
//! Bounds: 5 s where issue 16 asks for 5 s (asserted on the measured time;
//! the waits themselves run up to 15 s so a miss reports how long it took).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::{Browser, Page, within};
use crate::project::{Project, Service, Tool, http_get};
use crate::view::{
    Roster, await_roster, chats_and_is_read, exactly, gaps, join, open_and_join, own_id,
    reset_gaps, roster, someone_on_slot_moves, stays, walks_and_is_seen,
};

/// The test's own tags, so it never replaces a user's `amble:latest`;
/// the debootstrap base (`amble-demo-base:<release>`) is shared and reused.
const AMBLE_IMAGE: &str = "amble:compose-test";
const NATS_IMAGE: &str = "amble-demo-nats:compose-test";
/// What issue 16 allows for a node loss to show, a page to come back, a
/// view to converge.
const FIVE_S: Duration = Duration::from_secs(5);
/// How long a wait that should take under 5 s may run before it fails.
const WAIT: Duration = Duration::from_secs(15);
/// `up` to every service healthy.
const HEALTHY: Duration = Duration::from_secs(60);
/// The images: the first run debootstraps the base and may build amble
/// in release from nothing.
const IMAGES: Duration = Duration::from_secs(30 * 60);
/// After a recovery, how long every view must stay right.
const STABLE: Duration = Duration::from_secs(3);
/// The compose file's bots.
const BOTS: usize = 50;

/// The measured figures: printed, and written to timings.txt as they come
/// (so a failed run keeps what it measured).
struct Timings {
    path: PathBuf,
    text: String,
}

impl Timings {
    fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("timings.txt"),
            text: String::new(),
        }
    }

    fn record(&mut self, line: impl AsRef<str>) {
        let line = line.as_ref();
        println!("compose demo: {line}");
        let _ = writeln!(self.text, "{line}");
        let _ = std::fs::write(&self.path, &self.text);
    }

    /// Records `what took`, and fails when it is over `limit`.
    fn within(&mut self, what: &str, took: Duration, limit: Duration) {
        self.record(format!("{what}: {:.2} s", took.as_secs_f64()));
        assert!(
            took <= limit,
            "{what} took {:.2} s, over the {limit:?} issue 16 allows",
            took.as_secs_f64()
        );
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_demo_on_two_nodes_survives_kills_restarts_and_partitions() {
    let started = Instant::now();
    let tool = Tool::find();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate::project::remove_stale_projects().await;
    let images = build_images(root).await;
    let mut project = Project::new(tool.clone(), root, AMBLE_IMAGE, NATS_IMAGE);
    let browser = Browser::start("compose_demo").await;
    let mut t = Timings::new(browser.artifacts());
    project.keep_logs(browser.artifacts().join("compose-logs.txt"));
    t.record(format!(
        "{} as project {}, amble-1 on 127.0.0.1:{}, amble-2 on 127.0.0.1:{}",
        tool.name(),
        project.name,
        project.ports.amble_1,
        project.ports.amble_2
    ));
    t.record(format!("scripts/demo-images: {}", secs(images)));

    within(Duration::from_secs(600), "the compose demo", async {
        up_turns_healthy(&project, &mut t).await;
        nats_wants_a_password_and_each_node_has_its_user(&project, &mut t).await;
        let (ada, bo) = two_pages_see_each_other_walk_and_chat(&browser, &project).await;
        a_killed_node_drops_its_members_and_its_page_comes_back(&project, &mut t, &ada, &bo).await;
        the_bots_walk_on_both_nodes_and_both_pages_see_them(&project, &ada, &bo).await;
        a_rolling_restart_keeps_every_page_in_its_room(&project, &mut t, &ada, &bo).await;
        let everyone = pages_and_fresh_bots_on_both_nodes(&project, &ada, &bo).await;
        a_node_cut_off_from_nats_serves_its_own_and_heals(&project, &mut t, &ada, &bo, &everyone)
            .await;
        nats_restarted_under_load_the_rooms_converge(&project, &mut t, &ada, &bo, &everyone).await;
        nats_stopped_past_the_node_timeout_each_node_serves_its_own(
            &project, &mut t, &ada, &bo, &everyone,
        )
        .await;
        a_paused_node_comes_back_without_duplicates(&project, &mut t, &ada, &bo, &everyone).await;

        project.compose(&["stop", "bots"]).await;
        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");

        let down = Instant::now();
        project.down().await;
        let left = project.leftovers().await;
        assert_eq!(left, "", "`down` left containers or networks behind");
        t.record(format!("down, nothing left: {}", secs(down.elapsed())));
    })
    .await;
    t.record(format!("the whole test: {}", secs(started.elapsed())));
}

/// `scripts/demo-images --no-env` with the test's tags; returns how long it
/// took. Its output goes to target/demo-images/compose-test.log.
async fn build_images(root: &Path) -> Duration {
    let start = Instant::now();
    let log_path = root.join("target/demo-images/compose-test.log");
    std::fs::create_dir_all(root.join("target/demo-images")).expect("create target/demo-images");
    let log = std::fs::File::create(&log_path)
        .unwrap_or_else(|err| panic!("create {}: {err}", log_path.display()));
    let mut cmd = Command::new(root.join("scripts/demo-images"));
    cmd.arg("--no-env")
        .current_dir(root)
        .env("AMBLE_IMAGE", AMBLE_IMAGE)
        .env("NATS_IMAGE", NATS_IMAGE)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log's handle"))
        .stderr(log);
    // Its `cargo build --release` must see the environment a shell gives it:
    // the CARGO_PKG_*, CARGO_MANIFEST_* (and so on) that cargo sets for this
    // test are named by build scripts' rerun-if-env-changed (ring's, for
    // one), and would rebuild them, and again at the next build from a shell.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo = key.starts_with("CARGO_")
            && !matches!(&*key, "CARGO_HOME" | "CARGO_TARGET_DIR")
            && !key.starts_with("CARGO_BUILD_")
            && !key.starts_with("CARGO_PROFILE_");
        if set_by_cargo || key == "OUT_DIR" {
            cmd.env_remove(&*key);
        }
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("could not run scripts/demo-images: {err}"));
    let status = match tokio::time::timeout(IMAGES, child.wait()).await {
        Ok(status) => status.expect("wait for scripts/demo-images"),
        Err(_) => panic!(
            "scripts/demo-images took longer than {IMAGES:?}; its output is in {}",
            log_path.display()
        ),
    };
    if !status.success() {
        let out = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!(
            "scripts/demo-images --no-env: {status}; its output ({}):\n{out}",
            log_path.display()
        );
    }
    start.elapsed()
}

/// The second line of a node's /healthz (its cluster), or why there is none.
async fn cluster_line(project: &Project, node: Service) -> String {
    match http_get(project.node_addr(node), "/healthz").await {
        Some((200, body)) => body.lines().nth(1).unwrap_or("").to_owned(),
        Some((status, body)) => format!("status {status}: {body}"),
        None => "no answer".to_owned(),
    }
}

/// Polls `node`'s /healthz until its cluster line contains `wanted`.
async fn await_cluster_line(project: &Project, node: Service, wanted: &str) -> Duration {
    let start = Instant::now();
    loop {
        let line = cluster_line(project, node).await;
        if line.contains(wanted) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < WAIT,
            "{}'s /healthz did not say \"{wanted}\" within {WAIT:?}: {line}",
            node.name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Both nodes say they have their peer.
async fn await_cluster_whole(project: &Project) {
    for node in [Service::Amble1, Service::Amble2] {
        await_cluster_line(project, node, "connected, 1 peer").await;
    }
}

fn page_url(project: &Project, node: Service) -> String {
    let port = project.node_addr(node).port();
    let p = project.ports;
    format!("http://127.0.0.1:{port}/?nodes={},{}", p.amble_1, p.amble_2)
}

// ------------------------------------------------------------------ up

async fn up_turns_healthy(project: &Project, t: &mut Timings) {
    let start = Instant::now();
    project
        .compose(&["up", "--detach", "nats", "amble-1", "amble-2"])
        .await;
    project
        .await_healthy(&[Service::Nats, Service::Amble1, Service::Amble2], HEALTHY)
        .await;
    t.within(
        "up until nats, amble-1 and amble-2 are healthy",
        start.elapsed(),
        HEALTHY,
    );
    await_cluster_whole(project).await;
}

/// deploy/nats/nats.conf: a client without a password is refused, and the
/// nodes are connected as their own users (`/connz?auth=1` on the monitor).
/// NATS's client port is not published, so the test speaks to it at the
/// container's address on the project's `nats` network, which a Linux host
/// reaches through the network's bridge.
async fn nats_wants_a_password_and_each_node_has_its_user(project: &Project, t: &mut Timings) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let id = project.container(Service::Nats).await;
    let ips = crate::project::docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        &id,
    ])
    .await;
    let ip: std::net::IpAddr = ips
        .split_whitespace()
        .next()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("nats's container has no address: {ips:?}"));
    let answer = within(
        WAIT,
        "NATS's answer to a client without a password",
        async {
            let mut tcp = tokio::net::TcpStream::connect((ip, 4222))
                .await
                .unwrap_or_else(|err| panic!("connect to NATS at {ip}:4222: {err}"));
            tcp.write_all(b"CONNECT {\"verbose\":false}\r\nPING\r\n")
                .await
                .expect("write to NATS");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // NATS says why and closes the connection.
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        },
    )
    .await;
    assert!(
        answer.contains("-ERR 'Authorization Violation'") && !answer.contains("PONG"),
        "NATS answered a client without a password: {answer:?}"
    );

    let monitor = std::net::SocketAddr::from(([127, 0, 0, 1], project.ports.nats_monitor));
    let (status, body) = http_get(monitor, "/connz?auth=1")
        .await
        .expect("NATS's monitor answers");
    assert_eq!(status, 200, "{body}");
    let connz: serde_json::Value = serde_json::from_str(&body).expect("JSON from /connz");
    let mut users: Vec<&str> = connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["authorized_user"].as_str())
        .collect();
    users.sort_unstable();
    assert_eq!(users, ["amble-1", "amble-2"], "{body}");
    t.record(format!(
        "nats: a client without a password at {ip}:4222 is refused ({}); the nodes are users {}",
        answer
            .lines()
            .find(|l| l.starts_with("-ERR"))
            .unwrap_or_default(),
        users.join(" and ")
    ));
}

// ------------------------------------------------------------------ pages

async fn two_pages_see_each_other_walk_and_chat(
    browser: &Browser,
    project: &Project,
) -> (Page, Page) {
    let ada = open_and_join(browser, "ada", &page_url(project, Service::Amble1), "Ada").await;
    let bo = open_and_join(browser, "bo", &page_url(project, Service::Amble2), "Bo").await;
    let both = Roster(
        [
            (own_id(&ada).await, "Ada".to_owned()),
            (own_id(&bo).await, "Bo".to_owned()),
        ]
        .into(),
    );
    assert_eq!(
        both.per_slot(),
        (1, 1),
        "Ada on amble-1 and Bo on amble-2: {both:?}"
    );
    for page in [&ada, &bo] {
        await_roster(page, "Ada and Bo", WAIT, exactly(&both)).await;
    }
    walks_and_is_seen(&ada, "Ada", &bo).await;
    walks_and_is_seen(&bo, "Bo", &ada).await;
    chats_and_is_read(&ada, "hello from amble-1", &bo).await;
    chats_and_is_read(&bo, "hi Ada, amble-2 here", &ada).await;
    ada.screenshot("two-nodes-amble-1").await;
    bo.screenshot("two-nodes-amble-2").await;
    (ada, bo)
}

// ------------------------------------------------------------------ kill

async fn a_killed_node_drops_its_members_and_its_page_comes_back(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
) {
    let ada_id = own_id(ada).await;
    let bo_old = own_id(bo).await;
    reset_gaps(bo).await;
    // `docker kill` on the container is what `compose kill` asks the engine
    // for; the docker CLI starts in milliseconds, where docker-compose v1
    // (Python) takes one or two seconds on a busy machine, which would blur
    // the time measured from here.
    let amble_2 = project.container(Service::Amble2).await;
    let killed = Instant::now();
    crate::project::docker(&["kill", &amble_2]).await;
    t.record(format!(
        "kill amble-2: the command took {}",
        secs(killed.elapsed())
    ));

    // Both at once, each timed from the kill: Bo's page is back through
    // amble-1 before amble-1 has dropped Bo's old member (until then both
    // pages show Bo twice: the old member and the new).
    let (gone, back) = tokio::join!(
        async {
            await_roster(ada, "Bo's member on amble-2 to leave", WAIT, |r| {
                if r.0.contains_key(&bo_old) {
                    Err(format!("Bo#{bo_old} still shown: {r}"))
                } else {
                    Ok(())
                }
            })
            .await;
            killed.elapsed()
        },
        async {
            // Its own member (not the old one, which amble-1 still shows
            // until the node timeout) is on amble-1, and Ada is there.
            bo.wait_for_within(
                WAIT,
                "Bo back in the lobby through amble-1",
                "(room) => { const d = window.ambleDemo; \
                 const me = d.members().find((m) => m.self); \
                 return d.state() === 'joined' && d.room() === room && !!me && me.id % 16 === 1 \
                   && d.members().some((m) => m.name === 'Ada'); }",
                &[serde_json::json!(crate::view::ROOM)],
            )
            .await;
            killed.elapsed()
        },
    );
    let bo_new = own_id(bo).await;
    let both = Roster([(ada_id, "Ada".to_owned()), (bo_new, "Bo".to_owned())].into());
    await_roster(ada, "Bo back, through amble-1", WAIT, exactly(&both)).await;
    t.within(
        "kill amble-2: its member leaves the page on amble-1",
        gone,
        FIVE_S,
    );
    t.within(
        "kill amble-2: its page is back in the room through amble-1",
        back,
        FIVE_S,
    );
    // How much of that the page spent out of its room (the rest, it had not
    // yet seen its connection go).
    let (_, out_ms) = gaps(bo).await;
    t.record(format!(
        "kill amble-2: of which its page was out of its room {:.2} s",
        out_ms / 1e3
    ));
    let state = project.health(Service::Amble2).await;
    assert!(
        state.starts_with("exited"),
        "amble-2 stays down after `kill` until `start` (restart: unless-stopped): {state}"
    );
    bo.screenshot("amble-2-killed").await;

    let start = Instant::now();
    project.compose(&["start", "amble-2"]).await;
    project.await_healthy(&[Service::Amble2], HEALTHY).await;
    await_cluster_whole(project).await;
    t.record(format!(
        "start amble-2: healthy and in the cluster after {}",
        secs(start.elapsed())
    ));
    stays(
        &[ada, bo],
        &both,
        STABLE,
        "amble-2 started again: no ghost, no duplicate",
    )
    .await;

    // Bo goes back to amble-2, so the room spans both nodes again.
    join(bo, &page_url(project, Service::Amble2), "Bo").await;
    let bo_id = own_id(bo).await;
    assert_eq!(bo_id % 16, 2, "Bo on amble-2 again");
    let both = Roster([(ada_id, "Ada".to_owned()), (bo_id, "Bo".to_owned())].into());
    for page in [ada, bo] {
        await_roster(page, "Ada on amble-1, Bo on amble-2", WAIT, exactly(&both)).await;
    }
}

// ------------------------------------------------------------------ bots

/// Waits until `ada` shows the two pages and [`BOTS`] bots, spread over
/// both nodes, nobody twice, and `bo` shows exactly the same; returns it.
async fn everyone(ada: &Page, bo: &Page, bots: usize) -> Roster {
    let limit = Duration::from_secs(30);
    await_roster(ada, "the pages and the bots, on both nodes", limit, |r| {
        let (one, two) = r.per_slot();
        let dup = r.duplicates();
        if r.len() == bots + 2 && one > 1 && two > 1 && dup.is_empty() {
            Ok(())
        } else {
            Err(format!("{r}; duplicates {dup:?}"))
        }
    })
    .await;
    let all = roster(ada).await;
    await_roster(
        bo,
        "the same members as the page on amble-1",
        limit,
        exactly(&all),
    )
    .await;
    all
}

async fn the_bots_walk_on_both_nodes_and_both_pages_see_them(
    project: &Project,
    ada: &Page,
    bo: &Page,
) {
    project.compose(&["up", "--detach", "bots"]).await;
    everyone(ada, bo, BOTS).await;
    for page in [ada, bo] {
        for slot in [1, 2] {
            someone_on_slot_moves(page, slot, WAIT).await;
        }
    }
    ada.screenshot("bots-amble-1").await;
    bo.screenshot("bots-amble-2").await;
}

// ------------------------------------------------------------------ rolling restart

async fn a_rolling_restart_keeps_every_page_in_its_room(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
) {
    for page in [ada, bo] {
        reset_gaps(page).await;
    }
    let start = Instant::now();
    for node in [Service::Amble1, Service::Amble2] {
        let restart = Instant::now();
        project.compose(&["restart", node.name()]).await;
        project.await_healthy(&[node], HEALTHY).await;
        await_cluster_whole(project).await;
        t.record(format!(
            "rolling restart: {} back, healthy and in the cluster, after {}",
            node.name(),
            secs(restart.elapsed())
        ));
    }
    // Both pages are on amble-1 now (amble-2's restart sent them there).
    for page in [ada, bo] {
        await_roster(page, "Ada and Bo, once each", WAIT, |r| {
            match (r.id_of("Ada"), r.id_of("Bo"), r.duplicates().is_empty()) {
                (Some(_), Some(_), true) => Ok(()),
                _ => Err(format!("{:?}", r.0)),
            }
        })
        .await;
    }
    t.record(format!("rolling restart: {} in all", secs(start.elapsed())));
    for page in [ada, bo] {
        let (outs, longest_ms) = gaps(page).await;
        t.within(
            &format!(
                "rolling restart: the longest time {} was out of its room ({outs} times out)",
                page.label()
            ),
            Duration::from_secs_f64(longest_ms / 1e3),
            FIVE_S,
        );
        assert!(
            outs >= 1,
            "{} never left its room: was it on a restarted node?",
            page.label()
        );
    }

    // The bots do not reconnect (the load tester has no reconnect): those of
    // each restarted node left with it. Their report covers the whole run.
    project.compose(&["stop", "bots"]).await;
    let id = project.container(Service::Bots).await;
    let logs = crate::project::docker(&["logs", &id]).await;
    let _ = std::fs::write(t.path.with_file_name("bots-rolling-restart.log"), &logs);
    let report: Vec<&str> = logs
        .lines()
        .filter(|l| l.starts_with("  connected") || l.starts_with("  delivery"))
        .collect();
    assert!(
        report.len() >= 2,
        "the bots printed no report on SIGTERM:\n{logs}"
    );
    for line in &report[report.len() - 2..] {
        t.record(format!(
            "rolling restart, the bots' report: {}",
            line.trim()
        ));
    }
}

// ------------------------------------------------------------------ partitions

/// Ada back on amble-1, Bo on amble-2, the bots started again: the room
/// everyone should see once the cluster is whole.
async fn pages_and_fresh_bots_on_both_nodes(project: &Project, ada: &Page, bo: &Page) -> Roster {
    join(ada, &page_url(project, Service::Amble1), "Ada").await;
    join(bo, &page_url(project, Service::Amble2), "Bo").await;
    project.compose(&["up", "--detach", "bots"]).await;
    let all = everyone(ada, bo, BOTS).await;
    assert_eq!(
        all.id_of("Ada").map(|id| id % 16),
        Some(1),
        "Ada on amble-1"
    );
    assert_eq!(all.id_of("Bo").map(|id| id % 16), Some(2), "Bo on amble-2");
    all
}

/// Both pages show exactly `everyone` again; returns how long after `since`.
async fn converge(ada: &Page, bo: &Page, everyone: &Roster, since: Instant) -> Duration {
    for page in [ada, bo] {
        await_roster(
            page,
            "every member once, as before",
            WAIT,
            exactly(everyone),
        )
        .await;
    }
    since.elapsed()
}

async fn a_node_cut_off_from_nats_serves_its_own_and_heals(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
    everyone: &Roster,
) {
    let net = project.network("nats").await;
    let amble_2 = project.container(Service::Amble2).await;
    let cut = Instant::now();
    crate::project::docker(&["network", "disconnect", &net, &amble_2]).await;
    t.record(format!(
        "partition: the disconnect took {}",
        secs(cut.elapsed())
    ));

    // Each view and amble-2's /healthz at once, each timed from the cut.
    let (other, local, said) = tokio::join!(
        async {
            await_roster(
                ada,
                "amble-2's members to leave amble-1's room",
                WAIT,
                exactly(&everyone.on_slot(1)),
            )
            .await;
            cut.elapsed()
        },
        async {
            await_roster(
                bo,
                "amble-2's room to shrink to its own members",
                WAIT,
                exactly(&everyone.on_slot(2)),
            )
            .await;
            cut.elapsed()
        },
        async {
            await_cluster_line(project, Service::Amble2, "NATS unreachable").await;
            cut.elapsed()
        },
    );
    t.within(
        "partition: amble-1 drops the cut-off amble-2's members",
        other,
        FIVE_S,
    );
    t.within(
        "partition: the cut-off amble-2's room shrinks to its own members",
        local,
        FIVE_S,
    );
    t.record(format!(
        "partition: amble-2's /healthz says \"{}\" ({} after the cut)",
        cluster_line(project, Service::Amble2).await,
        secs(said)
    ));
    await_cluster_line(project, Service::Amble1, "connected, 0 peers").await;
    t.record(format!(
        "partition: amble-1's /healthz says \"{}\"",
        cluster_line(project, Service::Amble1).await
    ));
    // The cut-off node still serves its members: its bots walk on Bo's page.
    someone_on_slot_moves(bo, 2, FIVE_S).await;
    bo.screenshot("partition-amble-2-alone").await;

    let healed = Instant::now();
    crate::project::docker(&["network", "connect", &net, &amble_2]).await;
    let took = converge(ada, bo, everyone, healed).await;
    t.within("partition healed: every view whole again", took, FIVE_S);
    stays(&[ada, bo], everyone, STABLE, "after the partition healed").await;
    await_cluster_whole(project).await;
}

async fn nats_restarted_under_load_the_rooms_converge(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
    everyone: &Roster,
) {
    // Timed from when NATS answers again, seen on its monitor port.
    let start = Instant::now();
    let (_, (gone, back)) = tokio::join!(project.compose(&["restart", "nats"]), async {
        let gone = await_nats(project, false).await;
        (gone, await_nats(project, true).await)
    });
    t.record(format!(
        "restart nats: NATS away for {} ({} after the command began)",
        secs(back - gone),
        secs(gone - start)
    ));
    let took = converge(ada, bo, everyone, back).await;
    t.within(
        "restart nats: every view whole after NATS is back",
        took,
        FIVE_S,
    );
    stays(&[ada, bo], everyone, STABLE, "after NATS restarted").await;
    await_cluster_whole(project).await;
}

/// Whether NATS's monitor answers `/healthz` with 200.
async fn nats_answers(project: &Project) -> bool {
    let monitor = std::net::SocketAddr::from(([127, 0, 0, 1], project.ports.nats_monitor));
    matches!(http_get(monitor, "/healthz").await, Some((200, _)))
}

/// Polls NATS's monitor until it answers (`answering`) or stops answering;
/// returns when it first did.
async fn await_nats(project: &Project, answering: bool) -> Instant {
    let start = Instant::now();
    loop {
        if nats_answers(project).await == answering {
            return Instant::now();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "NATS's monitor (127.0.0.1:{}) still {} after 30 s",
            project.ports.nats_monitor,
            if answering { "silent" } else { "answering" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A longer outage than `restart`: NATS stopped until both rooms have
/// shrunk to their own node's members, then started again. Timed from when
/// NATS's monitor stopped (then started) answering.
async fn nats_stopped_past_the_node_timeout_each_node_serves_its_own(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
    everyone: &Roster,
) {
    let start = Instant::now();
    let (_, stopped) = tokio::join!(
        project.compose(&["stop", "nats"]),
        await_nats(project, false)
    );
    t.record(format!(
        "stop nats: NATS gone {} after the command began",
        secs(stopped - start)
    ));
    // Both views and both /healthz at once, each timed from the stop.
    let shrink = |page, slot| async move {
        await_roster(
            page,
            "the room to shrink to this node's own members",
            WAIT,
            exactly(&everyone.on_slot(slot)),
        )
        .await;
        stopped.elapsed()
    };
    let unreachable = |node| async move {
        await_cluster_line(project, node, "NATS unreachable").await;
        stopped.elapsed()
    };
    let (shrunk_1, shrunk_2, said_1, said_2) = tokio::join!(
        shrink(ada, 1),
        shrink(bo, 2),
        unreachable(Service::Amble1),
        unreachable(Service::Amble2),
    );
    for (node, shrunk, said) in [
        (Service::Amble1, shrunk_1, said_1),
        (Service::Amble2, shrunk_2, said_2),
    ] {
        t.within(
            &format!(
                "stop nats: {}'s room shrinks to its own members",
                node.name()
            ),
            shrunk,
            FIVE_S,
        );
        t.record(format!(
            "stop nats: {}'s /healthz says NATS is unreachable {} after the stop",
            node.name(),
            secs(said)
        ));
    }
    // Each node still serves its own members: their bots walk on its page.
    someone_on_slot_moves(ada, 1, FIVE_S).await;
    someone_on_slot_moves(bo, 2, FIVE_S).await;
    let (_, started) = tokio::join!(
        project.compose(&["start", "nats"]),
        await_nats(project, true)
    );
    t.record(format!(
        "stop nats: stopped for {}",
        secs(started - stopped)
    ));
    let took = converge(ada, bo, everyone, started).await;
    t.within("start nats: every view whole again", took, FIVE_S);
    stays(&[ada, bo], everyone, STABLE, "after NATS started again").await;
    await_cluster_whole(project).await;
}

async fn a_paused_node_comes_back_without_duplicates(
    project: &Project,
    t: &mut Timings,
    ada: &Page,
    bo: &Page,
    everyone: &Roster,
) {
    // `docker pause` and `unpause`: see the kill, above.
    let amble_2 = project.container(Service::Amble2).await;
    let paused = Instant::now();
    crate::project::docker(&["pause", &amble_2]).await;
    t.record(format!(
        "pause amble-2: the command took {}",
        secs(paused.elapsed())
    ));
    await_roster(
        ada,
        "the paused amble-2's members to leave",
        WAIT,
        exactly(&everyone.on_slot(1)),
    )
    .await;
    let dropped = paused.elapsed();
    t.within("pause amble-2: amble-1 drops its members", dropped, FIVE_S);
    // Past the node timeout (3 s) by a second more.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resumed = Instant::now();
    t.record(format!(
        "pause amble-2: paused for {}",
        secs(resumed - paused)
    ));
    crate::project::docker(&["unpause", &amble_2]).await;
    let took = converge(ada, bo, everyone, resumed).await;
    t.within("unpause amble-2: every view whole again", took, FIVE_S);
    stays(&[ada, bo], everyone, STABLE, "after amble-2 resumed").await;
    ada.screenshot("after-partitions-amble-1").await;
    bo.screenshot("after-partitions-amble-2").await;
}
