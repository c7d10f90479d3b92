//! `setup-dns --watch`: keeps the wiring. A check every `--interval`, and
//! at once when one of the ConfigMaps it writes into changes (a watch per
//! name), reads and plans as `setup-dns` does, lets
//! `cluster_dns::repair` decide (write again, report, back off), and
//! proves the result through the cluster DNS. The state is the metric
//! `clusterset_dns_wiring_ok{layout}`, an Event on the ConfigMap when it
//! changes, and the log; `/health`, `/ready` and `/metrics` are served as
//! `sync` serves them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ::kube::runtime::events::{Event, EventType, Recorder, Reporter};
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::ObjectReference;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{BoxError, verify_at, want};
use crate::cluster_dns::plan::{self, Edit};
use crate::cluster_dns::repair::{Action, Found, Repairs};
use crate::cluster_dns::verify::{self, Outcome};
use crate::cluster_dns::{kube, plan::Change};
use crate::cmd::Process;
use crate::config::{SetupDnsConfig, WatchConfig};
use crate::fault::{Faults, Task};
use crate::ops::http::Endpoints;
use crate::supervise::Supervisor;

/// The Events' reporting controller.
const CONTROLLER: &str = "clusterset-dns-setup-dns";

/// The metric's layout when none is recognised.
const UNKNOWN: &str = "unknown";

/// What `/metrics` shows.
struct Gauges {
    ok: IntGaugeVec,
    rewrites: IntCounterVec,
    /// The layout shown: a cluster has one, so a series of another goes.
    shown: Option<String>,
}

impl Gauges {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let ok = IntGaugeVec::new(
            Opts::new(
                "clusterset_dns_wiring_ok",
                "1 while setup-dns --watch finds the cluster DNS wired to clusterset-dns (in the layout named) and the proof query answered through it; 0 when the wiring is missing or rewritten and not (yet) repaired, the proof failed, or the layout cannot be wired this way (the Event on the ConfigMap and the log say which).",
            ),
            &["layout"],
        )?;
        let rewrites = IntCounterVec::new(
            Opts::new(
                "clusterset_dns_wiring_rewrites_total",
                "Times setup-dns --watch found its wiring removed or rewritten by someone else (repaired or only reported).",
            ),
            &["layout"],
        )?;
        registry.register(Box::new(ok.clone()))?;
        registry.register(Box::new(rewrites.clone()))?;
        Ok(Self { ok, rewrites, shown: None })
    }

    fn set(&mut self, layout: &str, ok: bool) {
        if let Some(old) = self.shown.take().filter(|o| o != layout) {
            let _ = self.ok.remove_label_values(&[old.as_str()]);
        }
        self.shown = Some(layout.to_owned());
        self.ok.with_label_values(&[layout]).set(i64::from(ok));
    }
}

/// Everything a check needs, kept across checks.
struct Checker<'a> {
    cfg: &'a SetupDnsConfig,
    w: &'a WatchConfig,
    client: ::kube::Client,
    want: plan::Want,
    proof: Name,
    decide: Repairs,
    recorder: Recorder,
    gauges: Gauges,
    /// The last Event published (reason and note), so a state is told
    /// once, not at every check.
    told: Option<(String, String)>,
}

