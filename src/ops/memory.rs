//! The memory budget (`--memory-limit`): a workload that does not fit
//! stops the server with a message naming the size it reached, instead of
//! the kernel's OOM killer ending it mid-update with no word.
//!
//! The limit is the flag's value, else the memory limit of the process's
//! own cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`: a container's
//! `resources.limits.memory`). The writer compares the resident size with
//! [`HEADROOM`] of it after every publish; the next build needs room too
//! (it holds the old and the new snapshot of what changed at once).

use std::path::{Path, PathBuf};

/// The share of the limit the resident size may reach.
pub const HEADROOM: f64 = 0.9;

/// The allocator's options (jemalloc's `malloc_conf`, NUL-terminated), which
/// the binary exports for jemalloc to read as it starts; `_RJEM_MALLOC_CONF`
/// in the environment still overrides them. Pages freed and not reused go
/// back to the kernel after 100 ms instead of jemalloc's 10 s: building the
/// first snapshot frees its temporaries while later services are still being
/// built, so the peak at 100,000 services is ~20 MB lower, and the resident
/// size the budget reads is what is in use. One published change costs the
/// same (with 0 ms it cost 40 % more). BENCHMARKS.md, "Fleet scale".
pub const ALLOCATOR_OPTIONS: &[u8; 19] = b"dirty_decay_ms:100\0";

/// Where the limit came from, for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// `--memory-limit`.
    Flag,
    /// The cgroup's limit file.
    Cgroup(PathBuf),
}

/// The limit the server keeps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes.
    pub limit: u64,
    /// Where it came from.
    pub source: LimitSource,
}

/// The resident size passed [`HEADROOM`] of the limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory: {resident_mib} MiB resident with {services} services, over {pct} % of the {limit_mib} MiB limit ({source}): raise it or split the fleet across servers",
    resident_mib = resident / (1 << 20),
    limit_mib = budget.limit / (1 << 20),
    pct = (HEADROOM * 100.0) as u32,
    source = match &budget.source {
        LimitSource::Flag => "--memory-limit".to_owned(),
        LimitSource::Cgroup(p) => format!("cgroup {}", p.display()),
    }
)]
pub struct OverBudget {
    /// Bytes resident.
    pub resident: u64,
    /// Services in the store then.
    pub services: usize,
    /// The budget.
    pub budget: MemoryBudget,
}

impl MemoryBudget {
    /// `Err` when the process's resident size is over [`HEADROOM`] of the
    /// limit; `Ok` also when it cannot be read (no /proc).
    pub fn check(&self, services: usize) -> Result<(), OverBudget> {
        match resident_bytes() {
            Some(resident) if resident as f64 > self.limit as f64 * HEADROOM => {
                Err(OverBudget { resident, services, budget: self.clone() })
            }
            _ => Ok(()),
        }
    }
}

/// `--memory-limit`: `auto` (the cgroup's limit, if any), `none`, or a size
/// in bytes with an optional suffix (`Ki`, `Mi`, `Gi`, `K`, `M`, `G`), as
/// Kubernetes writes quantities.
pub fn parse_limit(value: &str) -> Result<Option<MemoryBudget>, String> {
    match value {
        "auto" => Ok(cgroup_limit()),
        "none" => Ok(None),
        _ => {
            let limit = parse_size(value)?;
            Ok(Some(MemoryBudget { limit, source: LimitSource::Flag }))
        }
    }
}

/// A size such as `512Mi`, `2G` or `1048576`; at least 16 MiB.
fn parse_size(value: &str) -> Result<u64, String> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (digits, suffix) = value.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{value:?}: not a size (bytes, or a number with Ki, Mi, Gi, K, M or G), auto or none"
            ));
        }
    };
    let n: u64 = digits.parse().map_err(|_| format!("{value:?}: not a size"))?;
    let bytes = n.checked_mul(unit).ok_or_else(|| format!("{value:?}: too large"))?;
    if bytes < 16 << 20 {
        return Err(format!("{value:?}: less than 16Mi cannot hold the server"));
    }
    Ok(bytes)
}

