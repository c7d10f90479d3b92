//! One service's reconcile: the merged exports → the import, VIP and
//! slices in every member that imports it, what is no longer wanted
//! deleted, the KEP's conditions on every export.
//!
//! A reconcile owns everything it reads ([`Input`], a snapshot of the fleet
//! taken when it was started, and the service's [`KeyState`]), so many run
//! at once while the event loop goes on. Each member's writes run in a
//! lane of their own: a member whose API server hangs holds up its own
//! lane until the call's deadline or until it is marked unreachable, never
//! another member's writes.
//!
//! Every write is a server-side apply of a body computed from the input
//! ([`super::desired`]): idempotent, so a crash at any point is repaired by
//! the next run. A body equal to the last one applied is not sent again,
//! unless the object as found live (at start, or at a resync) no longer
//! holds it: drift.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::future::join_all;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use tracing::{Instrument, debug, info, warn};

use super::api::{ApiError, Kind, SharedApi, Stored};
use super::desired::{self, Consumers};
use super::own::Written;
use super::stats::SyncStats;
use crate::fleet::export::{ClusterExport, Exported};
use crate::fleet::merge::{Condition, ImportSpec, Merged, Status, condition, merge};
use crate::fleet::objects::ANNOTATION_CONSUMER_CLUSTERS;
use crate::fleet::state::{ExportInfo, ServiceInfo};
use crate::k8s::fence::WriteFence;
use crate::k8s::mcs::ANNOTATION_TRIGGER_TIME;
use crate::model::{AddressFamily, ClusterId, ImportType, ServiceKey};

/// An object the controller writes: which object of which member (not
/// kube's `ObjectRef`, which names an object of one cluster).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrittenObject {
    /// The member's index.
    pub member: usize,
    /// Its kind (or the status part of one).
    pub kind: Kind,
    /// Its namespace (the service's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl WrittenObject {
    /// `kind`'s object `name` of `key` in member `member`.
    pub fn new(member: usize, kind: Kind, key: &ServiceKey, name: String) -> Self {
        Self { member, kind, namespace: key.namespace.to_string(), name }
    }

    /// `namespace/name`, for logs.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A member as every reconcile sees it.
pub struct MemberEnv {
    /// The configured name.
    pub name: String,
    /// Its cluster id.
    pub cluster: ClusterId,
    /// Its API.
    pub api: SharedApi,
    /// The ServiceImport apiVersion it serves.
    pub import_version: String,
    /// The ServiceExport apiVersion it serves.
    pub export_version: String,
}

/// What every reconcile shares and never changes: the members' APIs,
/// settings and counters. Replaced whole when a member's API is
/// discovered; reconciles under way finish with the one they started with.
pub struct Env {
    /// Every member, in configuration order (one list shared by the
    /// shards' environments).
    pub members: Arc<[MemberEnv]>,
    /// Services in namespaces starting with one of these are exported
    /// automatically.
    pub auto_export_prefixes: Vec<String>,
    /// Counters.
    pub stats: Arc<SyncStats>,
    /// Writes are sent only while its fence is open (the shard's Lease is
    /// ours), checked at the wire.
    pub fence: WriteFence,
}

impl Env {
    /// Applies `body` in member `m`, counted, if the fence is open.
    async fn write(
        &self,
        m: usize,
        kind: Kind,
        namespace: &str,
        name: &str,
        body: &Value,
    ) -> Result<Stored, ApiError> {
        // Checked here to queue nothing doomed; what counts is the check
        // at the wire, after the rate limit's wait (`k8s::fence`).
        if !self.fence.fence.may_write() {
            return Err(ApiError::Fenced);
        }
        let span = self.span("apply", m, kind, namespace, name);
        let r = self.members[m].api.apply(&self.fence, kind, namespace, name, body).instrument(span).await;
        self.count(&r);
        r
    }

    /// Deletes in member `m`, counted, if the fence is open.
    async fn remove(&self, m: usize, kind: Kind, namespace: &str, name: &str) -> Result<(), ApiError> {
        if !self.fence.fence.may_write() {
            return Err(ApiError::Fenced);
        }
        let span = self.span("delete", m, kind, namespace, name);
        let r = self.members[m].api.delete(&self.fence, kind, namespace, name).instrument(span).await;
        self.count(&r);
        r
    }

