//! Side by side with the incumbent, CoreDNS's `multicluster` plugin
//! (coredns/multicluster), which is what most users of this server migrate
//! from.
//!
//! Both servers follow one real kube-apiserver holding the objects of
//! `tests/data/incumbent/fixtures.yaml` and are asked every query of
//! `queries.txt` with `dig`. The incumbent's answers, normalised, are
//! recorded in `incumbent.txt`; every field in which our answer differs is a
//! row of the table in `DIFFERENCES.md`, with the rule of
//! `docs/answers.md` or the MCS specification that our answer follows.
//! The test fails when a difference appears that the table does not list,
//! when a listed one is gone, or when either side of a listed one changed
//! (the table holds both values, exactly or as a digest).
//!
//! `CLUSTERSET_DNS_INCUMBENT=/path/to/coredns` (a CoreDNS built with the
//! plugin) also runs the incumbent on loopback against the same API server
//! and compares its live answers with the recording;
//! `CLUSTERSET_DNS_INCUMBENT_RECORD=1` rewrites the recording from them
//! instead. Without that variable the recording stands for the incumbent,
//! so the comparison runs everywhere, CI included (the plugin is not served
//! by the Go module proxy, so CI cannot build it; `README.md` beside the
//! data says how the recording was made).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::coredns::free_port;
use crate::harness::clusters::shared;
use crate::harness::eventually;
use crate::harness::served::Served;

/// The answer fields compared, in the order they are written.
const FIELDS: [&str; 7] = ["status", "flags", "edns", "question", "answer", "authority", "additional"];
/// Options every query gets before its own arguments.
const BASE_ARGS: [&str; 5] = ["+norec", "+nocookie", "+ignore", "+time=2", "+tries=1"];
/// The namespaces of the fixture.
const NAMESPACES: [&str; 3] = ["inc-a", "inc-b", "inc-empty"];
/// Which cluster of `harness::clusters::shared()` holds the fixture.
const CLUSTER: usize = 2;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/incumbent").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(data(name)).unwrap_or_else(|e| panic!("read {}: {e}", data(name).display()))
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn our_answers_differ_from_the_incumbent_only_where_documented() {
    let queries = queries();
    let recorded = parse_recording(&read("incumbent.txt"));
    let clusters = shared();
    apply_fixture(&clusters.kubeconfig(CLUSTER));

    // Stored order, as the incumbent answers: the default rotation changes
    // which records a truncated answer keeps from one query to the next
    // (any subset is valid), which a recording cannot pin.
    let mut args = vec![
        "--kubeconfig".to_owned(),
        path_str(&clusters.serve_kubeconfig(CLUSTER)),
        "--answer-policy".to_owned(),
        "all".to_owned(),
    ];
    for ns in NAMESPACES {
        args.extend(["--namespace".to_owned(), ns.to_owned()]);
    }
    let s = Served::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    eventually("ready", || s.get("/ready").0 == 200);
    wait_for_fixture(s.addr, "our server");
    let ours = ask_all(s.addr, &queries);
    // A reply without QR is not a DNS server's answer: another process
    // shares the port (see `free_port`), and the comparison would blame us.
    for (id, a) in &ours {
        let flags = a.field("flags").first().map_or("", String::as_str);
        assert!(
            a.field("status").first().is_some_and(|s| s == "no reply") || flags.split(' ').any(|f| f == "qr"),
            "{id}: the reply from {} is not a response (flags `{flags}`): another process answers on its port",
            s.addr
        );
    }

    let incumbent = match std::env::var_os("CLUSTERSET_DNS_INCUMBENT") {
        Some(bin) => {
            let live = Incumbent::start(Path::new(&bin), &clusters.kubeconfig(CLUSTER));
            wait_for_fixture(live.addr, "the incumbent");
            let answers = ask_all(live.addr, &queries);
            if std::env::var_os("CLUSTERSET_DNS_INCUMBENT_RECORD").is_some_and(|v| v == "1") {
                let text = render_recording(&live.version(), &queries, &answers);
                std::fs::write(data("incumbent.txt"), text).expect("write incumbent.txt");
                eprintln!("recorded {} answers of the incumbent into incumbent.txt", answers.len());
            } else {
                let changed = compare_answers(&recorded, &answers);
                assert!(
                    changed.is_empty(),
                    "the live incumbent ({}) no longer answers as recorded in incumbent.txt \
                     (CLUSTERSET_DNS_INCUMBENT_RECORD=1 re-records):\n{}",
                    live.version(),
                    changed.join("\n")
                );
            }
            answers
        }
        None => recorded,
    };

    let found = differences(&queries, &incumbent, &ours);
    let documented = documented_differences();
    let mut problems = Vec::new();
    for (key, (inc, our)) in &found {
        match documented.get(key) {
            None => problems.push(format!("undocumented: {}", row(key, inc, our, "RULE?"))),
            Some(d) if (&d.incumbent, &d.ours) != (inc, our) => problems.push(format!(
                "changed: {}\n    documented: incumbent `{}`, ours `{}`",
                row(key, inc, our, &d.rule),
                d.incumbent,
                d.ours
            )),
            Some(_) => {}
        }
    }
    for (key, d) in &documented {
        if !found.contains_key(key) {
            problems.push(format!("gone (remove the row): {}", row(key, &d.incumbent, &d.ours, &d.rule)));
        }
    }
    eprintln!("{} queries, {} differing fields", queries.len(), found.len());
    assert!(
        problems.is_empty(),
        "our answers and the incumbent's differ other than DIFFERENCES.md says ({} problems):\n{}\n\
         Every difference must follow a rule of docs/answers.md or the MCS specification \
         (else it is our bug to fix).",
        problems.len(),
        problems.join("\n")
    );
}

