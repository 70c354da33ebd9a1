//! The Prometheus client libraries' standard process metrics, read from `/proc/self` when
//! `/metrics` is scraped: CPU time, memory, file descriptors, threads and start time. Where
//! `/proc` cannot be read (not Linux), they are left out.

use std::time::{SystemTime, UNIX_EPOCH};

/// The clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on every Linux
/// architecture tether builds for.
const USER_HZ: f64 = 100.0;

/// Describes the metrics and records the start time; once, before the first scrape.
pub fn describe() {
    use metrics::describe_gauge;
    describe_gauge!("process_cpu_seconds_total", metrics::Unit::Seconds, "User and system CPU time spent.");
    describe_gauge!("process_resident_memory_bytes", metrics::Unit::Bytes, "Resident memory size.");
    describe_gauge!("process_virtual_memory_bytes", metrics::Unit::Bytes, "Virtual memory size.");
    describe_gauge!("process_open_fds", "Open file descriptors.");
    describe_gauge!("process_max_fds", "The most file descriptors the process may open.");
    describe_gauge!("process_threads", "OS threads.");
    describe_gauge!("process_start_time_seconds", metrics::Unit::Seconds, "Start time since the Unix epoch.");
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    metrics::gauge!("process_start_time_seconds").set(started);
}

/// Records what `/proc/self` says now.
pub fn record() {
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some(ticks) = cpu_ticks(&stat)
    {
        // A gauge, for the `metrics` facade's counters are whole numbers; it only ever grows.
        metrics::gauge!("process_cpu_seconds_total").set(ticks as f64 / USER_HZ);
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for (field, name) in [("VmRSS:", "process_resident_memory_bytes"), ("VmSize:", "process_virtual_memory_bytes")]
        {
            if let Some(kib) = status_field(&status, field) {
                metrics::gauge!(name).set(kib as f64 * 1024.0);
            }
        }
        if let Some(threads) = status_field(&status, "Threads:") {
            metrics::gauge!("process_threads").set(threads as f64);
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!("process_open_fds").set(fds.count() as f64);
    }
    if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
        metrics::gauge!("process_max_fds").set(soft as f64);
    }
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in clock ticks. The command name (field 2) is
/// in parentheses and may hold spaces, so fields are counted after its closing one.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    // Fields 3.. follow the name: utime is field 14 and stime 15, the 12th and 13th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The number after `field` in `/proc/<pid>/status` (kB for memory).
fn status_field(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| line.strip_prefix(field))?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (tether (a b)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(325));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn status_fields_are_read_by_name() {
        let status = "Name:\ttether\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\nThreads:\t9\n";
        assert_eq!(status_field(status, "VmRSS:"), Some(2048));
        assert_eq!(status_field(status, "Threads:"), Some(9));
        assert_eq!(status_field(status, "VmSwap:"), None);
    }
}
