//! The memory budget (`--memory-limit`). A first load that does not fit
//! fails the start with a message naming the size it reached. Once
//! serving, an update that would not fit is refused before it is applied
//! and the last good state keeps being served (`--on-memory-limit
//! keep-serving`, the default): every replica of every cluster gets the
//! same update at once, and exiting on it would take DNS away from the
//! whole fleet, where Knot and NSD keep serving the last good zone when a
//! reload fails.
//!
//! The limit is the flag's value, else the memory limit of the process's
//! own cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`: a container's
//! `resources.limits.memory`). An update is weighed before the memory is
//! spent: an objects file by its size ([`PARSE_BYTES_PER_FILE_BYTE`]), the
//! objects an update adds by their number ([`OBJECT_BYTES`]) and the
//! endpoints of the slices among them ([`ENDPOINT_BYTES`]), against
//! [`HEADROOM`] of the limit less what is resident now. Only growth is
//! weighed: an edit of an object its source holds, and a removal, are
//! always applied, so that an endpoint turning not-ready stops being
//! answered whatever the budget. The writer also compares the resident
//! size with it after every publish.
//!
//! **Nothing refused is lost.** A refused update leaves the store behind
//! its source, and no later change of that source brings back what was
//! refused: the source has *diverged* ([`Guard`] keeps which, and what its
//! refused update needed). `admission.rs` is the writer's side: once the
//! store fits what a diverged source needs (after a publish, or on its own
//! re-weighing every [`admission::RECHECK`] while anything is refused), it
//! asks that source to list again (`store::Relists`). Nothing is refused,
//! and no re-weighing reads the resident size, before the allocator has
//! given back the pages it holds free ([`release_freed_pages`]). Only a complete
//! list of the source admitted by the writer ends its divergence, and
//! `clusterset_dns_memory_over_budget` stays 1 until every diverged source
//! has been listed back in (and while the resident size is over the
//! headroom).

pub mod admission;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::store::SourceId;

/// The share of the limit the resident size may reach.
pub const HEADROOM: f64 = 0.9;

/// Resident bytes one more object (an import or a slice) may take, built
/// into a snapshot while the previous one is still served. The footprint
/// bench counts 2,325 heap bytes per service at 1,000 services (an import
/// and its slices) and `serve` holds 100,000 services (400,000 objects) in
/// 229 MB resident; 4 KiB an object is above both, so a refused update is
/// refused early rather than late. One figure for every kind (no
/// measurement says how much one kind costs beside the others), and
/// [`ENDPOINT_BYTES`] more for each endpoint of a new slice.
pub const OBJECT_BYTES: u64 = 4 << 10;

/// Resident bytes one more endpoint of a new EndpointSlice may take, beside
/// [`OBJECT_BYTES`] for the slice: a slice holds one endpoint or a
/// thousand. The footprint bench counts 4,201 bytes of model and 7,612 of
/// snapshot for a headless service of 40 endpoints (~295 a endpoint), and
/// a 1,000-endpoint slice served headless takes ~280 KiB resident
/// (tests/it/memory_budget.rs); 512 is above both, as [`OBJECT_BYTES`] is.
pub const ENDPOINT_BYTES: u64 = 512;

/// Bytes held at the peak of reading and parsing an objects file, per byte
/// of the file: its text and the objects parsed from it live at once (a
/// 232 MB file peaked 172 MB above the 279 MB it left resident; the
/// objects it becomes are weighed again by the writer).
pub const PARSE_BYTES_PER_FILE_BYTE: u64 = 2;

/// What the server does when an update would not fit (`--on-memory-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMemoryLimit {
    /// Refuse the update, keep serving the last good state, list its
    /// source again once it fits, say so in the log and in
    /// `clusterset_dns_memory_over_budget`.
    KeepServing,
    /// Stop the server (before the kernel's OOM killer does).
    Exit,
}

/// Reads the process's resident size ([`resident_bytes`]; tests give
/// their own).
type Resident = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// The budget as the running server keeps it: the limit, what to do past
/// it, and what is refused now. Shared by the writer, the objects files
/// (weighed before they are read) and the metrics.
pub struct Guard {
    /// The limit.
    pub budget: MemoryBudget,
    /// What to do past it.
    pub on_limit: OnMemoryLimit,
    refusals: Mutex<Refusals>,
    resident: Resident,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("budget", &self.budget).field("on_limit", &self.on_limit).finish()
    }
}

