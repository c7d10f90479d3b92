//! The event loop in process, on a paused clock: fake members whose watch
//! events the test sends and whose discovery it answers, the shards led as
//! the test says.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::DynamicObject;
use tokio::task::JoinHandle;

use super::*;
use crate::controller::api::fake::{FakeMember, Fault, gate};
use crate::controller::link::fake::FakeLink;
use crate::fault::Task;

/// shop/web as `tests/data/sync/web.yaml` has it.
fn web() -> (Vec<DynamicObject>, Vec<Service>, Vec<EndpointSlice>) {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sync/web.yaml")).unwrap();
    let (mut exports, mut services, mut slices) = (Vec::new(), Vec::new(), Vec::new());
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
        match v["kind"].as_str().unwrap() {
            "Service" => services.push(serde_json::from_value(v).unwrap()),
            "ServiceExport" => exports.push(serde_json::from_value(v).unwrap()),
            "EndpointSlice" => slices.push(serde_json::from_value(v).unwrap()),
            k => panic!("{k}"),
        }
    }
    (exports, services, slices)
}

/// A controller over `n` fake members, running.
struct Run {
    links: Vec<Arc<FakeLink>>,
    shards: Arc<Shards>,
    failures: Arc<Failures>,
    stats: Arc<SyncStats>,
    task: JoinHandle<()>,
}

impl Run {
    fn start(n: usize) -> Self {
        Self::with((1..=n).map(|i| FakeLink::new(&format!("cluster-{i}"))).collect())
    }

    fn with(links: Vec<Arc<FakeLink>>) -> Self {
        let shards = Shards::elected(1);
        let failures = Failures::new();
        let stats = Arc::new(SyncStats::new().unwrap());
        let behaviour = SyncBehaviour {
            on_member_lost: MemberLost::Keep,
            lost_after: Duration::from_secs(60),
            auto_export_prefixes: vec![],
            namespaces: vec![],
            resync: Duration::from_secs(600),
            concurrency: CONCURRENCY,
        };
        let members = links.iter().map(|l| Arc::new(l.clone()) as Arc<dyn MemberLink>).collect();
        let syncer = Syncer::new(members, behaviour, stats.clone(), shards.clone(), failures.clone());
        let task = tokio::spawn(syncer.run());
        Self { links, shards, failures, stats, task }
    }

    fn member(&self, i: usize) -> &FakeMember {
        &self.links[i].api
    }

    /// Member `i`'s complete lists: shop/web exported when `exports`.
    async fn list(&self, i: usize, exports: bool) {
        let (e, s, sl) = if exports { web() } else { (vec![], vec![], vec![]) };
        // The user's exports are objects of the member too (their status
        // is written there).
        for export in &e {
            let name = export.metadata.name.clone().unwrap();
            if self.member(i).get(Kind::ServiceExport, "shop", &name).is_none() {
                self.member(i).put(Kind::ServiceExport, "shop", &name, serde_json::to_value(export).unwrap());
            }
        }
        let cluster = ClusterId::parse(&format!("cluster-{}", i + 1)).unwrap();
        for event in member::listed(i, &cluster, &e, &s, &sl) {
            self.links[i].send(event).await;
        }
    }

    /// This replica leads the shard from now on (its Lease renewed for an
    /// hour).
    fn lead(&self) {
        self.shards.fence(0).held(Instant::now(), Duration::from_secs(3600));
        self.shards.set_led(0, true);
    }

    fn lose(&self) {
        self.shards.set_led(0, false);
    }

    fn imported(&self, i: usize) -> Option<serde_json::Value> {
        self.member(i).get(Kind::ServiceImport, "shop", "web")
    }
}

/// Waits (on the paused clock) until `f` holds, at most a minute.
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within a minute: {what}");
}

