//! One member's objects of one service, read with list requests only
//! (filtered by name or label): the read-only identity of
//! `deploy/centralized/rbac.yaml` may list, not get, and a list of a name
//! that does not exist is an empty list, not an error.
//!
//! Every read is on its own: one that is forbidden or fails is recorded as
//! such and the others still count.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::observed::{MemberSeen, Seen, SeenCondition, SeenExport, SeenImport, SeenService, SeenSlice};
use crate::fleet::export::ServicePortSpec;
use crate::fleet::member::Member;
use crate::fleet::objects;
use crate::k8s::mcs::{
    LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, MCS_GROUP,
    MCS_VERSIONS, mcs_resource,
};
use crate::model::{
    ANNOTATION_ENDPOINT_ANSWERS, ANNOTATION_UNREACHABLE_CLUSTERS, ClusterId, DnsLabel, Protocol, ServiceKey,
};

/// Reads what `member` holds for `key`, its VIP Service by any of
/// `vip_names`; each read may take `timeout`. The DNS answers are not read
/// here.
pub async fn member(
    member: &Member,
    key: &ServiceKey,
    vip_names: &[String],
    timeout: Duration,
) -> MemberSeen {
    let r = Reads { client: &member.client, cluster: &member.cluster, key, timeout };
    let mcs_selector = format!("{LABEL_SERVICE_NAME}={}", key.name);
    let (service, vip, export, import, mcs_slices, own_slices) = tokio::join!(
        r.service(),
        r.vip(&mcs_selector, vip_names),
        r.mcs("ServiceExport", "serviceexports", export),
        r.mcs("ServiceImport", "serviceimports", import),
        r.slices(&mcs_selector),
        r.own_slices(),
    );
    MemberSeen {
        name: member.name.clone(),
        cluster: member.cluster.clone(),
        service,
        export,
        import,
        vip,
        mcs_slices,
        own_slices,
        dns: None,
    }
}

struct Reads<'a> {
    client: &'a Client,
    cluster: &'a ClusterId,
    key: &'a ServiceKey,
    timeout: Duration,
}

/// Why a list request gave no list.
enum ListError {
    /// HTTP 403.
    Forbidden(String),
    /// HTTP 404: the resource type is not served (a CRD not installed).
    NoSuchResource,
    /// Anything else.
    Failed(String),
}

impl<'a> Reads<'a> {
    fn by_name(&self, name: &str) -> ListParams {
        ListParams::default().fields(&format!("metadata.name={name}"))
    }

    async fn list<K>(&self, api: Api<K>, lp: &ListParams) -> Result<Vec<K>, ListError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match tokio::time::timeout(self.timeout, api.list(lp)).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(ListError::Forbidden(s.message)),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(ListError::NoSuchResource),
            Ok(Err(e)) => Err(ListError::Failed(e.to_string())),
            Err(_) => Err(ListError::Failed(format!("no answer within {:?}", self.timeout))),
        }
    }

    fn seen<T>(&self, what: &str, r: Result<T, ListError>) -> Seen<T> {
        match r {
            Ok(v) => Seen::Read(v),
            Err(ListError::Forbidden(m)) => Seen::Forbidden(m),
            Err(ListError::NoSuchResource) => Seen::Failed(format!("the API serves no {what}")),
            Err(ListError::Failed(m)) => Seen::Failed(m),
        }
    }

    async fn service(&self) -> Seen<Option<SeenService>> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), self.key.namespace.as_str());
        let found = self.list(api, &self.by_name(self.key.name.as_str())).await;
        self.seen("Services", found.map(|v| v.first().map(|s| service(self.cluster, s))))
    }

    /// The ClusterIPs of the Service labelled for the service (`selector`)
    /// with one of `names`: the controller names it short or long
    /// (`desired::Naming`), and only it knows which.
    async fn vip(&self, selector: &str, names: &[String]) -> Seen<Option<Vec<String>>> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), self.key.namespace.as_str());
        let found = self.list(api, &ListParams::default().labels(selector)).await;
        self.seen(
            "Services",
            found.map(|v| {
                v.iter()
                    .find(|s| s.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
                    .map(|s| s.spec.as_ref().and_then(|s| s.cluster_ips.clone()).unwrap_or_default())
            }),
        )
    }

    /// The ServiceExport or ServiceImport of the name, in the newest MCS
    /// version the member serves.
    async fn mcs<T>(
        &self,
        kind: &str,
        plural: &str,
        parse: fn(&ClusterId, &DynamicObject) -> T,
    ) -> Seen<Option<T>> {
        for version in MCS_VERSIONS {
            let ar = mcs_resource(version, kind, plural);
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), self.key.namespace.as_str(), &ar);
            match self.list(api, &self.by_name(self.key.name.as_str())).await {
                Err(ListError::NoSuchResource) => continue,
                found => return self.seen(kind, found.map(|v| v.first().map(|o| parse(self.cluster, o)))),
            }
        }
        Seen::Failed(format!("the API serves no {kind}s ({MCS_GROUP} CRDs not installed)"))
    }

    async fn slices(&self, selector: &str) -> Seen<Vec<SeenSlice>> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), self.key.namespace.as_str());
        let found = self.list(api, &ListParams::default().labels(selector)).await;
        self.seen("EndpointSlices", found.map(|v| v.iter().map(slice).collect()))
    }

    /// The Service's own slices: not ours, not another MCS implementation's.
    async fn own_slices(&self) -> Seen<Vec<SeenSlice>> {
        let selector = format!("{LABEL_K8S_SERVICE_NAME}={},!{LABEL_SOURCE_CLUSTER}", self.key.name);
        match self.slices(&selector).await {
            Seen::Read(v) => Seen::Read(
                v.into_iter().filter(|s| s.managed_by.as_deref() != Some(objects::MANAGED_BY)).collect(),
            ),
            other => other,
        }
    }
}

