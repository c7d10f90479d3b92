//! Tidy: conventions of `src/` that the compiler does not check, checked by
//! reading the source (as rust-analyzer's `tidy.rs` does).
//!
//! - Data flows one way: a module imports only the modules [`LAYERS`] allows
//!   it. The table is the one place the direction is written down;
//!   ARCHITECTURE.md shows the same table.
//! - Every file opens with a `//!` doc comment saying what it is for.
//! - The repository stands alone: no file names a path outside it.
//! - ARCHITECTURE.md stays a map: at most [`ARCHITECTURE_MAX_BYTES`], and
//!   every path it names exists.
//! - Functions stay under [`FUNCTION_MAX_LINES`]; those over it today are
//!   listed in [`LONG_FUNCTIONS`], a list that only shrinks.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every top-level module of the library and the modules it may import
/// (through `crate::…`). A module may always use its own submodules.
/// Command roots (the entries with [`ANY`]) compose the others.
const LAYERS: &[(&str, &[&str])] = &[
    // The domain, no I/O.
    ("model", &[]),
    // Task names, caught-panic counters, test-only fault points: a leaf
    // every layer that runs tasks may count into.
    ("fault", &[]),
    // Backoff with jitter and the token bucket: a leaf for every layer that
    // retries or paces itself.
    ("pace", &[]),
    // Metric families read at scrape time, each declared with its reader:
    // a leaf for every layer that keeps counters.
    ("scrape", &[]),
    // The answering side: store → answer → wire.
    ("store", &["model"]),
    ("answer", &["model", "store"]),
    ("wire", &["model", "store", "answer", "fault"]),
    // Talking to API servers; knows the model (it converts into it), nothing
    // above; a watch that catches a panic reads its text with `fault`.
    ("k8s", &["model", "pace", "fault"]),
    // The multi-cluster model and member watches, shared by centralized serve and sync.
    ("fleet", &["model", "k8s"]),
    // Hub mode's records: a member's exports published on the hub, read back
    // as the member's objects.
    ("hub", &["model", "k8s", "fleet"]),
    // Everything that feeds the store (centralized mode through `fleet`).
    ("source", &["model", "store", "k8s", "fleet"]),
    // Active probes: read the store, feed it updates like a source.
    ("health", &["model", "store", "pace"]),
    // The sync controller: writes Kubernetes objects, never touches the store;
    // its watches, probes and discoveries run in a supervised set.
    ("controller", &["model", "k8s", "fleet", "pace", "scrape", "fault", "supervise", "hub"]),
    // `doctor`: reads members (list only), asks DNS, judges by the fleet's rules.
    ("diagnose", &["model", "k8s", "fleet"]),
    // `setup-dns`: reads and edits the cluster DNS's configuration, asks DNS.
    ("cluster_dns", &["k8s", "pace"]),
    // HTTP endpoints and metrics: read the store, the answer path and watch health.
    ("ops", &["model", "store", "answer", "wire", "k8s", "source", "fault", "scrape"]),
    // Restarts or fails tasks; used by the command roots.
    ("supervise", &["fault", "pace"]),
    // The command line: parses values straight into the types they
    // configure (networks, cluster ids, answer policies, list modes, …), so
    // each has one parser and one definition; nothing it imports imports it.
    ("cli", &["model", "k8s", "ops", "controller", "diagnose", "cluster_dns"]),
    // Command roots.
    ("config", ANY),
    ("cmd", ANY),
    ("lib", ANY),
    ("main", ANY),
];