/// Lets the loop run for `secs` of paused time.
async fn pass(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn an_export_is_imported_everywhere_once_the_shard_is_led_and_read() {
    let r = Run::start(2);
    r.links[0].serves("v1beta1");
    r.links[1].serves("v1beta1");
    r.list(0, true).await;
    r.list(1, false).await;
    pass(3).await;
    assert!(r.member(0).writes().is_empty() && r.member(1).writes().is_empty(), "written while not leading");
    r.lead();
    until("imported in both members", || r.imported(0).is_some() && r.imported(1).is_some()).await;
    assert_eq!(r.imported(1).unwrap()["apiVersion"], "multicluster.x-k8s.io/v1beta1");
    r.task.abort();
}

/// The slip the issue named: a read begun for an earlier take of a shard,
/// lost and taken again, must not count toward the new take, whose own read
/// of the live objects comes first.
#[tokio::test(start_paused = true)]
async fn a_shard_taken_again_waits_for_its_fresh_read_not_the_old_one() {
    let r = Run::start(2);
    for l in &r.links {
        l.serves("v1beta1");
    }
    r.list(0, true).await;
    r.list(1, false).await;
    pass(2).await;
    // The first take's reads hang in both members, at their last list.
    let first = gate();
    for i in 0..2 {
        r.member(i).fail(Some(Kind::ServiceExport), Fault::ListWait(first.clone()));
    }
    r.lead();
    pass(1).await;
    r.lose();
    pass(1).await;
    // Taken again: this take's reads hang at a gate of their own.
    let second = gate();
    for i in 0..2 {
        r.member(i).heal();
        r.member(i).fail(Some(Kind::ServiceExport), Fault::ListWait(second.clone()));
    }
    r.lead();
    pass(1).await;
    // The first take's reads end: they count for nothing now.
    first.send_replace(true);
    pass(5).await;
    assert!(
        r.member(0).writes().is_empty() && r.member(1).writes().is_empty(),
        "wrote before the fresh read: {:?} {:?}",
        r.member(0).writes(),
        r.member(1).writes()
    );
    second.send_replace(true);
    until("imported once the fresh read ended", || r.imported(1).is_some()).await;
    r.task.abort();
}

/// A member whose discovery answers late, serving only v1alpha1: nothing
/// is written to it, nor its ServiceImports watched, until then; then both
/// start with v1alpha1, while the other member was written all along.
#[tokio::test(start_paused = true)]
async fn a_member_discovered_late_serving_only_v1alpha1_is_watched_and_written_with_it() {
    let r = Run::start(2);
    r.links[0].serves("v1beta1");
    r.list(0, true).await;
    r.list(1, false).await;
    r.lead();
    until("member 0 imported", || r.imported(0).is_some()).await;
    pass(10).await;
    assert!(r.imported(1).is_none(), "written before its versions were known");
    assert!(
        r.links[1].imports.lock().unwrap().is_empty(),
        "its ServiceImports watched with a guessed version"
    );
    r.links[1].serves("v1alpha1");
    until("member 1 imported", || r.imported(1).is_some()).await;
    assert_eq!(r.imported(1).unwrap()["apiVersion"], "multicluster.x-k8s.io/v1alpha1");
    assert_eq!(*r.links[1].imports.lock().unwrap(), ["multicluster.x-k8s.io/v1alpha1"]);
    // The CRD upgraded later: the watches start again with the new version.
    r.links[1].serves("v1beta1");
    pass(301).await;
    assert_eq!(
        *r.links[1].imports.lock().unwrap(),
        ["multicluster.x-k8s.io/v1alpha1", "multicluster.x-k8s.io/v1beta1"]
    );
    r.task.abort();
}

/// A member whose discovery answers garbage: named as failing, counted,
/// asked again with backoff, and the others synced meanwhile.
#[tokio::test(start_paused = true)]
async fn a_member_whose_discovery_answers_garbage_is_counted_and_asked_again() {
    let r = Run::start(2);
    r.links[0].serves("v1beta1");
    r.links[1].discovery.send_replace(Some(Err(
        "multicluster.x-k8s.io/v1beta1: Error deserializing response: expected value at line 1 column 1"
            .into(),
    )));
    r.list(0, true).await;
    r.list(1, false).await;
    r.lead();
    until("member 0 imported", || r.imported(0).is_some()).await;
    pass(30).await;
    assert!(*r.links[1].asked.lock().unwrap() >= 4, "asked again with backoff");
    let registry = prometheus::Registry::new();
    r.stats.register(&registry, r.shards.clone(), None).unwrap();
    let text = crate::scrape::render(&registry);
    let errors = crate::scrape::series(&text);
    let key = r#"clusterset_dns_sync_watch_errors_total{watch="API discovery of member cluster-2"}"#;
    assert!(errors.get(key).is_some_and(|n| *n >= 4.0), "{text}");
    assert!(r.imported(1).is_none());
    r.task.abort();
}

/// The loop's tasks are supervised: one that panics is started again and
/// counted, and the loop goes on.
#[tokio::test(start_paused = true)]
async fn a_task_of_the_loop_that_panics_is_started_again_and_counted() {
    let r = Run::start(1);
    // Discovery panics on its first question.
    r.links[0].discovery.send_replace(Some(Err("panic".into())));
    *r.links[0].panic_on_discovery.lock().unwrap() = true;
    r.list(0, true).await;
    r.lead();
    pass(2).await;
    assert_eq!(r.failures.panics(Task::Discovery), 1);
    r.links[0].serves("v1beta1");
    until("imported after the restart", || r.imported(0).is_some()).await;
    r.task.abort();
}

/// `n` exports like shop/web, named web0..
fn many(n: usize) -> (Vec<DynamicObject>, Vec<Service>, Vec<EndpointSlice>) {
    let (e, s, sl) = web();
    let named = |v: serde_json::Value, i: usize| {
        let mut v = v;
        if v["kind"] == "EndpointSlice" {
            v["metadata"]["labels"]["kubernetes.io/service-name"] = format!("web{i}").into();
            v["metadata"]["name"] = format!("web{i}-x1y2z").into();
        } else {
            v["metadata"]["name"] = format!("web{i}").into();
        }
        v
    };
    fn each<T: serde::de::DeserializeOwned>(
        v: serde_json::Value,
        n: usize,
        named: impl Fn(serde_json::Value, usize) -> serde_json::Value,
    ) -> Vec<T> {
        (0..n).map(|i| serde_json::from_value(named(v.clone(), i)).unwrap()).collect()
    }
    (
        each(serde_json::to_value(&e[0]).unwrap(), n, named),
        each(serde_json::to_value(&s[0]).unwrap(), n, named),
        each(serde_json::to_value(&sl[0]).unwrap(), n, named),
    )
}

/// A takeover while this replica's writes wait in the member client's rate
/// limit: once the shard is lost, nothing more of it reaches the API
/// server, and the writes that waited end at once. (With the fence checked
/// only before the queue, every one of them was sent, over minutes.)
#[tokio::test(start_paused = true)]
async fn a_takeover_with_writes_waiting_in_the_rate_limit_sends_nothing_more() {
    let limits = crate::k8s::throttle::Limits { qps: 1.0, burst: 1 };
    let (link, seen) = FakeLink::over_the_wire("cluster-1", limits);
    let r = Run::with(vec![link]);
    r.links[0].serves("v1beta1");
    let (e, s, sl) = many(20);
    for event in member::listed(0, &ClusterId::parse("cluster-1").unwrap(), &e, &s, &sl) {
        r.links[0].send(event).await;
    }
    r.lead();
    let writes = || seen.lock().unwrap().iter().filter(|(call, _)| !call.starts_with("GET")).count();
    until("writing", || writes() > 0).await;
    pass(3).await;
    r.lose();
    let at_loss = writes();
    pass(600).await;
    assert_eq!(writes(), at_loss, "written after the shard was lost");
    assert!(at_loss < 10, "{at_loss} writes in 3 s at 1/s");
    // Every write that reached the server passed a fence.
    let sent = seen.lock().unwrap().clone();
    assert!(
        sent.iter().filter(|(c, _)| !c.starts_with("GET")).all(|(_, id)| id.starts_with("fence-0-")),
        "{sent:?}"
    );
    let fenced = ErrorReason::ALL.iter().position(|e| *e == ErrorReason::Fenced).unwrap();
    assert!(r.stats.errors[fenced].load(Ordering::Relaxed) > 0, "the waiting writes ended as fenced");
    r.task.abort();
}

/// A restart with nothing changed writes nothing: the members' objects are
/// read (their versions discovered first) before anything is written, and
/// no member is named as not reached meanwhile.
#[tokio::test(start_paused = true)]
async fn an_idle_restart_writes_nothing() {
    let links = vec![FakeLink::new("cluster-1"), FakeLink::new("cluster-2")];
    for l in &links {
        l.serves("v1beta1");
    }
    let first = Run::with(links.clone());
    first.list(0, true).await;
    first.list(1, false).await;
    first.lead();
    until("imported in both", || first.imported(0).is_some() && first.imported(1).is_some()).await;
    pass(10).await;
    first.task.abort();
    let _ = first.task.await;
    for l in &links {
        l.restarted();
    }
    let before: usize = links.iter().map(|l| l.api.writes().len()).sum();
    // The second run's discovery of cluster-2 answers a little later.
    links[1].discovery.send_replace(None);
    let second = Run::with(links.clone());
    second.list(0, true).await;
    second.list(1, false).await;
    second.lead();
    pass(1).await;
    links[1].serves("v1beta1");
    pass(20).await;
    let after: usize = links.iter().map(|l| l.api.writes().len()).sum();
    let written: Vec<_> = links.iter().map(|l| l.api.writes()).collect();
    assert_eq!(after, before, "an idle restart wrote (all writes per member): {written:?}");
    second.task.abort();
}

/// Spans as a collector receives them: each closed span's name, its
/// fields (as recorded by its end) and its parent's id, in the order they
/// closed.
#[derive(Clone, Default)]
struct Spans(Arc<std::sync::Mutex<Vec<Closed>>>);

#[derive(Debug, Clone)]
struct Closed {
    id: u64,
    parent: Option<u64>,
    name: &'static str,
    fields: std::collections::BTreeMap<String, String>,
}

#[derive(Default)]
struct Fields(std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span.extensions_mut().remove::<Fields>().unwrap_or_default().0;
        let parent = span.parent().map(|p| p.id().into_u64());
        self.0.lock().unwrap().push(Closed { id: id.into_u64(), parent, name: span.name(), fields });
    }
}

