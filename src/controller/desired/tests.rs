//! Unit tests of the objects the controller wants (`desired.rs`).

use super::*;
use crate::model::DnsLabel;

fn key(name: &str) -> ServiceKey {
    ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse(name).unwrap() }
}

#[test]
fn a_live_object_covers_a_body_when_apply_would_change_nothing() {
    let body = json!({"metadata": {"name": "web-abc", "labels": {"a": "1"}},
            "addressType": "IPv4", "ports": [],
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "namespace": null, "name": "web-0"}}]});
    // As the API server returns it: more metadata, defaults, nulls and
    // empty lists dropped.
    let live = json!({"metadata": {"name": "web-abc", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "1", "added-by": "someone"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true},
                           "targetRef": {"kind": "Pod", "name": "web-0"}}]});
    assert!(covers(&live, &body));
    // Edited: an address, a readiness, an endpoint added, a label value,
    // a field removed.
    let edited = |f: &dyn Fn(&mut Value)| {
        let mut l = live.clone();
        f(&mut l);
        covers(&l, &body)
    };
    assert!(!edited(&|l| l["endpoints"][0]["addresses"][0] = json!("10.9.9.9")));
    assert!(!edited(&|l| l["endpoints"][0]["conditions"]["ready"] = json!(false)));
    assert!(!edited(&|l| l["endpoints"].as_array_mut().unwrap().push(json!({"addresses": ["10.0.0.2"]}))));
    assert!(!edited(&|l| l["metadata"]["labels"]["a"] = json!("2")));
    assert!(!edited(&|l| {
        l.as_object_mut().unwrap().remove("endpoints");
    }));
    assert!(!edited(&|l| l["addressType"] = json!(null)));
    // A list we write non-empty, found empty or absent.
    let with_ports = json!({"ports": [{"port": 80}]});
    assert!(!covers(&json!({}), &with_ports));
    assert!(!covers(&json!({"ports": []}), &with_ports));
    assert!(covers(&json!({"ports": [{"port": 80, "protocol": "TCP"}]}), &with_ports));
    // The log names the field.
    assert_eq!(difference(&json!({"ports": [{"port": 81}]}), &with_ports).as_deref(), Some("ports[0].port"));
    let mut l = live.clone();
    l["endpoints"][0]["addresses"][0] = json!("10.9.9.9");
    assert_eq!(difference(&l, &body).as_deref(), Some("endpoints[0].addresses[0]"));
}

#[test]
fn unreachable_clusters_become_an_annotation_serve_reads() {
    let spec = ImportSpec {
        kind: ImportType::Headless,
        ports: vec![],
        session_affinity: SessionAffinity::None,
        affinity_timeout: None,
        ip_families: vec![AddressFamily::V4],
        traffic_distribution: None,
        internal_traffic_policy: None,
        metadata: Default::default(),
        annotations: [("clusterset-dns.io/answer-policy".to_owned(), "random".to_owned())].into(),
    };
    let all = import("multicluster.x-k8s.io/v1alpha1", &key("db"), &spec, &[], &[]);
    assert!(
        all["metadata"]["annotations"].get(ANNOTATION_UNREACHABLE_CLUSTERS).is_none(),
        "absent while all are reachable: {all}"
    );
    // The export's answer configuration is carried.
    assert_eq!(all["metadata"]["annotations"]["clusterset-dns.io/answer-policy"], "random");
    let c = |n: &str| ClusterId::parse(n).unwrap();
    let body =
        import("multicluster.x-k8s.io/v1alpha1", &key("db"), &spec, &[], &[c("cluster-3"), c("cluster-2")]);
    assert_eq!(body["metadata"]["annotations"][ANNOTATION_UNREACHABLE_CLUSTERS], "cluster-2,cluster-3");
    // What serve makes of that object.
    let obj: crate::k8s::crd::ServiceImport = serde_json::from_value(body).unwrap();
    let converted = crate::k8s::convert::service_import(&obj).unwrap();
    assert_eq!(converted.answers.unreachable, [c("cluster-2"), c("cluster-3")]);
    assert_eq!(converted.answers.policy, Some(crate::model::PolicyKind::Random));
}