/// Marks a command root: it may import every module.
const ANY: &[&str] = &["*"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/store/writer.rs` → `store`.
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).expect("file under src/");
    let first = rel.components().next().expect("non-empty path");
    first.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// The text without comments, so doc links and prose do not count as imports.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module named right after `crate::`, in `use` trees
/// (`crate::{a::x, b}`) and paths (`crate::a::f()`) alike.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `clusterset_dns::` is not `crate::`; an identifier before it means another path.
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

/// The first segment of each item of a `{…}` use group (the text after `{`).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item_start = true,
            c if at_item_start && !c.is_whitespace() => {
                heads.push(ident(&group[i..]));
                at_item_start = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

fn allowed(module: &str) -> &'static [&'static str] {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, allowed)| *allowed).unwrap_or_else(|| {
        panic!("module `{module}` is not in tests/tidy.rs LAYERS: add it with what it may import")
    })
}

#[test]
fn modules_import_only_what_their_layer_allows() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let module = module_of(file);
        let allowed = allowed(&module);
        if allowed == ANY {
            continue;
        }
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for import in crate_imports(&code_of(&text)) {
            if import != module && !allowed.contains(&import.as_str()) {
                problems.push(format!(
                    "{}: `{module}` imports `crate::{import}`; it may import only {allowed:?}",
                    file.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "imports against the direction (tests/tidy.rs LAYERS):\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_source_file_opens_with_a_doc_comment() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let missing: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            !text.trim_start().starts_with("//!")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a `//!` doc comment on top:\n{}", missing.join("\n"));
}

#[test]
fn the_import_reader_sees_groups_paths_and_not_comments() {
    let code = code_of(
        "use crate::store::{Object, Update};\nuse crate::{model::ServiceKey,\n    k8s::{watch, mcs}};\nlet x = crate::wire::respond();\n// crate::ops is prose\nuse clusterset_dns::serve;\n",
    );
    let found: Vec<String> = crate_imports(&code).into_iter().collect();
    assert_eq!(found, ["k8s", "model", "store", "wire"]);
}

#[test]
fn every_module_of_the_library_has_a_layer() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    for m in &modules {
        allowed(m);
    }
    for (m, _) in LAYERS {
        assert!(modules.contains(*m), "tests/tidy.rs LAYERS names `{m}`, which src/ does not have");
    }
}

/// Every `[dependencies]` entry of Cargo.toml is named in ARCHITECTURE.md's
/// "Dependencies and why" table: a crate added without saying why fails.
#[test]
fn every_dependency_is_named_in_the_architecture_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let deps: Vec<&str> = cargo
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .expect("[dependencies]")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
        .filter(|k| !k.is_empty())
        .collect();
    assert!(deps.len() > 10, "read {deps:?}");
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let table = arch.split("## Dependencies and why").nth(1).expect("the table's section");
    let table = table.split("\n## ").next().unwrap_or(table);
    let named: BTreeSet<&str> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('|').nth(1))
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .collect();
    let missing: Vec<&&str> = deps.iter().filter(|d| !named.contains(**d)).collect();
    assert!(missing.is_empty(), "in Cargo.toml but not in ARCHITECTURE.md's table: {missing:?}");
}
/// No source file over 900 lines: a module that large has more than one job.
#[test]
fn no_source_file_is_over_900_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > 900).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}

/// The longest a function may be: past it, a name for each part says more
/// than the comments inside one.
const FUNCTION_MAX_LINES: usize = 80;

/// Functions over [`FUNCTION_MAX_LINES`] today, to be split (file under
/// `src/`, function). The list only shrinks: a new long function fails, and
/// so does a listed one that got short enough to leave the list.
const LONG_FUNCTIONS: &[(&str, &str)] = &[
    ("answer.rs", "find"),
    ("answer/select.rs", "choose"),
    ("cmd/serve.rs", "start_in"),
    ("config/serve.rs", "from_args"),
];

/// The text with line comments dropped and every string and char literal
/// emptied (their braces do not count; a `//` in a string is no comment).
fn without_literals(code: &str) -> String {
    let (b, mut out, mut i) = (code.as_bytes(), String::with_capacity(code.len()), 0);
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i + 1 < b.len() && b[i + 1] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                // A raw string's `r#` was copied already; skip to the quote
                // that closes it (escapes only matter in plain strings).
                let raw = out.ends_with('r') || out.ends_with('#');
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && !raw {
                        i += 1;
                    }
                    if b[i.min(b.len() - 1)] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => {
                out.push_str("' '");
                i += 2;
            }
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                let end = code[i + 2..].find('\'').map_or(b.len() - 1, |e| i + 2 + e);
                out.push_str("' '");
                i = end;
            }
            c => out.push(c as char),
        }
        i += 1;
    }
    out
}

