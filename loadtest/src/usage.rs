//! What the load tester itself spends, from `/proc/self`: the bots share the
//! machine with the server, so their CPU belongs in the report.

/// Clock ticks per second in `/proc/*/stat` (`USER_HZ`, 100 on every Linux
/// ABI this runs on).
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) this process has used, in seconds.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat_cpu(&stat)
}

fn parse_stat_cpu(stat: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'. utime and stime are fields 14 and 15 of the line, 12th
    // and 13th after the state.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Resident memory of this process, bytes.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The soft limit on open files of this process (the run reads it
    /// through `limits`).
    fn open_files_limit() -> Option<u64> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line.split_whitespace().nth(3)?.parse().ok()
    }

    #[test]
    fn stat_fields() {
        let stat = "1234 (load test (x)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_stat_cpu(stat), Some(3.0));
    }

    #[test]
    fn reads_this_process() {
        assert!(cpu_seconds().is_some());
        assert!(rss_bytes().unwrap() > 0);
        assert!(open_files_limit().unwrap() > 0);
    }
}
