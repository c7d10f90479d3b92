//! Another member, as the hub shows it: its ExportRecords turned back into
//! its objects (`hub::follow`, converted as the push mode's watches convert
//! them), its liveness from its heartbeat. The controller reads it and
//! never writes it: that member's own agent does.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use std::time::SystemTime;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::debug;

use super::{MemberApis, MemberLink, PROBE_EVERY, undiscovered};
use crate::controller::api::{ApiError, Kind, MemberApi, SharedApi, Stored};
use crate::controller::own::OwnEvent;
use crate::fleet::state::MemberEvent;
use crate::hub::follow::{Keep, MemberRecords, RecordChange};
use crate::hub::heartbeat::LEASE;
use crate::hub::heartbeat::Stillness;
use crate::hub::record;
use crate::k8s::fence::WriteFence;
use crate::k8s::watch::{Lists, Reporter, WatchHealth, WatchTask, relist, scopes};
use crate::model::ClusterId;

/// How long a member's heartbeat may stand still before it counts as not
/// answering (three of its renewals missed at the default lease duration).
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(15);

/// A member of the hub other than this agent's own.
pub struct HubLink {
    name: String,
    cluster: ClusterId,
    hub: kube::Client,
    /// Its records' watch.
    records: Arc<WatchHealth>,
    /// Its heartbeat, as seen changing.
    heartbeat: Arc<WatchHealth>,
    /// Records skipped because they did not read, for `/metrics`.
    skipped: Arc<std::sync::atomic::AtomicU64>,
    /// Its heartbeat's last renewal (Unix seconds; 0: never read; -1: read,
    /// without a renewal stamp).
    renewed: Arc<AtomicI64>,
}

impl HubLink {
    /// Member `name` of the hub reached through `hub`. Its cluster id is its
    /// name: the namespace its records are in says who published them.
    pub fn new(
        name: &str,
        hub: kube::Client,
        skipped: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<Self, String> {
        let cluster = ClusterId::parse(name).map_err(|e| format!("member {name:?} on the hub: {e}"))?;
        Ok(Self {
            name: name.to_owned(),
            cluster,
            hub,
            records: Arc::new(WatchHealth::new(format!("ExportRecords of member {name} on the hub"))),
            heartbeat: Arc::new(WatchHealth::new(format!("heartbeat of member {name} on the hub"))),
            renewed: Arc::new(AtomicI64::new(0)),
            skipped,
        })
    }
}

impl MemberLink for HubLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// Its heartbeat's alone: the hub not answering (its records' watch
    /// failing) says nothing of the member, whose endpoints are then kept
    /// as last seen without calling it unreachable; that watch's health is
    /// exported on its own.
    fn stale_seconds(&self) -> f64 {
        self.heartbeat.stale_seconds()
    }

    fn gone_seconds(&self) -> f64 {
        self.heartbeat.stale_seconds()
    }

    fn known(&self) -> bool {
        self.renewed.load(Ordering::Relaxed) != 0
    }

    /// Its last renewal plus [`HEARTBEAT_STALE`]: every agent reading the
    /// same heartbeat says the same, so a restarted agent rewrites nothing.
    fn unreachable_since(&self) -> Option<String> {
        let renewed = self.renewed.load(Ordering::Relaxed);
        let stale =
            k8s_openapi::jiff::Timestamp::from_second(renewed + HEARTBEAT_STALE.as_secs() as i64).ok()?;
        (renewed > 0).then(|| crate::controller::desired::rfc3339(stale))
    }

    fn remote(&self) -> bool {
        true
    }