/// Functions of `code` and their length in lines, up to the first
/// `#[cfg(test)]` (unit tests are not held to it).
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let code = without_literals(code);
    let lines: Vec<&str> = code.lines().take_while(|l| l.trim() != "#[cfg(test)]").collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else { continue };
        let before_ok = words[..at]
            .iter()
            .all(|w| w.starts_with("pub") || ["async", "const", "unsafe", "extern", "\"\""].contains(w));
        let Some(name) = words.get(at + 1).filter(|_| before_ok) else { continue };
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // The body is the first brace outside the parameters' parentheses
        // (a parameter may destructure a struct: `Targets { addrs, .. }: Targets`).
        let (mut depth, mut parens) = (0usize, 0usize);
        let mut end = None;
        'lines: for (k, l) in lines.iter().enumerate().skip(start) {
            for c in l.chars() {
                match c {
                    '(' if depth == 0 => parens += 1,
                    ')' if depth == 0 => parens = parens.saturating_sub(1),
                    ';' if depth == 0 && parens == 0 => break 'lines,
                    '{' if depth == 0 && parens > 0 => {}
                    '}' if depth == 0 && parens > 0 => {}
                    '{' => depth += 1,
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            end = Some(k);
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            found.push((name, end - start + 1));
        }
    }
    found
}

#[test]
fn functions_stay_short_and_the_long_list_only_shrinks() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long = BTreeSet::new();
    for f in files.iter().filter(|f| f.file_name().is_some_and(|n| n != "tests.rs")) {
        let rel = f.strip_prefix(src()).unwrap_or(f).to_string_lossy().replace('\\', "/");
        for (name, n) in function_lengths(&std::fs::read_to_string(f).unwrap_or_default()) {
            if n > FUNCTION_MAX_LINES {
                long.insert((rel.clone(), name));
            }
        }
    }
    let listed: BTreeSet<(String, String)> =
        LONG_FUNCTIONS.iter().map(|(f, n)| ((*f).to_owned(), (*n).to_owned())).collect();
    let new: Vec<_> = long.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&long).collect();
    assert!(new.is_empty(), "over {FUNCTION_MAX_LINES} lines: split these: {new:?}");
    assert!(gone.is_empty(), "short enough now: take these off LONG_FUNCTIONS: {gone:?}");
}

#[test]
fn the_function_reader_counts_bodies_not_braces_in_strings() {
    let code = "pub(crate) async fn a(P { x }: P) -> u8 {\n    let s = \"{ http://x\";\n    let c = '}';\n    x\n}\nfn b();\n// fn c() {\nfn d() { 1 }\n#[cfg(test)]\nfn e() {\n}\n";
    assert_eq!(function_lengths(code), vec![("a".to_owned(), 5), ("d".to_owned(), 1)]);
}

/// Absolute paths into one machine's home or workspace: a fresh clone on
/// another machine has none of them. System paths (`/proc`, `/etc`, `/tmp`)
/// and `~/.cache/…` directories the repository's own scripts fill are fine.
const MACHINE_ROOTS: &[&str] = &["/work/", "/home/", "/root/", "/Users/"];

/// Paths outside the checkout that are meant so, with the reason.
const OUTSIDE_ON_PURPOSE: &[(&str, &str, &str)] = &[
    (
        "deploy/README.md",
        "../clusterset-dns/deploy/base",
        "a user's own kustomization, beside a clone of this repository",
    ),
    ("scripts/image.sh", "/home/nonroot", "the home directory in the image's /etc/passwd"),
];

/// The repository's files: those git tracks, or every file but the ignored
/// build directories where there is no git (a source archive).
fn repository_files(root: &Path) -> Vec<PathBuf> {
    let git = std::process::Command::new("git").args(["ls-files", "-z"]).current_dir(root).output();
    if let Some(out) = git.ok().filter(|o| o.status.success()) {
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .collect();
    }
    let ignored = ignored_roots(root);
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            let rel = path.strip_prefix(root).expect("under the root");
            if rel == Path::new(".git") || ignored.iter().any(|i| rel == i) {
                continue;
            }
            if path.is_dir() { todo.push(path) } else { out.push(path) }
        }
    }
    out
}

/// `.gitignore`'s rooted entries (`/target`): build output, not sources.
fn ignored_roots(root: &Path) -> Vec<PathBuf> {
    fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix('/'))
        .map(PathBuf::from)
        .collect()
}

/// `path` with `.` and `..` resolved by name; `None` when it climbs above
/// the filesystem root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_.@/+-~".contains(&b)
}

