//! The rooms' settings: the tick, the world, and a room's size.

use std::time::Duration;

/// How rooms behave: `--tick-ms`, the world's size and speed limit,
/// `--room-capacity`, `--tick-workers`.
#[derive(Clone, Debug, clap::Args)]
pub struct RoomConfig {
    /// Room batch period in milliseconds: a room's moves of one tick go out
    /// as one frame. 0 sends each move at once.
    #[arg(long, display_order = 2, env = "AMBLE_TICK_MS", default_value_t = 100)]
    pub tick_ms: u32,

    /// World width in centimetres.
    #[arg(long, display_order = 8, env = "AMBLE_WORLD_WIDTH", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub world_width: u32,

    /// World height in centimetres.
    #[arg(long, display_order = 9, env = "AMBLE_WORLD_HEIGHT", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub world_height: u32,

    /// Fastest walk, centimetres per second.
    #[arg(long, display_order = 10, env = "AMBLE_MAX_SPEED", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_speed: u32,

    /// Most members in one room.
    #[arg(long, display_order = 11, env = "AMBLE_ROOM_CAPACITY", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub room_capacity: u32,

    /// Tasks each room tick is shared out over: every room's batch is
    /// written by one of them, so a node sends from every core, and a
    /// room's frames stay in order. 0 means one per runtime worker thread
    /// (see `--workers`); 1 writes every room from the ticker task alone.
    #[arg(long, display_order = 59, env = "AMBLE_TICK_WORKERS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub tick_workers: u16,

    /// How long a member whose connection dropped without a Leave (closed,
    /// failed, idle, not reading) keeps its place, milliseconds: nobody
    /// sees it leave, and a Join with its resume token (`Welcome`) takes
    /// the place back. After it, the usual `Left`. Held places count in the
    /// room's capacity; a node holds at most --max-connections of them.
    /// 0 holds none (members leave at once, and `Welcome` has no token).
    #[arg(long, display_order = 120, env = "AMBLE_RESUME_GRACE_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(0..=600_000))]
    pub resume_grace_ms: u32,

    /// Spatial rooms (area of interest, docs/protocol.md "Spatial rooms"):
    /// rooms whose name matches one of these patterns (a name, or a prefix
    /// ending in `*`; comma-separated; empty for none) send each member
    /// only what happens within its view, so thousands can share one.
    /// Single node only for now: with --nats every room is a plain room.
    #[arg(long, display_order = 130, env = "AMBLE_SPATIAL_ROOMS", value_delimiter = ',',
          default_value = "plaza*", value_parser = parse_room_pattern)]
    pub spatial_rooms: Vec<String>,

    /// A spatial room's world width in centimetres.
    #[arg(long, display_order = 131, env = "AMBLE_SPATIAL_WORLD_WIDTH", default_value_t = 50_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub spatial_world_width: u32,

    /// A spatial room's world height in centimetres.
    #[arg(long, display_order = 132, env = "AMBLE_SPATIAL_WORLD_HEIGHT", default_value_t = 50_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub spatial_world_height: u32,

    /// Most members in one spatial room.
    #[arg(long, display_order = 133, env = "AMBLE_SPATIAL_CAPACITY", default_value_t = 20_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub spatial_capacity: u32,

    /// A spatial room's interest radius in centimetres: everyone within it
    /// is always in view.
    #[arg(long, display_order = 134, env = "AMBLE_INTEREST_RADIUS", default_value_t = 1_500,
          value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    pub interest_radius: u32,
}

/// A `--spatial-rooms` entry: a room name, or a prefix ending in `*`.
fn parse_room_pattern(text: &str) -> Result<String, String> {
    let name = text.strip_suffix('*').unwrap_or(text);
    let ok = name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok && !text.is_empty() {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a room name or a prefix ending in '*' ([A-Za-z0-9_.-], at most 32)"
        ))
    }
}

impl RoomConfig {
    pub fn tick(&self) -> Duration {
        Duration::from_millis(u64::from(self.tick_ms))
    }

    pub fn resume_grace(&self) -> Duration {
        Duration::from_millis(u64::from(self.resume_grace_ms))
    }

    /// Whether `room` is a spatial room.
    pub fn is_spatial(&self, room: &str) -> bool {
        self.spatial_rooms
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => room.starts_with(prefix),
                None => p == room,
            })
    }

    /// The unit of truncated motion times: the tick, or 10 ms when moves
    /// are sent at once.
    pub fn motion_time_unit_ms(&self) -> u32 {
        if self.tick_ms == 0 { 10 } else { self.tick_ms }
    }
}