/// The data files agree with each other without any server running: every
/// query is recorded, nothing else is, and every table row names a query
/// and a field and gives a rule.
#[test]
fn the_incumbent_recording_and_the_table_cover_the_query_set() {
    let queries = queries();
    let ids: BTreeSet<&str> = queries.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids.len(), queries.len(), "query ids are unique");
    let recorded = parse_recording(&read("incumbent.txt"));
    let recorded_ids: BTreeSet<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(recorded_ids, ids, "incumbent.txt records exactly the queries of queries.txt");
    for (id, answer) in &recorded {
        let q = queries.iter().find(|q| &q.id == id).expect("known id");
        assert_eq!(answer.args, q.args, "{id}: recorded with other arguments than queries.txt has");
    }
    let documented = documented_differences();
    assert!(!documented.is_empty(), "DIFFERENCES.md has a table");
    for ((id, field), d) in &documented {
        assert!(ids.contains(id.as_str()), "DIFFERENCES.md: unknown query {id}");
        assert!(FIELDS.contains(&field.as_str()), "DIFFERENCES.md: unknown field {field} ({id})");
        assert!(d.rule.len() > 10, "DIFFERENCES.md: {id} {field} names no rule");
    }
}

// ---------------------------------------------------------------------------
// Queries and answers

struct Query {
    id: String,
    args: Vec<String>,
}

/// `queries.txt`: `id dig-arguments…` per line, `#` comments.
fn queries() -> Vec<Query> {
    read("queries.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_owned);
            let id = words.next().expect("id");
            Query { id, args: words.collect() }
        })
        .collect()
}

/// One normalised reply: per field, its lines (records sorted, SOA serial
/// replaced, whitespace collapsed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Answer {
    args: Vec<String>,
    fields: BTreeMap<String, Vec<String>>,
}

impl Answer {
    fn field(&self, name: &str) -> &[String] {
        self.fields.get(name).map_or(&[], Vec::as_slice)
    }
}

fn ask_all(addr: SocketAddr, queries: &[Query]) -> BTreeMap<String, Answer> {
    queries
        .iter()
        .map(|q| {
            let out = Command::new("dig")
                .arg(format!("@{}", addr.ip()))
                .args(["-p", &addr.port().to_string()])
                .args(BASE_ARGS)
                .args(&q.args)
                .output()
                .expect("dig (apt-get install bind9-dnsutils)");
            let mut a = normalize(&String::from_utf8_lossy(&out.stdout));
            a.args.clone_from(&q.args);
            (q.id.clone(), a)
        })
        .collect()
}