/// The relative paths in `text` that climb (`../x`), and path joins that
/// climb (`"..", "..", "x"` as Python's `os.path.join` or TOML's
/// `path = ".."` write them), as written.
fn climbing_paths(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = i == 0 || !is_path_byte(b[i - 1]);
        if starts && b[i..].starts_with(b"../") {
            let end = (i..b.len()).find(|&j| !is_path_byte(b[j])).unwrap_or(b.len());
            found.push(text[i..end].to_owned());
            i = end;
        } else if b[i..].starts_with(b"\"..\"") {
            // A join: quoted parts separated by commas.
            let mut parts = Vec::new();
            let mut j = i;
            while let Some(rest) = text.get(j..).and_then(|r| r.strip_prefix('"')) {
                let Some(len) = rest.find('"') else { break };
                parts.push(&rest[..len]);
                j += len + 2;
                let after = text[j..].trim_start();
                match after.strip_prefix(',') {
                    Some(next) => j = text.len() - next.trim_start().len(),
                    None => break,
                }
            }
            found.push(parts.join("/"));
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// Nothing in the repository points outside it: no relative path climbs out
/// of the checkout (read from the file's directory, or from the root where
/// prose names a path from there), and no absolute path names a machine's
/// home or workspace. What a clone needs must be in the clone.
#[test]
fn no_file_refers_to_a_path_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ignored = ignored_roots(root);
    let on_purpose =
        |file: &str, path: &str| OUTSIDE_ON_PURPOSE.iter().any(|(f, p, _)| *f == file && path.starts_with(p));
    let mut outside = Vec::new();
    for file in repository_files(root) {
        let rel = file.strip_prefix(root).expect("under the root").to_string_lossy().into_owned();
        if rel == "tests/tidy.rs" {
            continue; // the patterns themselves
        }
        let Ok(text) = fs::read_to_string(&file) else { continue }; // binary
        let dir = file.parent().expect("a file has a directory");
        for path in climbing_paths(&text) {
            let inside =
                |p: Option<PathBuf>| p.and_then(|p| p.strip_prefix(root).ok().map(Path::to_path_buf));
            let from_file = inside(normalize(&dir.join(&path)));
            // Written from the file's directory, it must stay inside and
            // name something there (or under an ignored build directory);
            // else it may be prose naming a path from the root.
            let found = from_file.as_ref().is_some_and(|p| {
                let first = p.components().next().map(|c| PathBuf::from(c.as_os_str()));
                root.join(p).exists() || first.is_some_and(|f| ignored.contains(&f))
            });
            let from_root = inside(normalize(&root.join(&path)));
            if !found && (from_file.is_none() || from_root.is_none()) && !on_purpose(&rel, &path) {
                outside.push(format!("{rel}: {path}"));
            }
        }
        for (at, _) in text.match_indices('/') {
            let rest = &text[at..];
            let starts = at == 0 || !is_path_byte(text.as_bytes()[at - 1]);
            if let Some(machine) = MACHINE_ROOTS.iter().find(|m| starts && rest.starts_with(**m)) {
                let end = rest.bytes().position(|b| !is_path_byte(b)).unwrap_or(rest.len());
                if !on_purpose(&rel, &rest[..end]) {
                    outside.push(format!("{rel}: {} (under {machine})", &rest[..end]));
                }
            }
        }
    }
    assert!(
        outside.is_empty(),
        "paths outside the repository (bring what they name in):\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_outside_path_reader_sees_climbs_and_joins() {
    let text = "see ../shared/docs/x.md and .../source-cluster; \
                os.path.join(HERE, \"..\", \"..\", \"shared\", \"gen.py\"); path = \"..\"";
    assert_eq!(climbing_paths(text), ["../shared/docs/x.md", "../../shared/gen.py", ".."]);
    assert_eq!(normalize(Path::new("/a/b/../../../c")), None);
    assert_eq!(normalize(Path::new("/a/b/../c")), Some(PathBuf::from("/a/c")));
}

/// ARCHITECTURE.md is a map that names things and leaves the detail to the
/// `//!` docs of what it names; past this size it has become a second copy
/// of them (it was 63 KB when this limit was set).
const ARCHITECTURE_MAX_BYTES: usize = 25_000;

#[test]
fn the_architecture_stays_a_short_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let arch = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    assert!(
        arch.len() <= ARCHITECTURE_MAX_BYTES,
        "ARCHITECTURE.md is {} bytes, over {ARCHITECTURE_MAX_BYTES}: move detail into the `//!` docs of \
         the modules it names instead of adding it here",
        arch.len()
    );
}

/// Folders of the repository whose paths ARCHITECTURE.md names from the root.
const ROOTS: &[&str] =
    &["src/", "tests/", "benches/", "docs/", "scripts/", "deploy/", "charts/", "fuzz/", "zones/"];

/// A code span that names a file or folder: a Rust file, a folder (`x/`),
/// or anything under one of [`ROOTS`].
fn is_path(token: &str) -> bool {
    !token.is_empty()
        && !token.starts_with(['/', '.'])
        && token.chars().all(|c| c.is_ascii_alphanumeric() || "_-./*".contains(c))
        && (token.ends_with(".rs") || token.ends_with('/') || ROOTS.iter().any(|r| token.starts_with(r)))
}

/// The paths ARCHITECTURE.md names, each with the folders it may be read
/// from: the root, `src/`, and, under a `###` heading that names
/// `src/x.rs` or `src/x/`, the folder `src/x` (so `client.rs` under
/// `src/k8s/` is `src/k8s/client.rs`). Paths are code spans, and in prose
/// words that start with one of [`ROOTS`]; fenced blocks are diagrams.
fn architecture_paths(text: &str) -> Vec<(Vec<String>, String)> {
    let plain = vec![String::new(), "src".to_owned()];
    let mut bases = plain.clone();
    let mut found = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let spans: Vec<&str> = line.split('`').skip(1).step_by(2).collect();
        if line.starts_with("## ") {
            bases = plain.clone();
        } else if line.starts_with("### ") {
            bases = plain.clone();
            for s in spans.iter().filter(|s| s.starts_with("src/")) {
                bases.push(s.trim_end_matches('/').trim_end_matches(".rs").to_owned());
            }
        }
        for span in spans.iter().filter(|s| is_path(s)) {
            found.push((bases.clone(), (*span).to_owned()));
        }
        for prose in line.split('`').step_by(2) {
            for word in prose.split(|c: char| !(c.is_ascii_alphanumeric() || "_-./*".contains(c))) {
                let word = word.trim_end_matches(['.', ',']);
                if ROOTS.iter().any(|r| word.starts_with(r)) {
                    found.push((vec![String::new()], word.to_owned()));
                }
            }
        }
    }
    found
}

