//! The memory budget as the store's writer keeps it: which updates are
//! applied, which are refused, and when a source that diverged is asked to
//! list again (the policy; `cmd::serve`'s write loop only calls it).
//!
//! - Before the store is first ready, and with `--on-memory-limit exit`,
//!   every update is applied; the resident size after the publish decides
//!   then (a store over the budget stops the server: a first load must
//!   fit).
//! - Once ready, with `keep-serving`, an update that adds objects
//!   (`store::Growth`: by kind, counting only objects its source does not
//!   hold, and the endpoints of the slices among them) is weighed first
//!   and refused when it would not fit. An edit of
//!   a held object and a removal add nothing and are always applied.
//! - A refused update diverges its source (`Guard::refused`); the first
//!   refusal of a source is logged as an error, the ones after it while it
//!   stays diverged at debug (a busy source over the budget would flood
//!   the log). A complete list of the source (`Replace`, or a `LastPart`
//!   not cut short) that is admitted lists it back in.
//! - After every publish, and every [`RECHECK`] while anything is refused
//!   (no update may come), the resident size is weighed again, after the
//!   allocator gave back what it holds free (`release_freed_pages`), and
//!   each diverged source whose refused updates fit now is asked to list
//!   again through `store::Relists`, once per refusal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, error, info};

use super::{ENDPOINT_BYTES, Guard, OBJECT_BYTES, OnMemoryLimit, OverBudget};
use crate::store::{Growth, Relists, SourceId, Update, Writer};

/// How often the store is weighed again while anything is refused, when
/// no publish does it.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The writer's side of the memory budget. Lives on the writer's thread;
/// what it decides is kept in the shared [`Guard`].
pub struct Admission {
    guard: Arc<Guard>,
    relists: Relists,
    last_weighed: Instant,
}

impl Admission {
    /// The policy of `guard`, asking sources to list again through `relists`.
    pub fn new(guard: Arc<Guard>, relists: Relists) -> Self {
        Self { guard, relists, last_weighed: Instant::now() }
    }

    fn keeps_serving(&self) -> bool {
        self.guard.on_limit == OnMemoryLimit::KeepServing
    }

    /// Whether `writer` applies `update`; `false`: refused (logged, and its
    /// source diverged), the writer calls `Writer::refused` instead.
    pub fn admits(&mut self, writer: &Writer, update: &Update) -> bool {
        if !self.keeps_serving() || !writer.is_ready() {
            return true;
        }
        let Some(source) = source_of(update) else { return true };
        let list = matches!(update, Update::Replace { .. } | Update::LastPart { .. });
        let refusal = match writer.growth(update) {
            Growth::Adds(kinds) if kinds.total() == 0 && kinds.endpoints == 0 => None,
            Growth::Adds(kinds) => {
                let needs = (kinds.total() as u64)
                    .saturating_mul(OBJECT_BYTES)
                    .saturating_add((kinds.endpoints as u64).saturating_mul(ENDPOINT_BYTES));
                let what = || format!("{kinds} more from {source}");
                self.guard.weigh(what, needs).err().map(|e| (Some(needs), Some(e)))
            }
            Growth::CutShort => Some((None, None)),
        };
        let Some((needs, error)) = refusal else {
            if list {
                self.guard.listed(source);
            }
            return true;
        };
        let first = self.guard.refused(source, needs, list);
        match error {
            Some(e) if first => error!(error = %e, "update refused; its source is listed again once it fits"),
            Some(e) => debug!(error = %e, "update refused"),
            None => debug!(%source, "the rest of a list cut short by the memory budget refused with it"),
        }
        false
    }

    /// After a publish (`first`: the store was not ready before it). `Err`
    /// when the server must stop: the store is over the budget before it
    /// was first ready, or with `--on-memory-limit exit`.
    pub fn published(&mut self, services: usize, first: bool) -> Result<(), OverBudget> {
        let check = || self.guard.budget.check_resident(Some(self.guard.resident()), services);
        // Not over for pages that are free and only not given back yet
        // (the snapshot this publish replaced).
        let checked = check().or_else(|_| {
            let _ = super::release_freed_pages();
            check()
        });
        match checked {
            Err(e) if first || !self.keeps_serving() => return Err(e),
            Err(e) => {
                if self.guard.set_resident_over(true) {
                    error!(error = %e, "over the memory budget: updates that add objects are refused until it fits");
                }
            }
            Ok(()) => {
                self.guard.set_resident_over(false);
            }
        }
        self.last_weighed = Instant::now();
        self.ask_due();
        Ok(())
    }

    /// How long the writer may wait for an update before calling
    /// [`Admission::recheck`]; `None` while nothing is refused.
    pub fn recheck_in(&self) -> Option<Duration> {
        self.guard.is_over().then(|| RECHECK.saturating_sub(self.last_weighed.elapsed()))
    }