    fn watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<MemberEvent>,
    ) -> Vec<WatchTask> {
        let (hub, member, cluster, health) =
            (self.hub.clone(), self.name.clone(), self.cluster.clone(), self.records.clone());
        let (scopes, skipped) = (scopes(namespaces), self.skipped.clone());
        vec![WatchTask::new(health.clone(), move || {
            let mut t = MemberRecords::new(index, &member, cluster.clone(), scopes.clone(), skipped.clone());
            let (hub, health, events) = (hub.clone(), health.clone(), events.clone());
            async move {
                let (tx, mut rx) = mpsc::channel(256);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(hub, &record::namespace_of(t.member()), &record::resource());
                let lists = Lists::default();
                let watching =
                    relist(api, watcher::Config::default(), &lists, Reporter::new(health), Keep, tx);
                let translating = async {
                    while let Some(seen) = rx.recv().await {
                        let out = match seen {
                            RecordChange::Listed(all) => t.listed(all),
                            RecordChange::Applied(o) => t.changed(&o, false),
                            RecordChange::Deleted(o) => t.changed(&o, true),
                        };
                        for e in out {
                            if events.send(e).await.is_err() {
                                return;
                            }
                        }
                    }
                };
                tokio::join!(watching, translating);
            }
        })]
    }

    fn own_watches(&self, _: usize, _: &[String], _: mpsc::Sender<OwnEvent>) -> Vec<WatchTask> {
        Vec::new()
    }

    fn import_watches(
        &self,
        _: usize,
        _: &ApiResource,
        _: &[String],
        _: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask> {
        Vec::new()
    }

    /// Its heartbeat, read every second: failing once it has stood still
    /// for [`HEARTBEAT_STALE`] of the time the hub answered. While the hub
    /// does not answer nothing is learnt of the member: its state stands,
    /// and that time is not counted as the heartbeat standing still (so a
    /// frozen hub marks no member unreachable, nor brings back one that was).
    fn probe(&self) -> WatchTask {
        let (hub, ns, health) = (self.hub.clone(), record::namespace_of(&self.name), self.heartbeat.clone());
        let (member, renewed) = (self.name.clone(), self.renewed.clone());
        WatchTask::new(health.clone(), move || {
            let api: Api<Lease> = Api::namespaced(hub.clone(), &ns);
            let mut reporter = Reporter::new(health.clone());
            let (member, renewed) = (member.clone(), renewed.clone());
            async move {
                let mut still = Stillness::default();
                loop {
                    let read = match tokio::time::timeout(Duration::from_secs(2), api.get_opt(LEASE)).await {
                        Ok(Ok(Some(l))) => {
                            let at = l.spec.and_then(|s| s.renew_time).map(|t| t.0.as_second()).unwrap_or(-1);
                            // -1: read, with no renewal stamp (a 0 would be "never read").
                            renewed.store(if at == 0 { -1 } else { at }, Ordering::Relaxed);
                            Some(Some(l.metadata.resource_version.unwrap_or_default()))
                        }
                        Ok(Ok(None)) => Some(None),
                        Ok(Err(e)) => {
                            debug!(%member, error = %e, "heartbeat not read: the hub did not answer");
                            None
                        }
                        Err(_) => {
                            debug!(%member, "heartbeat not read: the hub did not answer within 2 s");
                            None
                        }
                    };
                    match read {
                        None => still.blind(Instant::now()),
                        Some(None) => {
                            renewed.store(-1, Ordering::Relaxed);
                            reporter.failed("no heartbeat")
                        }
                        Some(Some(version)) => {
                            // First read: how long ago it was renewed, by its
                            // stamp (another cluster's clock: a first
                            // estimate only); then only what is seen change.
                            let renewal = match renewed.load(Ordering::Relaxed) {
                                s if s > 0 => SystemTime::UNIX_EPOCH + Duration::from_secs(s as u64),
                                _ => SystemTime::now(),
                            };
                            let ago = SystemTime::now().duration_since(renewal).unwrap_or_default();
                            let still_for = still.seen(version, Instant::now(), ago);
                            if still_for < HEARTBEAT_STALE {
                                reporter.ok();
                            } else {
                                reporter.failed_since(
                                    &format!("heartbeat unchanged for {:.0} s", still_for.as_secs_f64()),
                                    renewal + HEARTBEAT_STALE,
                                );
                            }
                        }
                    }
                    tokio::time::sleep(PROBE_EVERY).await;
                }
            }
        })
    }

    fn discover(&self) -> BoxFuture<'static, Result<MemberApis, String>> {
        // Never written: its versions do not matter.
        Box::pin(async { Ok(undiscovered()) })
    }

    fn api(&self, _: &MemberApis, _: watch::Receiver<bool>, _: Option<prometheus::Histogram>) -> SharedApi {
        Arc::new(NotOurs(self.name.clone()))
    }
}

/// The write API of a member this agent does not write.
struct NotOurs(String);

impl MemberApi for NotOurs {
    fn apply<'a>(
        &'a self,
        _: &'a WriteFence,
        kind: Kind,
        _: &'a str,
        _: &'a str,
        _: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Stored, ApiError>> {
        Box::pin(async move { Err(not_ours(&self.0, kind)) })
    }

    fn delete<'a>(
        &'a self,
        _: &'a WriteFence,
        kind: Kind,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move { Err(not_ours(&self.0, kind)) })
    }

    fn list<'a>(
        &'a self,
        _: Kind,
        _: Option<&'a str>,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Vec<serde_json::Value>, ApiError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

fn not_ours(member: &str, kind: Kind) -> ApiError {
    ApiError::Kube(kube::Error::Service(
        format!("{kind} of member {member}: written by its own agent, not this one").into(),
    ))
}