/// Whether `path` (a `*` matching any part of one name) exists under `base`.
fn exists_under(root: &Path, base: &str, path: &str) -> bool {
    let full = root.join(base).join(path.trim_end_matches('/'));
    let Some((head, tail)) = path.split_once('*') else { return full.exists() };
    let (dir, prefix) = match head.rsplit_once('/') {
        Some((d, p)) => (root.join(base).join(d), p),
        None => (root.join(base), head),
    };
    fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.len() >= prefix.len() + tail.len() && name.starts_with(prefix) && name.ends_with(tail)
    })
}

#[test]
fn every_path_the_architecture_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let arch = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named = architecture_paths(&arch);
    assert!(named.len() > 50, "read only {} paths: {named:?}", named.len());
    let missing: Vec<String> = named
        .iter()
        .filter(|(bases, path)| !bases.iter().any(|b| exists_under(root, b, path)))
        .map(|(bases, path)| format!("{path} (looked under {bases:?})"))
        .collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn the_architecture_path_reader_reads_sections_spans_and_prose() {
    let text = "## Code map\n\n### `src/k8s/`\n\nclients (`client.rs`, `protobuf/`), see docs/sync.md.\n\
                ```\n `diagram.rs`\n```\n`k8s::fence` and `--flag` are not paths; `tests/it/sync*.rs` is.\n\
                ## Invariants\n\n`supervise.rs`\n";
    let found = architecture_paths(text);
    let plain = vec![String::new(), "src".to_owned()];
    let k8s = vec![String::new(), "src".to_owned(), "src/k8s".to_owned()];
    assert_eq!(
        found,
        [
            (k8s.clone(), "src/k8s/".to_owned()),
            (k8s.clone(), "client.rs".to_owned()),
            (k8s.clone(), "protobuf/".to_owned()),
            (vec![String::new()], "docs/sync.md".to_owned()),
            (k8s, "tests/it/sync*.rs".to_owned()),
            (plain, "supervise.rs".to_owned()),
        ]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(exists_under(root, "src/k8s", "client.rs"));
    assert!(exists_under(root, "", "tests/it/sync*.rs"));
    assert!(!exists_under(root, "src/k8s", "no_such_file.rs"));
    assert!(!exists_under(root, "", "tests/it/nothing*.rs"));
}