#[test]
fn consumer_clusters_choose_the_importing_members_and_fail_closed() {
    let c = |s: &str| ClusterId::parse(s).unwrap();
    let (a, b, x) = (c("cluster-a"), c("cluster-b"), c("cluster-x"));
    let members = [&a, &b];
    let of = |v: Option<&str>| {
        Consumers::of(
            &v.map(|v| (ANNOTATION_CONSUMER_CLUSTERS.to_owned(), v.to_owned())).into_iter().collect(),
        )
    };
    let all = of(None);
    assert!(all.includes(&a) && all.includes(&b));
    let only = of(Some(" cluster-b , cluster-x"));
    assert!(!only.includes(&a) && only.includes(&b));
    assert_eq!(
        only.describe(&members),
        "Imported into cluster-b only (clusterset-dns.io/consumer-clusters), where the namespace exists. Not member clusters: cluster-x."
    );
    let none = of(Some(""));
    assert!(!none.includes(&a) && none.describe(&members).starts_with("Imported into no member cluster"));
    let bad = of(Some("cluster-a,Not_A_Cluster"));
    assert!(matches!(bad, Consumers::Invalid(_)) && !bad.includes(&a), "{bad:?}");
    assert!(bad.describe(&members).contains("Not_A_Cluster"), "{}", bad.describe(&members));
    let _ = x;
    assert_eq!(
        export("multicluster.x-k8s.io/v1alpha1", &key("web"), Some("cluster-b"))["metadata"]["annotations"]
            [ANNOTATION_CONSUMER_CLUSTERS],
        "cluster-b"
    );
    assert!(
        export("multicluster.x-k8s.io/v1alpha1", &key("web"), None)["metadata"].get("annotations").is_none()
    );
}

fn port(name: Option<&str>, protocol: crate::model::Protocol, port: u16) -> ServicePortSpec {
    ServicePortSpec { name: name.map(|n| DnsLabel::parse(n).unwrap()), protocol, port, app_protocol: None }
}

#[test]
fn vip_services_name_unnamed_ports_and_mirrored_slices_follow() {
    use crate::model::Protocol::{Tcp, Udp};
    // One unnamed port stays unnamed, as the exported Service has it.
    let one = VipPorts::new(&[port(None, Tcp, 80)]);
    assert_eq!(one.body(), vec![json!({"protocol": "TCP", "port": 80})]);
    assert_eq!(one.unnamed_in(&[port(None, Tcp, 80)]), None);
    // Two clusters' unnamed ports: both named, never colliding with a
    // user's name.
    let union = [port(None, Tcp, 80), port(None, Tcp, 8080), port(Some("tcp-80"), Udp, 53)];
    let vip = VipPorts::new(&union);
    let body = vip.body();
    let names: Vec<&str> = body.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tcp-80-x", "tcp-8080", "tcp-80"]);
    assert_eq!(vip.unnamed_in(&[port(None, Tcp, 8080)]), Some("tcp-8080"));
    assert_eq!(vip.unnamed_in(&[port(Some("tcp-80"), Udp, 53)]), None);

    let source: EndpointSlice = serde_yaml_ng::from_str(
        "metadata: {name: web-abc, namespace: shop}
addressType: IPv4
ports: [{port: 8443, protocol: TCP}]
endpoints:
- addresses: [10.1.0.5]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-7
  zone: zone-a
  hints: {forZones: [{name: zone-a}]}",
    )
    .unwrap();
    let c = ClusterId::parse("b").unwrap();
    let renamed = ClusterPorts { served: vec![], unnamed_as: Some("tcp-8080".into()) };
    let body = slice(&key("web"), "m", &c, &source, Some("v"), Some(&renamed));
    assert_eq!(body["ports"], json!([{"name": "tcp-8080", "port": 8443, "protocol": "TCP"}]));
    let e = &body["endpoints"][0];
    assert_eq!(e["conditions"], json!({"ready": false, "serving": true, "terminating": true}));
    assert_eq!((e["nodeName"].as_str(), e["zone"].as_str()), (Some("node-7"), Some("zone-a")));
    assert_eq!(e["hints"], json!({"forZones": [{"name": "zone-a"}]}));
    // Not renamed when the VIP Service keeps the port unnamed.
    assert_eq!(slice(&key("web"), "m", &c, &source, Some("v"), None)["ports"][0].get("name"), None);
    let kept = ClusterPorts::default();
    assert_eq!(slice(&key("web"), "m", &c, &source, Some("v"), Some(&kept))["ports"][0].get("name"), None);
}

