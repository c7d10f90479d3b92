//! Every write the controller makes into a member, behind one small trait
//! ([`MemberApi`]): the reconcile logic is tested in process against a fake
//! member (`fake`, in tests), and the real one ([`KubeMember`]) adds what a fleet
//! needs around kube's client: a deadline on every call, an end to every
//! call once the member is found unreachable, and per-member write latency.
//!
//! Object kinds are an enum ([`Kind`]), so a delete of a kind that has no
//! arm cannot fall through to another kind's API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::Value;
use tokio::sync::watch;

use super::desired::FIELD_MANAGER;
use crate::k8s::fence::{self, WriteFence};

/// The objects (and the status parts of objects) the controller writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A ServiceImport's spec and metadata.
    ServiceImport,
    /// A ServiceImport's status (its clusters, SourcesReachable).
    ImportStatus,
    /// A clusterset VIP Service.
    Service,
    /// An MCS EndpointSlice.
    EndpointSlice,
    /// A ServiceExport the controller created (auto-export).
    ServiceExport,
    /// A ServiceExport's status (its conditions).
    ExportStatus,
}

impl Kind {
    /// Every kind, in metric order.
    pub const ALL: [Self; 6] = [
        Self::ServiceImport,
        Self::ImportStatus,
        Self::Service,
        Self::EndpointSlice,
        Self::ServiceExport,
        Self::ExportStatus,
    ];

