//! Where a bench's CPU went, read from `/proc` before and after: each named process's utime and
//! stime (`/proc/<pid>/stat`), the processes this bench ran and waited for (its children's
//! times, `cutime` and `cstime`: the `fleet submit` processes), and the whole machine's busy
//! time (`/proc/stat`), so that what no named process accounts for (Docker's shims and `runc`,
//! the containers, the kernel's own work) is measured as the rest, not guessed.

use fleet_tests::stack::Stack;
use std::collections::BTreeMap;

/// Clock ticks per second of `/proc`'s times (`USER_HZ`, 100 on Linux).
const TICKS: f64 = 100.0;

/// A process's CPU seconds so far (user and system).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_seconds(&stat, 11)
}

/// Two consecutive times of a `/proc/<pid>/stat` line, counted from the field after the
/// command's closing parenthesis: 11 for utime and stime, 13 for cutime and cstime.
fn stat_seconds(stat: &str, first: usize) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks =
        fields.get(first)?.parse::<f64>().ok()? + fields.get(first + 1)?.parse::<f64>().ok()?;
    Some(ticks / TICKS)
}

/// The CPU seconds of this process's children that ended and were waited for.
fn children_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_seconds(&s, 13))
        .unwrap_or(0.0)
}

/// The machine's busy CPU seconds so far, all cores: user, nice, system, irq, softirq and steal
/// from `/proc/stat`'s first line (idle and iowait left out).
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| v.get(i))
        .sum::<f64>()
        / TICKS
}

/// The process's peak resident memory (`VmHWM` in `/proc/<pid>/status`), in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

pub fn pids_of(name: &str) -> Vec<u32> {
    std::process::Command::new("pgrep")
        .args(["-x", name])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The stack's processes and the services' under the names the benches report them by:
/// coordinator, worker, rabbitmq, redis, s3 (moto, which `scripts/provision.sh` starts, and
/// s3s-fs when a bench runs on it, `scripts/lib/s3s.sh`: the idle one adds nothing).
pub fn fleet_processes(stack: &Stack) -> Vec<(String, u32)> {
    let mut processes: Vec<(String, u32)> = Vec::new();
    let coordinators = stack.coordinator_pid().into_iter();
    for pid in coordinators.chain(stack.extra_coordinator_pids()) {
        processes.push(("coordinator".into(), pid));
    }
    for pid in stack.worker_pids() {
        processes.push(("worker".into(), pid));
    }
    let services = [
        ("rabbitmq", "beam.smp"),
        ("redis", "redis-server"),
        ("s3", "moto_server"),
        ("s3", "s3s-fs"),
    ];
    for (name, command) in services {
        for pid in pids_of(command) {
            processes.push((name.into(), pid));
        }
    }
    processes
}

/// Docker's long-lived daemons (the per-container shims and `runc` come and go: they are in
/// the rest).
pub fn docker_processes() -> Vec<(String, u32)> {
    ["dockerd", "containerd"]
        .iter()
        .flat_map(|name| pids_of(name).into_iter().map(|p| ("docker".to_string(), p)))
        .collect()
}

/// CPU seconds of named processes, of this bench's waited children and of the machine, from
/// a start to now.
pub struct CpuMeter {
    processes: Vec<(String, u32)>,
    before: Vec<f64>,
    children: f64,
    machine: f64,
}

impl CpuMeter {
    pub fn start(processes: Vec<(String, u32)>) -> Self {
        let before = processes
            .iter()
            .map(|(_, p)| cpu_seconds(*p).unwrap_or(0.0))
            .collect();
        Self {
            processes,
            before,
            children: children_seconds(),
            machine: machine_busy_seconds(),
        }
    }

    /// CPU seconds since the start by name; with `children_as`, this bench's waited children
    /// under that name, and with `rest`, what the machine spent beyond everything named.
    pub fn seconds(&self, children_as: Option<&str>, rest: Option<&str>) -> BTreeMap<String, f64> {
        let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
        for ((name, pid), b) in self.processes.iter().zip(&self.before) {
            *cpu.entry(name.clone()).or_default() += cpu_seconds(*pid).unwrap_or(*b) - b;
        }
        if let Some(name) = children_as {
            *cpu.entry(name.into()).or_default() += children_seconds() - self.children;
        }
        if let Some(name) = rest {
            let named: f64 = cpu.values().sum();
            let busy = machine_busy_seconds() - self.machine;
            cpu.insert(name.into(), busy - named);
        }
        cpu
    }
}

#[cfg(test)]
mod tests {
    use super::stat_seconds;

    #[test]
    fn times_are_read_after_the_commands_parenthesis() {
        // A command name with spaces and a parenthesis of its own.
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 150 50 30 20 0";
        assert_eq!(stat_seconds(stat, 11), Some(2.0));
        assert_eq!(stat_seconds(stat, 13), Some(0.5));
        assert_eq!(stat_seconds("no parenthesis", 11), None);
    }
}
