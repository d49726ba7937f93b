//! The browser-test harness: the amble server in-process, Debian's Chromium
//! driven through chromedriver (WebDriver, with the `fantoccini` client).
//!
//! # Writing a browser test
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn something_in_the_demo() {
//!     // Waits for this binary's other browser tests to finish, then starts
//!     // chromedriver and empties target/browser-artifacts/something_in_the_demo/.
//!     let browser = Browser::start("something_in_the_demo").await;
//!     within(Duration::from_secs(120), "the whole test", async {
//!         let server = Server::with(Config::default()).await;
//!         let page = browser.open("ada", Viewport::DESKTOP).await;
//!         page.goto(&server.url("/")).await;
//!         page.fill("#name", "Ada").await;
//!         page.click("#join").await;
//!         page.wait_for("Ada to join", "() => window.ambleDemo.state() === 'joined'", &[]).await;
//!         page.screenshot("joined").await; // target/browser-artifacts/something_in_the_demo/joined.png
//!         assert_eq!(page.close().await, Vec::<String>::new(), "no errors in the page");
//!         server.stop().await;
//!     })
//!     .await;
//! }
//! ```
//!
//! - [`Server`] (the shared harness, `testkit`) runs `amble::serve` on
//!   127.0.0.1:0 in the test's runtime ([`Server::at`] brings it back on the
//!   same address, for restarts).
//! - [`Browser`] is one chromedriver (on a port it picks itself). Each
//!   [`Browser::open`] is one WebDriver session: its own Chromium with a
//!   fresh `--user-data-dir`, so two pages are two people with separate
//!   storage. [`Viewport`] sets the page size (and touch, for phones).
//! - [`Page`] helpers mirror what a person does (`click`, `fill`, `press`,
//!   `key_down`, `click_at`) and what a test reads (`eval`, `text`, `value`,
//!   `is_visible`). JavaScript is given as a function expression and called
//!   with `args`: `page.eval::<f64>("(n) => n + 1", &[json!(1)])`.
//! - Every wait is bounded: [`Page::wait_for`] polls a predicate for up to
//!   [`WAIT`] and on timeout saves `<label>-failed.png` and panics with
//!   the last value seen; each WebDriver command is bounded too. Wrap the
//!   test body in [`within`] for a bound on the whole test.
//! - [`Page::close`] returns the page's uncaught exceptions and
//!   `console.error` lines (network failures are not counted).
//! - Screenshots go under `target/browser-artifacts/<test>/`, never under
//!   `web/` (build.rs embeds `web/`; a write there would rebuild amble).
//! - Missing Chromium or chromedriver fails the test with what to install;
//!   nothing skips. `AMBLE_CHROMIUM` and `AMBLE_CHROMEDRIVER` name other
//!   binaries.
//! - Dropping the [`Browser`] kills chromedriver's whole process group
//!   (chromedriver and every Chromium it started), also when a test panics.
//!   Tests in one binary take turns: a [`Browser`] holds the only turn, so
//!   a 2-core machine never runs two browser tests' Chromiums at once.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use fantoccini::actions::{
    InputSource as _, KeyAction, KeyActions, MOUSE_BUTTON_LEFT, MouseActions, PointerAction,
};
use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How long any single wait in a browser test may take.
pub const WAIT: Duration = Duration::from_secs(15);
/// How long chromedriver, or one Chromium with its first page, may take to
/// start (slow on a loaded machine).
const START: Duration = Duration::from_secs(60);
/// How often [`Page::wait_for`] asks again.
const POLL: Duration = Duration::from_millis(50);

/// The flags Chromium needs on a closed, headless build machine: no GPU, no
/// sandbox (tests may run as root), no calls home.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// What to install when Chromium or chromedriver is missing.
const INSTALL: &str = "the browser tests need Debian's chromium and chromium-driver: \
    `apt-get install chromium chromium-driver` (scripts/test installs them), or set \
    AMBLE_CHROMIUM and AMBLE_CHROMEDRIVER; these tests never skip";

/// Resolves with `fut`'s value, or panics after `limit` saying what did not
/// happen.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

// ------------------------------------------------------------------ server