    /// The span of one write: a child of its member's lane in its
    /// reconcile's span, so a trace shows every member's writes.
    fn span(&self, verb: &'static str, m: usize, kind: Kind, namespace: &str, name: &str) -> tracing::Span {
        tracing::info_span!("write", verb, member = %self.members[m].name, kind = %kind, object = %format_args!("{namespace}/{name}"))
    }

    /// Counts a write that was sent (refused at the wire: not sent).
    fn count<T>(&self, r: &Result<T, ApiError>) {
        if !matches!(r, Err(ApiError::Fenced)) {
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One member as a reconcile of one service sees it.
#[derive(Debug, Clone, Default)]
pub struct MemberInput {
    /// Reachable and its API versions known: written to.
    pub writable: bool,
    /// Another writer's (hub mode: another member's agent): read, never
    /// written, never named as not reached.
    pub remote: bool,
    /// Lost past `--member-lost-after` with `--on-member-lost=remove`.
    pub removed: bool,
    /// Unreachable since (RFC 3339).
    pub unreachable_since: Option<String>,
    /// The member's Service of this name.
    pub service: Option<ServiceInfo>,
    /// The member's ServiceExport of this name.
    pub export: Option<ExportInfo>,
}

/// The fleet as one service's reconcile needs it, taken when it starts.
#[derive(Debug, Clone)]
pub struct Input {
    /// The service.
    pub key: ServiceKey,
    /// Its exports that count (removed members' left out, duplicate
    /// cluster ids marked).
    pub exports: Vec<ClusterExport>,
    /// Per member.
    pub members: Vec<MemberInput>,
    /// The exporting clusters' own EndpointSlices of the service, by name.
    pub sources: HashMap<ClusterId, BTreeMap<String, Arc<EndpointSlice>>>,
    /// Every member (but removed ones) has listed: what is not wanted may
    /// be deleted. Before, "not wanted" may mean "not known".
    pub synced: bool,
    /// Another exported service of the namespace shares this one's name
    /// stem and is older ([`desired::Naming`]).
    pub has_elder: bool,
}

/// The controller's memory of one service: disjoint from every other
/// service's, so services are reconciled concurrently, each with its own;
/// and split by member ([`KeyState::take_member`]) for the lanes.
#[derive(Debug, Default)]
pub struct KeyState {
    /// The digest of the last body applied per object ([`desired::digest_of`]),
    /// also written on the object itself ([`desired::ANNOTATION_APPLIED`]) so
    /// a new leader knows it without writing.
    pub applied: HashMap<WrittenObject, String>,
    /// The ClusterIPs of each VIP Service written.
    pub vips: HashMap<WrittenObject, Vec<String>>,
    /// Objects of ours that exist, and those a reconcile wanted whose write
    /// failed (retried with the service; `written` has no version of them).
    pub owned: BTreeSet<WrittenObject>,
    /// lastTransitionTime per (member, condition type), with its status: the
    /// export's conditions, and the import's SourcesReachable.
    pub transitions: HashMap<(usize, &'static str), (Status, String)>,
    /// Counted in [`SyncStats::conflicts`].
    pub conflicted: bool,
    /// Writes this member's part made in the reconcile under way (for its
    /// span; never carried from one reconcile to the next).
    pub sent: u32,
    /// The uid of each member's export whose conditions `transitions` and
    /// `applied` hold.
    pub export_uids: HashMap<usize, Option<String>>,
    /// The resourceVersions our writes gave our objects: a watch event with
    /// another is someone else's change.
    pub written: Written<WrittenObject>,
    /// Objects as found live (at start or at a resync), pruned to what we
    /// write: the next apply of each compares its body with it, so an edit
    /// made while no controller ran is repaired.
    pub live: HashMap<WrittenObject, Value>,
}

impl KeyState {
    /// Forgets what was applied to `r` (and its status), so it is written again.
    pub fn invalidate(&mut self, r: &WrittenObject) {
        self.applied.remove(r);
        if r.kind == Kind::ServiceImport {
            self.applied.remove(&WrittenObject { kind: Kind::ImportStatus, ..r.clone() });
        }
        self.vips.remove(r);
        self.live.remove(r);
        self.written.forget(r);
    }

    /// Our objects of `kind` in member `m` and `scope` (`None`: every
    /// namespace) that `listed` (asked for at `began`) does not hold, though
    /// written before it began: deleted while no event said so.
    pub fn gone(
        &self,
        m: usize,
        (kind, scope): (Kind, Option<&str>),
        listed: &std::collections::BTreeSet<(String, String)>,
        began: std::time::Instant,
    ) -> Vec<WrittenObject> {
        self.owned
            .iter()
            .filter(|r| {
                r.member == m
                    && r.kind == kind
                    && scope.is_none_or(|ns| ns == r.namespace)
                    && !listed.contains(&(r.namespace.clone(), r.name.clone()))
                    && self.written.before(r, began)
            })
            .cloned()
            .collect()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
            && self.owned.is_empty()
            && self.transitions.is_empty()
            && !self.conflicted
            && self.live.is_empty()
    }

    /// Moves out what concerns member `m`, for its lane.
    pub fn take_member(&mut self, m: usize) -> Self {
        fn split<V>(map: &mut HashMap<WrittenObject, V>, m: usize) -> HashMap<WrittenObject, V> {
            let (out, keep) = std::mem::take(map).into_iter().partition(|(r, _)| r.member == m);
            *map = keep;
            out
        }
        let owned: BTreeSet<WrittenObject> = self.owned.iter().filter(|r| r.member == m).cloned().collect();
        self.owned.retain(|r| r.member != m);
        let (transitions, keep) =
            std::mem::take(&mut self.transitions).into_iter().partition(|((i, _), _)| *i == m);
        self.transitions = keep;
        let export_uids = self.export_uids.remove(&m).map(|u| HashMap::from([(m, u)])).unwrap_or_default();
        Self {
            applied: split(&mut self.applied, m),
            vips: split(&mut self.vips, m),
            owned,
            transitions,
            conflicted: false,
            sent: 0,
            export_uids,
            written: self.written.take(|r| r.member == m),
            live: split(&mut self.live, m),
        }
    }

    /// Takes back what [`Self::take_member`] moved out (or what another
    /// reconcile's adopt found meanwhile): entries already here win.
    pub fn absorb(&mut self, other: Self) {
        for (r, v) in other.applied {
            self.applied.entry(r).or_insert(v);
        }
        for (r, v) in other.vips {
            self.vips.entry(r).or_insert(v);
        }
        self.owned.extend(other.owned);
        for (r, v) in other.transitions {
            self.transitions.entry(r).or_insert(v);
        }
        for (r, v) in other.export_uids {
            self.export_uids.entry(r).or_insert(v);
        }
        for (r, v) in other.live {
            self.live.entry(r).or_insert(v);
        }
        self.written.absorb(other.written);
    }

    /// Counts the service into the conflicts gauge when the merged exports
    /// put it in conflict, out of it when they no longer do.
    fn count_conflict(&mut self, merged: &Merged, stats: &SyncStats) {
        let conflicted = merged.conditions.iter().any(|(_, conds)| {
            conds.iter().any(|c| c.kind == condition::CONFLICT && c.status == Status::True)
        });
        if conflicted != self.conflicted {
            self.conflicted = conflicted;
            if conflicted {
                stats.conflicts.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.conflicts.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// How this service's objects are named: as its VIP Service already
    /// is (a name never moves while the service is exported, whatever is
    /// exported beside it); otherwise short, unless an elder shares its
    /// stem.
    fn naming(&self, key: &ServiceKey, has_elder: bool) -> desired::Naming {
        for naming in [desired::Naming::Long, desired::Naming::Short] {
            let vip = desired::vip_name(key, naming);
            if self.owned.iter().any(|r| r.kind == Kind::Service && r.name == vip) {
                return naming;
            }
        }
        if has_elder { desired::Naming::Long } else { desired::Naming::Short }
    }
}

/// What the merged exports ask of every member, computed once per reconcile.
struct Goal<'a> {
    key: &'a ServiceKey,
    spec: Option<&'a ImportSpec>,
    clusters: &'a [ClusterId],
    unreachable: &'a [(ClusterId, String)],
    cluster_ports: HashMap<&'a ClusterId, desired::ClusterPorts>,
    consumers: &'a Consumers,
    naming: desired::Naming,
    sources: &'a HashMap<ClusterId, BTreeMap<String, Arc<EndpointSlice>>>,
    /// When each exporting cluster's ServiceExport was created.
    exported_at: HashMap<&'a ClusterId, i64>,
}

/// Brings every member in line with the exports of `input.key`; returns
/// the service's state and the first error (every member had its turn).
pub async fn reconcile(mut ks: KeyState, input: Input, env: Arc<Env>) -> (KeyState, Result<(), ApiError>) {
    let started = std::time::Instant::now();
    let key = &input.key;
    let merged = merge(&input.exports);
    let consumers = merged.spec.as_ref().map_or(Consumers::All, |s| Consumers::of(&s.annotations));
    if let Consumers::Invalid(e) = &consumers {
        warn!(service = %key, "{e}: imported nowhere until the export's annotation is fixed");
    }
    ks.count_conflict(&merged, &env.stats);
    let unreachable: Vec<(ClusterId, String)> = env
        .members
        .iter()
        .zip(&input.members)
        .filter_map(|(m, mi)| Some((m.cluster.clone(), mi.unreachable_since.clone()?)))
        .filter(|(c, _)| merged.clusters.contains(c))
        .collect();
    // Members that should import but cannot be written now: Ready says so.
    let not_reached: Vec<&str> = env
        .members
        .iter()
        .zip(&input.members)
        .filter(|(m, mi)| !mi.writable && !mi.remote && !mi.removed && consumers.includes(&m.cluster))
        .map(|(m, _)| m.name.as_str())
        .collect();
    // Which of each exporting cluster's ports it serves behind the VIP, and
    // what its unnamed port is called there.
    let vip_ports = merged.spec.as_ref().map(|s| desired::VipPorts::new(&s.ports));
    let cluster_ports = input
        .exports
        .iter()
        .filter_map(|e| match (&e.service, &vip_ports) {
            (Exported::Service(s), Some(v)) => Some((&e.cluster, v.of_cluster(&s.ports))),
            _ => None,
        })
        .collect();
    let goal = Goal {
        key,
        spec: merged.spec.as_ref(),
        clusters: &merged.clusters,
        unreachable: &unreachable,
        cluster_ports,
        consumers: &consumers,
        naming: ks.naming(key, input.has_elder),
        sources: &input.sources,
        exported_at: input.exports.iter().map(|e| (&e.cluster, e.exported_at)).collect(),
    };
    // Each writable member's writes in a lane of its own; what we own in
    // the others stays until they answer again.
    let lanes = (0..env.members.len()).filter(|i| input.members[*i].writable).map(|i| {
        let part = ks.take_member(i);
        let (input, env, goal) = (&input, &env, &goal);
        async move {
            let (part, result) = lane(part, i, input, env, goal).await;
            (i, part, result)
        }
        .instrument(member_span(&env.members[i]))
    });
    let mut failed: Option<ApiError> = None;
    // Writes made per member, for the span.
    let mut written: BTreeMap<usize, u32> = BTreeMap::new();
    for (i, mut part, result) in join_all(lanes).await {
        *written.entry(i).or_default() += std::mem::take(&mut part.sent);
        ks.absorb(part);
        if let Err(e) = result {
            failed = Some(e);
        }
    }
    let ready = merged.spec.is_some() && failed.is_none() && !matches!(consumers, Consumers::Invalid(_));
    let imported = imported_message(&env, &consumers, &not_reached);
    let status = (ready, &consumers, imported.as_str());
    if let Err(e) = write_conditions(&mut ks, &input, &env, &merged.conditions, status, &mut written).await {
        failed = Some(e);
    }
    env.stats.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    record_outcome(&written, failed.as_ref());
    (ks, failed.map_or(Ok(()), Err))
}

/// Writes each exporting member's conditions (`status`: whether the import
/// is ready, its consumers and the Ready message), each member in a lane of
/// its own; counts the writes into `written`. Returns the last error.
async fn write_conditions(
    ks: &mut KeyState,
    input: &Input,
    env: &Env,
    conditions: &[(ClusterId, Vec<Condition>)],
    (ready, consumers, imported): (bool, &Consumers, &str),
    written: &mut BTreeMap<usize, u32>,
) -> Result<(), ApiError> {
    // Members sharing a cluster id share its entry: each gets it once.
    let mut targets: BTreeMap<usize, &Vec<Condition>> = BTreeMap::new();
    for (cluster, conds) in conditions {
        for (i, m) in env.members.iter().enumerate() {
            if &m.cluster == cluster && input.members[i].writable && input.members[i].export.is_some() {
                targets.entry(i).or_insert(conds);
            }
        }
    }
    let lanes = targets.into_iter().map(|(i, conds)| {
        let mut part = ks.take_member(i);
        async move {
            let r = part.conditions(env, input, i, conds, ready, (consumers, imported)).await;
            (i, part, r)
        }
        .instrument(member_span(&env.members[i]))
    });
    let mut failed = Ok(());
    for (i, mut part, result) in join_all(lanes).await {
        *written.entry(i).or_default() += std::mem::take(&mut part.sent);
        ks.absorb(part);
        if result.is_err() {
            failed = result;
        }
    }
    failed
}

/// What the reconcile did (`written`: writes per member), on its span
/// (`syncer` opens it, with the service, shard and reason).
fn record_outcome(written: &BTreeMap<usize, u32>, failed: Option<&ApiError>) {
    let members_written = written.values().filter(|n| **n > 0).count();
    let writes: u32 = written.values().sum();
    let outcome = failed.map_or("ok", |e| e.reason().as_str());
    let span = tracing::Span::current();
    span.record("members_written", members_written);
    span.record("writes", writes);
    span.record("outcome", outcome);
    debug!(members_written, writes, outcome, "reconciled");
}

/// The span of one member's lane in a reconcile.
fn member_span(m: &MemberEnv) -> tracing::Span {
    tracing::info_span!("member", member = %m.name, cluster = %m.cluster)
}

/// "Imported into every member cluster …, except cluster-3: …".
fn imported_message(env: &Env, consumers: &Consumers, not_reached: &[&str]) -> String {
    let members: Vec<&ClusterId> = env.members.iter().map(|m| &m.cluster).collect();
    let mut imported = consumers.describe(&members);
    if !not_reached.is_empty() {
        if imported.ends_with('.') {
            imported.pop();
        }
        imported.push_str(&format!(
            ", except {}: unreachable; written when it answers again.",
            not_reached.join(", ")
        ));
    }
    imported
}

/// Member `i`'s writes for one service: its auto-export, its import, VIP
/// and slices, and the deletion of what it no longer needs.
async fn lane(
    mut part: KeyState,
    i: usize,
    input: &Input,
    env: &Env,
    goal: &Goal<'_>,
) -> (KeyState, Result<(), ApiError>) {
    let m = &env.members[i];
    let key = goal.key;
    let mut failed = None;
    match auto_export(env, input, i).await {
        Ok(wrote) => part.sent += u32::from(wrote),
        Err(e) => {
            warn!(member = %m.name, service = %key, error = %e, "cannot auto-export");
            failed = Some(e);
        }
    }
    let mut want: BTreeSet<WrittenObject> = BTreeSet::new();
    // Members outside the consumer clusters import nothing: what we own
    // there is not wanted, so it is deleted below.
    if let Some(spec) = goal.spec
        && goal.consumers.includes(&m.cluster)
    {
        match part.member_objects(env, i, spec, goal, &mut want).await {
            Ok(()) => {}
            // No such namespace in this member: namespace sameness means the
            // service is not imported there.
            Err(e) if e.is_not_found() => {
                debug!(member = %m.name, service = %key, "namespace absent; not imported");
            }
            Err(e) => {
                warn!(member = %m.name, service = %key, error = %e, "cannot write");
                failed = Some(e);
            }
        }
    }
    // Whatever we own for this service and no longer want goes, once every
    // member has listed.
    if !input.synced {
        want.extend(part.owned.iter().cloned());
    }
    let owned = std::mem::take(&mut part.owned);
    let mut kept = BTreeSet::new();
    for r in owned.difference(&want) {
        if let Err(e) = part.delete(env, r).await {
            kept.insert(r.clone());
            failed = Some(e);
        }
    }
    kept.extend(want);
    part.owned = kept;
    (part, failed.map_or(Ok(()), Err))
}

/// Creates or removes the ServiceExport of the service in member `i` for
/// Services that ask to be exported (annotation or namespace prefix). Only
/// exports the controller created are ever removed. True when it wrote.
async fn auto_export(env: &Env, input: &Input, i: usize) -> Result<bool, ApiError> {
    let key = &input.key;
    let m = &env.members[i];
    let prefixed = env.auto_export_prefixes.iter().any(|p| key.namespace.as_str().starts_with(p.as_str()));
    let service = input.members[i].service.as_ref();
    let wants = service.is_some_and(|s| s.auto_export || prefixed);
    let consumers = service.and_then(|s| s.consumers.as_deref());
    let has = input.members[i].export.as_ref();
    // An export of ours follows the Service's consumer clusters.
    let stale = |e: &ExportInfo| {
        e.ours && e.annotations.get(ANNOTATION_CONSUMER_CLUSTERS).map(String::as_str) != consumers
    };
    let apply = match (wants, has) {
        (true, None) => Some("auto-exported"),
        (true, Some(e)) if stale(e) => Some("auto-export: consumer clusters updated"),
        _ => None,
    };
    let (ns, name) = (key.namespace.as_str(), key.name.as_str());
    if let Some(done) = apply {
        env.write(i, Kind::ServiceExport, ns, name, &desired::export(&m.export_version, key, consumers))
            .await?;
        info!(member = %m.name, service = %key, consumers = ?consumers, "{done}");
        return Ok(true);
    }
    if let (false, Some(e)) = (wants, has)
        && e.ours
    {
        match env.remove(i, Kind::ServiceExport, ns, name).await {
            Ok(()) => {
                info!(member = %m.name, service = %key, "auto-export removed");
                return Ok(true);
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

impl KeyState {
    /// The lastTransitionTime of condition `kind` in member `i`, now
    /// `status`: kept while its status stays, `now` when it changes or is
    /// first seen.
    fn transition(&mut self, i: usize, kind: &'static str, status: Status, now: &str) -> String {
        let slot = self.transitions.entry((i, kind)).or_insert_with(|| (status, now.to_owned()));
        if slot.0 != status {
            *slot = (status, now.to_owned());
        }
        slot.1.clone()
    }

    /// The import, VIP and slices of the service in member `i`.
    async fn member_objects(
        &mut self,
        env: &Env,
        i: usize,
        spec: &ImportSpec,
        goal: &Goal<'_>,
        want: &mut BTreeSet<WrittenObject>,
    ) -> Result<(), ApiError> {
        let key = goal.key;
        let m = &env.members[i];
        let vip_name = (spec.kind == ImportType::ClusterSetIp).then(|| desired::vip_name(key, goal.naming));
        let mut ips: Vec<String> = Vec::new();
        if let Some(vip_name) = &vip_name {
            let r = WrittenObject::new(i, Kind::Service, key, vip_name.clone());
            want.insert(r.clone());
            ips = self.vip(env, &r, key, spec).await?;
        }
        self.slices(env, i, goal, vip_name.as_deref(), want).await?;
        let r = WrittenObject::new(i, Kind::ServiceImport, key, key.name.to_string());
        want.insert(r.clone());
        let down: Vec<ClusterId> = goal.unreachable.iter().map(|(c, _)| c.clone()).collect();
        self.apply(env, &r, &desired::import(&m.import_version, key, spec, &ips, &down)).await?;
        // SourcesReachable's time while true: when it became so, kept as
        // the export conditions' are (and adopted from the live import).
        let reachable = if goal.unreachable.is_empty() { Status::True } else { Status::False };
        let since = self.transition(i, desired::CONDITION_SOURCES_REACHABLE, reachable, &now_rfc3339());
        let status = desired::import_status(&m.import_version, key, goal.clusters, goal.unreachable, &since);
        let sr = WrittenObject { kind: Kind::ImportStatus, ..r };
        let digest = desired::digest_of(&status["status"]);
        if self.applied.get(&sr) != Some(&digest) {
            let stored = env.write(i, Kind::ImportStatus, &sr.namespace, &sr.name, &status).await?;
            self.sent += 1;
            // The status write gives the import a new version too.
            self.written
                .record(WrittenObject { kind: Kind::ServiceImport, ..sr.clone() }, stored.version.as_deref());
            self.applied.insert(sr, digest);
        }
        Ok(())
    }

    /// Writes the VIP Service `r` of the import `spec`; returns the
    /// addresses it was given.
    async fn vip(
        &mut self,
        env: &Env,
        r: &WrittenObject,
        key: &ServiceKey,
        spec: &ImportSpec,
    ) -> Result<Vec<String>, ApiError> {
        let m = &env.members[r.member];
        let body = desired::vip_service(key, &r.name, spec);
        // A Service's primary IP family cannot change in place (the API
        // server refuses it, 422, for ever): when the import's changes
        // (another export became the oldest), the VIP is replaced. Known
        // from the addresses it was given; if they are not known, from
        // the refusal.
        let had_v4 =
            self.vips.get(r).and_then(|ips| ips.first()?.parse::<IpAddr>().ok()).map(|a| a.is_ipv4());
        let wants_v4 = spec.ip_families.first().map(|f| *f == AddressFamily::V4);
        if let (Some(had), Some(wants)) = (had_v4, wants_v4)
            && had != wants
        {
            info!(member = %m.name, service = %key, "the import's IP family changed: replacing its VIP Service");
            self.delete(env, r).await?;
        }
        let written = match self.apply(env, r, &body).await {
            Err(e) if e.primary_family_refused() => {
                info!(member = %m.name, service = %key, "VIP Service of another IP family: replacing it");
                self.delete(env, r).await?;
                self.apply(env, r, &body).await?
            }
            other => other?,
        };
        if let Some(stored) = written {
            self.vips.insert(r.clone(), stored.cluster_ips);
        }
        // Applied unchanged earlier: its addresses are known.
        Ok(self.vips.get(r).cloned().unwrap_or_default())
    }

    /// Member `i`'s copies of every exporting cluster's EndpointSlices,
    /// pointing at the VIP Service `vip_name` when there is one.
    async fn slices(
        &mut self,
        env: &Env,
        i: usize,
        goal: &Goal<'_>,
        vip_name: Option<&str>,
        want: &mut BTreeSet<WrittenObject>,
    ) -> Result<(), ApiError> {
        let key = goal.key;
        let sources: Vec<(&ClusterId, &String, &Arc<EndpointSlice>)> = goal
            .clusters
            .iter()
            .flat_map(|c| goal.sources.get(c).into_iter().flatten().map(move |(name, s)| (c, name, s)))
            .collect();
        let names = desired::slice_names(
            key,
            goal.naming,
            &sources.iter().map(|(c, name, _)| (*c, name.as_str())).collect::<Vec<_>>(),
        );
        for ((cluster, _, source), name) in sources.iter().zip(names) {
            let ports = goal.cluster_ports.get(cluster);
            let body = desired::slice(key, &name, cluster, source, vip_name, ports);
            let r = WrittenObject::new(i, Kind::EndpointSlice, key, name);
            want.insert(r.clone());
            let trigger = desired::trigger_time(source, goal.exported_at.get(cluster).copied());
            self.apply_carrying(env, &r, &body, trigger.as_deref()).await?;
        }
        Ok(())
    }

    /// Server-side applies `body` unless it equals the last body applied
    /// and the object, if it was found live since, still holds it. Returns
    /// what was stored when it was written.
    async fn apply(
        &mut self,
        env: &Env,
        r: &WrittenObject,
        body: &Value,
    ) -> Result<Option<Stored>, ApiError> {
        self.apply_carrying(env, r, body, None).await
    }

    /// [`Self::apply`] of a slice that carries `trigger`
    /// ([`desired::trigger_time`]) when it is written: the time is no part
    /// of what decides whether it is (neither of the digest nor of the
    /// comparison with the live object), and a write without one removes
    /// the one written before.
    async fn apply_carrying(
        &mut self,
        env: &Env,
        r: &WrittenObject,
        body: &Value,
        trigger: Option<&str>,
    ) -> Result<Option<Stored>, ApiError> {
        let m = &env.members[r.member];
        let digest = desired::digest_of(body);
        // The live body stays until it is written over: a write that fails
        // (fenced, unreachable, throttled) leaves the drift to the retry.
        let drift = self.live.get(r).and_then(|live| desired::object_difference(live, body));
        if self.applied.get(r) == Some(&digest) {
            match &drift {
                Some(field) => {
                    info!(member = %m.name, kind = %r.kind, object = %r.path(), field, "ours, changed while no controller ran: writing it again");
                }
                None => {
                    self.live.remove(r);
                    env.stats.unchanged.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
            }
        }
        let mut body = body.clone();
        body["metadata"]["annotations"][desired::ANNOTATION_APPLIED] = Value::String(digest.clone());
        if let Some(t) = trigger {
            body["metadata"]["annotations"][ANNOTATION_TRIGGER_TIME] = Value::String(t.to_owned());
        }
        let stored = env.write(r.member, r.kind, &r.namespace, &r.name, &body).await?;
        self.sent += 1;
        if self.live.remove(r).is_some() && drift.is_some() && self.applied.get(r) == Some(&digest) {
            env.stats.drift(r.kind);
        }
        self.written.record(r.clone(), stored.version.as_deref());
        self.applied.insert(r.clone(), digest);
        Ok(Some(stored))
    }

    async fn delete(&mut self, env: &Env, r: &WrittenObject) -> Result<(), ApiError> {
        let m = &env.members[r.member];
        let result = env.remove(r.member, r.kind.object(), &r.namespace, &r.name).await;
        self.invalidate(r);
        match result {
            Ok(()) => {
                info!(member = %m.name, kind = %r.kind, object = %r.path(), "deleted");
                self.sent += 1;
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes Valid, Ready and Conflict on member `i`'s export.
    async fn conditions(
        &mut self,
        env: &Env,
        input: &Input,
        i: usize,
        conds: &[Condition],
        ready: bool,
        (consumers, imported): (&Consumers, &str),
    ) -> Result<(), ApiError> {
        let key = &input.key;
        let m = &env.members[i];
        let Some(export) = &input.members[i].export else { return Ok(()) };
        // A deleted and re-created export is a new object: its conditions
        // start afresh (times included) and must be written even when the
        // body equals the one its predecessor got.
        let uid = export.uid.clone();
        if self.export_uids.get(&i) != Some(&uid) {
            // The import's condition is not the export's.
            self.transitions.retain(|(m, kind), _| *m != i || *kind == desired::CONDITION_SOURCES_REACHABLE);
            self.applied.remove(&WrittenObject::new(i, Kind::ExportStatus, key, key.name.to_string()));
            self.export_uids.insert(i, uid);
        }
        let mut all = conds.to_vec();
        let valid = conds.iter().any(|c| c.kind == condition::VALID && c.status == Status::True);
        all.push(if valid && ready {
            Condition {
                kind: condition::READY,
                status: Status::True,
                reason: "Exported".into(),
                message: imported.into(),
            }
        } else {
            let (reason, message) = match (valid, consumers) {
                (false, _) => ("Failed", "The export is not valid.".to_owned()),
                (true, Consumers::Invalid(_)) => ("InvalidConsumerClusters", imported.to_owned()),
                (true, _) => ("Pending", "Not yet written to every member cluster.".to_owned()),
            };
            Condition { kind: condition::READY, status: Status::False, reason: reason.into(), message }
        });
        let now = now_rfc3339();
        let timed: Vec<(Condition, String)> = all
            .into_iter()
            .map(|c| {
                let t = self.transition(i, c.kind, c.status, &now);
                (c, t)
            })
            .collect();
        let body = desired::export_status(&m.export_version, key, &timed);
        let r = WrittenObject::new(i, Kind::ExportStatus, key, key.name.to_string());
        let text = desired::digest_of(&body["status"]);
        if self.applied.get(&r) == Some(&text) {
            return Ok(());
        }
        match env.write(i, Kind::ExportStatus, &r.namespace, &r.name, &body).await {
            Ok(_) => {
                self.applied.insert(r, text);
                self.sent += 1;
                Ok(())
            }
            // The export went meanwhile.
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => {
                warn!(member = %m.name, service = %key, error = %e, "cannot write the export's conditions");
                Err(e)
            }
        }
    }
}

/// Now, as Kubernetes writes times.
pub fn now_rfc3339() -> String {
    desired::rfc3339(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests;
