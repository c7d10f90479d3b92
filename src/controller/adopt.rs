//! What a member holds of ours, read whole from its API server: at start,
//! after every leadership change, when a member's API is first discovered,
//! and at every slow resync. Each object's live body is kept until the next
//! reconcile of its service compares it with the body it wants
//! ([`super::desired::covers`]), so what changed while no controller ran (a
//! `kubectl edit`, a restored backup, another controller) is repaired, and
//! what did not is not written again.

use std::collections::HashMap;

use serde_json::Value;
use tracing::warn;

use super::api::{ApiError, Kind, MemberApi};
use super::desired::{self, FIELD_MANAGER, LABEL_APP_MANAGED_BY};
use super::reconcile::{KeyState, WrittenObject};
use crate::fleet::merge::{Status, condition};
use crate::k8s::mcs::LABEL_SERVICE_NAME;
use crate::model::{ClusterId, ServiceKey};

/// The fields of an object we write (and so compare); the rest (status,
/// managedFields, uid, …) is dropped so that what waits for its reconcile
/// stays small.
const COMPARED: &[&str] = &["spec", "addressType", "endpoints", "ports"];

/// Reads member `m`'s objects of ours and its exports' conditions in
/// `scopes`, into one [`KeyState`] per service. Returns the lists that
/// failed too: their objects are not adopted (they are written again if
/// wanted, and nothing is deleted that was not seen).
pub async fn adopt(
    api: &dyn MemberApi,
    m: usize,
    cluster: &ClusterId,
    scopes: &[Option<String>],
) -> (HashMap<ServiceKey, KeyState>, Vec<(Kind, ApiError)>) {
    let mut found: HashMap<ServiceKey, KeyState> = HashMap::new();
    let mut failed = Vec::new();
    let ours = format!("{LABEL_APP_MANAGED_BY}={FIELD_MANAGER}");
    for scope in scopes {
        for kind in [Kind::ServiceImport, Kind::Service, Kind::EndpointSlice] {
            match api.list(kind, scope.as_deref(), &ours).await {
                Ok(items) => {
                    for o in items {
                        adopt_object(&mut found, m, cluster, kind, o);
                    }
                }
                Err(e) => failed.push((kind, e)),
            }
        }
        match api.list(Kind::ServiceExport, scope.as_deref(), "").await {
            Ok(items) => {
                for o in items {
                    adopt_conditions(&mut found, m, cluster, &o);
                }
            }
            Err(e) => failed.push((Kind::ServiceExport, e)),
        }
    }
    (found, failed)
}

fn key_of(cluster: &ClusterId, kind: Kind, namespace: &str, name: &str) -> Option<ServiceKey> {
    let meta = kube::api::ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..Default::default()
    };
    match crate::fleet::objects::key_of(cluster, kind.as_str(), &meta) {
        Ok(k) => Some(k),
        Err(e) => {
            warn!(error = %e, "not adopted");
            None
        }
    }
}

fn adopt_object(
    found: &mut HashMap<ServiceKey, KeyState>,
    m: usize,
    cluster: &ClusterId,
    kind: Kind,
    o: Value,
) {
    let meta = &o["metadata"];
    let (Some(ns), Some(name), Some(service)) =
        (meta["namespace"].as_str(), meta["name"].as_str(), meta["labels"][LABEL_SERVICE_NAME].as_str())
    else {
        return;
    };
    let Some(key) = key_of(cluster, kind, ns, service) else { return };
    let r = WrittenObject { member: m, kind, namespace: ns.to_owned(), name: name.to_owned() };
    let ks = found.entry(key).or_default();
    // What an earlier leader applied, as it recorded it: equal bodies are
    // not written again, unless the live object no longer holds them.
    if let Some(d) = meta["annotations"][desired::ANNOTATION_APPLIED].as_str() {
        ks.applied.insert(r.clone(), d.to_owned());
    }
    if kind == Kind::Service {
        let ips = o["spec"]["clusterIPs"].as_array().into_iter().flatten();
        ks.vips.insert(r.clone(), ips.filter_map(|ip| ip.as_str().map(str::to_owned)).collect());
    }
    if kind == Kind::ServiceImport && !o["status"].is_null() {
        ks.applied.insert(
            WrittenObject { kind: Kind::ImportStatus, ..r.clone() },
            desired::digest_of(&o["status"]),
        );
        // Its SourcesReachable time is kept, as the export conditions' are.
        let conditions = o["status"]["conditions"].as_array().into_iter().flatten();
        if let Some(c) = conditions.into_iter().find(|c| c["type"] == desired::CONDITION_SOURCES_REACHABLE) {
            ks.transitions.insert((m, desired::CONDITION_SOURCES_REACHABLE), timed_status(c));
        }
    }
    // This version is as we found it: its watch event is not a change.
    ks.written.record(r.clone(), meta["resourceVersion"].as_str());
    let mut live = serde_json::Map::new();
    live.insert(
        "metadata".into(),
        serde_json::json!({"name": name, "namespace": ns,
            "labels": meta["labels"].clone(), "annotations": meta["annotations"].clone()}),
    );
    for field in COMPARED {
        if let Some(v) = o.get(*field) {
            live.insert((*field).into(), v.clone());
        }
    }
    ks.live.insert(r.clone(), Value::Object(live));
    ks.owned.insert(r);
}