/// dig's output → `Answer`. No reply at all is status `no reply`.
fn normalize(text: &str) -> Answer {
    let mut fields: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let set = |f: &mut BTreeMap<String, Vec<String>>, k: &str, v: String| {
        f.insert(k.to_owned(), vec![v]);
    };
    set(&mut fields, "status", "no reply".into());
    let mut section = String::new();
    for line in text.lines() {
        let words = || line.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(rest) = line.strip_prefix(";; ->>HEADER<<-") {
            // A later reply (none with the options used) replaces an earlier one.
            fields.clear();
            let status = rest.split("status: ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("?");
            set(&mut fields, "status", status.to_owned());
            set(&mut fields, "edns", "none".into());
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            set(&mut fields, "flags", rest.split(';').next().unwrap_or_default().trim().to_owned());
        } else if line == ";; OPT PSEUDOSECTION:" {
            section = "opt".into();
            fields.remove("edns");
        } else if let Some(title) = line.strip_prefix(";; ").and_then(|l| l.strip_suffix(" SECTION:")) {
            section = title.to_lowercase();
        } else if line.trim().is_empty() {
            section.clear();
        } else if section == "opt" && line.contains(':') {
            // `; EDNS: version: 0, flags:; udp: 1232`, then one line per option;
            // option values (a cookie) vary per query: keep the name and a
            // trailing `(echoed)`/`(good)` note. (Other comments, such as
            // `; Transfer failed.`, may follow without a blank line.)
            let l = line.trim_start_matches(';').trim();
            let v = match l.strip_prefix("EDNS: ") {
                Some(e) => e.to_owned(),
                None => {
                    let name = l.split(':').next().unwrap_or(l);
                    let note = l.rsplit_once('(').map(|(_, n)| format!(" ({n}")).unwrap_or_default();
                    format!("{name}{note}")
                }
            };
            fields.entry("edns".into()).or_default().push(v);
        } else if section == "question" {
            fields.entry("question".into()).or_default().push(words().trim_start_matches(';').to_owned());
        } else if !line.starts_with(';') && ["answer", "authority", "additional"].contains(&section.as_str())
        {
            let mut w: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            if w.get(3).is_some_and(|t| t == "SOA") && w.len() > 6 {
                w[6] = "SERIAL".into();
            }
            fields.entry(section.clone()).or_default().push(w.join(" "));
        }
    }
    for s in ["answer", "authority", "additional"] {
        if let Some(v) = fields.get_mut(s) {
            v.sort();
        }
    }
    Answer { args: Vec::new(), fields }
}

// ---------------------------------------------------------------------------
// The recording

fn render_recording(version: &str, queries: &[Query], answers: &BTreeMap<String, Answer>) -> String {
    let mut out = String::from(
        "# The incumbent's answers to queries.txt on fixtures.yaml, normalised\n\
         # (tests/it/incumbent.rs: records sorted per section, SOA serial replaced).\n\
         # Written by the test with CLUSTERSET_DNS_INCUMBENT_RECORD=1; do not edit.\n",
    );
    let _ = writeln!(out, "# Recorded from: {version}");
    for q in queries {
        let a = &answers[&q.id];
        let _ = writeln!(out, "\n=== {} {}", q.id, q.args.join(" "));
        for f in FIELDS {
            for v in a.field(f) {
                let _ = writeln!(out, "{f}: {v}");
            }
        }
    }
    out
}

fn parse_recording(text: &str) -> BTreeMap<String, Answer> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Answer)> = None;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        if let Some(head) = line.strip_prefix("=== ") {
            if let Some((id, a)) = current.take() {
                out.insert(id, a);
            }
            let mut w = head.split_whitespace().map(str::to_owned);
            let id = w.next().expect("id");
            current = Some((id, Answer { args: w.collect(), fields: BTreeMap::new() }));
        } else {
            let (field, value) = line.split_once(": ").unwrap_or_else(|| (line.trim_end_matches(':'), ""));
            let (_, a) = current.as_mut().unwrap_or_else(|| panic!("incumbent.txt: `{line}` before any ==="));
            assert!(FIELDS.contains(&field), "incumbent.txt: unknown field in `{line}`");
            a.fields.entry(field.to_owned()).or_default().push(value.to_owned());
        }
    }
    if let Some((id, a)) = current {
        out.insert(id, a);
    }
    out
}

