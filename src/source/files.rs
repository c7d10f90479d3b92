//! `--objects PATH` sources: a file, or every `.yaml`/`.yml`/`.json` file
//! directly in a directory. Files are watched and re-read on change (and on
//! SIGHUP); a file that fails to parse keeps serving its last good objects,
//! so a half-saved edit never takes answers away.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, mpsc};
use tracing::{error, info, warn};

use super::objects::{self, ParseError};
use crate::model::Interop;
use crate::store::{Object, SourceId, Update};

/// How long a burst of file events settles before the reload.
const SETTLE: Duration = Duration::from_millis(50);

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The path or a file in it could not be read.
    #[error("{path}: {source}")]
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

struct FileState {
    digest: u64,
    objects: Vec<Object>,
}

/// One `--objects` path.
pub struct FileSource {
    /// The store's name for this source.
    pub id: SourceId,
    path: PathBuf,
    /// Last good state of each file.
    files: BTreeMap<PathBuf, FileState>,
    /// Which fleet managers' shapes are read (`--interop`).
    interop: Interop,
}

impl FileSource {
    /// A source for `path` (nothing is read yet).
    pub fn new(id: SourceId, path: PathBuf) -> Self {
        Self { id, path, files: BTreeMap::new(), interop: Interop::NONE }
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

    /// Reads the source. `strict` (the first load) returns the first error;
    /// otherwise a failing file is reported and keeps its last good objects,
    /// and a file that disappeared takes its objects with it. Files whose
    /// bytes did not change are not parsed again unless `force`.
    pub fn load(&mut self, strict: bool, force: bool) -> Result<Vec<Object>, LoadError> {
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| LoadError::Io { path, source }
        };
        let listed = match self.files() {
            Ok(l) => l,
            Err(e) if !strict => {
                error!(path = %self.path.display(), error = %e, "cannot list objects; serving the last good state");
                return Ok(self.objects());
            }
            Err(e) => return Err(io_err(&self.path)(e)),
        };
        self.files.retain(|p, _| listed.contains(p));
        for file in listed {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) if strict => return Err(io_err(&file)(e)),
                Err(e) => {
                    error!(file = %file.display(), error = %e, "cannot read objects; serving its last good state");
                    continue;
                }
            };
            let digest = digest(&text);
            if !force && self.files.get(&file).is_some_and(|s| s.digest == digest) {
                continue;
            }
            match objects::parse_with(&text, &file.display().to_string(), self.interop) {
                Ok(parsed) => {
                    for e in &parsed.skipped {
                        warn!(file = %file.display(), "skipping object: {e}");
                    }
                    if !parsed.ignored.is_empty() {
                        let kinds: Vec<String> =
                            parsed.ignored.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
                        info!(file = %file.display(), "ignoring objects of kinds not served: {}", kinds.join(", "));
                    }
                    info!(file = %file.display(), objects = parsed.objects.len(), skipped = parsed.skipped.len(), "loaded objects");
                    self.files.insert(file, FileState { digest, objects: parsed.objects });
                }
                Err(e) if strict => return Err(e.into()),
                Err(e) => {
                    error!("{e}; serving the file's last good state");
                    // Remember the digest so the same broken bytes are reported once.
                    if let Some(state) = self.files.get_mut(&file) {
                        state.digest = digest;
                    } else {
                        self.files.insert(file, FileState { digest, objects: Vec::new() });
                    }
                }
            }
        }
        Ok(self.objects())
    }

    fn objects(&self) -> Vec<Object> {
        self.files.values().flat_map(|s| s.objects.iter().cloned()).collect()
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

fn digest(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Keeps the sources' files watched and sends a `Replace` for each source
/// after every change; `reload` (SIGHUP) forces a full re-read.
pub async fn watch(mut sources: Vec<FileSource>, updates: mpsc::Sender<Update>, reload: Arc<Notify>) {
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
        for s in &mut sources {
            // Not strict: errors were logged and the last good state stays.
            let Ok(objects) = s.load(false, force) else {
                continue;
            };
            if updates.send(Update::Replace { source: s.id, objects }).await.is_err() {
                return; // the store is gone: shutting down
            }
        }
        force = tokio::select! {
            _ = changed.notified() => false,
            _ = reload.notified() => true,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMPORT: &str = "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {name: web, namespace: shop}\nspec: {type: Headless}\n";

    #[test]
    fn a_broken_edit_keeps_the_last_good_objects() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, IMPORT).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not objects").unwrap();
        let mut src = FileSource::new(SourceId(1), dir.path().to_owned());
        assert_eq!(src.load(true, false).unwrap().len(), 1);
        std::fs::write(&file, "kind: [broken").unwrap();
        assert_eq!(src.load(false, false).unwrap().len(), 1);
        assert!(src.load(true, true).is_err(), "a strict load reports the broken file");
    }

    #[test]
    fn a_removed_file_takes_its_objects_away() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), IMPORT).unwrap();
        std::fs::write(dir.path().join("b.yml"), IMPORT.replace("web", "api")).unwrap();
        let mut src = FileSource::new(SourceId(1), dir.path().to_owned());
        assert_eq!(src.load(true, false).unwrap().len(), 2);
        std::fs::remove_file(dir.path().join("b.yml")).unwrap();
        assert_eq!(src.load(false, false).unwrap().len(), 1);
    }

    #[test]
    fn a_missing_path_fails_the_first_load_with_its_name() {
        let mut src = FileSource::new(SourceId(1), PathBuf::from("/nonexistent/objects.yaml"));
        let e = src.load(true, false).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/objects.yaml: "), "{e}");
    }
}
