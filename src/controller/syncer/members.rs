//! The controller's members: starting their tasks (watches, own watches,
//! probes, discovery), taking in what discovery learns, reading our objects
//! from them, and noticing them unreachable or lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{Done, Inbox, Lead, MemberLost, News, Syncer, Take, UNREACHABLE_AFTER, build_env};
use crate::controller::adopt::adopt;
use crate::controller::api::Kind;
use crate::controller::link::{MemberApis, discovery_health};
use crate::controller::queue::Reason;
use crate::controller::reconcile::{KeyState, now_rfc3339};
use crate::fault::Task;
use crate::k8s::watch::{Reporter, WATCH_BACKOFF, WatchTask, scopes};
use crate::model::ServiceKey;

/// How often a member's MCS versions are asked again once known: a CRD
/// upgraded to serve a newer version is followed.
const REDISCOVER: std::time::Duration = std::time::Duration::from_secs(300);

impl Syncer {
    /// Starts every member's tasks in the loop's [`TaskSet`](crate::supervise::TaskSet):
    /// its watches, the watches of our objects that need no MCS version,
    /// its probe and its discovery. Returns the channels they send on.
    pub(super) fn start_tasks(&mut self) -> Inbox {
        let (tx, events) = mpsc::channel::<crate::fleet::state::MemberEvent>(1024);
        let (own_tx, own) = mpsc::channel(1024);
        let (news_tx, news) = mpsc::channel(64);
        let mut watches = Vec::new();
        for i in 0..self.members.len() {
            let m = self.members[i].clone();
            let ns = &self.behaviour.namespaces;
            for w in m.watches(i, ns, tx.clone()).into_iter().chain(m.own_watches(i, ns, own_tx.clone())) {
                watches.push(w.health.clone());
                self.tasks.spawn(Task::Watch, w.name().to_owned(), w.run);
            }
            let probe = m.probe();
            watches.push(probe.health.clone());
            self.tasks.spawn(Task::Liveness, probe.name().to_owned(), probe.run);
            let discovery = discovery(m, i, news_tx.clone());
            watches.push(discovery.health.clone());
            self.tasks.spawn(Task::Discovery, discovery.name().to_owned(), discovery.run);
        }
        self.watches = watches;
        self.stats.set_watches(&self.watches);
        Inbox { events, own, own_tx, news }
    }

    /// Takes in news from the tasks: a member's MCS versions learned (or
    /// changed) make it writable, start its watches of our ServiceImports
    /// with them (ending those of other versions), and read it whole.
    pub(super) fn news(
        &mut self,
        news: News,
        own_tx: &mpsc::Sender<crate::controller::own::OwnEvent>,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
    ) {
        if let Some(i) = self.learn(news, own_tx) {
            self.read_members(running, scopes, Some(i), &[]);
        }
    }

    /// Takes in news without reading the member (before the loop runs, the
    /// first take of the shards reads every member discovered by then).
    /// Returns the member whose versions were learned or changed.
    pub(super) fn learn(
        &mut self,
        news: News,
        own_tx: &mpsc::Sender<crate::controller::own::OwnEvent>,
    ) -> Option<usize> {
        let News::Discovered(i, apis) = news;
        if self.discovered[i] && self.apis[i] == apis {
            return None;
        }
        let m = self.members[i].clone();
        info!(member = %m.name(), import = %apis.import.api_version, export = %apis.export.api_version, "MCS API discovered: reconciling everything it takes part in");
        for id in std::mem::take(&mut self.import_watches[i]) {
            self.tasks.abort(id);
        }
        self.watches.retain(|h| {
            !h.name.starts_with("our ServiceImports") || !h.name.ends_with(&format!("of member {}", m.name()))
        });
        for w in m.import_watches(i, &apis.import, &self.behaviour.namespaces, own_tx.clone()) {
            self.watches.push(w.health.clone());
            let id = self.tasks.spawn(Task::Watch, w.name().to_owned(), w.run);
            self.import_watches[i].push(id);
        }
        self.stats.set_watches(&self.watches);
        let latency = Some(self.stats.write_seconds.with_label_values(&[m.name()]));
        self.member_apis[i] = m.api(&apis, self.down[i].subscribe(), latency);
        self.apis[i] = apis;
        self.discovered[i] = true;
        self.envs = build_env(
            &self.members,
            &self.apis,
            &self.member_apis,
            &self.behaviour,
            &self.stats,
            &self.shards,
        );
        Some(i)
    }

    /// Takes in what [`adopt`] found in a member, in a read begun at
    /// `began`: nothing of a shard not led, or taken since it began (that
    /// take's own read is newer).
    pub(super) fn adopted(
        &mut self,
        found: HashMap<ServiceKey, KeyState>,
        all: bool,
        began: std::time::Instant,
        why: Reason,
    ) {
        let lists = 4 * scopes(&self.behaviour.namespaces).len();
        self.stats.reads.fetch_add(lists as u64, Ordering::Relaxed);
        for (key, found) in found {
            let shard = self.shards.of(&key);
            if self.lead[shard] == Lead::No || self.takes[shard].1.is_some_and(|t| t > began) {
                continue;
            }
            if self.queue.is_running(&key) {
                self.adopted.entry(key.clone()).or_insert_with(|| (KeyState::default(), why)).0.adopt(found);
            } else {
                self.keys.entry(key.clone()).or_default().adopt(found);
            }
            self.queue.backlog(key, why);
        }
        if all {
            self.queue_all(Reason::Member);
        }
    }

