//! `--objects PATH` sources: a file, or every `.yaml`/`.yml`/`.json` file
//! directly in a directory. Files are watched and re-read on change (and on
//! SIGHUP); a file that fails to parse keeps serving its last good objects,
//! so a half-saved edit never takes answers away.
//!
//! Each file is its own store source ([`SourceId::File`]): the store keeps
//! a file's last good objects, so this module keeps none (at fleet scale a
//! second copy of every object would double the memory), and a file whose
//! bytes did not change is neither parsed nor sent again.
//!
//! With a memory budget, a changed file is weighed by its size before it
//! is read ([`Admit`]). A file refused there, or whose objects the store's
//! writer refused, is read again when the budget asks for its source
//! (`store::Relists`: the store fits again), even if its bytes did not
//! change since.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, mpsc};
use tracing::{error, info, warn};

use super::objects::{self, ParseError};
use crate::model::Interop;
use crate::store::{Relists, SourceId, Update};

/// How long a burst of file events settles before the reload.
const SETTLE: Duration = Duration::from_millis(50);

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The path or a file in it could not be read (the cause is the
    /// source: printed after this by whoever prints the chain).
    #[error("{path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file is not valid Kubernetes objects.
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// Which store source each file of one `--objects` path has. It outlives
/// a restarted watch task ([`FileSource::slots`]), so a file keeps its
/// source, and the objects of a file removed meanwhile are still taken
/// away.
#[derive(Debug, Clone, Default)]
pub struct FileSlots(Arc<std::sync::Mutex<Slots>>);

#[derive(Debug, Default)]
struct Slots {
    of: BTreeMap<PathBuf, SourceId>,
    /// Sources of removed files, for new files to reuse.
    free: Vec<SourceId>,
    next: u32,
}

impl Slots {
    /// The source of `file` of the `index`th `--objects` path: its own, or
    /// one a removed file freed, or a new one.
    fn source_of(&mut self, file: &Path, index: u16) -> SourceId {
        if let Some(source) = self.of.get(file) {
            return *source;
        }
        let source = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            SourceId::File { path: index, file: self.next - 1 }
        });
        self.of.insert(file.to_owned(), source);
        source
    }

    /// Frees the sources of the files not in `listed` (removed), and
    /// returns those files and their sources.
    fn free_gone(&mut self, listed: &[PathBuf]) -> Vec<(PathBuf, SourceId)> {
        let gone: Vec<PathBuf> = self.of.keys().filter(|p| !listed.contains(p)).cloned().collect();
        let freed: Vec<_> = gone.into_iter().filter_map(|p| self.of.remove(&p).map(|s| (p, s))).collect();
        self.free.extend(freed.iter().map(|(_, s)| *s));
        freed
    }
}

/// Logs what a file's parse loaded, skipped and ignored.
fn report_loaded(file: &Path, parsed: &objects::Parsed) {
    for e in &parsed.skipped {
        warn!(file = %file.display(), error = %e, "skipping object");
    }
    if !parsed.ignored.is_empty() {
        let kinds: Vec<String> = parsed.ignored.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        info!(file = %file.display(), "ignoring objects of kinds not served: {}", kinds.join(", "));
    }
    info!(file = %file.display(), objects = parsed.objects.len(), skipped = parsed.skipped.len(), "loaded objects");
}

/// One `--objects` path.
pub struct FileSource {
    /// Which `--objects` path this is (0-based): its files' store sources
    /// are `SourceId::File { path: index, … }`.
    index: u16,
    path: PathBuf,
    /// Digest of each file's bytes last read (good or not).
    digests: BTreeMap<PathBuf, u64>,
    slots: FileSlots,
    /// Which fleet managers' shapes are read (`--interop`).
    interop: Interop,
    /// Weighs a changed file by its size before it is read (the memory
    /// budget); `Err` says why it is not loaded.
    admit: Option<Admit>,
}

/// A file (its store source, its path) and its size in bytes → whether
/// it may be read now, and why not. A file refused is read again once the
/// budget asks for its source, or when it changes; one refused and then
/// removed sends its source's empty state like any removed file.
pub type Admit = std::sync::Arc<dyn Fn(SourceId, &Path, u64) -> Result<(), String> + Send + Sync>;

impl FileSource {
    /// A source for the `index`th `--objects` path (nothing is read yet).
    pub fn new(index: u16, path: PathBuf) -> Self {
        Self::with_slots(index, path, FileSlots::default())
    }

    /// Files changed after the first load are weighed by `admit` before
    /// they are read: one that would not fit the memory budget is not read
    /// (its last good objects stay) until it changes again.
    pub fn with_admit(mut self, admit: Admit) -> Self {
        self.admit = Some(admit);
        self
    }