#[test]
fn a_port_whose_number_lost_the_conflict_is_not_mirrored() {
    use crate::model::Protocol::{Tcp, Udp};
    // The conformance suite's StrictPortConflict: cluster a exports tcp
    // 42 first, cluster b tcp 4242 (target port 42 in both); the import
    // has tcp 42 (and b's udp 53, no conflict).
    let vip = VipPorts::new(&[port(Some("tcp"), Tcp, 42), port(Some("dns"), Udp, 53)]);
    let a = vip.of_cluster(&[port(Some("tcp"), Tcp, 42)]);
    let b = vip.of_cluster(&[port(Some("tcp"), Tcp, 4242), port(Some("dns"), Udp, 53)]);
    assert_eq!(a.served, ["tcp"]);
    assert_eq!(b.served, ["dns"], "b's tcp is 4242, not the import's 42");
    let source: EndpointSlice = serde_yaml_ng::from_str(
        "metadata: {name: hello-xyz, namespace: shop}
addressType: IPv4
ports: [{name: tcp, port: 42, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
endpoints: [{addresses: [10.2.0.5]}]",
    )
    .unwrap();
    let c = ClusterId::parse("b").unwrap();
    let mirrored = slice(&key("hello"), "m", &c, &source, Some("v"), Some(&b));
    assert_eq!(mirrored["ports"], json!([{"name": "dns", "port": 53, "protocol": "UDP"}]));
    // Ports not known (no Service of the cluster): mirrored as they are.
    assert_eq!(
        slice(&key("hello"), "m", &c, &source, Some("v"), None)["ports"].as_array().map(Vec::len),
        Some(2)
    );
}

#[test]
fn exported_labels_reach_the_import_but_never_replace_ours() {
    let spec = ImportSpec {
        kind: ImportType::ClusterSetIp,
        ports: vec![],
        session_affinity: SessionAffinity::None,
        affinity_timeout: None,
        ip_families: vec![AddressFamily::V4],
        traffic_distribution: None,
        internal_traffic_policy: Some("Cluster".into()),
        metadata: crate::fleet::export::ExportedMetadata {
            labels: [("team".into(), "a".into()), (LABEL_APP_MANAGED_BY.into(), "someone".into())].into(),
            annotations: [("note".into(), "x".into())].into(),
        },
        annotations: Default::default(),
    };
    let body = import("multicluster.x-k8s.io/v1alpha1", &key("web"), &spec, &[], &[]);
    assert_eq!(body["metadata"]["labels"]["team"], "a");
    assert_eq!(body["metadata"]["labels"][LABEL_APP_MANAGED_BY], FIELD_MANAGER);
    assert_eq!(body["metadata"]["annotations"]["note"], "x");
    assert_eq!(body["spec"]["internalTrafficPolicy"], "Cluster");
}

#[test]
fn derived_names_are_stable_short_and_distinct() {
    let long = "a".repeat(63);
    for naming in [Naming::Short, Naming::Long] {
        assert!(vip_name(&key(&long), naming).len() <= 63);
        assert_eq!(vip_name(&key("web"), naming), vip_name(&key("web"), naming));
        assert_ne!(vip_name(&key("web"), naming), vip_name(&key("api"), naming));
        assert!(!vip_name(&key("web"), naming).starts_with("derived-"));
    }
    let c = ClusterId::parse("cluster-a").unwrap();
    let d = ClusterId::parse("cluster-b").unwrap();
    assert_ne!(slice_name(&key("web"), &c, "web-x"), slice_name(&key("web"), &d, "web-x"));
    assert!(slice_name(&key(&long), &c, "x").len() <= 63);
    // Pinned: a changed digest would orphan every object after an upgrade.
    assert_eq!(vip_name(&key("web"), Naming::Short), "web-clusterset-19ea9383");
}

#[test]
fn services_sharing_a_stem_get_distinct_long_names() {
    // Two names whose first 40 characters agree: one stem, so only the
    // short names' 32-bit digests tell them apart.
    let stem40 = "a-service-with-a-rather-long-name-for-dn";
    let (x, y) = (format!("{stem40}s-one"), format!("{stem40}s-two"));
    assert_eq!(stem(&x), stem(&y));
    assert_eq!(stem(stem40), stem(&x), "the 40-character name itself shares the stem");
    // A cut that ends in a dash drops it: names stay DNS labels.
    assert_eq!(stem(&format!("{}-x", "b".repeat(39))), "b".repeat(39));
    let c = ClusterId::parse("cluster-a").unwrap();
    for n in [&x, &y, &"c".repeat(63)] {
        let long = vip_name(&key(n), Naming::Long);
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, vip_name(&key(n), Naming::Short));
        let slices = slice_names(&key(n), Naming::Long, &[(&c, "s-1"), (&c, "s-2")]);
        assert!(slices.iter().all(|s| s.len() <= 63 && s.starts_with(stem(n))), "{slices:?}");
        assert_ne!(slices[0], slices[1]);
        assert_ne!(slices, slice_names(&key(n), Naming::Short, &[(&c, "s-1"), (&c, "s-2")]));
    }
    assert_ne!(vip_name(&key(&x), Naming::Long), vip_name(&key(&y), Naming::Long));
    // The same source of both services: distinct long names.
    assert_ne!(
        slice_names(&key(&x), Naming::Long, &[(&c, "s")]),
        slice_names(&key(&y), Naming::Long, &[(&c, "s")])
    );
}

#[test]
fn sources_whose_short_digests_collide_get_distinct_names() {
    let a = ClusterId::parse("cluster-a").unwrap();
    let b = ClusterId::parse("cluster-b").unwrap();
    // Found offline: two names the EndpointSlice controller could give
    // (service name, 5 random characters) with one 32-bit digest.
    let (x, y) = ("web-h6kvr", "web-efi2a");
    assert_eq!(slice_name(&key("web"), &a, x), slice_name(&key("web"), &a, y), "the pair collides");
    // Either order: the first by (cluster, source) keeps the short name,
    // so a name does not move when the order of the sources does.
    for sources in [vec![(&a, x), (&a, y), (&b, x)], vec![(&b, x), (&a, y), (&a, x)]] {
        let names = slice_names(&key("web"), Naming::Short, &sources);
        let of = |src: (&ClusterId, &str)| names[sources.iter().position(|s| *s == src).unwrap()].clone();
        assert_eq!(of((&a, y)), slice_name(&key("web"), &a, y), "web-efi2a < web-h6kvr keeps its name");
        assert_eq!(of((&a, x)), format!("web-{}", long_digest(&["cluster-a", x])));
        assert_eq!(of((&b, x)), slice_name(&key("web"), &b, x), "no collision, no change");
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), 3, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 63));
    }
    // Without a collision every name is slice_name's.
    assert_eq!(
        slice_names(&key("web"), Naming::Short, &[(&a, x), (&b, y)]),
        [slice_name(&key("web"), &a, x), slice_name(&key("web"), &b, y)]
    );
}