/// Live answers against recorded ones: one line per differing field.
fn compare_answers(recorded: &BTreeMap<String, Answer>, live: &BTreeMap<String, Answer>) -> Vec<String> {
    let mut out = Vec::new();
    for (id, a) in live {
        let Some(r) = recorded.get(id) else {
            out.push(format!("{id}: not recorded"));
            continue;
        };
        for f in FIELDS {
            if r.field(f) != a.field(f) {
                out.push(format!("{id} {f}: recorded `{}`, live `{}`", cell(r.field(f)), cell(a.field(f))));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The differences and their table

type Key = (String, String);

/// Every (query, field) whose values differ, with (incumbent, ours) as cells.
fn differences(
    queries: &[Query],
    incumbent: &BTreeMap<String, Answer>,
    ours: &BTreeMap<String, Answer>,
) -> BTreeMap<Key, (String, String)> {
    let mut out = BTreeMap::new();
    for q in queries {
        let inc = incumbent.get(&q.id).unwrap_or_else(|| panic!("no incumbent answer for {}", q.id));
        let our = &ours[&q.id];
        for f in FIELDS {
            if inc.field(f) != our.field(f) {
                out.insert((q.id.clone(), f.to_owned()), (cell(inc.field(f)), cell(our.field(f))));
            }
        }
    }
    out
}

/// A field's lines as one table cell: up to three records as they are, more
/// as a count, the first record and a digest of all.
fn cell(lines: &[String]) -> String {
    match lines.len() {
        0 => "(none)".into(),
        1..=3 => lines.join(" ; "),
        n => {
            // FNV-1a, 32 bits: stable across Rust versions and machines.
            let digest = lines
                .join("\n")
                .bytes()
                .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
            format!("{n} records: {} ; … digest {digest:08x}", lines[0])
        }
    }
}

fn row(key: &Key, incumbent: &str, ours: &str, rule: &str) -> String {
    format!("| `{}` | {} | `{incumbent}` | `{ours}` | {rule} |", key.0, key.1)
}

struct Documented {
    incumbent: String,
    ours: String,
    rule: String,
}

/// The rows of the table in `DIFFERENCES.md`:
/// `| `query` | field | `incumbent` | `ours` | rule |`.
fn documented_differences() -> BTreeMap<Key, Documented> {
    let mut out = BTreeMap::new();
    for line in read("DIFFERENCES.md").lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim().trim_matches('|').split(" | ").map(str::trim).collect();
        let [id, field, incumbent, ours, rule] = cells.as_slice() else {
            panic!("DIFFERENCES.md: a row needs 5 cells: {line}")
        };
        let unquote = |c: &str| c.strip_prefix('`').and_then(|c| c.strip_suffix('`')).unwrap_or(c).to_owned();
        let key = (unquote(id), (*field).to_owned());
        let d = Documented { incumbent: unquote(incumbent), ours: unquote(ours), rule: (*rule).to_owned() };
        assert!(out.insert(key.clone(), d).is_none(), "DIFFERENCES.md: {key:?} twice");
    }
    out
}

// ---------------------------------------------------------------------------
// The cluster and the servers

fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// `kubectl apply --server-side` of the fixture (namespaces first in the file).
fn apply_fixture(kubeconfig: &Path) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "--server-side", "--field-manager", "clusterset-dns-tests", "-f"])
        .arg(data("fixtures.yaml"))
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    assert!(
        out.status.success(),
        "kubectl apply of fixtures.yaml failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `addr` answers the fixture's slowest parts in full (the
/// incumbent serves before its EndpointSlice watch has listed).
fn wait_for_fixture(addr: SocketAddr, who: &str) {
    let count = |name: &str| {
        let out = crate::harness::served::dig(addr, &[name, "A", "+tcp", "+short"]);
        out.lines().filter(|l| !l.trim().is_empty()).count()
    };
    eventually(&format!("{who} serves the fixture"), || {
        count("big.inc-b.svc.clusterset.local") == 100
            && count("db.inc-a.svc.clusterset.local") == 3
            && count("hl.inc-a.svc.clusterset.local") == 3
            && count("vip.inc-a.svc.clusterset.local") == 1
    });
}

/// The incumbent: `multicluster clusterset.local` alone in a server block on
/// 127.0.0.1, following the API server with an admin kubeconfig (it lists
/// Namespaces too, which our serve identity may not). Killed on drop.
struct Incumbent {
    child: Child,
    addr: SocketAddr,
    bin: PathBuf,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Incumbent {
    fn start(bin: &Path, kubeconfig: &Path) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = format!(
            "clusterset.local:{port} {{\n    bind 127.0.0.1\n    multicluster clusterset.local {{\n        \
             kubeconfig {}\n    }}\n}}\n",
            kubeconfig.display()
        );
        let (child, log) = crate::coredns::spawn_coredns(bin, dir.path(), &conf);
        let c = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            bin: bin.to_owned(),
            log,
            _dir: dir,
        };
        let banner = format!("clusterset.local.:{port} on 127.0.0.1");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.log.lock().expect("log lock").contains(&banner) {
            assert!(
                Instant::now() < deadline,
                "the incumbent did not start in 30 s:\n{}\n{conf}",
                c.log.lock().expect("log lock")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// `coredns -version`, on one line.
    fn version(&self) -> String {
        let out = Command::new(&self.bin).arg("-version").output().expect("coredns -version");
        let text = String::from_utf8_lossy(&out.stdout);
        let plugins = Command::new(&self.bin).arg("-plugins").output().expect("coredns -plugins");
        let mc = String::from_utf8_lossy(&plugins.stdout).contains("dns.multicluster");
        format!(
            "{}{}",
            text.split_whitespace().collect::<Vec<_>>().join(" "),
            if mc { " with dns.multicluster" } else { " WITHOUT dns.multicluster" }
        )
    }
}

impl Drop for Incumbent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