    /// Weighs the store again with no publish: the resident size, and the
    /// diverged sources that fit now.
    pub fn recheck(&mut self) {
        let _ = super::release_freed_pages();
        let resident = self.guard.resident();
        let over = self.guard.budget.check_resident(Some(resident), 0).is_err();
        if self.guard.set_resident_over(over) && !over {
            info!(resident_mib = resident >> 20, "the resident size is within the memory budget again");
        }
        self.last_weighed = Instant::now();
        self.ask_due();
    }

    /// Asks every diverged source whose refused updates fit now to list again.
    fn ask_due(&self) {
        for source in self.guard.due() {
            info!(%source, "the store fits what was refused: listing the source again");
            self.relists.ask(source);
        }
    }
}

/// The source an update came from; `None` for the health overlay's.
fn source_of(update: &Update) -> Option<SourceId> {
    match update {
        Update::Register(s)
        | Update::Replace { source: s, .. }
        | Update::Part { source: s, .. }
        | Update::LastPart { source: s, .. }
        | Update::Upsert { source: s, .. }
        | Update::Remove { source: s, .. } => Some(*s),
        Update::EndpointHealth { .. } | Update::ClusterLiveness { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::str::FromStr;
    use std::sync::atomic::{AtomicU64, Ordering};

    use hickory_proto::rr::Name;

    use super::*;
    use crate::model::{
        AddressFamily, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport,
        ServiceKey, SliceKey, SliceOrigin,
    };
    use crate::ops::memory::{LimitSource, MemoryBudget};
    use crate::store::{self, Object, Reader, ZoneConfig};

    const MIB: u64 = 1 << 20;
    const WATCH: SourceId = SourceId::Watch(1);

    /// A writer whose store is ready with `web` (one endpoint, ready), and
    /// the writer's budget: a 100 MiB limit (90 MiB of headroom) and a
    /// resident size the test sets.
    struct Fixture {
        reader: Reader,
        writer: Writer,
        admission: Admission,
        guard: Arc<Guard>,
        resident: Arc<AtomicU64>,
        relists: Relists,
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    /// A ClusterSetIP import: served with its VIP alone.
    fn import(name: &str) -> Object {
        Object::Import(ServiceImport {
            key: key(name),
            kind: ImportType::ClusterSetIp,
            ips: vec![IpAddr::from_str("10.0.0.1").unwrap()].into(),
            ports: vec![Port { name: None, protocol: Protocol::Tcp, port: 80 }].into(),
            answers: Default::default(),
        })
    }

    fn slice(name: &str, ready: bool) -> Object {
        Object::Slice(EndpointSet {
            slice: SliceKey { namespace: "ns".into(), name: format!("{name}-a") },
            service: key(name),
            cluster: ClusterId::parse("c1").unwrap(),
            family: AddressFamily::V4,
            ports: vec![],
            endpoints: vec![Endpoint::new(vec![IpAddr::from_str("10.1.0.1").unwrap()].into(), ready)],
            origin: SliceOrigin::Mcs,
            trigger: Default::default(),
        })
    }

    fn fixture(on_limit: OnMemoryLimit) -> Fixture {
        let (reader, mut writer) = store::new(ZoneConfig::with_defaults(
            Name::from_str("clusterset.local.").unwrap(),
            store::AnswerConfig::standard(),
        ));
        writer.apply(Update::Replace { source: WATCH, objects: vec![import("web"), slice("web", true)] });
        writer.publish();
        let resident = Arc::new(AtomicU64::new(50 * MIB));
        let r = resident.clone();
        let budget = MemoryBudget { limit: 100 * MIB, source: LimitSource::Flag };
        let guard =
            Arc::new(Guard::new(budget, on_limit).with_resident(move || Some(r.load(Ordering::Relaxed))));
        let relists = Relists::default();
        let admission = Admission::new(guard.clone(), relists.clone());
        Fixture { reader, writer, admission, guard, resident, relists }
    }

    impl Fixture {
        /// Applies `update` if the budget admits it, and publishes.
        fn send(&mut self, update: Update) -> bool {
            let admitted = self.admission.admits(&self.writer, &update);
            if admitted {
                self.writer.apply(update);
            } else {
                self.writer.refused(&update);
            }
            self.writer.publish();
            admitted
        }

        fn served(&self, name: &str) -> bool {
            self.reader.load().service(&store::names_key("ns", name)).is_some()
        }

        fn over(&mut self) {
            self.resident.store(95 * MIB, Ordering::Relaxed);
            self.admission.published(1, false).unwrap();
            assert!(self.guard.is_over());
        }
    }

    #[test]
    fn over_the_budget_an_edit_is_applied_and_a_new_object_refused() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        f.over();
        // The endpoint turns not-ready: an edit, never weighed.
        assert!(f.send(Update::Upsert { source: WATCH, object: slice("web", false) }));
        let Object::Slice(set) = slice("web", false) else { unreachable!() };
        let removal = Update::Remove { source: WATCH, id: Object::Slice(set).id() };
        assert!(f.send(removal));
        assert!(f.guard.diverged().is_empty(), "nothing refused");
        // A new service: refused, its source diverged.
        assert!(!f.send(Update::Upsert { source: WATCH, object: import("late") }));
        assert!(!f.served("late"));
        assert_eq!(f.guard.diverged(), [WATCH]);
    }

    #[test]
    fn a_new_slice_is_weighed_by_its_endpoints() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        // 300 KiB under the headroom: a slice of one endpoint fits, one of
        // a thousand (~500 KiB by ENDPOINT_BYTES) does not.
        f.resident.store(90 * MIB - 300 * 1024, Ordering::Relaxed);
        let with = |name: &str, n: u32| {
            let Object::Slice(mut set) = slice("web", true) else { unreachable!() };
            set.slice.name = name.into();
            set.endpoints = (0..n)
                .map(|i| {
                    Endpoint::new(vec![IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0000 + i))].into(), true)
                })
                .collect();
            Update::Upsert { source: WATCH, object: Object::Slice(set) }
        };
        assert!(f.send(with("web-b", 1)));
        assert!(!f.send(with("web-c", 1000)));
        assert_eq!(f.guard.diverged(), [WATCH]);
        // The slice it holds grown to a thousand: an edit, applied.
        assert!(f.send(with("web-b", 1000)));
    }

    #[test]
    fn a_diverged_source_stays_over_budget_until_listed_back_in_and_is_asked_once_it_fits() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        f.over();
        assert!(!f.send(Update::Upsert { source: WATCH, object: import("late") }));
        // Memory is freed; an admitted change of the same source does not
        // bring back what was refused, so the alarm stays.
        f.resident.store(50 * MIB, Ordering::Relaxed);
        assert!(f.send(Update::Upsert { source: WATCH, object: import("later") }));
        f.admission.published(2, false).unwrap();
        assert!(f.guard.is_over(), "a later admitted update cleared the divergence");
        assert!(f.relists.is_asked(WATCH), "not asked to list again though the store fits");
        assert!(f.relists.take(|s| s == WATCH) == [WATCH]);
        f.admission.recheck();
        assert!(!f.relists.is_asked(WATCH), "asked twice for one refusal");
        // Its list comes and fits: listed back in.
        let objects = vec![import("web"), slice("web", true), import("late"), import("later")];
        assert!(f.send(Update::Replace { source: WATCH, objects }));
        assert!(f.served("late"));
        assert!(!f.guard.is_over());
        assert_eq!(f.admission.recheck_in(), None, "nothing to weigh again");
    }

    #[test]
    fn a_relist_refused_again_is_asked_again_only_once_it_fits() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        f.over();
        let objects = || vec![import("web"), slice("web", true), import("a"), import("b")];
        assert!(!f.send(Update::Replace { source: WATCH, objects: objects() }));
        // 2 objects of 4 KiB: not yet at 90 MiB - 4 KiB.
        f.resident.store(90 * MIB - 4 * 1024, Ordering::Relaxed);
        f.admission.recheck();
        assert!(!f.relists.is_asked(WATCH));
        assert!(f.guard.is_over(), "the resident size fits, the refused list does not");
        assert!(f.admission.recheck_in().is_some());
        f.resident.store(60 * MIB, Ordering::Relaxed);
        f.admission.recheck();
        assert!(f.relists.is_asked(WATCH));
        assert!(f.send(Update::Replace { source: WATCH, objects: objects() }));
        assert!(f.served("a") && f.served("b"));
        assert!(!f.guard.is_over());
    }

    #[test]
    fn a_list_in_parts_cut_short_diverges_its_source_and_its_rest_is_refused_quietly() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        f.over();
        let first = Update::Part {
            source: WATCH,
            objects: vec![import("web"), slice("web", true), import("a")],
            first: true,
        };
        assert!(!f.send(first));
        assert!(!f.send(Update::LastPart { source: WATCH, objects: vec![] }));
        assert!(f.served("web"), "a list cut short removes nothing");
        assert_eq!(f.guard.diverged(), [WATCH]);
        f.resident.store(50 * MIB, Ordering::Relaxed);
        f.admission.recheck();
        assert!(f.relists.is_asked(WATCH), "needs what its refused part did");
    }

    #[test]
    fn before_the_first_ready_and_with_exit_an_over_budget_store_stops_the_server() {
        let mut f = fixture(OnMemoryLimit::KeepServing);
        f.resident.store(95 * MIB, Ordering::Relaxed);
        let e = f.admission.published(7, true).unwrap_err();
        assert!(
            e.to_string().contains("95 MiB resident with 7 services, over 90 % of the 100 MiB limit"),
            "{e}"
        );
        let mut f = fixture(OnMemoryLimit::Exit);
        assert!(f.send(Update::Upsert { source: WATCH, object: import("late") }), "exit weighs after");
        f.resident.store(95 * MIB, Ordering::Relaxed);
        assert!(f.admission.published(2, false).is_err());
    }
}
