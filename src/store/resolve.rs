//! Which import and which slices a service is answered from when several
//! objects speak for it: our MCS objects, and the Services and slices other
//! fleet managers write (`--interop`). Pure; the writer calls it for every
//! service it rebuilds.
//!
//! The rules, in order (docs/interop.md says them for operators):
//! - A ServiceImport with `spec.ips`, or a Headless one, is served as it is.
//! - A ClusterSetIP ServiceImport without `spec.ips` takes the cluster IPs
//!   and ports of its backing Service (Karmada's `derived-<svc>`, else the
//!   same-name Service Kosmos or Karmada's MultiClusterService wrote); a
//!   headless backing Service makes the service headless (Kosmos imports
//!   are always ClusterSetIP, whatever the root Service is). Without a
//!   backing Service with an address the import answers NODATA.
//! - Without a ServiceImport, only a `CrossCluster` MultiClusterService's
//!   Service makes a service exist.
//! - Slices: only those of the first origin present ([`SliceOrigin`](crate::model::SliceOrigin)'s
//!   order: MCS first), so a name never mixes two fleet managers' views
//!   and never depends on which object arrived last.

use std::borrow::Cow;
use std::sync::Arc;

use super::input::SourceId;
use super::slice::Slice;
use super::vec_map::VecMap;
use crate::model::{BackingKind, BackingService, ImportType, ServiceImport, ServiceKey, SliceKey};

/// What one service is answered from.
pub(crate) struct Served<'a> {
    /// The import, as given or completed from its backing Service.
    pub(crate) import: Cow<'a, ServiceImport>,
    /// The slices of the winning origin.
    pub(crate) slices: Vec<&'a Slice>,
    /// Why a ClusterSetIP import has no address (answered NODATA), naming
    /// the objects; `None` when it has one or needs none.
    pub(crate) unresolved: Option<String>,
}

/// Resolves one service's objects; `None` when it has no import (and no
/// `CrossCluster` Service standing for one).
pub(crate) fn served<'a>(
    key: &ServiceKey,
    import: Option<&'a ServiceImport>,
    backing: &'a VecMap<(SourceId, SliceKey), BackingService>,
    slices: impl Iterator<Item = &'a Slice> + Clone,
) -> Option<Served<'a>> {
    // `min_by_key` keeps the first of equals: map order, (source, name).
    let backing = backing.values().min_by_key(|b| b.kind);
    let first = slices.clone().map(|s| s.origin).min();
    let slices = slices.filter(|s| Some(s.origin) == first).collect();
    let (import, unresolved) = match (import, backing) {
        (Some(i), _) if !i.ips.is_empty() || i.kind == ImportType::Headless => (Cow::Borrowed(i), None),
        (Some(i), Some(b)) if b.headless => {
            (Cow::Owned(ServiceImport { kind: ImportType::Headless, ports: ports(i, b), ..i.clone() }), None)
        }
        (Some(i), Some(b)) if !b.ips.is_empty() => {
            (Cow::Owned(ServiceImport { ips: b.ips[..].into(), ports: ports(i, b), ..i.clone() }), None)
        }
        (Some(i), Some(b)) => (
            Cow::Borrowed(i),
            Some(format!(
                "ServiceImport {key} has no spec.ips and its backing Service {} ({}) has no cluster IP",
                b.object,
                b.kind.as_str()
            )),
        ),
        (Some(i), None) => (
            Cow::Borrowed(i),
            Some(format!(
                "ServiceImport {key} is ClusterSetIP with no spec.ips yet (its clusterset VIP not allocated; with --interop, no backing Service derived-{} or {} either)",
                key.name, key.name
            )),
        ),
        (None, Some(b)) if b.kind == BackingKind::KarmadaCrossCluster => {
            let import = ServiceImport {
                key: key.clone(),
                kind: if b.headless { ImportType::Headless } else { ImportType::ClusterSetIp },
                ips: b.ips[..].into(),
                ports: b.ports[..].into(),
                answers: Default::default(),
            };
            let unresolved = (!b.headless && b.ips.is_empty()).then(|| {
                format!("Service {} (MultiClusterService CrossCluster) has no cluster IP", b.object)
            });
            (Cow::Owned(import), unresolved)
        }
        (None, _) => return None,
    };
    Some(Served { import, slices, unresolved })
}

