//! What a page of the demo shows, read through `window.ambleDemo`: who is
//! in the room (ids and names), and for how long the page was ever out of
//! its room. Waits on views are polled (the page has no event a test can
//! await across WebDriver), each bounded, and report how long they took.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use crate::driver::{Browser, Page, Viewport};

/// The room every page and bot is in: the demo's lobby.
pub const ROOM: &str = "lobby";
/// Member ids are `local_index * slots + node_slot` (docs/cluster.md); the
/// compose file leaves `--cluster-slots` at its default.
const CLUSTER_SLOTS: u32 = 16;
/// How often a view is read again.
const POLL: Duration = Duration::from_millis(50);

/// A member as a page shows it.
#[derive(Clone, Debug, Deserialize)]
struct Member {
    id: u32,
    name: String,
}

/// Who is in a room: member id to name. An id's slot (`id % 16`) is
/// the node the member is connected to (1: amble-1, 2: amble-2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster(pub BTreeMap<u32, String>);

impl Roster {
    /// The members connected to node `slot`.
    pub fn on_slot(&self, slot: u32) -> Self {
        Self(
            self.0
                .iter()
                .filter(|(id, _)| *id % CLUSTER_SLOTS == slot)
                .map(|(id, name)| (*id, name.clone()))
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// How many members are on each of slots 1 and 2.
    pub fn per_slot(&self) -> (usize, usize) {
        (self.on_slot(1).len(), self.on_slot(2).len())
    }

    /// Names shown more than once.
    pub fn duplicates(&self) -> Vec<String> {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for name in self.0.values() {
            *count.entry(name).or_default() += 1;
        }
        count
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// What `self` has that `expected` has not, and the reverse, for messages.
    pub fn diff(&self, expected: &Self) -> String {
        let extra: Vec<String> = self
            .0
            .iter()
            .filter(|(id, _)| !expected.0.contains_key(id))
            .map(|(id, name)| format!("{name}#{id}"))
            .collect();
        let missing: Vec<String> = expected
            .0
            .iter()
            .filter(|(id, _)| !self.0.contains_key(id))
            .map(|(id, name)| format!("{name}#{id}"))
            .collect();
        format!(
            "{} shown; extra (ghosts) {extra:?}; missing {missing:?}",
            self.len()
        )
    }

    /// The id of the member called `name`, when there is exactly one.
    pub fn id_of(&self, name: &str) -> Option<u32> {
        let mut ids = self.0.iter().filter(|(_, n)| *n == name).map(|(id, _)| *id);
        match (ids.next(), ids.next()) {
            (Some(id), None) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Roster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (one, two) = self.per_slot();
        write!(
            f,
            "{} members ({one} on amble-1, {two} on amble-2)",
            self.len()
        )
    }
}

/// Who `page` shows in its room now (itself included).
pub async fn roster(page: &Page) -> Roster {
    let members: Vec<Member> = page
        .eval(
            "() => window.ambleDemo.members().map((m) => ({ id: m.id, name: m.name }))",
            &[],
        )
        .await;
    Roster(members.into_iter().map(|m| (m.id, m.name)).collect())
}

/// Polls `page`'s roster until `check` accepts it (returns `Ok`); returns
/// how long that took. After `limit` it saves `<label>-failed.png` and
/// panics with `what` and `check`'s last complaint.
pub async fn await_roster(
    page: &Page,
    what: &str,
    limit: Duration,
    check: impl Fn(&Roster) -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    loop {
        let seen = roster(page).await;
        let last = match check(&seen) {
            Ok(()) => return start.elapsed(),
            Err(why) => why,
        };
        if start.elapsed() >= limit {
            let shot = page.screenshot(&format!("{}-failed", page.label())).await;
            panic!(
                "{}: timed out after {limit:?} waiting for {what}: {last} (screenshot {})",
                page.label(),
                shot.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A check for [`await_roster`]: exactly `expected`, nobody twice.
pub fn exactly(expected: &Roster) -> impl Fn(&Roster) -> Result<(), String> + '_ {
    move |seen| {
        let dup = seen.duplicates();
        if seen == expected && dup.is_empty() {
            Ok(())
        } else {
            Err(format!("{}; duplicates {dup:?}", seen.diff(expected)))
        }
    }
}

/// Watches `pages` for `period`: each must keep showing exactly `expected`
/// (a ghost or a duplicate that shows up late fails here).
pub async fn stays(pages: &[&Page], expected: &Roster, period: Duration, what: &str) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        for page in pages {
            let seen = roster(page).await;
            if let Err(why) = exactly(expected)(&seen) {
                let shot = page.screenshot(&format!("{}-failed", page.label())).await;
                panic!(
                    "{}: {what}: the view changed again: {why} (screenshot {})",
                    page.label(),
                    shot.display()
                );
            }
        }
        tokio::time::sleep(POLL * 4).await;
    }
}

/// Opens the demo at `url` (with `?nodes=` for the other node), joins the
/// lobby as `name`, and starts the page's out-of-room recorder.
pub async fn open_and_join(browser: &Browser, label: &str, url: &str, name: &str) -> Page {
    let page = browser.open(label, Viewport::DESKTOP).await;
    join(&page, url, name).await;
    page
}

/// Loads `url` in `page` and joins the lobby as `name` (again).
pub async fn join(page: &Page, url: &str, name: &str) {
    page.goto(url).await;
    page.fill("#name", name).await;
    page.fill("#room", ROOM).await;
    page.click("#join").await;
    page.wait_for(
        &format!("{name} to join {ROOM} through {url}"),
        "(room) => window.ambleDemo.state() === 'joined' && window.ambleDemo.room() === room",
        &[json!(ROOM)],
    )
    .await;
    // Every 20 ms: is the page in its room? The longest time it was not
    // (measured in the page, so WebDriver's round trips do not blur it).
    page.eval::<()>(
        "(room) => { \
           const g = { outSince: null, longestMs: 0, outs: 0 }; \
           window.roomGaps = g; \
           setInterval(() => { \
             const d = window.ambleDemo; \
             const inRoom = d.state() === 'joined' && d.room() === room; \
             const now = performance.now(); \
             if (!inRoom && g.outSince === null) { g.outSince = now; g.outs++; } \
             if (g.outSince !== null) g.longestMs = Math.max(g.longestMs, now - g.outSince); \
             if (inRoom) g.outSince = null; \
           }, 20); }",
        &[json!(ROOM)],
    )
    .await;
}

/// How often the page left its room since it joined (or since the last
/// [`reset_gaps`]), and the longest time it stayed out, in ms.
pub async fn gaps(page: &Page) -> (u32, f64) {
    #[derive(Deserialize)]
    struct Gaps {
        outs: u32,
        #[serde(rename = "longestMs")]
        longest_ms: f64,
    }
    let g: Gaps = page
        .eval(
            "() => ({ outs: window.roomGaps.outs, longestMs: window.roomGaps.longestMs })",
            &[],
        )
        .await;
    (g.outs, g.longest_ms)
}

pub async fn reset_gaps(page: &Page) {
    page.eval::<()>(
        "() => { window.roomGaps.outs = 0; window.roomGaps.longestMs = 0; }",
        &[],
    )
    .await;
}

/// The page's own member id.
pub async fn own_id(page: &Page) -> u32 {
    page.eval(
        "() => window.ambleDemo.members().find((m) => m.self)?.id ?? null",
        &[],
    )
    .await
}

#[derive(Clone, Copy, Debug, Deserialize)]
struct Point {
    x: f64,
    y: f64,
}

/// `walker` clicks a point of the floor 3 m away from where it stands;
/// `watcher` (on the other node) sees it walk there, then arrive.
pub async fn walks_and_is_seen(walker: &Page, name: &str, watcher: &Page) {
    let me: Point = walker
        .eval(
            "() => { const m = window.ambleDemo.members().find((m) => m.self); \
             return { x: m.x, y: m.y }; }",
            &[],
        )
        .await;
    let width: f64 = walker
        .eval("() => window.ambleDemo.limits().worldWidth", &[])
        .await;
    let goal = Point {
        x: if me.x + 300.0 < width - 100.0 {
            me.x + 300.0
        } else {
            me.x - 300.0
        },
        y: 100f64.max(me.y - 150.0),
    };
    let on_canvas: Point = walker
        .eval(
            "(x, y) => window.ambleDemo.worldToCanvas(x, y)",
            &[json!(goal.x), json!(goal.y)],
        )
        .await;
    let floor = walker.rect("#floor").await;
    walker
        .click_at(floor.x + on_canvas.x, floor.y + on_canvas.y)
        .await;
    let target = walker
        .wait_for(
            &format!("{name} walking"),
            "() => window.ambleDemo.members().find((m) => m.self && m.walking)?.target",
            &[],
        )
        .await;
    let target: Point = serde_json::from_value(target).expect("a point");
    watcher
        .wait_for(
            &format!("{name} arrived on the other node"),
            "(name, x, y) => { const a = window.ambleDemo.members().find((m) => m.name === name); \
             return !!a && !a.walking && Math.abs(a.x - x) < 0.5 && Math.abs(a.y - y) < 0.5; }",
            &[json!(name), json!(target.x), json!(target.y)],
        )
        .await;
}

/// `from` says `text` in the chat; `to` shows it in its panel.
pub async fn chats_and_is_read(from: &Page, text: &str, to: &Page) {
    from.fill("#chat-input", text).await;
    from.press("#chat-input", fantoccini::key::Key::Enter).await;
    to.wait_for(
        &format!("\"{text}\" in the chat panel"),
        "(text) => document.querySelector('#messages').textContent.includes(text)",
        &[json!(text)],
    )
    .await;
}

/// Whether some member connected to node `slot` other than the page
/// itself walks on `page` within `limit` (its position changes).
pub async fn someone_on_slot_moves(page: &Page, slot: u32, limit: Duration) {
    page.wait_for_within(
        limit,
        &format!("a member of node slot {slot} moving"),
        "(slot, slots) => { \
           const now = window.ambleDemo.members().filter((m) => !m.self && m.id % slots === slot); \
           const before = window.slotPositions ?? new Map(); \
           window.slotPositions = new Map(now.map((m) => [m.id, `${m.x},${m.y}`])); \
           return now.some((m) => before.has(m.id) && before.get(m.id) !== `${m.x},${m.y}`); }",
        &[json!(slot), json!(CLUSTER_SLOTS)],
    )
    .await;
}
