//! What the controller needs of one member, behind one trait
//! ([`MemberLink`]): its watches (the fleet's objects and our own), a probe
//! of its API server, discovery of its MCS versions, and its write API. The
//! real one ([`KubeLink`]) is a connected `fleet::member::Member`; a fake
//! (`fake`, in tests) lets the whole event loop run in process on a paused
//! clock, its events sent by the test.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::ApiResource;
use tokio::sync::{mpsc, watch};

use super::api::{CALL_DEADLINE, KubeMember, SharedApi};
use super::own::{self, OwnEvent};
use crate::fleet::member::{self, Member};
use crate::fleet::state::MemberEvent;
use crate::k8s::mcs::find_mcs;
use crate::k8s::watch::{Lists, Reporter, WatchHealth, WatchTask};
use crate::model::ClusterId;

pub mod hub;

/// The MCS API versions a member serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberApis {
    /// Its ServiceImport version.
    pub import: ApiResource,
    /// Its ServiceExport version.
    pub export: ApiResource,
}

/// How long a probe of a member's API server waits for its answer.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// How often members are probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// One member as the controller uses it.
pub trait MemberLink: Send + Sync {
    /// Its configured name.
    fn name(&self) -> &str;
    /// Its cluster id.
    fn cluster(&self) -> &ClusterId;
    /// Seconds since its API server last answered (its watches, the probe,
    /// its ClusterProfile's mark).
    fn stale_seconds(&self) -> f64;
    /// Watches of its ServiceExports, Services and their slices, sending
    /// as member `index`.
    fn watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<MemberEvent>,
    ) -> Vec<WatchTask>;
    /// Watches of our objects that need no MCS version.
    fn own_watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask>;
    /// Watches of our ServiceImports of version `import`.
    fn import_watches(
        &self,
        index: usize,
        import: &ApiResource,
        namespaces: &[String],
        events: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask>;
    /// A probe of its API server, every [`PROBE_EVERY`].
    fn probe(&self) -> WatchTask;
    /// Its MCS versions, asked once (the error says what it answered).
    fn discover(&self) -> BoxFuture<'static, Result<MemberApis, String>>;
    /// Its write API with those versions: calls end once `down` turns true.
    fn api(
        &self,
        apis: &MemberApis,
        down: watch::Receiver<bool>,
        latency: Option<prometheus::Histogram>,
    ) -> SharedApi;
    /// True for a member this controller reads but never writes (hub mode:
    /// another member's agent writes it); it is not named as not reached.
    fn remote(&self) -> bool {
        false
    }
    /// Seconds it has been gone, for `--on-member-lost=remove`: by default
    /// as long as it has not answered. A remote member is gone only while
    /// what says so (the hub) answers: an unreachable hub removes nothing.
    fn gone_seconds(&self) -> f64 {
        self.stale_seconds()
    }
    /// Whether what it says of its liveness has been heard once (hub mode:
    /// its heartbeat read); the first reconcile waits for it, so a restart
    /// does not call a member reachable that was not.
    fn known(&self) -> bool {
        true
    }
    /// When it stopped answering, as its link can tell it the same to every
    /// reader (hub mode: from its heartbeat's last renewal), RFC 3339;
    /// `None`: the controller's own clock when it noticed.
    fn unreachable_since(&self) -> Option<String> {
        None
    }
}

/// A connected member.
pub struct KubeLink(pub Member);

impl MemberLink for KubeLink {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn cluster(&self) -> &ClusterId {
        &self.0.cluster
    }

    fn stale_seconds(&self) -> f64 {
        self.0.stale_seconds()
    }