/// A condition as written: its status and lastTransitionTime.
fn timed_status(c: &Value) -> (Status, String) {
    let status = match c["status"].as_str() {
        Some("True") => Status::True,
        Some("False") => Status::False,
        _ => Status::Unknown,
    };
    (status, c["lastTransitionTime"].as_str().unwrap_or_default().to_owned())
}

/// The export's conditions as written: their transition times are kept,
/// and equal conditions are not written again.
fn adopt_conditions(found: &mut HashMap<ServiceKey, KeyState>, m: usize, cluster: &ClusterId, o: &Value) {
    let meta = &o["metadata"];
    let (Some(ns), Some(name)) = (meta["namespace"].as_str(), meta["name"].as_str()) else { return };
    let Some(st) = o.get("status").filter(|s| s.get("conditions").is_some()) else { return };
    let Some(key) = key_of(cluster, Kind::ServiceExport, ns, name) else { return };
    let ks = found.entry(key.clone()).or_default();
    for c in st["conditions"].as_array().into_iter().flatten() {
        let kind = match c["type"].as_str() {
            Some(condition::VALID) => condition::VALID,
            Some(condition::READY) => condition::READY,
            Some(condition::CONFLICT) => condition::CONFLICT,
            _ => continue,
        };
        ks.transitions.insert((m, kind), timed_status(c));
    }
    ks.applied
        .insert(WrittenObject::new(m, Kind::ExportStatus, &key, name.to_owned()), desired::digest_of(st));
    ks.export_uids.insert(m, meta["uid"].as_str().map(str::to_owned));
}

impl KeyState {
    /// Takes in what [`adopt`] found for this service. What the controller
    /// knows of its own writes wins, except what only the live objects can
    /// tell: their bodies (compared at the next apply) and their statuses.
    pub fn adopt(&mut self, found: Self) {
        for (r, d) in &found.applied {
            if matches!(r.kind, Kind::ImportStatus | Kind::ExportStatus) {
                self.applied.insert(r.clone(), d.clone());
            }
        }
        self.live.extend(found.live.iter().map(|(r, v)| (r.clone(), v.clone())));
        self.absorb(found);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controller::api::fake::FakeMember;

    fn cluster() -> ClusterId {
        ClusterId::parse("cluster-1").unwrap()
    }

    #[tokio::test]
    async fn our_objects_are_adopted_whole_and_others_are_not() {
        let api = FakeMember::default();
        let labels = json!({"app.kubernetes.io/managed-by": FIELD_MANAGER, LABEL_SERVICE_NAME: "web"});
        api.put(
            Kind::EndpointSlice,
            "shop",
            "web-abc",
            json!({"metadata": {"namespace": "shop", "name": "web-abc", "resourceVersion": "3",
                "labels": labels, "annotations": {desired::ANNOTATION_APPLIED: "0123"},
                "managedFields": [{"manager": "x"}]},
                "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]}),
        );
        // Not labelled as ours by its service: skipped (the fake ignores
        // label selectors; the object's own labels decide).
        api.put(
            Kind::Service,
            "shop",
            "other",
            json!({"metadata": {"namespace": "shop", "name": "other", "labels": {}}}),
        );
        api.put(
            Kind::ServiceExport,
            "shop",
            "web",
            json!({"metadata": {"namespace": "shop", "name": "web", "uid": "u1"},
                "status": {"conditions": [{"type": "Valid", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        );
        let (found, failed) = adopt(&api, 0, &cluster(), &[None]).await;
        assert!(failed.is_empty());
        assert_eq!(found.len(), 1, "{:?}", found.keys().collect::<Vec<_>>());
        let ks = found.values().next().unwrap();
        let slice = WrittenObject {
            member: 0,
            kind: Kind::EndpointSlice,
            namespace: "shop".into(),
            name: "web-abc".into(),
        };
        assert_eq!(ks.applied.get(&slice).map(String::as_str), Some("0123"));
        assert!(ks.owned.contains(&slice));
        assert!(ks.written.ours(&slice, "3"));
        let live = &ks.live[&slice];
        assert_eq!(live["endpoints"][0]["addresses"][0], "10.0.0.1");
        assert!(live["metadata"].get("managedFields").is_none(), "pruned: {live}");
        assert_eq!(ks.transitions.get(&(0, condition::VALID)).map(|t| t.0), Some(Status::True));
        assert_eq!(ks.export_uids.get(&0), Some(&Some("u1".to_owned())));
    }

    #[tokio::test]
    async fn a_failed_list_adopts_nothing_of_its_kind_and_says_so() {
        let api = FakeMember::default();
        api.fail(Some(Kind::Service), crate::controller::api::fake::Fault::Status(500));
        let (_, failed) = adopt(&api, 0, &cluster(), &[Some("shop".into())]).await;
        assert_eq!(failed.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![Kind::Service]);
    }
}
