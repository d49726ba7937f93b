//! The cluster's settings: its flags ([`ClusterConfig`], the NATS
//! connection and the `--node-*` and `--cluster-*` flags) and what a node
//! runs with ([`ClusterSettings`]: the node's name and slot resolved, the
//! periods as durations, checked against the tick).

use std::path::PathBuf;
use std::time::Duration;

use super::wire;

/// The cluster's flags. Without `--nats` amble runs alone and the others
/// are not read.
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterConfig {
    /// NATS server URL(s), comma-separated (`nats://host:4222`, `tls://...`).
    /// When set, this node joins a cluster of amble nodes sharing rooms
    /// through NATS (see docs/cluster.md); when absent, amble runs alone.
    #[arg(
        long,
        display_order = 39,
        env = "AMBLE_NATS",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub nats: Vec<String>,

    /// NATS credentials file (JWT and NKey seed, `.creds`).
    #[arg(
        long,
        display_order = 40,
        env = "AMBLE_NATS_CREDS_FILE",
        value_name = "PATH"
    )]
    pub nats_creds_file: Option<PathBuf>,

    /// File holding a NATS token (trailing line breaks are not part of it).
    #[arg(
        long,
        display_order = 41,
        env = "AMBLE_NATS_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub nats_token_file: Option<PathBuf>,

    /// NATS user name; the password comes from --nats-password-file.
    #[arg(
        long,
        display_order = 42,
        env = "AMBLE_NATS_USER",
        requires = "nats_password_file"
    )]
    pub nats_user: Option<String>,

    /// File holding the NATS password of --nats-user.
    #[arg(
        long,
        display_order = 43,
        env = "AMBLE_NATS_PASSWORD_FILE",
        value_name = "PATH",
        requires = "nats_user"
    )]
    pub nats_password_file: Option<PathBuf>,

    /// PEM file of certificate authorities to trust for the NATS server.
    #[arg(
        long,
        display_order = 44,
        env = "AMBLE_NATS_TLS_CA_FILE",
        value_name = "PATH"
    )]
    pub nats_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for NATS (mutual TLS); needs --nats-tls-key-file.
    #[arg(
        long,
        display_order = 45,
        env = "AMBLE_NATS_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "nats_tls_key_file"
    )]
    pub nats_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --nats-tls-cert-file.
    #[arg(
        long,
        display_order = 46,
        env = "AMBLE_NATS_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "nats_tls_cert_file"
    )]
    pub nats_tls_key_file: Option<PathBuf>,

    /// Refuse to talk to NATS without TLS. A switch: alone it is on; a
    /// value may be 1/0, yes/no, true/false, on/off.
    #[arg(long, display_order = 47, env = "AMBLE_NATS_REQUIRE_TLS",
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL",
          hide_possible_values = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
          default_missing_value = "true")]
    pub nats_require_tls: bool,

    /// This node's name in the cluster, `[A-Za-z0-9_-]{1,64}`. Default: the
    /// host name's first label, then `-PORT` (the port bound), e.g.
    /// `box-3000`. A node started again under the same name is the same
    /// node in a new incarnation: its previous run's members are removed.
    #[arg(long, display_order = 48, env = "AMBLE_NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,

    /// This node's slot, below --cluster-slots: its member ids are
    /// `index * slots + slot`, so nodes never hand out the same id. Claimed
    /// through NATS at start-up: a slot held by a live node refuses the
    /// start. Default: the node name's trailing number mod the slot count
    /// (else a hash of the name) when no live node holds it, else the
    /// lowest free slot.
    #[arg(long, display_order = 49, env = "AMBLE_NODE_SLOT")]
    pub node_slot: Option<u32>,

    /// Number of node slots; every node of a cluster must use the same.
    #[arg(long, display_order = 50, env = "AMBLE_CLUSTER_SLOTS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cluster_slots: u32,

    /// NATS subject prefix, so several deployments can share one NATS.
    #[arg(long, display_order = 51, env = "AMBLE_CLUSTER_PREFIX", default_value = "amble",
          value_parser = parse_cluster_prefix)]
    pub cluster_prefix: String,

    /// Period of this node's heartbeat to the other nodes, milliseconds.
    #[arg(long, display_order = 52, env = "AMBLE_CLUSTER_HEARTBEAT_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub cluster_heartbeat_ms: u64,

    /// A node not heard from for this long (milliseconds) is down: its
    /// members leave every room with reason SERVER_LOST.
    #[arg(long, display_order = 53, env = "AMBLE_CLUSTER_NODE_TIMEOUT_MS", default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(20..))]
    pub cluster_node_timeout_ms: u64,

    /// How long before each tick (milliseconds) this node publishes its
    /// members' moves, so other nodes can send them in the same tick.
    #[arg(
        long,
        display_order = 54,
        env = "AMBLE_CLUSTER_LEAD_MS",
        default_value_t = 20
    )]
    pub cluster_lead_ms: u32,

    /// How long (milliseconds) a node opening a room waits for the other
    /// nodes' parts of it before it welcomes the joiner.
    #[arg(long, display_order = 55, env = "AMBLE_CLUSTER_SNAPSHOT_TIMEOUT_MS",
          default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cluster_snapshot_timeout_ms: u64,

    /// Messages waiting to be published to NATS, at most; past it they are
    /// dropped and counted (the other nodes repair through full states).
    #[arg(long, display_order = 56, env = "AMBLE_CLUSTER_QUEUE", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(16..))]
    pub cluster_queue: u32,

    /// How long (milliseconds) a node stays subscribed to a room after its
    /// last local member there left, so a page reload does not reopen it.
    #[arg(
        long,
        display_order = 57,
        env = "AMBLE_CLUSTER_ROOM_LINGER_MS",
        default_value_t = 1_000
    )]
    pub cluster_room_linger_ms: u64,

    /// On a graceful stop, how long (milliseconds) the other nodes keep
    /// this node's members in sight after it closed their connections, so
    /// that clients failing over take their places back through another
    /// node (with a resume grace); then this node says goodbye and the rest
    /// leave. 0: goodbye at once.
    #[arg(long, display_order = 140, env = "AMBLE_CLUSTER_DRAIN_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub cluster_drain_ms: u64,
}

