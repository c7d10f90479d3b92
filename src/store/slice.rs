//! An EndpointSlice as the writer keeps it ([`Slice`]), and the port lists
//! every import and slice with the same ports share ([`PortLists`]).
//!
//! A source hands the writer an [`EndpointSet`]: the slice with its own
//! namespace, its service's key and its ports. Kept so, a slice of a
//! 100,000-service fleet held its namespace three times (its key, its
//! service's key, the service it is filed under), its service's name
//! twice, and a port list equal to every other slice's: ~160 bytes in the
//! vector of its service and five small heap blocks beside its endpoints
//! (docs/benchmarks-history.md, "Slices filed under their service, one port
//! list for all"). A [`Slice`] keeps what the service's
//! answers and the writer's bookkeeping read, once.

use std::collections::HashSet;
use std::sync::Arc;

use crate::model::{
    AddressFamily, ClusterId, Endpoint, EndpointSet, Port, ServiceKey, SliceKey, SliceOrigin,
};

/// One EndpointSlice, filed under its service: see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slice {
    /// The object's name. Its namespace is its service's: every source
    /// reads a slice's service from labels of the slice, in its namespace.
    pub(crate) name: Box<str>,
    /// The cluster the endpoints run in.
    pub(crate) cluster: ClusterId,
    /// IPv4 or IPv6.
    pub(crate) family: AddressFamily,
    /// Who wrote it.
    pub(crate) origin: SliceOrigin,
    /// Its ports, shared through [`PortLists`].
    pub(crate) ports: Arc<[Port]>,
    /// Its endpoints, no spare room.
    pub(crate) endpoints: Box<[Endpoint]>,
    /// Its trigger time's [`fingerprint`](crate::model::ChangeTrigger::fingerprint)
    /// (in the record's padding): whether a change came with a trigger
    /// time of its own (`store::programming`). Not answered, not compared.
    pub(crate) trigger: u32,
}

impl Slice {
    /// The slice `set` with its ports taken from `ports`.
    pub(crate) fn new(set: EndpointSet, ports: &mut PortLists) -> Self {
        Self {
            ports: ports.share(&set.ports),
            name: set.slice.name.into_boxed_str(),
            cluster: set.cluster,
            family: set.family,
            origin: set.origin,
            endpoints: set.endpoints.into_boxed_slice(),
            trigger: set.trigger.fingerprint(),
        }
    }

    /// True when `set` would be answered as this slice (its service and
    /// trigger time aside).
    pub(crate) fn same_as(&self, set: &EndpointSet) -> bool {
        *self.name == *set.slice.name
            && self.cluster == set.cluster
            && self.family == set.family
            && self.origin == set.origin
            && *self.ports == *set.ports
            && *self.endpoints == *set.endpoints
    }

    /// Its id, filed under `service`.
    pub(crate) fn key(&self, service: &ServiceKey) -> SliceKey {
        SliceKey { namespace: service.namespace.as_str().to_owned(), name: self.name.to_string() }
    }
}

/// Port lists by value, each allocated once: at 100,000 services nearly
/// every import and slice names the same one or two ports, and a list of
/// its own was a heap block and a name's block each.
///
/// A list no import or slice holds any more is dropped when the set has
/// doubled since it was last swept, so the sweeps cost O(1) per list added.
#[derive(Debug, Default)]
pub(crate) struct PortLists {
    lists: HashSet<Arc<[Port]>, foldhash::fast::RandomState>,
    /// Lists held after the last sweep.
    swept: usize,
}

/// Fewer lists than this are never swept: not worth a pass.
const SWEEP_FLOOR: usize = 64;

impl PortLists {
    /// The shared list equal to `ports`.
    pub(crate) fn share(&mut self, ports: &[Port]) -> Arc<[Port]> {
        if let Some(list) = self.lists.get(ports) {
            return list.clone();
        }
        if self.lists.len() >= SWEEP_FLOOR.max(2 * self.swept) {
            // Only the set holds a list nothing else refers to.
            self.lists.retain(|list| Arc::strong_count(list) > 1);
            self.swept = self.lists.len();
        }
        let list: Arc<[Port]> = ports.into();
        self.lists.insert(list.clone());
        list
    }

    /// Number of lists held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lists.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DnsLabel, Protocol};

    fn ports(numbers: &[u16]) -> Vec<Port> {
        numbers
            .iter()
            .map(|&port| Port { name: DnsLabel::parse("http").ok(), protocol: Protocol::Tcp, port })
            .collect()
    }

    fn set(name: &str) -> EndpointSet {
        EndpointSet {
            slice: SliceKey { namespace: "shop".into(), name: name.into() },
            service: ServiceKey {
                namespace: DnsLabel::parse("shop").unwrap(),
                name: DnsLabel::parse("web").unwrap(),
            },
            cluster: ClusterId::parse("east").unwrap(),
            family: AddressFamily::V4,
            ports: ports(&[80]),
            endpoints: vec![Endpoint::new(vec!["10.0.0.1".parse().unwrap()].into(), true)],
            origin: SliceOrigin::Mcs,
            trigger: Default::default(),
        }
    }

    #[test]
    fn a_slice_keeps_what_its_set_says_but_its_service() {
        let mut lists = PortLists::default();
        let s = Slice::new(set("web-east"), &mut lists);
        assert!(s.same_as(&set("web-east")));
        assert_eq!(s.key(&set("x").service), set("web-east").slice);
        let differs: [fn(&mut EndpointSet); 6] = [
            |e| e.slice.name = "web-west".into(),
            |e| e.cluster = ClusterId::parse("west").unwrap(),
            |e| e.family = AddressFamily::V6,
            |e| e.origin = SliceOrigin::Kosmos,
            |e| e.ports = ports(&[81]),
            |e| e.endpoints[0].ready = false,
        ];
        for change in differs {
            let mut other = set("web-east");
            change(&mut other);
            assert!(!s.same_as(&other), "{other:?}");
        }
        // A new trigger time alone changes no answer.
        let mut retimed = set("web-east");
        retimed.trigger = crate::model::ChangeTrigger::At(std::time::SystemTime::now());
        assert!(s.same_as(&retimed));
        assert_ne!(Slice::new(retimed, &mut lists).trigger, s.trigger);
    }

    #[test]
    fn a_slice_is_half_an_endpoint_set() {
        // Name, cluster, ports and endpoints (16 bytes each), family,
        // origin and the trigger's fingerprint: 72 bytes, where an `EndpointSet` is 152 (module docs).
        let size = std::mem::size_of::<Slice>();
        assert!(size <= 72, "Slice grew to {size} bytes");
    }

    #[test]
    fn equal_port_lists_are_one_allocation() {
        let mut lists = PortLists::default();
        let a = lists.share(&ports(&[80, 443]));
        let b = lists.share(&ports(&[80, 443]));
        let c = lists.share(&ports(&[80]));
        assert!(Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &c));
        assert_eq!((&*a, &*c), (&ports(&[80, 443])[..], &ports(&[80])[..]));
    }

    #[test]
    fn lists_nothing_holds_are_swept_as_the_set_grows() {
        let mut lists = PortLists::default();
        let kept = lists.share(&ports(&[1]));
        // Thousands of lists, each dropped at once: the set stays small.
        for port in 2..5000 {
            drop(lists.share(&ports(&[port])));
            assert!(lists.len() <= 2 * SWEEP_FLOOR, "{} lists at port {port}", lists.len());
        }
        // A list still held is never swept and is shared again.
        assert!(Arc::ptr_eq(&kept, &lists.share(&ports(&[1]))));
    }
}