    fn watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<MemberEvent>,
    ) -> Vec<WatchTask> {
        // kube's default lists (paged, 500); `--list-mode` is serve's.
        member::watch_tasks(index, &self.0, namespaces, &Lists::default(), events)
    }

    fn own_watches(
        &self,
        index: usize,
        namespaces: &[String],
        events: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask> {
        own::watches(index, &self.0, namespaces, events)
    }

    fn import_watches(
        &self,
        index: usize,
        import: &ApiResource,
        namespaces: &[String],
        events: mpsc::Sender<OwnEvent>,
    ) -> Vec<WatchTask> {
        own::import_watches(index, &self.0, import, namespaces, events)
    }

    /// A watch on a frozen or partitioned API server fails no request, it
    /// only stops hearing; the probe does, within [`PROBE_DEADLINE`].
    fn probe(&self) -> WatchTask {
        let (client, health) = (self.0.client.clone(), self.0.probe.clone());
        WatchTask::new(health.clone(), move || {
            let (client, mut reporter) = (client.clone(), Reporter::new(health.clone()));
            async move {
                loop {
                    match tokio::time::timeout(PROBE_DEADLINE, client.apiserver_version()).await {
                        Ok(Ok(_)) => reporter.ok(),
                        Ok(Err(e)) => reporter.failed(&e.to_string()),
                        Err(_) => reporter.failed(&format!("no answer within {PROBE_DEADLINE:?}")),
                    }
                    tokio::time::sleep(PROBE_EVERY).await;
                }
            }
        })
    }

    fn discover(&self) -> BoxFuture<'static, Result<MemberApis, String>> {
        let client = self.0.client.clone();
        Box::pin(async move {
            let import = find_mcs(&client, "ServiceImport", "serviceimports").await?;
            let export = find_mcs(&client, "ServiceExport", "serviceexports").await?;
            Ok(MemberApis { import, export })
        })
    }

    fn api(
        &self,
        apis: &MemberApis,
        down: watch::Receiver<bool>,
        latency: Option<prometheus::Histogram>,
    ) -> SharedApi {
        Arc::new(KubeMember::new(
            self.0.name.clone(),
            self.0.client.clone(),
            (apis.import.clone(), apis.export.clone()),
            CALL_DEADLINE,
            down,
            latency,
        ))
    }
}

/// Placeholder versions for a member not discovered yet (never written to).
pub fn undiscovered() -> MemberApis {
    use crate::k8s::mcs::mcs_resource;
    MemberApis {
        import: mcs_resource("v1beta1", "ServiceImport", "serviceimports"),
        export: mcs_resource("v1beta1", "ServiceExport", "serviceexports"),
    }
}

/// The health of a member's API discovery, as its watches' (exported).
pub fn discovery_health(name: &str) -> Arc<WatchHealth> {
    Arc::new(WatchHealth::new(format!("API discovery of member {name}")))
}

#[cfg(any(test, feature = "fakes"))]
#[allow(clippy::unwrap_used, missing_docs)]
pub mod fake {
    //! A member in process: the test sends its watches' events, answers its
    //! discovery, sets its staleness; its writes land in a `FakeMember`.

    use std::sync::Mutex;

    use super::*;
    use crate::controller::api::fake::FakeMember;

    /// The fake.
    pub struct FakeLink {
        name: String,
        cluster: ClusterId,
        /// Where its writes land.
        pub api: Arc<FakeMember>,
        /// Seconds since it last answered.
        pub stale: Mutex<f64>,
        events: Mutex<Option<mpsc::Sender<MemberEvent>>>,
        own: Mutex<Option<mpsc::Sender<OwnEvent>>>,
        /// The versions its ServiceImport watches were started with, in order.
        pub imports: Mutex<Vec<String>>,
        /// The versions its write API was built with, in order.
        pub built: Mutex<Vec<String>>,
        /// What discovery answers (it waits while `None`).
        pub discovery: watch::Sender<Option<Result<MemberApis, String>>>,
        /// Discoveries asked.
        pub asked: Mutex<u32>,
        /// The next discovery panics.
        pub panic_on_discovery: Mutex<bool>,
        /// Writes go through a real member client over an in-process API
        /// server (its stack: retries, rate limit, fence) instead of
        /// landing in `api`.
        wire: Option<kube::Client>,
    }

    impl FakeLink {
        /// A member named (and with the cluster id) `name`.
        pub fn new(name: &str) -> Arc<Self> {
            Arc::new(Self {
                name: name.into(),
                cluster: ClusterId::parse(name).unwrap(),
                api: Arc::default(),
                stale: Mutex::new(0.0),
                events: Mutex::default(),
                own: Mutex::default(),
                imports: Mutex::default(),
                built: Mutex::default(),
                discovery: watch::channel(None).0,
                asked: Mutex::new(0),
                panic_on_discovery: Mutex::new(false),
                wire: None,
            })
        }