/// What is refused now.
#[derive(Debug, Default)]
struct Refusals {
    /// The resident size was over [`HEADROOM`] at the last weighing.
    resident_over: bool,
    /// The sources that diverged: an update of theirs was refused, and
    /// they have not been listed back in since.
    diverged: BTreeMap<SourceId, Diverged>,
}

/// One diverged source.
#[derive(Debug, Clone, Copy)]
struct Diverged {
    /// Bytes its refused updates needed: it is asked to list again once
    /// they fit.
    needs: u64,
    /// Asked to list again, and that list has not come yet.
    asked: bool,
}

/// An update that would take the process past the budget.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory: {what} needs about {needs_mib} MiB more and {resident_mib} MiB are resident, over {pct} % of the {limit_mib} MiB limit ({source}); refused, the last good state is served and the source is listed again once it fits: raise the limit or split the fleet across servers",
    needs_mib = needs.div_ceil(1 << 20),
    resident_mib = resident / (1 << 20),
    limit_mib = budget.limit / (1 << 20),
    pct = (HEADROOM * 100.0) as u32,
    source = budget.source_name(),
)]
pub struct WouldNotFit {
    /// What was weighed (a file, a source's objects).
    pub what: String,
    /// Bytes it would take.
    pub needs: u64,
    /// Bytes resident then.
    pub resident: u64,
    /// The budget.
    pub budget: MemoryBudget,
}

impl Guard {
    /// The running server's budget.
    pub fn new(budget: MemoryBudget, on_limit: OnMemoryLimit) -> Self {
        Self { budget, on_limit, refusals: Mutex::default(), resident: Box::new(resident_bytes) }
    }

    /// The same, reading the resident size from `resident` instead of
    /// `/proc`: for tests of what the budget decides.
    #[cfg(test)]
    pub(crate) fn with_resident(self, resident: impl Fn() -> Option<u64> + Send + Sync + 'static) -> Self {
        Self { resident: Box::new(resident), ..self }
    }