    /// The same, for a restarted watch: the files keep the sources `slots`
    /// gave them (every file is read again).
    pub fn with_slots(index: u16, path: PathBuf, slots: FileSlots) -> Self {
        Self { index, path, digests: BTreeMap::new(), slots, interop: Interop::NONE, admit: None }
    }

    /// Files of `sources` (this path's) are read again by the next load,
    /// changed or not: the store lacks what it refused of them.
    pub fn forget(&mut self, sources: &BTreeSet<SourceId>) {
        let slots = self.slots.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (path, _) in slots.of.iter().filter(|(_, s)| sources.contains(s)) {
            self.digests.remove(path);
        }
    }

    /// The sources its files have, for [`FileSource::with_slots`].
    pub fn slots(&self) -> FileSlots {
        self.slots.clone()
    }

    /// Reads the fleet managers' shapes `interop` names too.
    pub fn with_interop(mut self, interop: Interop) -> Self {
        self.interop = interop;
        self
    }

    /// The configured path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The files this source reads now: the path itself, or the visible
    /// `.yaml`/`.yml`/`.json` files directly in the directory, sorted.
    pub fn files(&self) -> io::Result<Vec<PathBuf>> {
        if !self.path.is_dir() {
            // Reading it reports a missing file with its path.
            return Ok(vec![self.path.clone()]);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            let path = entry?.path();
            let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            // Kubernetes ConfigMap mounts keep the real files in hidden `..data`
            // directories behind symlinks; the visible names are what count.
            if !hidden && matches!(ext, "yaml" | "yml" | "json") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Reads the source and returns the store updates: the complete objects
    /// of each file that changed, and none for each file that disappeared.
    /// `strict` (the first load) returns the first error; otherwise a
    /// failing file is reported and keeps its last good objects in the
    /// store. Files whose bytes did not change are not parsed again unless
    /// `force`.
    pub fn load(&mut self, strict: bool, force: bool) -> Result<Vec<Update>, LoadError> {
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| LoadError::Io { path, source }
        };
        let mut updates = Vec::new();
        let listed = match self.files() {
            Ok(l) => l,
            Err(e) if !strict => {
                error!(path = %self.path.display(), error = %e, "cannot list objects; serving the last good state");
                return Ok(updates);
            }
            Err(e) => return Err(io_err(&self.path)(e)),
        };
        // A poisoned lock means a panic in the few lines below; the table
        // itself is still whole.
        let slots = self.slots.0.clone();
        let mut slots = slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (path, source) in slots.free_gone(&listed) {
            self.digests.remove(&path);
            info!(file = %path.display(), "file removed: its objects are gone");
            updates.push(Update::Replace { source, objects: Vec::new() });
        }
        for file in listed {
            // The digest is read in pieces first: an unchanged file (every
            // event in its directory, the watch's first pass) costs no copy
            // of its text.
            let known = self.digests.get(&file).copied();
            if !force && known.is_some() && digest_of_file(&file).ok() == known {
                continue;
            }
            // The file's source before it is weighed, so that a refusal
            // names the source the budget asks to list again.
            let source = slots.source_of(&file, self.index);
            if !strict
                && let Some(admit) = &self.admit
                && let Ok(meta) = std::fs::metadata(&file)
                && let Err(why) = admit(source, &file, meta.len())
            {
                error!(file = %file.display(), bytes = meta.len(), error = %why, "objects file not loaded");
                continue;
            }
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) if strict => return Err(io_err(&file)(e)),
                Err(e) => {
                    error!(file = %file.display(), error = %e, "cannot read objects; serving its last good state");
                    continue;
                }
            };
            let digest = digest(text.as_bytes());
            if !force && known == Some(digest) {
                continue;
            }
            let parsed = objects::parse_with(&text, &file.display().to_string(), self.interop);
            drop(text);
            // Remember the digest even of broken bytes, so they are reported once.
            self.digests.insert(file.clone(), digest);
            match parsed {
                Ok(parsed) => {
                    report_loaded(&file, &parsed);
                    updates.push(Update::Replace { source, objects: parsed.objects });
                }
                Err(e) if strict => return Err(e.into()),
                Err(e) => error!(file = %file.display(), error = %e, "serving the file's last good state"),
            }
        }
        Ok(updates)
    }

    /// What to watch: a directory itself, or a file's directory (editors and
    /// ConfigMap updates replace files by renaming, which a watch on the
    /// file itself would miss).
    fn watch_target(&self) -> PathBuf {
        if self.path.is_dir() {
            return self.path.clone();
        }
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        }
    }
}