/// The backing Service's ports: they are what its cluster IP serves (Kosmos
/// writes a placeholder port on its imports). The import's when it has none.
fn ports(import: &ServiceImport, backing: &BackingService) -> Arc<[crate::model::Port]> {
    if backing.ports.is_empty() { Arc::clone(&import.ports) } else { backing.ports[..].into() }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::model::{AddressFamily, ClusterId, DnsLabel, Port, Protocol, SliceOrigin};

    static NONE_B: VecMap<(SourceId, SliceKey), BackingService> = VecMap::new();
    static NONE_S: VecMap<(SourceId, SliceKey), Slice> = VecMap::new();

    fn key() -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse("db").unwrap() }
    }

    fn import(ips: &[&str]) -> ServiceImport {
        ServiceImport {
            key: key(),
            kind: ImportType::ClusterSetIp,
            ips: ips.iter().map(|i| i.parse().unwrap()).collect::<Vec<_>>().into(),
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }].into(),
            answers: Default::default(),
        }
    }

    fn backing(name: &str, kind: BackingKind, ips: &[&str]) -> ((SourceId, SliceKey), BackingService) {
        let object = SliceKey { namespace: "shop".into(), name: name.into() };
        let b = BackingService {
            object: object.clone(),
            service: key(),
            kind,
            headless: ips == ["None"],
            ips: ips.iter().filter(|i| **i != "None").map(|i| i.parse().unwrap()).collect(),
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 5432 }],
        };
        ((SourceId::Watch(3), object), b)
    }

    fn slice(name: &str, origin: SliceOrigin) -> ((SourceId, SliceKey), Slice) {
        let s = SliceKey { namespace: "shop".into(), name: name.into() };
        let set = Slice {
            name: name.into(),
            cluster: ClusterId::parse("c1").unwrap(),
            family: AddressFamily::V4,
            origin,
            ports: Default::default(),
            endpoints: Default::default(),
            trigger: 0,
        };
        ((SourceId::Watch(2), s), set)
    }

    fn ips(i: &ServiceImport) -> Vec<IpAddr> {
        i.ips.to_vec()
    }

    #[test]
    fn import_ips_win_over_a_backing_service() {
        let b = VecMap::from_iter([backing("derived-db", BackingKind::KarmadaDerived, &["10.96.0.9"])]);
        let i = import(&["10.0.0.1"]);
        let s = served(&key(), Some(&i), &b, NONE_S.values()).unwrap();
        assert_eq!(ips(&s.import), vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.import.ports[0].port, 80);
        assert!(s.unresolved.is_none());
    }

    #[test]
    fn an_import_without_ips_takes_the_backing_service_ips_and_ports() {
        let b = VecMap::from_iter([backing("derived-db", BackingKind::KarmadaDerived, &["10.96.0.9"])]);
        let i = import(&[]);
        let s = served(&key(), Some(&i), &b, NONE_S.values()).unwrap();
        assert_eq!(ips(&s.import), vec!["10.96.0.9".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.import.ports[0].port, 5432);
    }

    #[test]
    fn karmada_derived_wins_over_a_same_name_service_whatever_the_order() {
        for order in [[0, 1], [1, 0]] {
            let candidates = [
                backing("derived-db", BackingKind::KarmadaDerived, &["10.96.0.9"]),
                backing("db", BackingKind::Kosmos, &["10.96.0.7"]),
            ];
            let mut b = VecMap::default();
            for k in order {
                let (id, v) = candidates[k].clone();
                b.insert(id, v);
            }
            let i = import(&[]);
            let s = served(&key(), Some(&i), &b, NONE_S.values()).unwrap();
            assert_eq!(ips(&s.import), vec!["10.96.0.9".parse::<IpAddr>().unwrap()]);
        }
    }

    #[test]
    fn a_headless_backing_service_makes_the_import_headless() {
        let b = VecMap::from_iter([backing("db", BackingKind::Kosmos, &["None"])]);
        let i = import(&[]);
        let s = served(&key(), Some(&i), &b, NONE_S.values()).unwrap();
        assert_eq!(s.import.kind, ImportType::Headless);
        assert!(s.unresolved.is_none());
    }

    #[test]
    fn a_missing_or_unallocated_backing_service_is_named() {
        let i = import(&[]);
        let s = served(&key(), Some(&i), &NONE_B, NONE_S.values()).unwrap();
        assert!(s.import.ips.is_empty());
        assert!(s.unresolved.unwrap().contains("ServiceImport shop/db is ClusterSetIP with no spec.ips yet"));
        let b = VecMap::from_iter([backing("derived-db", BackingKind::KarmadaDerived, &[])]);
        let s = served(&key(), Some(&i), &b, NONE_S.values()).unwrap();
        assert!(s.unresolved.unwrap().contains("shop/derived-db"));
    }

    #[test]
    fn only_a_crosscluster_service_stands_for_a_missing_import() {
        let b = VecMap::from_iter([backing("db", BackingKind::Kosmos, &["10.96.0.7"])]);
        assert!(served(&key(), None, &b, NONE_S.values()).is_none());
        let b = VecMap::from_iter([backing("db", BackingKind::KarmadaCrossCluster, &["10.96.0.7"])]);
        let s = served(&key(), None, &b, NONE_S.values()).unwrap();
        assert_eq!(s.import.kind, ImportType::ClusterSetIp);
        assert_eq!(ips(&s.import), vec!["10.96.0.7".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn mcs_slices_win_over_foreign_ones() {
        let slices = VecMap::from_iter([
            slice("a-karmada", SliceOrigin::Karmada),
            slice("b-mcs", SliceOrigin::Mcs),
            slice("c-kosmos", SliceOrigin::Kosmos),
        ]);
        let i = import(&["10.0.0.1"]);
        let s = served(&key(), Some(&i), &NONE_B, slices.values()).unwrap();
        assert_eq!(s.slices.len(), 1);
        assert_eq!(&*s.slices[0].name, "b-mcs");
        let slices = VecMap::from_iter([
            slice("c-kosmos", SliceOrigin::Kosmos),
            slice("a-karmada", SliceOrigin::Karmada),
        ]);
        let s = served(&key(), Some(&i), &NONE_B, slices.values()).unwrap();
        assert_eq!(s.slices.iter().map(|s| &*s.name).collect::<Vec<_>>(), ["a-karmada"]);
    }
}