        /// A member whose writes go through a member client with the rate
        /// limit `limits` to an in-process API server; what reached that
        /// server is recorded in the second value.
        pub fn over_the_wire(
            name: &str,
            limits: crate::k8s::throttle::Limits,
        ) -> (Arc<Self>, crate::controller::api::fake::Received) {
            let (builder, seen) = crate::controller::api::fake::api_server();
            let client = crate::k8s::client::limited(builder, Some(limits), name, Arc::default()).unwrap();
            let mut link = Arc::try_unwrap(Self::new(name)).ok().unwrap();
            link.wire = Some(client);
            (Arc::new(link), seen)
        }

        /// Discovery answers with `version` for both kinds from now on.
        pub fn serves(&self, version: &str) {
            use crate::k8s::mcs::mcs_resource;
            let apis = MemberApis {
                import: mcs_resource(version, "ServiceImport", "serviceimports"),
                export: mcs_resource(version, "ServiceExport", "serviceexports"),
            };
            self.discovery.send_replace(Some(Ok(apis)));
        }

        /// Forgets the controller's senders (it was stopped; the next one
        /// gives its own).
        pub fn restarted(&self) {
            *self.events.lock().unwrap() = None;
            *self.own.lock().unwrap() = None;
        }

        /// Sends an event of its watches, once the controller started them.
        pub async fn send(&self, e: MemberEvent) {
            started(&self.events).await.send(e).await.unwrap();
        }

        /// Sends an event of its own-object watches, once started.
        pub async fn send_own(&self, e: OwnEvent) {
            started(&self.own).await.send(e).await.unwrap();
        }
    }

    /// The sender the controller gave, waiting (paused time) until it has.
    async fn started<T>(slot: &Mutex<Option<mpsc::Sender<T>>>) -> mpsc::Sender<T> {
        for _ in 0..100 {
            if let Some(tx) = slot.lock().unwrap().clone() {
                return tx;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the controller did not start the watches");
    }

    fn idle(name: String) -> WatchTask {
        WatchTask::new(Arc::new(WatchHealth::new(name)), std::future::pending)
    }

    impl MemberLink for Arc<FakeLink> {
        fn name(&self) -> &str {
            &self.name
        }

        fn cluster(&self) -> &ClusterId {
            &self.cluster
        }

        fn stale_seconds(&self) -> f64 {
            *self.stale.lock().unwrap()
        }

        fn watches(&self, _: usize, _: &[String], events: mpsc::Sender<MemberEvent>) -> Vec<WatchTask> {
            *self.events.lock().unwrap() = Some(events);
            vec![idle(format!("ServiceExports of member {}", self.name))]
        }

        fn own_watches(&self, _: usize, _: &[String], events: mpsc::Sender<OwnEvent>) -> Vec<WatchTask> {
            *self.own.lock().unwrap() = Some(events);
            vec![idle(format!("our Services of member {}", self.name))]
        }

        fn import_watches(
            &self,
            _: usize,
            import: &ApiResource,
            _: &[String],
            _: mpsc::Sender<OwnEvent>,
        ) -> Vec<WatchTask> {
            self.imports.lock().unwrap().push(import.api_version.clone());
            vec![idle(format!("our ServiceImports ({}) of member {}", import.api_version, self.name))]
        }

        fn probe(&self) -> WatchTask {
            idle(format!("API probe of member {}", self.name))
        }

        fn discover(&self) -> BoxFuture<'static, Result<MemberApis, String>> {
            *self.asked.lock().unwrap() += 1;
            if std::mem::take(&mut *self.panic_on_discovery.lock().unwrap()) {
                panic!("discovery panicked (test)");
            }
            let mut rx = self.discovery.subscribe();
            Box::pin(async move {
                let answer = rx.wait_for(Option::is_some).await.map(|a| a.clone());
                answer.ok().flatten().unwrap_or_else(|| Err("gone".into()))
            })
        }

        fn api(
            &self,
            apis: &MemberApis,
            down: watch::Receiver<bool>,
            _: Option<prometheus::Histogram>,
        ) -> SharedApi {
            self.built.lock().unwrap().push(apis.import.api_version.clone());
            match &self.wire {
                Some(client) => Arc::new(KubeMember::new(
                    self.name.clone(),
                    client.clone(),
                    (apis.import.clone(), apis.export.clone()),
                    CALL_DEADLINE,
                    down,
                    None,
                )),
                None => self.api.clone(),
            }
        }
    }
}