/// The pieces a file's bytes are digested in: [`digest`] and
/// [`digest_of_file`] feed the hasher the same pieces, so their digests of
/// the same bytes agree.
const PIECE: usize = 256 * 1024;

/// A digest of a file's bytes, to skip re-reading a file that did not change.
/// foldhash's quality hasher with a fixed seed: several times faster than
/// std's SipHash over a large file (a serial step at start-up; 2.5 % of its
/// instructions at 10,000 services). Not a cryptographic digest, and it
/// need not be: the file is the operator's own, nobody picks its versions
/// to collide.
fn digest(bytes: &[u8]) -> u64 {
    let mut h = digester();
    for piece in bytes.chunks(PIECE) {
        h.write(piece);
    }
    h.finish()
}

fn digester() -> impl Hasher {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x636c_7573_7465_7273).build_hasher()
}

/// [`digest`] of a file's bytes, read in pieces.
fn digest_of_file(path: &Path) -> io::Result<u64> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut h = digester();
    let mut buf = Vec::with_capacity(PIECE);
    loop {
        // Whole pieces, as `digest` cuts them (a single read may return
        // fewer bytes; `take` + `read_to_end` fills the piece).
        buf.clear();
        let n = (&mut file).take(PIECE as u64).read_to_end(&mut buf)?;
        if n > 0 {
            h.write(&buf);
        }
        if n < PIECE {
            return Ok(h.finish());
        }
    }
}

/// [`FileSource::load`] on a blocking thread: reading and parsing a large
/// file takes seconds of CPU that the runtime's two threads must not lose
/// (they answer TCP, /health and watches). A panic there is a panic here.
pub async fn load_blocking(
    mut source: FileSource,
    strict: bool,
    force: bool,
) -> (FileSource, Result<Vec<Update>, LoadError>) {
    let loaded = tokio::task::spawn_blocking(move || {
        let result = source.load(strict, force);
        (source, result)
    })
    .await;
    match loaded {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is shutting down, nothing waits for this.
        Err(_) => std::future::pending().await,
    }
}