#[test]
fn the_digest_of_a_body_is_pinned() {
    // Live objects carry the digest of the body applied; a change to it
    // (serde_json's key order, e.g. a crate enabling `preserve_order`, or
    // the hash) would make every object look changed and be written again.
    let body = json!({"spec": {"type": "ClusterSetIP", "ports": [{"port": 80, "protocol": "TCP"}]}, "b": 1, "a": [true, null]});
    assert_eq!(
        body.to_string(),
        r#"{"a":[true,null],"b":1,"spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"ClusterSetIP"}}"#
    );
    assert_eq!(digest_of(&body), "3bc615025f4df24c");
}

/// Two services whose names share their first 40 characters: the younger
/// export takes long names, the elder and every other service keep short
/// ones; once the elder stops exporting, the younger has no elder.
#[test]
fn the_younger_of_two_services_sharing_a_stem_has_an_elder() {
    use crate::fleet::state::{Change, Delta, ExportInfo, FleetState, MemberEvent};
    use crate::model::{ClusterId, SliceKey};
    let long = |suffix: &str| format!("{}{suffix}", "a".repeat(40));
    let mut state = FleetState::new(vec![ClusterId::parse("c1").unwrap()], 1);
    let export = |name: &str, at: i64| MemberEvent {
        member: 0,
        change: Change::Exports(Delta::Applied(
            SliceKey { namespace: "shop".into(), name: name.into() },
            key(name),
            ExportInfo {
                exported_at: at,
                ours: false,
                annotations: Default::default(),
                metadata: Default::default(),
                uid: None,
            },
        )),
    };
    let mut dirty = std::collections::BTreeSet::new();
    state.apply(export(&long("-old"), 100), &mut dirty);
    state.apply(export(&long("-new"), 200), &mut dirty);
    state.apply(export("web", 50), &mut dirty);
    state.apply(export(&"b".repeat(45), 10), &mut dirty);
    assert!(has_elder(&state, &key(&long("-new"))));
    assert!(!has_elder(&state, &key(&long("-old"))));
    assert!(!has_elder(&state, &key("web")));
    assert!(!has_elder(&state, &key(&"b".repeat(45))));
    // The service named the stem itself, exported earlier, is an elder too.
    state.apply(export(&"a".repeat(40), 1), &mut dirty);
    assert!(has_elder(&state, &key(&long("-old"))));
    state.apply(
        MemberEvent {
            member: 0,
            change: Change::Exports(Delta::Deleted(SliceKey {
                namespace: "shop".into(),
                name: "a".repeat(40),
            })),
        },
        &mut dirty,
    );
    state.apply(
        MemberEvent {
            member: 0,
            change: Change::Exports(Delta::Deleted(SliceKey {
                namespace: "shop".into(),
                name: long("-old"),
            })),
        },
        &mut dirty,
    );
    assert!(!has_elder(&state, &key(&long("-new"))), "its elder stopped exporting");
}