fn service(cluster: &ClusterId, s: &Service) -> SeenService {
    let spec = s.spec.as_ref();
    SeenService {
        type_: spec.and_then(|s| s.type_.clone()).unwrap_or_else(|| "ClusterIP".into()),
        headless: spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None"),
        cluster_ips: spec.and_then(|s| s.cluster_ips.clone()).unwrap_or_default(),
        exported: objects::exported(cluster, s),
    }
}

fn export(cluster: &ClusterId, o: &DynamicObject) -> SeenExport {
    let conditions = o
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let f = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            SeenCondition {
                type_: f("type"),
                status: f("status"),
                reason: f("reason"),
                message: f("message"),
            }
        })
        .collect();
    SeenExport {
        created: objects::exported_at(&o.metadata),
        created_text: o.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        conditions,
        annotations: objects::our_annotations(&o.metadata),
        metadata: objects::exported_metadata(cluster, o),
    }
}

fn import(_: &ClusterId, o: &DynamicObject) -> SeenImport {
    let spec = o.data.get("spec");
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let ports = spec
        .and_then(|s| s.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(ServicePortSpec {
                name: p.get("name").and_then(Value::as_str).and_then(|n| DnsLabel::parse(n).ok()),
                protocol: Protocol::from_api(p.get("protocol").and_then(Value::as_str))?,
                port: p.get("port").and_then(Value::as_u64).and_then(|n| u16::try_from(n).ok())?,
                app_protocol: p.get("appProtocol").and_then(Value::as_str).map(str::to_owned),
            })
        })
        .collect();
    let clusters = o
        .data
        .pointer("/status/clusters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("cluster").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let annotations: BTreeMap<String, String> = o.metadata.annotations.clone().unwrap_or_default();
    SeenImport {
        type_: spec.and_then(|s| s.get("type")).and_then(Value::as_str).unwrap_or("").to_owned(),
        ips: strings(spec.and_then(|s| s.get("ips"))),
        ports,
        clusters,
        unreachable: annotations
            .get(ANNOTATION_UNREACHABLE_CLUSTERS)
            .map(|v| v.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
        endpoint_answers: annotations.get(ANNOTATION_ENDPOINT_ANSWERS).is_some_and(|v| v == "true"),
    }
}

fn slice(s: &EndpointSlice) -> SeenSlice {
    let label = |k: &str| s.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned();
    let mut ready = Vec::new();
    let mut not_ready = 0;
    for e in &s.endpoints {
        // EndpointSlice API: an unset `ready` means ready.
        if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
            ready.extend(e.addresses.iter().filter_map(|a| a.parse::<std::net::IpAddr>().ok()));
        } else {
            not_ready += 1;
        }
    }
    SeenSlice {
        name: s.metadata.name.clone().unwrap_or_default(),
        source: label(LABEL_SOURCE_CLUSTER),
        managed_by: label(LABEL_MANAGED_BY),
        service_name: label(LABEL_K8S_SERVICE_NAME),
        ready,
        not_ready,
    }
}