/// Runs checks until SIGTERM or SIGINT.
pub(super) async fn run(
    cfg: &SetupDnsConfig,
    w: &WatchConfig,
    client: ::kube::Client,
    server: SocketAddr,
) -> Result<(), BoxError> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let process = Process::new()?;
    let gauges = Gauges::new(&process.registry)?;
    let listener = tokio::net::TcpListener::bind(w.http_listen).await?;
    info!(addr = %listener.local_addr()?, "HTTP /health /ready /metrics");
    let ready = Arc::new(AtomicBool::new(false));
    // `/ready`: once the first check is done.
    let first = ready.clone();
    // A task of its own, not a branch of the loop's select: a check can take
    // up to an interval, and /health must answer meanwhile. Its death is
    // fatal, and ends the loop below.
    let sup = Supervisor::new(process.failures.clone());
    // No fault points: setup-dns's configuration reads no CLUSTERSET_DNS_FAULT.
    let endpoints =
        Endpoints::new(process.registry.clone(), process.failures.clone(), Faults::default(), move || {
            (!first.load(Ordering::Relaxed)).then(|| "the first check is not done".to_owned())
        });
    let _http = sup.fatal(Task::Http, endpoints.serve(listener));
    let reporter = Reporter {
        controller: CONTROLLER.into(),
        instance: std::env::var("POD_NAME").ok().or_else(|| std::env::var("HOSTNAME").ok()),
    };
    let mut checker = Checker {
        cfg,
        w,
        recorder: Recorder::new(client.clone(), reporter),
        want: want(cfg, server),
        proof: Name::from_ascii(format!("dns-version.{}.", cfg.zone))?,
        decide: Repairs::new(w.mode),
        client,
        gauges,
        told: None,
    };
    // Changes of the ConfigMaps we write into wake the loop; a small
    // buffer is enough, as one check covers every change before it.
    let (tx, mut changed) = mpsc::channel(8);
    let watched = checker.client.clone();
    let follow = kube::follow(&watched, tx);
    tokio::pin!(follow);
    info!(mode = ?w.mode, interval_seconds = w.interval.as_secs(), zone = %cfg.zone, "watching the cluster DNS wiring");
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            reason = process.failures.wait_fatal() => return Err(reason.to_owned().into()),
            () = &mut follow => return Err("the ConfigMap watches stopped".into()),
            () = tokio::time::sleep_until(next) => {}
            Some(name) = changed.recv() => {
                // Everything that changed meanwhile is covered by this check.
                while changed.try_recv().is_ok() {}
                tracing::debug!(configmap = %name, "changed: checking now");
            }
        }
        checker.check().await;
        ready.store(true, Ordering::Relaxed);
        next = tokio::time::Instant::now() + w.interval;
    }
}

/// `kube-system/<name> <key>`, or the OpenShift object: what a change is to.
fn object(edit: &Edit) -> String {
    match edit {
        Edit::ConfigMapKey { name, key, .. } => format!("{}/{name} {key}", kube::NS),
        Edit::OpenShiftServers(_) => "dns.operator.openshift.io/default spec.servers".into(),
    }
}

/// The ConfigMap a change is to, if it is one.
fn configmap(edit: &Edit) -> Option<&'static str> {
    match edit {
        Edit::ConfigMapKey { name, .. } => Some(name),
        Edit::OpenShiftServers(_) => None,
    }
}

/// What changed, for people: each object, removed or rewritten, and by
/// whom when `managedFields` says.
fn what_changed(changes: &[Change], writers: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for c in changes {
        // Our edit only adds lines when the wiring was taken out whole.
        let removed = !c.diff.lines().any(|l| l.starts_with('-') && !l.starts_with("---"));
        let _ = write!(
            out,
            "{}{}: the clusterset-dns wiring was {}",
            if out.is_empty() { "" } else { "; " },
            object(&c.edit),
            if removed { "removed" } else { "rewritten" },
        );
        if let Some(w) = configmap(&c.edit).and_then(|n| writers.get(n)) {
            let _ = write!(out, " (last written by field manager {w:?})");
        }
    }
    out
}