    /// The name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceImport => "ServiceImport",
            Self::ImportStatus => "ServiceImport/status",
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::ServiceExport => "ServiceExport",
            Self::ExportStatus => "ServiceExport/status",
        }
    }

    /// The object whose part this is: a status is written on its object.
    pub fn object(self) -> Self {
        match self {
            Self::ImportStatus => Self::ServiceImport,
            Self::ExportStatus => Self::ServiceExport,
            k => k,
        }
    }

    fn is_status(self) -> bool {
        matches!(self, Self::ImportStatus | Self::ExportStatus)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a reconcile failed, for `clusterset_dns_sync_errors_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    /// 429: the API server throttled us (kube's client already retried).
    Throttled,
    /// 403: our identity may not do it.
    Forbidden,
    /// 409: a conflicting write.
    Conflict,
    /// 422 or 400: the API server refused the body.
    Invalid,
    /// Any other status from the API server (5xx included).
    Server,
    /// No answer: connection, TLS, the call's deadline, or the member found
    /// unreachable while the call waited.
    Unreachable,
    /// Not sent: this replica's Lease may have run out (`k8s::fence`, checked at the wire).
    Fenced,
}

impl ErrorReason {
    /// Every reason, in metric order.
    pub const ALL: [Self; 7] = [
        Self::Throttled,
        Self::Forbidden,
        Self::Conflict,
        Self::Invalid,
        Self::Server,
        Self::Unreachable,
        Self::Fenced,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Forbidden => "forbidden",
            Self::Conflict => "conflict",
            Self::Invalid => "invalid",
            Self::Server => "server",
            Self::Unreachable => "unreachable",
            Self::Fenced => "fenced",
        }
    }
}

/// A call to a member's API server that did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API server answered with an error, or kube's client failed.
    #[error("{0}")]
    Kube(kube::Error),
    /// No answer within the call's deadline: a partitioned or frozen API
    /// server accepts the connection and never answers.
    #[error("no answer within {0:?}")]
    Deadline(Duration),
    /// The member was found unreachable while the call waited; it is
    /// written again once it answers.
    #[error("member unreachable")]
    MemberDown,
    /// Not sent, or not waited for past the tenure: the Lease may no
    /// longer be ours (checked at the wire: `k8s::fence`).
    #[error("not sent: this replica's Lease may have run out")]
    Fenced,
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        if fence::is_fenced(&e) { Self::Fenced } else { Self::Kube(e) }
    }
}

impl ApiError {
    /// The HTTP status the API server answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Kube(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }

    /// True for 404: the object (or its namespace) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// The metric reason.
    pub fn reason(&self) -> ErrorReason {
        if matches!(self, Self::Fenced) {
            return ErrorReason::Fenced;
        }
        match self.code() {
            Some(429) => ErrorReason::Throttled,
            Some(403) => ErrorReason::Forbidden,
            Some(409) => ErrorReason::Conflict,
            Some(400 | 422) => ErrorReason::Invalid,
            Some(_) => ErrorReason::Server,
            None => ErrorReason::Unreachable,
        }
    }

    /// The API server's Retry-After, in seconds (0 when it gave none).
    pub fn retry_after(&self) -> u32 {
        match self {
            Self::Kube(kube::Error::Api(s)) => s.details.as_ref().map_or(0, |d| d.retry_after_seconds),
            _ => 0,
        }
    }

    /// Whether a refused Service write was refused for its primary IP
    /// family: the existing ClusterIP is of another family than
    /// `ipFamilies[0]`.
    pub fn primary_family_refused(&self) -> bool {
        match self {
            Self::Kube(kube::Error::Api(s)) if s.code == 422 => {
                s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field == "spec.clusterIPs[0]"))
            }
            _ => false,
        }
    }
}

/// What the API server stored for a write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// Its resourceVersion: the watch event carrying it is our own write.
    pub version: Option<String>,
    /// A Service's `spec.clusterIPs`.
    pub cluster_ips: Vec<String>,
}

impl Stored {
    /// What matters of an object the API server returned.
    pub fn of(object: &Value) -> Self {
        Self {
            version: object["metadata"]["resourceVersion"].as_str().map(str::to_owned),
            cluster_ips: object["spec"]["clusterIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip.as_str().map(str::to_owned))
                .collect(),
        }
    }
}

/// The writes and reads of one member the controller makes. Every object
/// is in the service's namespace; bodies are server-side apply bodies.
pub trait MemberApi: Send + Sync {
    /// Applies `body` as `name` of `kind` in `namespace` (a status kind
    /// writes the status subresource), taking over fields others set,
    /// except for a ServiceExport, which only creates what is missing.
    /// Sent only through an open `fence`, checked at the wire.
    fn apply<'a>(
        &'a self,
        fence: &'a WriteFence,
        kind: Kind,
        namespace: &'a str,
        name: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, Result<Stored, ApiError>>;

    /// Deletes `name` of `kind` in `namespace`, through an open `fence`.
    fn delete<'a>(
        &'a self,
        fence: &'a WriteFence,
        kind: Kind,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>>;

    /// Every object of `kind` in `scope` (`None`: every namespace) whose
    /// labels match `labels` (empty: all), whole, as JSON.
    fn list<'a>(
        &'a self,
        kind: Kind,
        scope: Option<&'a str>,
        labels: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ApiError>>;
}

/// How long one API call may take before the member counts as
/// unreachable for it. Generous: the client-side rate limit's wait is
/// inside it, and a member found unreachable ends its calls sooner.
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// A member's API server through kube's client.
pub struct KubeMember {
    name: String,
    client: kube::Client,
    import: ApiResource,
    export: ApiResource,
    deadline: Duration,
    /// True while the member is marked unreachable: calls waiting on it end.
    down: watch::Receiver<bool>,
    /// Seconds per write, observed per member.
    latency: Option<prometheus::Histogram>,
}

impl KubeMember {
    /// The API of a member reached through `client`, with the MCS versions
    /// discovery found; calls end after `deadline`, or as soon as `down`
    /// turns true.
    pub fn new(
        name: String,
        client: kube::Client,
        (import, export): (ApiResource, ApiResource),
        deadline: Duration,
        down: watch::Receiver<bool>,
        latency: Option<prometheus::Histogram>,
    ) -> Self {
        Self { name, client, import, export, deadline, down, latency }
    }

    fn resource(&self, kind: Kind) -> ApiResource {
        match kind.object() {
            Kind::Service => ApiResource::erase::<Service>(&()),
            Kind::EndpointSlice => ApiResource::erase::<EndpointSlice>(&()),
            Kind::ServiceExport => self.export.clone(),
            _ => self.import.clone(),
        }
    }

    fn api(&self, kind: Kind, scope: Option<&str>) -> Api<DynamicObject> {
        match scope {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.resource(kind)),
            None => Api::all_with(self.client.clone(), &self.resource(kind)),
        }
    }

    /// Runs `call` under the deadline, ending it once the member is down.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        self.bounded_by(self.deadline, call).await.map_err(|e| match e {
            Ended::Deadline => {
                tracing::warn!(member = %self.name, deadline = ?self.deadline, "API call unanswered: counted as unreachable");
                ApiError::Deadline(self.deadline)
            }
            Ended::Api(e) => e,
        })
    }

    async fn bounded_by<T>(
        &self,
        deadline: Duration,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Ended> {
        if *self.down.borrow() {
            return Err(Ended::Api(ApiError::MemberDown));
        }
        let mut down = self.down.clone();
        tokio::select! {
            r = tokio::time::timeout(deadline, call) => match r {
                Ok(r) => r.map_err(|e| Ended::Api(e.into())),
                Err(_) => Err(Ended::Deadline),
            },
            _ = down.wait_for(|d| *d) => Err(Ended::Api(ApiError::MemberDown)),
        }
    }

    /// A write: its deadline is never later than the end of its fence, and
    /// it ends as soon as the fence is closed (a call still waiting then, in
    /// the rate limit or for its answer, is given up as fenced: the tenure
    /// it was sent under is over, and a call given up before it was sent
    /// takes no place in the rate limit).
    async fn timed_write<T>(
        &self,
        fence: &WriteFence,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        let call = async {
            tokio::select! {
                r = call => r,
                () = fence.fence.closing() => Err(kube::Error::Service(Box::new(fence::Fenced { shard: fence.shard }))),
            }
        };
        let start = Instant::now();
        let tenure = fence.fence.remaining().unwrap_or(self.deadline);
        let r = if tenure.is_zero() {
            Err(ApiError::Fenced)
        } else if tenure < self.deadline {
            self.bounded_by(tenure, call).await.map_err(|e| match e {
                Ended::Deadline => ApiError::Fenced,
                Ended::Api(e) => e,
            })
        } else {
            self.bounded(call).await
        };
        if let Some(h) = &self.latency {
            h.observe(start.elapsed().as_secs_f64());
        }
        r
    }
}

/// How a bounded call ended, when not with its answer.
enum Ended {
    /// Its deadline passed.
    Deadline,
    /// It failed, or the member was marked down.
    Api(ApiError),
}

impl MemberApi for KubeMember {
    fn apply<'a>(
        &'a self,
        fence: &'a WriteFence,
        kind: Kind,
        namespace: &'a str,
        name: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, Result<Stored, ApiError>> {
        Box::pin(async move {
            let api = self.api(kind, Some(namespace));
            // An export is the user's object once it exists: created, never
            // taken over.
            let pp = if kind == Kind::ServiceExport {
                PatchParams::apply(FIELD_MANAGER)
            } else {
                PatchParams::apply(FIELD_MANAGER).force()
            };
            let patch = Patch::Apply(body);
            // Built as kube's `Api::patch`/`patch_status` build it, with the
            // fence added for the client's innermost layer.
            let request = kube::core::Request::new(api.resource_url());
            let (built, verb) = if kind.is_status() {
                (request.patch_subresource("status", name, &pp, &patch), "patch_status")
            } else {
                (request.patch(name, &pp, &patch), "patch")
            };
            let mut req = built.map_err(|e| ApiError::Kube(kube::Error::BuildRequest(e)))?;
            req.extensions_mut().insert(verb);
            req.extensions_mut().insert(fence.clone());
            let object: DynamicObject = self.timed_write(fence, self.client.request(req)).await?;
            Ok(Stored::of(&serde_json::to_value(&object).unwrap_or_default()))
        })
    }

    fn delete<'a>(
        &'a self,
        fence: &'a WriteFence,
        kind: Kind,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let api = self.api(kind, Some(namespace));
            let request = kube::core::Request::new(api.resource_url());
            let mut req = request
                .delete(name, &DeleteParams::default())
                .map_err(|e| ApiError::Kube(kube::Error::BuildRequest(e)))?;
            req.extensions_mut().insert("delete");
            req.extensions_mut().insert(fence.clone());
            self.timed_write(fence, self.client.request_text(req)).await.map(|_| ())
        })
    }

    fn list<'a>(
        &'a self,
        kind: Kind,
        scope: Option<&'a str>,
        labels: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ApiError>> {
        Box::pin(async move {
            let api = self.api(kind, scope);
            let lp =
                if labels.is_empty() { ListParams::default() } else { ListParams::default().labels(labels) };
            let list = self.bounded(api.list(&lp)).await?;
            Ok(list.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
        })
    }
}

/// A member API shared by the reconciles of every service.
pub type SharedApi = Arc<dyn MemberApi>;

#[cfg(any(test, feature = "fakes"))]
#[allow(clippy::unwrap_used, missing_docs)]
pub mod fake {
    //! A member API in memory: objects by (kind, namespace, name), every
    //! call recorded, and faults to inject per call (a status error, a hang).

    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// A fault for the next calls that match.
    #[derive(Debug, Clone)]
    pub enum Fault {
        /// Answer with this HTTP status.
        Status(u16),
        /// Never answer.
        Hang,
        /// Wait until the gate opens (`send_replace(true)`), then go on.
        Wait(Gate),
        /// The same, for lists only (writes go on).
        ListWait(Gate),
    }

    /// A gate calls wait at: closed (`false`) until opened.
    pub type Gate = Arc<watch::Sender<bool>>;

    /// A closed gate.
    pub fn gate() -> Gate {
        Arc::new(watch::channel(false).0)
    }

    /// One call as the fake saw it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Call {
        /// "apply", "delete" or "list".
        pub verb: &'static str,
        /// The kind.
        pub kind: Kind,
        /// The object's name ("" for a list).
        pub name: String,
    }

    /// What reached an in-process API server ([`api_server`]): method and
    /// path, Audit-ID.
    pub type Received = Arc<Mutex<Vec<(String, String)>>>;

    /// A client builder over an in-process API server.
    pub type Server = kube::client::ClientBuilder<
        tower::util::BoxService<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
            std::convert::Infallible,
        >,
    >;

    /// A member API server in process, for a real client stack over it:
    /// answers a list with nothing and a write with the object it names,
    /// at once, and records what reached it (method, path, Audit-ID), in
    /// order.
    pub fn api_server() -> (Server, Received) {
        let seen: Received = Arc::default();
        let log = seen.clone();
        let server = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let id = req.headers().get(crate::k8s::fence::AUDIT_ID).and_then(|v| v.to_str().ok());
            log.lock()
                .unwrap()
                .push((format!("{} {}", req.method(), req.uri().path()), id.unwrap_or("").to_owned()));
            let name = req.uri().path().rsplit('/').next().unwrap_or("").to_owned();
            let body = if req.method() == http::Method::GET {
                serde_json::json!({"metadata": {}, "items": []}).to_string()
            } else {
                serde_json::json!({"metadata": {"name": name, "resourceVersion": "7"}}).to_string()
            };
            std::future::ready(Ok(http::Response::new(kube::client::Body::from(body.into_bytes()))))
        });
        (kube::client::ClientBuilder::new(tower::util::BoxService::new(server), "default"), seen)
    }

    /// The fake member.
    #[derive(Default)]
    pub struct FakeMember {
        /// What it holds: the last body applied, as stored (status kinds
        /// merged into their object under `status`).
        pub objects: Mutex<BTreeMap<(Kind, String, String), Value>>,
        /// Every call, in order.
        pub calls: Mutex<Vec<Call>>,
        faults: Mutex<Vec<(Option<Kind>, Fault)>>,
        version: Mutex<u64>,
    }

    impl FakeMember {
        /// Fails every later call of `kind` (all kinds: `None`) with `fault`.
        pub fn fail(&self, kind: Option<Kind>, fault: Fault) {
            self.faults.lock().unwrap().push((kind, fault));
        }

        /// Clears the faults.
        pub fn heal(&self) {
            self.faults.lock().unwrap().clear();
        }

        /// The writes (applies and deletes) made so far.
        pub fn writes(&self) -> Vec<Call> {
            self.calls.lock().unwrap().iter().filter(|c| c.verb != "list").cloned().collect()
        }

        /// The stored object, if any.
        pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
            self.objects.lock().unwrap().get(&(kind.object(), namespace.into(), name.into())).cloned()
        }

        /// Puts an object as someone else (or an earlier leader) left it.
        pub fn put(&self, kind: Kind, namespace: &str, name: &str, object: Value) {
            self.objects.lock().unwrap().insert((kind, namespace.into(), name.into()), object);
        }

        /// One call: its faults first (a hang, a wait), then for a write the
        /// fence, as at the wire; recorded once it reaches the "wire".
        async fn call(
            &self,
            verb: &'static str,
            kind: Kind,
            name: &str,
            fence: Option<&WriteFence>,
        ) -> Result<(), ApiError> {
            let fault = self
                .faults
                .lock()
                .unwrap()
                .iter()
                .find(|(k, f)| {
                    k.is_none_or(|k| k == kind) && (verb == "list" || !matches!(f, Fault::ListWait(_)))
                })
                .map(|(_, f)| f.clone());
            match fault {
                None => {}
                Some(Fault::Hang) => futures::future::pending().await,
                Some(Fault::Wait(gate) | Fault::ListWait(gate)) => {
                    let _ = gate.subscribe().wait_for(|open| *open).await;
                }
                Some(Fault::Status(code)) => {
                    self.calls.lock().unwrap().push(Call { verb, kind, name: name.into() });
                    return Err(ApiError::Kube(kube::Error::Api(
                        kube::core::Status::failure("injected", "Injected").with_code(code).boxed(),
                    )));
                }
            }
            if fence.is_some_and(|f| !f.fence.may_write()) {
                return Err(ApiError::Fenced);
            }
            self.calls.lock().unwrap().push(Call { verb, kind, name: name.into() });
            Ok(())
        }

        fn next_version(&self) -> String {
            let mut v = self.version.lock().unwrap();
            *v += 1;
            v.to_string()
        }
    }

    impl MemberApi for FakeMember {
        fn apply<'a>(
            &'a self,
            fence: &'a WriteFence,
            kind: Kind,
            namespace: &'a str,
            name: &'a str,
            body: &'a Value,
        ) -> BoxFuture<'a, Result<Stored, ApiError>> {
            Box::pin(async move {
                self.call("apply", kind, name, Some(fence)).await?;
                let version = self.next_version();
                let mut objects = self.objects.lock().unwrap();
                let key = (kind.object(), namespace.to_owned(), name.to_owned());
                if kind.is_status() {
                    let Some(o) = objects.get_mut(&key) else {
                        return Err(ApiError::Kube(kube::Error::Api(
                            kube::core::Status::failure("not found", "NotFound").with_code(404).boxed(),
                        )));
                    };
                    o["status"] = body["status"].clone();
                    o["metadata"]["resourceVersion"] = Value::String(version);
                    return Ok(Stored::of(o));
                }
                let mut stored = body.clone();
                stored["metadata"]["resourceVersion"] = Value::String(version);
                if kind == Kind::Service && stored["spec"]["clusterIPs"].is_null() {
                    let n = objects.len();
                    stored["spec"]["clusterIPs"] = serde_json::json!([format!("10.96.0.{}", n % 250 + 1)]);
                }
                if let Some(old) = objects.get(&key)
                    && !old["spec"]["clusterIPs"].is_null()
                {
                    stored["spec"]["clusterIPs"] = old["spec"]["clusterIPs"].clone();
                }
                // As the API server: writing an object leaves its status.
                if let Some(old) = objects.get(&key)
                    && !old["status"].is_null()
                {
                    stored["status"] = old["status"].clone();
                }
                let out = Stored::of(&stored);
                objects.insert(key, stored);
                Ok(out)
            })
        }

        fn delete<'a>(
            &'a self,
            fence: &'a WriteFence,
            kind: Kind,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<(), ApiError>> {
            Box::pin(async move {
                self.call("delete", kind, name, Some(fence)).await?;
                match self.objects.lock().unwrap().remove(&(kind.object(), namespace.into(), name.into())) {
                    Some(_) => Ok(()),
                    None => Err(ApiError::Kube(kube::Error::Api(
                        kube::core::Status::failure("not found", "NotFound").with_code(404).boxed(),
                    ))),
                }
            })
        }

        fn list<'a>(
            &'a self,
            kind: Kind,
            scope: Option<&'a str>,
            _labels: &'a str,
        ) -> BoxFuture<'a, Result<Vec<Value>, ApiError>> {
            Box::pin(async move {
                self.call("list", kind, "", None).await?;
                Ok(self
                    .objects
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|((k, ns, _), _)| *k == kind && scope.is_none_or(|s| s == ns))
                    .map(|(_, v)| v.clone())
                    .collect())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_refused_primary_family_is_told_from_other_invalid_services() {
        // As the API server sends it.
        let refused = |field: &str| -> ApiError {
            ApiError::Kube(kube::Error::Api(
                serde_json::from_value::<kube::core::Status>(
                    serde_json::json!({"status": "Failure", "code": 422, "reason": "Invalid",
                "message": "Service is invalid", "details": {"name": "web", "kind": "Service",
                "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value", "field": field}]}}),
                )
                .unwrap()
                .boxed(),
            ))
        };
        assert!(refused("spec.clusterIPs[0]").primary_family_refused());
        assert!(!refused("spec.ports[0].port").primary_family_refused());
        let plain = ApiError::Kube(kube::Error::Api(
            kube::core::Status::failure("invalid", "Invalid").with_code(422).boxed(),
        ));
        assert!(!plain.primary_family_refused());
    }

    #[test]
    fn errors_are_told_apart_by_what_the_api_server_said() {
        let api = |code| {
            ApiError::Kube(kube::Error::Api(
                kube::core::Status::failure("refused", "Test").with_code(code).boxed(),
            ))
        };
        assert_eq!(api(429).reason(), ErrorReason::Throttled);
        assert_eq!(api(403).reason(), ErrorReason::Forbidden);
        assert_eq!(api(409).reason(), ErrorReason::Conflict);
        assert_eq!(api(422).reason(), ErrorReason::Invalid);
        assert_eq!(api(503).reason(), ErrorReason::Server);
        assert_eq!(ApiError::Deadline(CALL_DEADLINE).reason(), ErrorReason::Unreachable);
        assert_eq!(ApiError::MemberDown.reason(), ErrorReason::Unreachable);
        assert_eq!(ApiError::Fenced.reason(), ErrorReason::Fenced);
        assert!(api(404).is_not_found());
    }

    /// A takeover while the member's rate limit holds writes back: those
    /// that reach the wire after the tenure ended are never sent, whatever
    /// the call's own deadline. Checked before the queue only (as before
    /// the fence moved to the wire), all twenty were sent.
    #[tokio::test(start_paused = true)]
    async fn writes_queued_in_the_rate_limit_are_not_sent_once_the_tenure_ends() {
        use crate::k8s::fence::{Fence, WriteFence};
        let (builder, seen) = fake::api_server();
        let limits = crate::k8s::throttle::Limits { qps: 1.0, burst: 1 };
        let client = crate::k8s::client::limited(builder, Some(limits), "m", Arc::default()).unwrap();
        let (_down, rx) = watch::channel(false);
        let m = KubeMember::new(
            "m".into(),
            client,
            (ApiResource::erase::<Service>(&()), ApiResource::erase::<Service>(&())),
            CALL_DEADLINE,
            rx,
            None,
        );
        let fence = Arc::new(Fence::closed());
        fence.held(tokio::time::Instant::now(), Duration::from_secs(15));
        let write = WriteFence::new(fence.clone(), 2);
        let body = json!({"apiVersion": "v1", "kind": "Service"});
        let start = tokio::time::Instant::now();
        // Another replica takes the shard 2.5 s in: this one closes its fence.
        let takeover = async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            fence.close();
        };
        let names: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
        let writes = names.iter().map(|n| m.apply(&write, Kind::Service, "ns", n, &body));
        let (results, ()) = tokio::join!(futures::future::join_all(writes), takeover);
        let sent = seen.lock().unwrap().clone();
        // One token at once, then one a second: at 0, 1 and 2 s.
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(
            sent.iter().all(|(call, id)| call.starts_with("PATCH /api/v1/namespaces/ns/services/s")
                && id.starts_with("fence-2-")),
            "{sent:?}"
        );
        let fenced = results.iter().filter(|r| matches!(r, Err(ApiError::Fenced))).count();
        assert_eq!(fenced, 17, "{results:?}");
        assert_eq!(start.elapsed(), Duration::from_millis(2500), "the fenced calls ended with the tenure");
        // The queued writes of the lost shard took no tokens: a write of a
        // shard still held is sent at the next token, at 3 s.
        let held = Arc::new(Fence::closed());
        held.held(tokio::time::Instant::now(), Duration::from_secs(15));
        m.apply(&WriteFence::new(held, 1), Kind::Service, "ns", "other", &body).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // Reads carry no fence.
        m.list(Kind::Service, Some("ns"), "").await.unwrap();
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last, ("GET /api/v1/namespaces/ns/services".to_owned(), String::new()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_to_a_member_that_never_answers_ends_at_its_deadline_or_when_it_is_marked_down() {
        let hang = || futures::future::pending::<Result<(), kube::Error>>();
        let (tx, rx) = watch::channel(false);
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let m = KubeMember::new(
            "m".into(),
            client,
            (ApiResource::erase::<Service>(&()), ApiResource::erase::<Service>(&())),
            Duration::from_secs(30),
            rx,
            None,
        );
        let start = tokio::time::Instant::now();
        assert!(matches!(m.bounded(hang()).await, Err(ApiError::Deadline(_))));
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        let start = tokio::time::Instant::now();
        let marked = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            tx.send_replace(true);
        };
        let (r, ()) = tokio::join!(m.bounded(hang()), marked);
        assert!(matches!(r, Err(ApiError::MemberDown)));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // Down already: no call is made at all.
        assert!(matches!(m.bounded(async { Ok(()) }).await, Err(ApiError::MemberDown)));
    }
}