/// The resident set size of this process (`VmRSS`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?;
    kib.trim().parse::<u64>().ok().map(|k| k * 1024)
}

/// The memory limit of this process's cgroup, when it has one.
fn cgroup_limit() -> Option<MemoryBudget> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(Path::new("/sys/fs/cgroup"), &cgroups)
}

/// [`cgroup_limit`] with the cgroup file system at `root` and
/// `/proc/self/cgroup`'s text: v2 (`0::/path`, `memory.max`) first, then
/// v1's memory controller (`N:memory:/path`, `memory.limit_in_bytes`, where
/// "no limit" is a huge number).
fn cgroup_limit_in(root: &Path, cgroups: &str) -> Option<MemoryBudget> {
    let read = |file: PathBuf| -> Option<(u64, PathBuf)> {
        let text = std::fs::read_to_string(&file).ok()?;
        let limit = text.trim().parse::<u64>().ok()?; // "max": no limit
        (limit < 1 << 60).then_some((limit, file))
    };
    let rel = |p: &str| p.trim_start_matches('/').to_owned();
    let mut found = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if controllers.is_empty() {
            found = found.or_else(|| read(root.join(rel(path)).join("memory.max")));
        } else if controllers.split(',').any(|c| c == "memory") {
            found = found.or_else(|| read(root.join("memory").join(rel(path)).join("memory.limit_in_bytes")));
        }
    }
    found.map(|(limit, file)| MemoryBudget { limit, source: LimitSource::Cgroup(file) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_options_are_one_c_string_of_known_pairs() {
        let (last, text) = ALLOCATOR_OPTIONS.split_last().expect("not empty");
        assert_eq!(*last, 0, "NUL-terminated");
        let text = std::str::from_utf8(text).expect("ASCII");
        assert!(!text.contains('\0'));
        for pair in text.split(',') {
            let (key, value) = pair.split_once(':').expect("key:value");
            assert!(["dirty_decay_ms", "muzzy_decay_ms", "narenas"].contains(&key), "{key}");
            value.parse::<i64>().expect("a number");
        }
    }

    #[test]
    fn sizes_read_as_kubernetes_writes_them() {
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("67108864"), Ok(64 << 20));
        assert!(parse_size("1Mi").unwrap_err().contains("less than 16Mi"));
        assert!(parse_size("12Pb").unwrap_err().contains("not a size"));
        assert!(parse_size("Mi").is_err());
        assert_eq!(parse_limit("none"), Ok(None));
    }

    #[test]
    fn the_cgroups_limit_is_found_for_v2_and_v1() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = dir.path().join("kubepods/pod1");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "268435456\n").unwrap();
        let b = cgroup_limit_in(dir.path(), "0::/kubepods/pod1\n").unwrap();
        assert_eq!((b.limit, b.source), (256 << 20, LimitSource::Cgroup(v2.join("memory.max"))));
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_in(dir.path(), "0::/kubepods/pod1\n"), None, "max: no limit");
        let v1 = dir.path().join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        let text = "12:pids:/docker/abc\n9:memory:/docker/abc\n0::/\n";
        assert_eq!(cgroup_limit_in(dir.path(), text).map(|b| b.limit), Some(1 << 30));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit_in(dir.path(), text), None, "v1's no-limit value");
    }

    #[test]
    fn over_the_headroom_names_the_size_the_services_and_the_limit() {
        let resident = resident_bytes().expect("/proc/self/status");
        let tight = MemoryBudget { limit: resident / 2, source: LimitSource::Flag };
        let e = tight.check(1234).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("1234 services") && text.contains("--memory-limit"), "{text}");
        assert!(text.contains(&format!("{} MiB resident", e.resident >> 20)), "{text}");
        let roomy = MemoryBudget { limit: resident * 4, source: LimitSource::Flag };
        assert!(roomy.check(1).is_ok());
    }
}