    /// Reads every writable member's objects of ours again (`only`: one
    /// member; `gained`: for shards just taken), in the running set: a
    /// member that does not answer holds up nothing. Returns how many reads
    /// were started.
    pub(super) fn read_members(
        &mut self,
        running: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        scopes: &[Option<String>],
        only: Option<usize>,
        gained: &[Take],
    ) -> usize {
        let mut started = 0;
        for i in 0..self.members.len() {
            if only.is_some_and(|o| o != i)
                || !self.discovered[i]
                || self.unreachable[i].is_some()
                || self.members[i].remote()
            {
                continue;
            }
            let (api, cluster, scopes) =
                (self.envs[0].members[i].api.clone(), self.members[i].cluster().clone(), scopes.to_vec());
            let name = self.members[i].name().to_owned();
            let all = only.is_some();
            let gained = gained.to_vec();
            started += 1;
            let began = std::time::Instant::now();
            running.push(Box::pin(async move {
                let (found, failed) = adopt(api.as_ref(), i, &cluster, &scopes).await;
                for (kind, e) in &failed {
                    warn!(member = %name, kind = %kind, error = %e, "cannot list our objects: not adopted, written again if wanted");
                }
                let listed = [Kind::ServiceImport, Kind::Service, Kind::EndpointSlice]
                    .into_iter()
                    .filter(|k| !failed.iter().any(|(f, _)| f == k))
                    .collect();
                Done::Adopted { member: i, found, listed, began, all, gained }
            }));
        }
        started
    }

    /// Notices members becoming unreachable or reachable again, and queues
    /// every service they take part in.
    pub(super) fn check_members(&mut self) {
        for i in 0..self.members.len() {
            let stale = self.stale(i);
            let unreachable = stale >= UNREACHABLE_AFTER;
            let name = self.members[i].name();
            match (unreachable, self.unreachable[i].is_some()) {
                (true, false) => {
                    warn!(member = %name, stale_seconds = stale, "member unreachable: its endpoints are kept and marked; writes to it wait");
                    self.unreachable[i] =
                        Some(self.members[i].unreachable_since().unwrap_or_else(now_rfc3339));
                    self.down[i].send_replace(true);
                }
                (false, true) => {
                    info!(member = %name, "member reachable again: reconciling everything it takes part in");
                    self.unreachable[i] = None;
                    self.down[i].send_replace(false);
                }
                _ => continue,
            }
            // Writes to it were skipped, or its endpoints are marked: every
            // service may need a write.
            self.queue_all(Reason::Member);
        }
        self.mark_removed();
    }

    /// Queues every service a member has objects of, and every service the
    /// controller has objects for, for `reason`.
    pub(super) fn queue_all(&mut self, reason: Reason) {
        let keys: Vec<ServiceKey> = self.state.keys().into_iter().chain(self.keys.keys().cloned()).collect();
        for key in keys {
            self.queue.touch(key, reason);
        }
    }

    /// Applies `--on-member-lost=remove`: members unreachable for the window
    /// stop counting; their services are queued when that changes.
    pub(super) fn mark_removed(&mut self) {
        for i in 0..self.members.len() {
            let removed = self.behaviour.on_member_lost == MemberLost::Remove
                && self.members[i].gone_seconds() >= self.behaviour.lost_after.as_secs_f64();
            if removed != self.removed[i] {
                if removed {
                    warn!(member = %self.members[i].name(), "member lost for {:?}: removing its endpoints everywhere (--on-member-lost=remove)", self.behaviour.lost_after);
                } else {
                    info!(member = %self.members[i].name(), "lost member is back: its endpoints return");
                }
                self.removed[i] = removed;
                for key in self.state.exported_by(i) {
                    self.queue.touch(key, Reason::Member);
                }
            }
        }
    }
}

/// How long one discovery of a member's MCS versions may take: a frozen
/// API server answers nothing, and its task then asks again.
const DISCOVERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Member `i`'s MCS API discovery as a task: asked until it answers (its
/// health reported and exported like a watch's, so a member whose discovery
/// answers garbage is named in the log and counted), then again every
/// [`REDISCOVER`]; what it learns, and each change of it, is sent as news.
fn discovery(
    m: Arc<dyn crate::controller::link::MemberLink>,
    i: usize,
    news: mpsc::Sender<News>,
) -> WatchTask {
    let health = discovery_health(m.name());
    WatchTask::new(health.clone(), move || {
        let (m, news, health) = (m.clone(), news.clone(), health.clone());
        async move {
            let mut reporter = Reporter::new(health);
            let mut backoff = WATCH_BACKOFF;
            let mut known: Option<MemberApis> = None;
            loop {
                let asked = tokio::time::timeout(DISCOVERY_TIMEOUT, m.discover()).await;
                match asked.unwrap_or_else(|_| Err(format!("no answer within {DISCOVERY_TIMEOUT:?}"))) {
                    Ok(apis) => {
                        reporter.ok();
                        backoff.reset();
                        if known.as_ref() != Some(&apis) {
                            known = Some(apis.clone());
                            if news.send(News::Discovered(i, apis)).await.is_err() {
                                return;
                            }
                        }
                        tokio::time::sleep(REDISCOVER).await;
                    }
                    Err(e) => {
                        reporter.failed(&e);
                        tokio::time::sleep(backoff.next_wait()).await;
                    }
                }
            }
        }
    })
}