    /// Bytes resident now; 0 when that cannot be read (no /proc).
    pub fn resident(&self) -> u64 {
        (self.resident)().unwrap_or(0)
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, Refusals> {
        // A poisoned lock means a panic in one of these short methods; the
        // state is whole.
        self.refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `needs` more bytes fit now: `Err` with the resident size
    /// when they would take the process past [`HEADROOM`] of the limit.
    fn fits(&self, needs: u64) -> Result<(), u64> {
        let mut resident = Reading::new(self);
        if resident.fits(needs) { Ok(()) } else { Err(resident.bytes) }
    }

    /// `Err` when `needs` more bytes (`what` names them in the message)
    /// would take the process past [`HEADROOM`] of the limit. Marks nothing.
    pub fn weigh(&self, what: impl FnOnce() -> String, needs: u64) -> Result<(), WouldNotFit> {
        self.fits(needs).map_err(|resident| WouldNotFit {
            what: what(),
            needs,
            resident,
            budget: self.budget.clone(),
        })
    }

    /// An objects file of `source` is weighed by `needs` before it is read:
    /// refused, the source diverged; admitted, whatever diverged it before
    /// is answered by this read (the writer weighs the objects it brings).
    pub fn admit_file(
        &self,
        source: SourceId,
        what: impl FnOnce() -> String,
        needs: u64,
    ) -> Result<(), WouldNotFit> {
        match self.weigh(what, needs) {
            Ok(()) => {
                self.listed(source);
                Ok(())
            }
            Err(e) => {
                self.refused(source, Some(needs), true);
                Err(e)
            }
        }
    }

    /// An update of `source` was refused: it diverged. `needs`: the bytes
    /// the update needed (`None`: the rest of a list cut short, which
    /// needs what its refused part did). `list`: the update was a
    /// complete state (a list, a file read), which answers an ask to list
    /// again. True when the source had not diverged before.
    pub fn refused(&self, source: SourceId, needs: Option<u64>, list: bool) -> bool {
        let mut r = self.refusals();
        let new = !r.diverged.contains_key(&source);
        let d = r.diverged.entry(source).or_insert(Diverged { needs: 0, asked: false });
        match needs {
            // A list brings everything its source holds: its need replaces
            // those of the changes refused before it.
            Some(n) if list => d.needs = n,
            Some(n) => d.needs = d.needs.saturating_add(n),
            None => {}
        }
        if list {
            d.asked = false;
        }
        new
    }

    /// A complete state of `source` was admitted: it is listed back in.
    pub fn listed(&self, source: SourceId) {
        let mut r = self.refusals();
        if r.diverged.remove(&source).is_some() {
            tracing::info!(%source, "listed back in after a refusal of the memory budget");
            if r.diverged.is_empty() && !r.resident_over {
                tracing::info!("every update fits the memory budget again");
            }
        }
    }

    /// Records whether the resident size is over [`HEADROOM`] of the limit;
    /// true when that changed.
    pub fn set_resident_over(&self, over: bool) -> bool {
        let mut r = self.refusals();
        std::mem::replace(&mut r.resident_over, over) != over
    }

    /// The diverged sources not asked yet whose needs fit now, marked as
    /// asked: the writer asks them to list again.
    pub fn due(&self) -> Vec<SourceId> {
        let mut r = self.refusals();
        let mut due = Vec::new();
        // One reading for every source, the allocator asked at most once.
        let mut resident = Reading::new(self);
        for (source, d) in r.diverged.iter_mut().filter(|(_, d)| !d.asked) {
            if resident.fits(d.needs) {
                d.asked = true;
                due.push(*source);
            }
        }
        due
    }

    /// True while anything is refused: the resident size was over the
    /// headroom at the last weighing, or a source diverged and has not
    /// been listed back in (`clusterset_dns_memory_over_budget`).
    pub fn is_over(&self) -> bool {
        let r = self.refusals();
        r.resident_over || !r.diverged.is_empty()
    }

    /// The sources diverged now, for messages and tests.
    pub fn diverged(&self) -> Vec<SourceId> {
        self.refusals().diverged.keys().copied().collect()
    }
}

/// The resident size as one decision reads it: read once, and once more
/// after the allocator gave back what it holds free, the first time
/// something would not fit (not refused for pages that are free and only
/// not given back yet).
struct Reading<'a> {
    guard: &'a Guard,
    bytes: u64,
    released: bool,
}

impl<'a> Reading<'a> {
    fn new(guard: &'a Guard) -> Self {
        Self { guard, bytes: guard.resident(), released: false }
    }