/// Checks a `--node-name`: `[A-Za-z0-9_-]{1,64}`.
pub fn parse_node_name(text: &str) -> Result<String, String> {
    if wire::valid_node_name(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
        ))
    }
}

/// Checks a `--cluster-prefix`: one or more NATS tokens of
/// `[A-Za-z0-9_-]`, separated by single dots.
pub fn parse_cluster_prefix(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text.split('.').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        });
    if ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: tokens of A-Z, a-z, 0-9, '_' and '-' separated by single dots, at most 64 characters"
        ))
    }
}

/// The defaults of every cluster flag, hermetic: no `AMBLE_*` variable is
/// read (as `Config::default()`).
impl Default for ClusterConfig {
    fn default() -> Self {
        use clap::FromArgMatches as _;
        let command = <Self as clap::Args>::augment_args(clap::Command::new("amble"))
            .mut_args(|arg| arg.env(None::<&str>));
        command
            .try_get_matches_from(["amble"])
            .and_then(|matches| Self::from_arg_matches(&matches))
            .expect("every default value is valid")
    }
}

/// Why the cluster flags do not fit together.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// `--node-slot` is not below `--cluster-slots`.
    #[error("--node-slot {slot} must be below --cluster-slots {slots}")]
    SlotOutOfRange { slot: u32, slots: u32 },
    /// `--cluster-lead-ms` is not below a non-zero `--tick-ms`.
    #[error("--cluster-lead-ms {lead_ms} must be below --tick-ms {tick_ms}")]
    LeadNotBelowTick { lead_ms: u32, tick_ms: u32 },
}

/// How a cluster node runs: the NATS connection as configured, the node's
/// name and slot resolved (defaults from the host name and the port
/// bound), the periods as durations.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub urls: Vec<String>,
    pub creds_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub require_tls: bool,
    pub node: String,
    /// The slot wanted: `--node-slot`, else derived from the name. The
    /// node claims it through NATS at start-up (`link::claim`), and runs
    /// with the slot claimed.
    pub slot: u32,
    /// Whether `slot` is the operator's `--node-slot` (a clash refuses
    /// the start) rather than the default (a clash takes a free slot).
    pub slot_explicit: bool,
    pub slots: u32,
    pub prefix: String,
    pub heartbeat: Duration,
    pub node_timeout: Duration,
    pub lead: Duration,
    pub snapshot_timeout: Duration,
    pub queue: usize,
    pub linger: Duration,
    /// `--cluster-drain-ms`.
    pub drain: Duration,
}