/// The amble server, in-process, until [`Server::stop`] or drop: the shared
/// harness's [`testkit::TestServer`].
pub use testkit::TestServer as Server;

/// `GET path` from `server`, as JSON.
pub async fn get_json(server: &Server, path: &str) -> Value {
    // HTTP/1.0: the body is never chunked and ends with the connection.
    let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", server.addr);
    let text = within(WAIT, &format!("GET {path}"), server.request(&req)).await;
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "GET {path}: {head}"
    );
    serde_json::from_str(body).unwrap_or_else(|err| panic!("GET {path}: {err}: {body}"))
}

// ----------------------------------------------------------------- browser

/// One browser test at a time per test binary.
static TURN: Semaphore = Semaphore::const_new(1);

/// The size of a page, and whether it is a phone (touch, mobile layout).
#[derive(Clone, Copy, Debug)]
pub struct Viewport {
    pub width: u32,
    pub height: u32,
    pub pixel_ratio: f64,
    pub touch: bool,
    pub mobile: bool,
}

impl Viewport {
    /// A laptop: 1280 x 720 CSS pixels, mouse and keyboard.
    pub const DESKTOP: Self = Self {
        width: 1280,
        height: 720,
        pixel_ratio: 1.0,
        touch: false,
        mobile: false,
    };
    /// A phone held upright: 390 x 844 CSS pixels at 3x, touch.
    pub const PHONE: Self = Self {
        width: 390,
        height: 844,
        pixel_ratio: 3.0,
        touch: true,
        mobile: true,
    };
}

/// chromedriver and the Chromiums it starts; all killed on drop.
pub struct Browser {
    driver: std::process::Child,
    url: String,
    chromium: PathBuf,
    artifacts: PathBuf,
    /// Chromium profiles, removed after drop has killed every Chromium
    /// (fields drop after `Drop::drop`): a live one would write on.
    profiles: Mutex<Vec<tempfile::TempDir>>,
    _turn: SemaphorePermit<'static>,
}