/// What a check found in `read` and its `planned` edits: wired, drifted
/// (with the changes that wire it again) or not wireable (why); and the
/// object its Events are about.
fn findings(
    read: &kube::Read,
    planned: Result<plan::Plan, plan::Unrecognised>,
    want: &plan::Want,
) -> (Found, Vec<Change>, ObjectReference) {
    let first_cm = |names: &[&str]| names.iter().find_map(|n| read.references.get(*n).cloned());
    let (found, changes, about) = match planned {
        Err(e) => (
            Found::Unwireable(format!(
                "the Pods' DNS cannot be changed this way: {e}\n(For names in cluster.local instead, see `serve --also-zone cluster.local` and Corefile.example's cluster.local block.)"
            )),
            Vec::new(),
            None,
        ),
        Ok(p) if p.manual.is_some() => (
            Found::Unwireable(p.manual.unwrap_or_default()),
            Vec::new(),
            read.references.get("rke2-coredns-rke2-coredns").cloned(),
        ),
        Ok(p) => match plan::nodelocal_unwired(read.nodelocal_daemonset, &read.observed, want) {
            Some(why) => (Found::Unwireable(why), Vec::new(), first_cm(&["coredns"])),
            None if p.changes.is_empty() => (Found::Wired, p.changes, None),
            None => {
                let objects = p.changes.iter().map(|c| object(&c.edit)).collect();
                let about =
                    first_cm(&p.changes.iter().filter_map(|c| configmap(&c.edit)).collect::<Vec<_>>());
                (Found::Drift(objects), p.changes, about)
            }
        },
    };
    let about =
        about.or_else(|| first_cm(&kube::WRITABLE)).unwrap_or_else(|| kube::reference("coredns", None));
    (found, changes, about)
}