    /// Whether `needs` more bytes stay within [`HEADROOM`] of the limit.
    fn fits(&mut self, needs: u64) -> bool {
        let limit = self.guard.budget.limit as f64 * HEADROOM;
        let over = |bytes: u64| bytes.saturating_add(needs) as f64 > limit;
        if over(self.bytes) && !self.released {
            let _ = release_freed_pages();
            self.released = true;
            self.bytes = self.guard.resident();
        }
        !over(self.bytes)
    }
}

/// The allocator's options (jemalloc's `malloc_conf`, NUL-terminated), which
/// the binary exports for jemalloc to read as it starts; `_RJEM_MALLOC_CONF`
/// in the environment still overrides them. Pages freed and not reused go
/// back to the kernel after 100 ms instead of jemalloc's 10 s: building the
/// first snapshot frees its temporaries while later services are still being
/// built, so the peak at 100,000 services is ~20 MB lower, and the resident
/// size the budget reads is what is in use. One published change costs the
/// same (with 0 ms it cost 40 % more). docs/benchmarks-history.md, "jemalloc,
/// headless SRV per query, and model trims".
pub const ALLOCATOR_OPTIONS: &[u8; 19] = b"dirty_decay_ms:100\0";

/// Gives the pages the allocator holds free back to the kernel now, so that
/// the resident size is what is in use. jemalloc gives them back after
/// [`ALLOCATOR_OPTIONS`]' decay time, but only from inside an allocation
/// or a free: a server that answers without allocating and gets no update
/// keeps what a removal freed resident for as long as it stays quiet, and a
/// refused source would wait for its store to fit until something else
/// allocated. Called before a refusal and on the writer's re-weighing while
/// anything is refused, never per update: purging all at once costs what
/// the decay spreads out. A `serve` whose global allocator is not jemalloc
/// (none is; unit tests) purges jemalloc's empty arenas: nothing. False
/// when jemalloc refused the call (logged at debug).
pub fn release_freed_pages() -> bool {
    // jemalloc's MALLCTL_ARENAS_ALL: every arena.
    const NAME: &[u8] = b"arena.4096.purge\0";
    // SAFETY: `NAME` is NUL-terminated; `arena.<i>.purge` reads and writes
    // nothing (jemalloc refuses it with EPERM unless all four pointers and
    // the length are null), so no memory of ours is touched.
    #[allow(unsafe_code)]
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            NAME.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        tracing::debug!(status, "jemalloc arena.4096.purge failed");
    }
    status == 0
}

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
    source = budget.source_name(),
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
    /// Where the limit came from, for messages.
    pub fn source_name(&self) -> String {
        match &self.source {
            LimitSource::Flag => "--memory-limit".to_owned(),
            LimitSource::Cgroup(p) => format!("cgroup {}", p.display()),
        }
    }

    /// `Err` when the process's resident size is over [`HEADROOM`] of the
    /// limit; `Ok` also when it cannot be read (no /proc).
    pub fn check(&self, services: usize) -> Result<(), OverBudget> {
        self.check_resident(resident_bytes(), services)
    }

    /// [`MemoryBudget::check`] of `resident` bytes (`None`: unknown, `Ok`).
    pub fn check_resident(&self, resident: Option<u64>, services: usize) -> Result<(), OverBudget> {
        match resident {
            Some(resident) if resident as f64 > self.limit as f64 * HEADROOM => {
                Err(OverBudget { resident, services, budget: self.clone() })
            }
            _ => Ok(()),
        }
    }
}

/// The resident set size of this process (`VmRSS`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?;
    kib.trim().parse::<u64>().ok().map(|k| k * 1024)
}

/// The memory limit of this process's cgroup, when it has one
/// (`--memory-limit auto`).
pub fn cgroup_limit() -> Option<MemoryBudget> {
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn jemalloc_takes_the_purge_call() {
        // A wrong name (ENOENT) or a pointer where purge takes none (EPERM)
        // would make every purge a silent no-op.
        assert!(release_freed_pages());
    }

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
    fn an_update_is_weighed_against_what_is_resident_before_it_is_spent() {
        let resident = resident_bytes().expect("/proc/self/status");
        let limit = (resident + (64 << 20)) * 10 / 9;
        let g = Guard::new(MemoryBudget { limit, source: LimitSource::Flag }, OnMemoryLimit::KeepServing);
        assert!(g.weigh(|| "small".into(), 1 << 20).is_ok());
        let e = g.weigh(|| "objects file big.yaml".into(), 256 << 20).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("objects file big.yaml needs about 256 MiB more"), "{text}");
        assert!(text.contains("--memory-limit") && text.contains("listed again once it fits"), "{text}");
        assert!(!g.is_over(), "weighing alone marks nothing");
    }

    #[test]
    fn a_file_refused_before_it_is_read_diverges_until_a_read_is_admitted() {
        let resident = Arc::new(AtomicU64::new(100 << 20));
        let r = resident.clone();
        let g = Guard::new(
            MemoryBudget { limit: 200 << 20, source: LimitSource::Flag },
            OnMemoryLimit::KeepServing,
        )
        .with_resident(move || Some(r.load(Ordering::Relaxed)));
        let file = SourceId::File { path: 0, file: 2 };
        assert!(g.admit_file(file, || "f".into(), 150 << 20).is_err());
        assert!(g.is_over());
        assert_eq!(g.diverged(), [file]);
        // Not yet: 100 + 150 MiB is over 180.
        assert_eq!(g.due(), []);
        resident.store(20 << 20, Ordering::Relaxed);
        assert_eq!(g.due(), [file], "fits now: asked to be read again");
        assert_eq!(g.due(), [], "asked once");
        assert!(g.admit_file(file, || "f".into(), 150 << 20).is_ok());
        assert!(!g.is_over());
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