impl Browser {
    /// Waits for this binary's other browser tests to end, then starts
    /// chromedriver. `test` names the artifacts directory, which is emptied.
    pub async fn start(test: &str) -> Self {
        let turn = TURN
            .acquire()
            .await
            .expect("the turn semaphore is never closed");
        let chromium = program("AMBLE_CHROMIUM", "chromium");
        let chromedriver = program("AMBLE_CHROMEDRIVER", "chromedriver");
        let artifacts = artifacts_root().join(test);
        let _ = std::fs::remove_dir_all(&artifacts);
        std::fs::create_dir_all(&artifacts)
            .unwrap_or_else(|err| panic!("create {}: {err}", artifacts.display()));

        // Its own process group, so that drop can kill it with every Chromium.
        let mut driver = std::os::unix::process::CommandExt::process_group(
            std::process::Command::new(&chromedriver).arg("--port=0"),
            0,
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| {
            panic!(
                "could not start {}: {err}; {INSTALL}",
                chromedriver.display()
            )
        });
        let stdout = driver.stdout.take().expect("piped stdout");
        let stdout = tokio::process::ChildStdout::from_std(stdout).expect("async stdout");
        let mut this = Self {
            driver,
            url: String::new(),
            chromium,
            artifacts,
            profiles: Mutex::new(Vec::new()),
            _turn: turn,
        };
        // "ChromeDriver was started successfully on port 40321."
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = String::new();
        let port = within(START, "chromedriver to say its port", async {
            while let Some(line) = lines.next_line().await.expect("chromedriver output") {
                if let Some(port) = line
                    .split_once("started successfully on port ")
                    .and_then(|(_, rest)| rest.trim_end_matches('.').trim().parse::<u16>().ok())
                {
                    return port;
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            panic!("chromedriver exited before it listened:\n{seen}");
        })
        .await;
        // Keep reading, so chromedriver never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        this.url = format!("http://127.0.0.1:{port}");
        this
    }

    /// Where this test's screenshots go: target/browser-artifacts/<test>/.
    pub fn artifacts(&self) -> &Path {
        &self.artifacts
    }

    /// A new Chromium with an empty profile, showing a blank page; `label`
    /// names it in failures and artifacts.
    pub async fn open(&self, label: &str, viewport: Viewport) -> Page {
        let profile = tempfile::Builder::new()
            .prefix("amble-chromium-")
            .tempdir()
            .expect("a temporary profile directory");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        self.profiles.lock().expect("profiles lock").push(profile);
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": args,
                "mobileEmulation": {
                    "deviceMetrics": {
                        "width": viewport.width,
                        "height": viewport.height,
                        "pixelRatio": viewport.pixel_ratio,
                        "touch": viewport.touch,
                        "mobile": viewport.mobile,
                    }
                }
            },
            "goog:loggingPrefs": { "browser": "ALL" },
            "timeouts": { "script": WAIT.as_millis() as u64, "pageLoad": WAIT.as_millis() as u64 },
        });
        let Value::Object(caps) = caps else {
            unreachable!("a JSON object")
        };
        let caps: Capabilities = caps;
        let client = within(START, &format!("{label}: Chromium to start"), async {
            ClientBuilder::new(HttpConnector::new())
                .capabilities(caps)
                .connect(&self.url)
                .await
        })
        .await
        .unwrap_or_else(|err| panic!("{label}: no WebDriver session: {err}; {INSTALL}"));
        Page {
            client,
            label: label.to_owned(),
            artifacts: self.artifacts.clone(),
            errors: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let pid = i32::try_from(self.driver.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            // The group is chromedriver's own pid; it may be gone already.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// target/browser-artifacts, beside the build (never under web/).
fn artifacts_root() -> PathBuf {
    let target = option_env!("CARGO_TARGET_TMPDIR")
        .and_then(|tmp| Path::new(tmp).parent().map(Path::to_path_buf))
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("browser-artifacts")
}

/// `$var`, or `name` on the PATH; panics with what to install.
fn program(var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{var}={} is not a file; {INSTALL}",
            path.display()
        );
        return path;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no `{name}` on the PATH: {INSTALL}"))
}

// -------------------------------------------------------------------- page

/// A rectangle in CSS pixels from the viewport's top left corner.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

/// One person's browser: a WebDriver session with its own Chromium.
pub struct Page {
    client: Client,
    label: String,
    artifacts: PathBuf,
    errors: Mutex<Vec<String>>,
}

impl Page {
    /// The WebDriver client, for what the helpers do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Bounds one WebDriver command and names the page when it fails.
    async fn command<T, E: std::fmt::Display>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> T {
        let label = &self.label;
        within(WAIT, &format!("{label}: {what}"), fut)
            .await
            .unwrap_or_else(|err| panic!("{label}: {what}: {err}"))
    }

    /// Runs the DevTools protocol command `cmd` with `params` on the page
    /// (chromedriver's `goog/cdp/execute`) and returns its result.
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        let command = Cdp {
            cmd: cmd.to_owned(),
            params,
        };
        self.command(&format!("DevTools {cmd}"), self.client.issue_cmd(command))
            .await
    }

    pub async fn goto(&self, url: &str) {
        self.command(&format!("open {url}"), self.client.goto(url))
            .await;
    }

    /// Calls the JavaScript function expression `js` with `args` and
    /// returns its result (a promise is awaited).
    pub async fn eval<T: DeserializeOwned>(&self, js: &str, args: &[Value]) -> T {
        let value = self
            .command(&format!("evaluate {js}"), self.try_eval(js, args))
            .await;
        serde_json::from_value(value.clone())
            .unwrap_or_else(|err| panic!("{}: {js} gave {value}: {err}", self.label))
    }

    async fn try_eval(
        &self,
        js: &str,
        args: &[Value],
    ) -> Result<Value, fantoccini::error::CmdError> {
        let script = format!("return ({js})(...arguments);");
        self.client.execute(&script, args.to_vec()).await
    }

    /// Polls `js` (a function expression called with `args`) until it
    /// returns a truthy value, and returns that value; panics after [`WAIT`].
    pub async fn wait_for(&self, what: &str, js: &str, args: &[Value]) -> Value {
        self.wait_for_within(WAIT, what, js, args).await
    }

    /// [`Page::wait_for`] with another bound.
    pub async fn wait_for_within(
        &self,
        limit: Duration,
        what: &str,
        js: &str,
        args: &[Value],
    ) -> Value {
        let deadline = Instant::now() + limit;
        let mut last = String::from("no answer");
        loop {
            match tokio::time::timeout_at(deadline, self.try_eval(js, args)).await {
                Ok(Ok(v)) if truthy(&v) => return v,
                Ok(Ok(v)) => last = format!("last value {v}"),
                Ok(Err(err)) => last = format!("last error {err}"),
                Err(_) => break,
            }
            if Instant::now() + POLL >= deadline {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.fail(&format!(
            "timed out after {limit:?} waiting for {what} ({last})"
        ))
        .await
    }

    /// Saves `<label>-failed.png` (best effort) and panics with `message`.
    async fn fail(&self, message: &str) -> ! {
        let path = self.artifacts.join(format!("{}-failed.png", self.label));
        let shot = tokio::time::timeout(Duration::from_secs(5), self.client.screenshot()).await;
        let saved = match shot.map(|png| png.map(|png| std::fs::write(&path, png))) {
            Ok(Ok(Ok(()))) => format!("; screenshot {}", path.display()),
            _ => String::new(),
        };
        panic!("{}: {message}{saved}", self.label)
    }

    /// Waits until `selector` matches an element that is displayed.
    pub async fn wait_visible(&self, selector: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.is_visible(selector).await {
            if Instant::now() + POLL >= deadline {
                self.fail(&format!(
                    "timed out after {WAIT:?} waiting for {selector} to be visible"
                ))
                .await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Whether `selector` matches an element that is displayed.
    pub async fn is_visible(&self, selector: &str) -> bool {
        let found = self
            .command(
                &format!("find {selector}"),
                self.client.find_all(Locator::Css(selector)),
            )
            .await;
        match found.first() {
            Some(el) => {
                self.command(&format!("is {selector} displayed"), el.is_displayed())
                    .await
            }
            None => false,
        }
    }

    /// Clicks the middle of `selector` once it is displayed and nothing
    /// covers it.
    pub async fn click(&self, selector: &str) {
        self.wait_visible(selector).await;
        let deadline = Instant::now() + WAIT;
        loop {
            let el = self
                .command(
                    &format!("find {selector}"),
                    self.client.find(Locator::Css(selector)),
                )
                .await;
            match within(
                WAIT,
                &format!("{}: click {selector}", self.label),
                el.click(),
            )
            .await
            {
                Ok(()) => return,
                Err(err) if Instant::now() + POLL < deadline => {
                    // Covered or still moving: try again, as a person would.
                    let _ = err;
                    tokio::time::sleep(POLL).await;
                }
                Err(err) => self.fail(&format!("click {selector}: {err}")).await,
            }
        }
    }

    /// Empties the field `selector` and types `text` into it.
    pub async fn fill(&self, selector: &str, text: &str) {
        self.wait_visible(selector).await;
        let el = self
            .command(
                &format!("find {selector}"),
                self.client.find(Locator::Css(selector)),
            )
            .await;
        self.command(&format!("clear {selector}"), el.clear()).await;
        self.command(&format!("type into {selector}"), el.send_keys(text))
            .await;
    }

    /// Presses `key` in `selector` (focusing it first).
    pub async fn press(&self, selector: &str, key: fantoccini::key::Key) {
        let el = self
            .command(
                &format!("find {selector}"),
                self.client.find(Locator::Css(selector)),
            )
            .await;
        self.command(
            &format!("press {key:?} in {selector}"),
            el.send_keys(&char::from(key).to_string()),
        )
        .await;
    }

    /// Holds `key` down (in whatever has focus) until [`Page::key_up`].
    pub async fn key_down(&self, key: char) {
        let keys = KeyActions::new("keyboard".into()).then(KeyAction::Down { value: key });
        self.command(
            &format!("key {key} down"),
            self.client.perform_actions(keys),
        )
        .await;
    }

    pub async fn key_up(&self, key: char) {
        let keys = KeyActions::new("keyboard".into()).then(KeyAction::Up { value: key });
        self.command(&format!("key {key} up"), self.client.perform_actions(keys))
            .await;
    }

    /// A left click at (`x`, `y`) CSS pixels from the viewport's top left.
    pub async fn click_at(&self, x: f64, y: f64) {
        let mouse = MouseActions::new("mouse".into())
            .then(PointerAction::MoveTo {
                duration: None,
                x,
                y,
            })
            .then(PointerAction::Down {
                button: MOUSE_BUTTON_LEFT,
            })
            .then(PointerAction::Up {
                button: MOUSE_BUTTON_LEFT,
            });
        self.command(
            &format!("click at {x}, {y}"),
            self.client.perform_actions(mouse),
        )
        .await;
    }

    /// Where `selector` is on screen.
    pub async fn rect(&self, selector: &str) -> Rect {
        self.eval(
            "(s) => { const r = document.querySelector(s).getBoundingClientRect(); \
             return { x: r.x, y: r.y, width: r.width, height: r.height }; }",
            &[json!(selector)],
        )
        .await
    }

    /// The `textContent` of `selector`.
    pub async fn text(&self, selector: &str) -> String {
        self.eval::<Option<String>>(
            "(s) => document.querySelector(s)?.textContent ?? null",
            &[json!(selector)],
        )
        .await
        .unwrap_or_else(|| panic!("{}: no element {selector}", self.label))
    }

    /// The `value` of the form field `selector`.
    pub async fn value(&self, selector: &str) -> String {
        self.eval::<Option<String>>(
            "(s) => document.querySelector(s)?.value ?? null",
            &[json!(selector)],
        )
        .await
        .unwrap_or_else(|| panic!("{}: no field {selector}", self.label))
    }

    /// Saves what the page shows as `<state>.png` in the test's artifacts
    /// directory and returns its path.
    pub async fn screenshot(&self, state: &str) -> PathBuf {
        let png = self.command("screenshot", self.client.screenshot()).await;
        let path = self.artifacts.join(format!("{state}.png"));
        std::fs::write(&path, png).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        path
    }

    /// The page's uncaught exceptions and `console.error` lines so far,
    /// each prefixed with the page's label.
    pub async fn errors(&self) -> Vec<String> {
        let log = self
            .command("read the browser log", self.client.issue_cmd(BrowserLog))
            .await;
        let mut errors = self.errors.lock().expect("errors lock");
        for entry in log.as_array().into_iter().flatten() {
            let source = entry["source"].as_str().unwrap_or_default();
            if entry["level"] == "SEVERE" && matches!(source, "javascript" | "console-api") {
                errors.push(format!(
                    "{}: {}",
                    self.label,
                    entry["message"].as_str().unwrap_or_default()
                ));
            }
        }
        errors.clone()
    }

    /// Ends the session (Chromium quits) and returns the page's errors.
    pub async fn close(self) -> Vec<String> {
        let errors = self.errors().await;
        self.command("close", self.client.clone().close()).await;
        errors
    }
}

/// JavaScript truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// chromedriver's browser log (its own command, outside the W3C set): read
/// entries are dropped from the log.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _url: &url::Url) -> (axum::http::Method, Option<String>) {
        (
            axum::http::Method::POST,
            Some(json!({ "type": "browser" }).to_string()),
        )
    }
}

/// A DevTools protocol command through chromedriver (outside the W3C set).
#[derive(Debug)]
struct Cdp {
    cmd: String,
    params: Value,
}

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/goog/cdp/execute",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _url: &url::Url) -> (axum::http::Method, Option<String>) {
        (
            axum::http::Method::POST,
            Some(json!({ "cmd": self.cmd, "params": self.params }).to_string()),
        )
    }
}

/// Opens the demo's lobby on `page`, joins `room` as `name` and waits for
/// the Welcome.
pub async fn join(page: &Page, server: &Server, room: &str, name: &str) {
    page.goto(&server.url("/")).await;
    page.fill("#name", name).await;
    page.fill("#room", room).await;
    page.click("#join").await;
    page.wait_for("joined", "() => window.ambleDemo.state() === 'joined'", &[])
        .await;
}