/// Keeps the sources' files watched and sends a `Replace` for each source
/// after every change; `reload` (SIGHUP) forces a full re-read, and an ask
/// of `relists` for a file's source a re-read of that file.
pub async fn watch(
    mut sources: Vec<FileSource>,
    updates: mpsc::Sender<Update>,
    reload: Arc<Notify>,
    relists: Relists,
) {
    let files = |s: SourceId| matches!(s, SourceId::File { .. });
    // Every file is read below: asks made before are answered by that.
    relists.take(files);
    let changed = Arc::new(Notify::new());
    let signal = changed.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            signal.notify_one();
        }
    });
    let _watcher = match watcher {
        Ok(mut w) => {
            for s in &sources {
                let target = s.watch_target();
                if let Err(e) = w.watch(&target, RecursiveMode::NonRecursive) {
                    warn!(path = %target.display(), error = %e, "cannot watch for changes; send SIGHUP to reload");
                }
            }
            Some(w)
        }
        Err(e) => {
            warn!(error = %e, "file watching unavailable; send SIGHUP to reload");
            None
        }
    };
    // A change between the first load and the watch being armed raised no
    // event: read once more now (unchanged files cost a digest comparison).
    let mut force = false;
    loop {
        tokio::time::sleep(SETTLE).await;
        if force {
            info!("reloading every objects file");
        }
        for s in std::mem::take(&mut sources) {
            // Not strict: errors were logged and the last good state stays.
            let (s, loaded) = load_blocking(s, false, force).await;
            sources.push(s);
            for update in loaded.unwrap_or_default() {
                if updates.send(update).await.is_err() {
                    return; // the store is gone: shutting down
                }
            }
        }
        force = tokio::select! {
            _ = changed.notified() => false,
            _ = reload.notified() => true,
            asked = relists.asked(files) => {
                let asked: BTreeSet<SourceId> = asked.into_iter().collect();
                info!(sources = ?asked, "reading objects files again: the store fits what it refused of them");
                for s in &mut sources {
                    s.forget(&asked);
                }
                false
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMPORT: &str = "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {name: web, namespace: shop}\nspec: {type: Headless}\n";

    /// (source, number of objects) of each `Replace`.
    fn replaced(updates: Vec<Update>) -> Vec<(SourceId, usize)> {
        updates
            .into_iter()
            .map(|u| match u {
                Update::Replace { source, objects } => (source, objects.len()),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_broken_edit_keeps_the_last_good_objects() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, IMPORT).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not objects").unwrap();
        let mut src = FileSource::new(0, dir.path().to_owned());
        assert_eq!(replaced(src.load(true, false).unwrap()), [(SourceId::File { path: 0, file: 0 }, 1)]);
        // Unchanged: nothing is sent again.
        assert!(src.load(false, false).unwrap().is_empty());
        std::fs::write(&file, "kind: [broken").unwrap();
        assert!(src.load(false, false).unwrap().is_empty(), "the store keeps the last good objects");
        assert!(src.load(true, true).is_err(), "a strict load reports the broken file");
        std::fs::write(&file, IMPORT.replace("web", "api")).unwrap();
        assert_eq!(replaced(src.load(false, false).unwrap()), [(SourceId::File { path: 0, file: 0 }, 1)]);
    }

    #[test]
    fn a_removed_file_takes_its_objects_away() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), IMPORT).unwrap();
        std::fs::write(dir.path().join("b.yml"), IMPORT.replace("web", "api")).unwrap();
        let mut src = FileSource::new(2, dir.path().to_owned());
        let (a, b) = (SourceId::File { path: 2, file: 0 }, SourceId::File { path: 2, file: 1 });
        assert_eq!(replaced(src.load(true, false).unwrap()), [(a, 1), (b, 1)]);
        std::fs::remove_file(dir.path().join("b.yml")).unwrap();
        assert_eq!(replaced(src.load(false, false).unwrap()), [(b, 0)]);
        // A new file reuses the freed source.
        std::fs::write(dir.path().join("c.json"), IMPORT.replace("web", "db")).unwrap();
        assert_eq!(replaced(src.load(false, false).unwrap()), [(b, 1)]);
        // A restarted watch keeps every file's source, and takes away the
        // objects of a file removed while it was not running.
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let mut restarted = FileSource::with_slots(2, dir.path().to_owned(), src.slots());
        assert_eq!(replaced(restarted.load(false, false).unwrap()), [(a, 0), (b, 1)]);
    }

    #[test]
    fn a_file_whose_source_the_budget_asks_for_is_read_again_unchanged() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, IMPORT).unwrap();
        std::fs::write(dir.path().join("b.yaml"), IMPORT.replace("web", "api")).unwrap();
        let refuse = Arc::new(AtomicBool::new(false));
        let weighed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (r, w) = (refuse.clone(), weighed.clone());
        let admit: Admit = Arc::new(move |source, _: &Path, _| {
            w.lock().unwrap().push(source);
            if r.load(Ordering::Relaxed) { Err("no room".into()) } else { Ok(()) }
        });
        let mut src = FileSource::new(0, dir.path().to_owned()).with_admit(admit);
        let (a, b) = (SourceId::File { path: 0, file: 0 }, SourceId::File { path: 0, file: 1 });
        assert_eq!(replaced(src.load(true, false).unwrap()), [(a, 1), (b, 1)]);
        assert!(weighed.lock().unwrap().is_empty(), "the first load is not weighed: it must fit whole");
        // Refused before it is read: nothing sent, its source named.
        refuse.store(true, Ordering::Relaxed);
        std::fs::write(&file, IMPORT.replace("web", "db")).unwrap();
        assert!(src.load(false, false).unwrap().is_empty());
        assert_eq!(*weighed.lock().unwrap(), [a]);
        refuse.store(false, Ordering::Relaxed);
        assert_eq!(replaced(src.load(false, false).unwrap()), [(a, 1)]);
        // Read, but (say) its objects refused by the store's writer: an
        // unchanged file is not read again, unless its source is asked for.
        assert!(src.load(false, false).unwrap().is_empty());
        src.forget(&BTreeSet::from([a]));
        assert_eq!(replaced(src.load(false, false).unwrap()), [(a, 1)]);
        assert!(src.load(false, false).unwrap().is_empty());
    }

    #[test]
    fn a_missing_path_fails_the_first_load_with_its_name() {
        let mut src = FileSource::new(0, PathBuf::from("/nonexistent/objects.yaml"));
        let e = src.load(true, false).unwrap_err();
        // The path here, the cause once, as the error's source.
        assert_eq!(e.to_string(), "/nonexistent/objects.yaml");
        let cause = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
        assert!(cause.contains("No such file"), "{cause}");
    }

    #[test]
    fn the_digest_read_in_pieces_is_the_digest_of_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.yaml");
        let text = IMPORT.repeat(20_000); // more than one piece
        std::fs::write(&file, &text).unwrap();
        assert_eq!(digest_of_file(&file).unwrap(), digest(text.as_bytes()));
    }
}