impl ClusterSettings {
    /// The settings for `config` on `port`, with rooms ticking every
    /// `tick_ms` (`--tick-ms`), or `None` without `--nats`.
    pub fn from_config(
        config: &ClusterConfig,
        tick_ms: u32,
        port: u16,
    ) -> Result<Option<Self>, SettingsError> {
        // Every flag by name, so a new one cannot be left out unseen.
        let ClusterConfig {
            nats,
            nats_creds_file,
            nats_token_file,
            nats_user,
            nats_password_file,
            nats_tls_ca_file,
            nats_tls_cert_file,
            nats_tls_key_file,
            nats_require_tls,
            node_name,
            node_slot,
            cluster_slots,
            cluster_prefix,
            cluster_heartbeat_ms,
            cluster_node_timeout_ms,
            cluster_lead_ms,
            cluster_snapshot_timeout_ms,
            cluster_queue,
            cluster_room_linger_ms,
            cluster_drain_ms,
        } = config;
        if nats.is_empty() {
            return Ok(None);
        }
        let node = match node_name {
            Some(name) => name.clone(),
            None => default_node_name(&host_name(), port),
        };
        let slots = *cluster_slots;
        let slot = match *node_slot {
            Some(slot) if slot < slots => slot,
            Some(slot) => return Err(SettingsError::SlotOutOfRange { slot, slots }),
            None => default_slot(&node, slots),
        };
        if *cluster_lead_ms >= tick_ms && tick_ms > 0 {
            return Err(SettingsError::LeadNotBelowTick {
                lead_ms: *cluster_lead_ms,
                tick_ms,
            });
        }
        Ok(Some(Self {
            urls: nats.clone(),
            creds_file: nats_creds_file.clone(),
            token_file: nats_token_file.clone(),
            user: nats_user.clone(),
            password_file: nats_password_file.clone(),
            tls_ca_file: nats_tls_ca_file.clone(),
            tls_cert_file: nats_tls_cert_file.clone(),
            tls_key_file: nats_tls_key_file.clone(),
            require_tls: *nats_require_tls,
            node,
            slot,
            slot_explicit: node_slot.is_some(),
            slots,
            prefix: cluster_prefix.clone(),
            heartbeat: Duration::from_millis(*cluster_heartbeat_ms),
            node_timeout: Duration::from_millis(*cluster_node_timeout_ms),
            lead: Duration::from_millis(u64::from(*cluster_lead_ms)),
            snapshot_timeout: Duration::from_millis(*cluster_snapshot_timeout_ms),
            queue: *cluster_queue as usize,
            linger: Duration::from_millis(*cluster_room_linger_ms),
            drain: Duration::from_millis(*cluster_drain_ms),
        }))
    }
}

/// This machine's host name, or `amble` when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "amble".to_owned())
}

/// The default node name: the host name's first label, with anything
/// outside `[A-Za-z0-9_-]` made a `-`, then `-PORT`.
pub fn default_node_name(host: &str, port: u16) -> String {
    let label = host.split('.').next().unwrap_or_default();
    let mut name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(wire::MAX_NODE_CHARS - 6)
        .collect();
    if name.is_empty() {
        name.push_str("amble");
    }
    format!("{name}-{port}")
}

/// The default slot: the name's trailing number mod `slots`, else a stable
/// hash (FNV-1a) of the name mod `slots`.
pub fn default_slot(name: &str, slots: u32) -> u32 {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let tail = &name[name.len() - digits..];
    // At most 20 digits are read (the rest cannot change a u64 parse's
    // fit); a longer run falls back to the hash.
    if !tail.is_empty()
        && let Ok(n) = tail.parse::<u64>()
    {
        // The remainder is below `slots`, a u32.
        return (n % u64::from(slots)) as u32;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(slots)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_and_slots() {
        assert_eq!(default_node_name("box.example.org", 3000), "box-3000");
        assert_eq!(default_node_name("we ird!", 3001), "we-ird--3001");
        assert_eq!(default_node_name("", 80), "amble-80");
        assert!(wire::valid_node_name(&default_node_name(
            &"x".repeat(300),
            65535
        )));
        assert_eq!(default_slot("amble-1", 16), 1);
        assert_eq!(default_slot("box-3001", 16), 9);
        assert_eq!(default_slot("n17", 16), 1);
        let hashed = default_slot("alpha", 16);
        assert!(hashed < 16);
        assert_eq!(hashed, default_slot("alpha", 16), "stable");
        // A run of digits too long for a u64 falls back to the hash.
        assert!(default_slot(&"9".repeat(40), 16) < 16);
    }

    #[test]
    fn settings_need_nats_and_check_the_slot_and_lead() {
        let mut config = ClusterConfig::default();
        assert!(
            ClusterSettings::from_config(&config, 100, 3000)
                .unwrap()
                .is_none()
        );
        config.nats = vec!["nats://127.0.0.1:4222".into()];
        config.node_name = Some("n3".into());
        let s = ClusterSettings::from_config(&config, 100, 3000)
            .unwrap()
            .unwrap();
        assert_eq!((s.node.as_str(), s.slot, s.slots), ("n3", 3, 16));
        config.node_slot = Some(16);
        let err = ClusterSettings::from_config(&config, 100, 3000).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--node-slot 16 must be below --cluster-slots 16"
        );
        config.node_slot = Some(15);
        config.cluster_lead_ms = 100;
        let err = ClusterSettings::from_config(&config, 100, 3000).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--cluster-lead-ms 100 must be below --tick-ms 100"
        );
        // Moves sent at once (`--tick-ms 0`) have no lead to keep.
        assert!(ClusterSettings::from_config(&config, 0, 3000).is_ok());
    }
}