impl Checker<'_> {
    /// One check: read, plan, decide, act, prove, report.
    async fn check(&mut self) {
        let read = match kube::read(&self.client).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "cannot read the cluster DNS configuration; checking again later");
                return;
            }
        };
        let planned = plan::plan(&read.observed, &self.want);
        let layout = planned.as_ref().map_or(UNKNOWN, |p| p.layout.label());
        let (found, changes, about) = findings(&read, planned, &self.want);
        let changed = what_changed(&changes, &read.last_writer);
        match self.decide.decide(&found, Instant::now()) {
            Action::Ok => self.prove(layout, &about, None).await,
            Action::Write { repair } => {
                if repair {
                    self.gauges.rewrites.with_label_values(&[layout]).inc();
                }
                if self.write(layout, &read, &changes).await {
                    let note = if repair {
                        info!(layout, changed = %changed, "re-applied the wiring");
                        ("Reapplied", format!("{changed}; re-applied"))
                    } else {
                        info!(layout, "wired the cluster DNS");
                        (
                            "Wired",
                            format!("wired {} to clusterset-dns at {}", self.want.zone, self.want.upstream),
                        )
                    };
                    self.prove(layout, &about, Some(note)).await;
                }
            }
            Action::Report => {
                self.gauges.rewrites.with_label_values(&[layout]).inc();
                self.gauges.set(layout, false);
                warn!(layout, changed = %changed, "the wiring changed; not re-applied (--watch=report)");
                self.tell(
                    &about,
                    EventType::Warning,
                    "WiringChanged",
                    format!("{changed}; not re-applied (--watch=report)"),
                )
                .await;
            }
            Action::BackOff { objects, until, new } => {
                self.gauges.set(layout, false);
                if new {
                    self.gauges.rewrites.with_label_values(&[layout]).inc();
                }
                let wait = until.saturating_duration_since(Instant::now()).as_secs();
                let who = read.last_writer.values().next().map_or("another controller".to_owned(), |w| {
                    format!("another controller (field manager {w:?})")
                });
                let note = format!(
                    "{who} keeps rewriting {}: rewritten again after 3 repairs in 10 minutes; not re-applying for {wait} s. Configure the wiring through that controller, or stop it. Now: {changed}",
                    objects.join(", ")
                );
                if new {
                    warn!(layout, retry_in_seconds = wait, "{note}");
                }
                self.tell(&about, EventType::Warning, "RewrittenByAnotherController", note).await;
            }
            Action::Unwireable(why) => {
                self.gauges.set(layout, false);
                if self.told.as_ref().is_none_or(|(r, n)| r != "CannotWire" || *n != why) {
                    warn!(layout, "{why}");
                }
                self.tell(&about, EventType::Warning, "CannotWire", why).await;
            }
        }
    }

    /// Writes `changes`; false (and the wiring not ok) when a write failed.
    async fn write(&mut self, layout: &str, read: &kube::Read, changes: &[Change]) -> bool {
        for c in changes {
            if let Err(e) = kube::write(&self.client, read, &c.edit).await {
                // A conflict is someone writing at the same time: their
                // change wakes the next check.
                warn!(error = %e, "writing the wiring failed; checking again");
                self.gauges.set(layout, false);
                return false;
            }
        }
        self.decide.written();
        true
    }

    /// Asks the proof query through the cluster DNS (at most the interval
    /// long) and records the result; `done`: what was just written.
    async fn prove(&mut self, layout: &str, about: &ObjectReference, done: Option<(&str, String)>) {
        let outcome = if self.cfg.verify {
            let at = match verify_at(self.cfg, &self.client).await {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "cannot find where to prove the wiring");
                    self.gauges.set(layout, false);
                    return;
                }
            };
            let patience = self.w.interval.min(self.cfg.verify_timeout).max(Duration::from_secs(1));
            Some((at, verify::until_answered(at, &self.proof, patience).await.0))
        } else {
            None
        };
        let proven = match &outcome {
            None => true,
            Some((_, o)) => matches!(o, Outcome::Answered(_)),
        };
        self.gauges.set(layout, proven);
        let said = match &outcome {
            None => "not proven (--no-verify)".to_owned(),
            Some((at, Outcome::Answered(t))) => format!("proven: {} TXT \"{t}\" through {at}", self.proof),
            Some((at, o)) => format!("not proven: {} through {at}: {o:?}", self.proof),
        };
        if let Some((reason, note)) = done {
            self.tell(about, EventType::Normal, reason, format!("{note}; {said}")).await;
        } else if proven {
            self.tell(about, EventType::Normal, "WiringProven", said).await;
        } else {
            warn!(layout, "{said}");
            self.tell(about, EventType::Warning, "WiringNotProven", said).await;
        }
    }

    /// Publishes an Event on `about` unless it is the one told last.
    async fn tell(&mut self, about: &ObjectReference, kind: EventType, reason: &str, note: String) {
        if self.told.as_ref().is_some_and(|(r, n)| r == reason && *n == note) {
            return;
        }
        // An Event's note holds at most 1 kB.
        let mut short = note.clone();
        if short.len() > 1000 {
            let mut cut = 1000;
            while !short.is_char_boundary(cut) {
                cut -= 1;
            }
            short.truncate(cut);
        }
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(short),
            action: "Check".into(),
            secondary: None,
        };
        match self.recorder.publish(&event, about).await {
            Ok(()) => self.told = Some((reason.to_owned(), note)),
            Err(e) => warn!(error = %e, reason, "cannot publish the Event"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_changed_says_removed_or_rewritten_and_names_the_writer() {
        let change = |diff: &str| Change {
            edit: Edit::ConfigMapKey { name: "coredns", key: "Corefile", value: None, create: false },
            diff: diff.into(),
        };
        let writers = [("coredns".to_owned(), "kubectl-edit".to_owned())].into();
        let removed = what_changed(&[change("--- a\n+++ a\n@@ line 3 @@\n+x\n")], &writers);
        assert_eq!(
            removed,
            "kube-system/coredns Corefile: the clusterset-dns wiring was removed (last written by field manager \"kubectl-edit\")"
        );
        let rewritten = what_changed(&[change("--- a\n+++ a\n@@ line 3 @@\n-y\n+x\n")], &BTreeMap::new());
        assert_eq!(rewritten, "kube-system/coredns Corefile: the clusterset-dns wiring was rewritten");
    }
}
