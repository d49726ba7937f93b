//! Open files: every bot holds one socket, so a process runs at most as
//! many bots as it may open files. The load tester raises its soft limit to
//! the hard limit at start ([`raise`]), sizes itself against what it got
//! (the default `--processes`), and when even that is too small says what
//! to do, with the numbers ([`advice`]).

use std::io;

use rlimit::Resource;

/// Open files a process needs besides its bots' sockets (the runtime, the
/// metrics scrape, stdio, pipes to children).
pub const RESERVE: u64 = 64;

/// The open-file limits of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// What this process may open now.
    pub soft: u64,
    /// What an unprivileged process may raise its soft limit to.
    pub hard: u64,
}

impl OpenFiles {
    /// Bots one process can run within the soft limit.
    pub fn bots(&self) -> u64 {
        self.soft.saturating_sub(RESERVE)
    }
}

/// The limits now.
pub fn current() -> Option<OpenFiles> {
    let (soft, hard) = Resource::NOFILE.get().ok()?;
    Some(OpenFiles { soft, hard })
}

/// Raises the soft limit to the hard limit (once is enough: children
/// inherit it) and returns the limits it leaves.
pub fn raise() -> Option<OpenFiles> {
    let before = current()?;
    if before.soft < before.hard
        && let Err(err) = rlimit::increase_nofile_limit(before.hard)
    {
        // An unlimited hard limit cannot be the soft limit of open files
        // on Linux: the kernel's own ceiling is.
        let _ = raise_to_kernel_ceiling(err);
    }
    current()
}

fn raise_to_kernel_ceiling(err: io::Error) -> io::Result<u64> {
    let ceiling: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or(err)?;
    rlimit::increase_nofile_limit(ceiling)
}

/// What to do when `bots` bots in one process need more files than
/// `files` allows: the numbers, the `ulimit -n` to run, and
/// `--processes` when spreading the rooms over processes helps
/// (`processes`: the smallest count that fits, if any).
pub fn advice(bots: u64, files: OpenFiles, processes: Option<u32>, room_size: u32) -> String {
    let need = bots + RESERVE;
    let mut text = format!(
        "{bots} bots in one process need about {need} open files (one socket each, plus \
         {RESERVE}), but a process here may open at most {} (hard limit {}). Either:\n  \
         - raise the limit in the shell that starts the load tester: `ulimit -n {need}`",
        files.soft, files.hard
    );
    if need > files.hard {
        text.push_str(&format!(
            " (above the hard limit of {} this needs root, or a higher `nofile` in \
             /etc/security/limits.conf; in Docker, `--ulimit nofile={need}`)",
            files.hard
        ));
    }
    match processes {
        Some(n) => text.push_str(&format!(
            ", or\n  - pass --processes {n} to spread the rooms over {n} processes"
        )),
        None => text.push_str(&format!(
            ", or\n  - use smaller rooms: a room's {room_size} bots always run in one process \
             (--room-size, or --rooms with more rooms)"
        )),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit() {
        let files = raise().expect("limits readable");
        assert!(files.soft >= 1 && files.soft <= files.hard);
        // Raised as far as the kernel allows: soft equals hard unless the
        // hard limit is above the kernel's ceiling.
        let ceiling: Option<u64> = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        assert!(
            files.soft == files.hard || ceiling.is_some_and(|c| files.soft == c),
            "{files:?}"
        );
    }

    #[test]
    fn advice_gives_the_numbers_and_both_ways() {
        let files = OpenFiles {
            soft: 1_024,
            hard: 1_024,
        };
        let text = advice(1_000, files, Some(2), 30);
        assert!(text.contains("about 1064 open files"), "{text}");
        assert!(text.contains("at most 1024 (hard limit 1024)"), "{text}");
        assert!(text.contains("`ulimit -n 1064`"), "{text}");
        assert!(text.contains("needs root"), "{text}");
        assert!(text.contains("--processes 2"), "{text}");

        // Under the hard limit: ulimit alone will do; no root needed.
        let files = OpenFiles {
            soft: 512,
            hard: 4_096,
        };
        let text = advice(1_000, files, None, 1_000);
        assert!(
            text.contains("`ulimit -n 1064`") && !text.contains("root"),
            "{text}"
        );
        assert!(text.contains("smaller rooms"), "{text}");
        assert!(!text.contains("--processes"), "{text}");
    }
}