impl Spans {
    fn closed(&self, name: &str) -> Vec<Closed> {
        self.0.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }

    /// The closed spans whose ancestor is span `id`.
    fn within(&self, id: u64) -> Vec<Closed> {
        let all = self.0.lock().unwrap().clone();
        let parent_of = |s: u64| all.iter().find(|c| c.id == s).and_then(|c| c.parent);
        all.iter()
            .filter(|s| {
                let mut up = s.parent;
                while let Some(p) = up {
                    if p == id {
                        return true;
                    }
                    up = parent_of(p);
                }
                false
            })
            .cloned()
            .collect()
    }
}

/// Why each reconcile ran is counted, and every reconcile is a span with
/// its service, shard, reason, members written and outcome, holding one
/// span per member and one per write: what a collector shows of one export
/// reaching every member.
#[tokio::test(start_paused = true)]
async fn each_reconcile_is_a_span_of_its_writes_and_its_reason_is_counted() {
    use crate::controller::api::MemberApi;
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    // The test's runtime is one thread: every task of the loop runs here.
    let _traced = tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let reasons = |r: &Run| -> Vec<(&'static str, u64)> {
        Reason::ALL
            .iter()
            .zip(&r.stats.reconciles)
            .map(|(why, n)| (why.as_str(), n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    let r = Run::start(2);
    r.links[0].serves("v1beta1");
    r.links[1].serves("v1beta1");
    r.list(0, true).await;
    r.list(1, false).await;
    r.lead();
    until("imported in both members", || r.imported(0).is_some() && r.imported(1).is_some()).await;
    pass(3).await;
    // Led from the start: the shard's take reconciled it.
    assert_eq!(reasons(&r), [("takeover", 1)]);
    let first = spans.closed("reconcile");
    assert_eq!(first.len(), 1, "{first:?}");
    let f = &first[0].fields;
    let field = |k: &str| f.get(k).map(String::as_str);
    assert_eq!(
        (field("service"), field("shard"), field("reason"), field("outcome"), field("members_written")),
        (Some("shop/web"), Some("0"), Some("takeover"), Some("ok"), Some("2")),
        "{f:?}"
    );
    let inside = spans.within(first[0].id);
    let members: BTreeSet<&str> = inside
        .iter()
        .filter(|s| s.name == "member")
        .filter_map(|s| s.fields.get("member").map(String::as_str))
        .collect();
    assert_eq!(members, ["cluster-1", "cluster-2"].into());
    let writes: Vec<&Closed> = inside.iter().filter(|s| s.name == "write").collect();
    let sent: usize = r.member(0).writes().len() + r.member(1).writes().len();
    assert_eq!(writes.len(), sent, "one span per write: {writes:?}");
    assert_eq!(field("writes"), Some(sent.to_string().as_str()));
    assert!(
        writes.iter().any(|w| w.fields.get("member").map(String::as_str) == Some("cluster-2")
            && w.fields.get("kind").map(String::as_str) == Some("ServiceImport")),
        "{writes:?}"
    );

    // Someone deletes our import in cluster-2: a repair, for drift.
    let version = r.imported(1).unwrap()["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    r.member(1)
        .delete(
            &crate::k8s::fence::WriteFence::new(Arc::new(crate::k8s::fence::Fence::open()), 0),
            Kind::ServiceImport,
            "shop",
            "web",
        )
        .await
        .unwrap();
    let seen = OwnObject {
        kind: Kind::ServiceImport,
        namespace: "shop".into(),
        name: "web".into(),
        service: "web".into(),
        version,
    };
    r.links[1]
        .send_own(OwnEvent { member: 1, change: crate::controller::own::OwnChange::Deleted(seen) })
        .await;
    until("written again", || r.imported(1).is_some()).await;
    // The exporting member's slice changes: an event.
    let (_, _, mut slices) = web();
    slices[0].endpoints[0].addresses = vec!["10.0.1.6".into()];
    let key = crate::fleet::objects::slice_service(&slices[0]).unwrap();
    let id = crate::model::SliceKey { namespace: "shop".into(), name: "web-x1y2z".into() };
    let change = crate::fleet::state::Change::Slices(crate::fleet::state::Delta::Applied(
        id,
        key,
        Arc::new(slices.remove(0)),
    ));
    r.links[0].send(MemberEvent { member: 0, change }).await;
    pass(3).await;
    assert_eq!(reasons(&r), [("event", 1), ("drift", 1), ("takeover", 1)]);
    let last: Vec<String> =
        spans.closed("reconcile").iter().filter_map(|s| s.fields.get("reason").cloned()).collect();
    assert_eq!(last, ["takeover", "drift", "event"]);
    r.task.abort();
}
