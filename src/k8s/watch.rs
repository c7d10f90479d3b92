//! The one way this program watches Kubernetes: a relist-after-error loop
//! with health and staleness reporting, shared by the store's sources, the
//! centralized members and the sync controller.
//!
//! After any watch error the watcher is started afresh (after a backoff), so
//! recovery always goes through a complete list: that list replaces what the
//! consumer held (what was deleted meanwhile disappears) and is the proof
//! that the data is current again. Re-watching from the last resource
//! version would give no such proof: a quiet watch delivers no event. While
//! a watch fails, [`WatchHealth`] says how stale its data is.
//!
//! What a watch sends is its consumer's business ([`Translate`]); this
//! module knows nothing of the store or the fleet. A consumer may also ask
//! for a complete list again ([`Translate::relist`]: the store refused
//! some of what the watch sent, for want of memory); the watcher is then
//! started afresh at once, as after an error but with no backoff and no
//! error counted.
//!
//! How a watch gets its complete list is [`Lists`] (`--list-mode`,
//! `--list-page-size`): list requests in pages, or a streaming list
//! (KEP-3157: a watch with `sendInitialEvents=true` whose initial objects
//! come from the API server's watch cache as events, ended by a bookmark
//! annotated `k8s.io/initial-events-end`). The API server's `WatchList`
//! feature gate allows streaming lists; its default (k8s.io/apiserver
//! `pkg/features/kube_features.go`, read at v0.33.13 and v0.34.2): alpha,
//! off, from 1.27; beta, on, in 1.32; beta, off again, in 1.33 ("the json
//! and proto streaming encoders appear to work better"); beta, on, from
//! 1.34. Where the gate is off, the API server refuses the watch with 422
//! Invalid, "sendInitialEvents is forbidden for watch unless the WatchList
//! feature gate is enabled" (apimachinery
//! `pkg/apis/meta/internalversion/validation`, v0.33.13); servers before
//! 1.27 refuse it with 422 too ("resourceVersionMatch is forbidden for
//! watch"). So a 422 at the start of a streaming list means "not here", and
//! [`ListMode::Auto`] lists in pages from then on.
//!
//! kube-runtime 5.0 starts a streaming list at `resourceVersion=0`: the
//! objects are the watch cache's as it stands, which on an API server
//! lagging behind etcd may be a little old, where a paged list is a
//! consistent read. The watch goes on from there, so the served data
//! converges either way; only the first moment differs.

use std::fmt::Debug;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, Stream, StreamExt};
use kube::Client;
use kube::Resource;
use kube::api::{Api, ApiResource};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::pace::{Backoff, Jitter};

/// The flag that chooses how watches list, for messages.
const LIST_MODE_FLAG: &str = "--list-mode";

/// Items of a list handed over at once by a consumer that takes lists in
/// parts ([`Translate::part`]): large enough that a part costs the
/// consumer little per object, small enough that it is a sliver of a
/// fleet's list (5,000 of 400,000 objects at 100,000 services).
pub const LIST_PART: usize = 5_000;

/// How a failing watch is reported again while it stays down.
const STALE_LOG_EVERY: Duration = Duration::from_secs(30);
/// The wait between attempts (a watch, or API discovery): from 0.5 s,
/// doubled per failure up to 30 s, up to a fifth more so that many servers
/// do not retry in lockstep.
pub const WATCH_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30), Jitter::Add);

/// The health of one watch, shared with the metrics endpoint.
#[derive(Debug)]
pub struct WatchHealth {
    /// What is watched, e.g. `ServiceImport (all namespaces)`.
    pub name: String,
    /// Unix time in ms since which the watch has been failing; 0 while healthy.
    stale_since_ms: AtomicU64,
    /// Watch errors seen.
    errors: AtomicU64,
    /// Responses in JSON to a request for protobuf.
    json_answers: AtomicU64,
}

impl WatchHealth {
    /// A healthy watch named `name` (what it watches, for logs and metrics).
    pub fn new(name: String) -> Self {
        Self {
            name,
            stale_since_ms: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            json_answers: AtomicU64::new(0),
        }
    }

    /// Seconds since the watch started failing; 0 while it is healthy. The
    /// data served from it is at least this old.
    pub fn stale_seconds(&self) -> f64 {
        match self.stale_since_ms.load(Ordering::Relaxed) {
            0 => 0.0,
            since => now_ms().saturating_sub(since) as f64 / 1000.0,
        }
    }

    /// Errors seen since start.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Responses in JSON to a request for protobuf, since start.
    pub fn json_answers(&self) -> u64 {
        self.json_answers.load(Ordering::Relaxed)
    }

    /// One more response in JSON to a request for protobuf.
    pub(super) fn json_answer(&self) {
        self.json_answers.fetch_add(1, Ordering::Relaxed);
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(1)
}

/// Logs watch failures and recoveries, and keeps the health figures.
pub struct Reporter {
    health: Arc<WatchHealth>,
    last_log: Option<Instant>,
}

impl Reporter {
    /// Reports into `health`.
    pub fn new(health: Arc<WatchHealth>) -> Self {
        Self { health, last_log: None }
    }

    /// What is watched (the health's name).
    pub fn name(&self) -> &str {
        &self.health.name
    }

    /// The watch (or discovery) is current again.
    pub fn ok(&mut self) {
        let since = self.health.stale_since_ms.swap(0, Ordering::Relaxed);
        if since != 0 {
            let down = now_ms().saturating_sub(since) as f64 / 1000.0;
            info!(watch = %self.health.name, stale_seconds = down, "watch recovered; converging on the current state");
            self.last_log = None;
        }
    }

    /// The watch (or discovery) failed with `error`; logged at once, then at
    /// most every `STALE_LOG_EVERY` while it stays down.
    pub fn failed(&mut self, error: &str) {
        self.failed_since(error, SystemTime::now());
    }

    /// As [`Reporter::failed`], stale since `since` if it was not already
    /// (what failed says when it began: a heartbeat's last renewal).
    pub fn failed_since(&mut self, error: &str, since: SystemTime) {
        self.health.errors.fetch_add(1, Ordering::Relaxed);
        let since_ms = since.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(1).max(1);
        let first = self
            .health
            .stale_since_ms
            .compare_exchange(0, since_ms.min(now_ms()), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        let due = self.last_log.is_none_or(|t| t.elapsed() >= STALE_LOG_EVERY);
        if first || due {
            warn!(
                watch = %self.health.name,
                stale_seconds = self.health.stale_seconds(),
                %error,
                "watch failing; serving the last known data and retrying"
            );
            self.last_log = Some(Instant::now());
        }
    }
}

/// How watches get their complete lists (`--list-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMode {
    /// Streaming lists where the API server allows them; where it refuses
    /// the first one, lists in pages from then on, with one warning.
    Auto,
    /// Streaming lists only: where the API server refuses them the watches
    /// fail (and say so, naming the flag) until it allows them.
    Stream,
    /// List requests, in pages of `--list-page-size` objects.
    Paged,
}

/// How the watches of one API server list: the mode and page size, and in
/// [`ListMode::Auto`] whether the server refused a streaming list, shared
/// by every clone so that one refusal switches them all (and warns once).
#[derive(Debug, Clone)]
pub struct Lists {
    mode: ListMode,
    page_size: Option<NonZeroU32>,
    refused: Arc<AtomicBool>,
}

impl Default for Lists {
    /// kube's default: paged, 500 objects a page.
    fn default() -> Self {
        Self::new(ListMode::Paged, NonZeroU32::new(500))
    }
}

impl Lists {
    /// Lists in `mode`; `page_size` objects per request when paged (`None`:
    /// one request for all).
    pub fn new(mode: ListMode, page_size: Option<NonZeroU32>) -> Self {
        Self { mode, page_size, refused: Arc::new(AtomicBool::new(false)) }
    }

    /// The same mode and page size for the watches of another API server,
    /// which may allow streaming lists where this one refused them.
    pub fn for_another_server(&self) -> Self {
        Self::new(self.mode, self.page_size)
    }

    /// The mode as configured.
    pub fn mode(&self) -> ListMode {
        self.mode
    }

    /// Objects per list request when paged.
    pub fn page_size(&self) -> Option<NonZeroU32> {
        self.page_size
    }

    /// Whether the next list is a streaming list.
    fn streaming(&self) -> bool {
        match self.mode {
            ListMode::Stream => true,
            ListMode::Auto => !self.refused.load(Ordering::Relaxed),
            ListMode::Paged => false,
        }
    }

    /// `config` (selectors) set up for a streaming list or a paged one.
    fn config(&self, config: &watcher::Config, streaming: bool) -> watcher::Config {
        let config = watcher::Config { page_size: self.page_size.map(NonZeroU32::get), ..config.clone() };
        if streaming { config.streaming_lists() } else { config }
    }

    /// What `error` means in this mode when a watch that tried a streaming
    /// list failed with it before it had listed. (Whether it tried is the
    /// caller's: another watch's refusal may have switched the mode since.)
    fn refusal(&self, error: &watcher::Error) -> Refusal {
        match error {
            watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 422 => {
                self.refused(&status.message)
            }
            _ => Refusal::None,
        }
    }

    /// What a streaming list that the API server ended before its end
    /// bookmark (`k8s.io/initial-events-end`) means in this mode. kube's
    /// watcher starts such a list again by itself, silently; a server that
    /// takes the parameters but never ends the list would keep the watch
    /// from ever being ready.
    fn unfinished(&self) -> Refusal {
        self.refused("it ended a streaming list without the bookmark that marks the end of its objects")
    }

    /// The API server refused a streaming list because of `why`.
    fn refused(&self, why: &str) -> Refusal {
        match self.mode {
            ListMode::Auto => {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    warn!(
                        reason = %why,
                        "the API server refuses streaming lists (its WatchList feature gate is off, or it \
                         predates Kubernetes 1.27); listing in pages of --list-page-size from now on \
                         ({LIST_MODE_FLAG} paged says so and skips the attempt)"
                    );
                }
                Refusal::FallBack
            }
            ListMode::Stream | ListMode::Paged => Refusal::Failed(format!(
                "the API server refuses streaming lists ({why}): enable its WatchList feature gate, \
                 or use {LIST_MODE_FLAG} auto or paged"
            )),
        }
    }
}

/// What a failure of a streaming list before its end means.
#[derive(Debug, PartialEq)]
enum Refusal {
    /// Not a refusal: an error like any other.
    None,
    /// Refused; the next attempt lists in pages.
    FallBack,
    /// Refused and the mode insists: report this and retry as usual.
    Failed(String),
}

/// Makes one run of a task that is restarted whenever it ends.
pub type Maker = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A watch as a task its owner runs and restarts: what it watches (its
/// [`WatchHealth`], exported by name) and how to start a run of it.
#[derive(Clone)]
pub struct WatchTask {
    /// Its health, named after what it watches.
    pub health: Arc<WatchHealth>,
    /// Starts one run.
    pub run: Maker,
}

impl WatchTask {
    /// A task whose runs are `make()`, reporting into `health`.
    pub fn new<F, Fut>(health: Arc<WatchHealth>, make: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Self { health, run: Arc::new(move || Box::pin(make())) }
    }

    /// What it watches.
    pub fn name(&self) -> &str {
        &self.health.name
    }
}

/// The scopes watches run in: each namespace, or all namespaces at once.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() }
}

/// An API of a built-in namespaced kind in one scope (a namespace, or all).
pub fn scoped<K>(client: Client, scope: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// An API of a dynamic kind (a discovered MCS version) in one scope.
pub fn scoped_with<K>(client: Client, scope: Option<&str>, resource: &ApiResource) -> Api<K>
where
    K: Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match scope {
        Some(ns) => Api::namespaced_with(client, ns, resource),
        None => Api::all_with(client, resource),
    }
}

/// What one watch makes of its objects. The relist loop is the same for
/// every watch; what it sends, and what an object that cannot be used
/// means, is the consumer's.
pub trait Translate<K>: Send {
    /// A listed object as kept until its list is complete.
    type Item: Send;
    /// What the watch sends.
    type Message: Send;
    /// One object of a list; `None` leaves it out.
    fn item(&self, object: &K) -> Option<Self::Item>;
    /// A list has [`LIST_PART`] items not yet sent: a message that hands
    /// them over now (taking them out of `items`), so that a large list is
    /// never held whole; `first` for a list's first part. `None` (the
    /// default) keeps them until the list is complete.
    fn part(&self, items: &mut Vec<Self::Item>, first: bool) -> Option<Self::Message> {
        let _ = (items, first);
        None
    }
    /// A complete list (the first, or a relist): it replaces what the
    /// consumer held from this watch; `items` are those after the last
    /// part sent, if any. `began` is when the list was asked
    /// for: an object written after it may be missing from the list
    /// without being gone (its event follows).
    fn listed(&self, items: Vec<Self::Item>, began: Instant) -> Self::Message;
    /// The end of a list handed over in [`Translate::part`]s: its items
    /// after the last part. Only a consumer that takes parts gets it.
    fn rest(&self, items: Vec<Self::Item>, began: Instant) -> Self::Message {
        self.listed(items, began)
    }
    /// An object added or changed; `None` sends nothing.
    fn applied(&self, object: &K) -> Option<Self::Message>;
    /// An object deleted; `None` sends nothing.
    fn deleted(&self, object: &K) -> Option<Self::Message>;
    /// Ends when the consumer wants a complete list again (it lost some
    /// of what was sent); made as each watcher starts, so an ask made
    /// before a list began may be dropped here: that list answers it.
    /// Never ends, by default.
    fn relist(&self) -> impl Future<Output = ()> + Send + '_ {
        std::future::pending()
    }
}

/// Runs one watch until `out`'s receiver is gone, restarting it with a
/// complete list (after a backoff) after every error. `config` gives the
/// selectors; `lists` how to list.
pub async fn relist<K, T>(
    api: Api<K>,
    config: watcher::Config,
    lists: &Lists,
    reporter: Reporter,
    translate: T,
    out: mpsc::Sender<T::Message>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    T: Translate<K>,
{
    let start = |streaming| watcher::watcher(api.clone(), lists.config(&config, streaming));
    relist_with(start, lists, reporter, translate, out).await;
}

/// [`relist`] with the watcher `start` makes (a streaming list when it is
/// given `true`): for watches that kube's watcher cannot make, the
/// protobuf ones of `k8s::protobuf`.
pub async fn relist_with<K, S, T>(
    mut start: impl FnMut(bool) -> S,
    lists: &Lists,
    mut reporter: Reporter,
    translate: T,
    out: mpsc::Sender<T::Message>,
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
    T: Translate<K>,
{
    let mut backoff = WATCH_BACKOFF;
    loop {
        let streaming = lists.streaming();
        let stream = start(streaming);
        // A panic while translating an object (a bug, never an input we
        // expect) is a watch failure like any other: reported, then a
        // relist after the backoff. Whoever spawned the watch never sees
        // it die.
        let run =
            std::panic::AssertUnwindSafe(pump(stream, (lists, streaming), &mut reporter, &translate, &out))
                .catch_unwind()
                .await;
        let end = run.unwrap_or_else(|payload| {
            reporter.failed(&format!("panicked: {}", crate::fault::panic_message(&*payload)));
            End::Failed { listed: false }
        });
        match end {
            End::Closed => return,
            // Refused a streaming list: list in pages at once.
            End::FallBack => {}
            End::Relist => info!(watch = %reporter.name(), "listing again, as the consumer asked"),
            End::Failed { listed } => {
                if listed {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.next_wait()).await;
            }
        }
    }
}

/// Why a watcher stream was left.
enum End {
    /// The receiver is gone: the consumer is shutting down.
    Closed,
    /// The watch failed; `listed` when it had completed a list first.
    Failed { listed: bool },
    /// The API server refused a streaming list; the next list is paged.
    FallBack,
    /// The consumer asked for a complete list again.
    Relist,
}

impl End {
    /// The end of a watch whose list was refused (or that failed, as
    /// [`Refusal::Failed`]): reported, unless the next list falls back.
    fn refused(refusal: Refusal, reporter: &mut Reporter, listed: bool) -> Self {
        match refusal {
            Refusal::FallBack => return Self::FallBack,
            Refusal::Failed(why) => reporter.failed(&why),
            Refusal::None => {}
        }
        Self::Failed { listed }
    }
}

/// The list a watch is receiving (from `Init` to `InitDone`).
struct Listing<I> {
    /// Whether a list began and has not ended.
    open: bool,
    began: Instant,
    /// Items not handed over yet.
    buffer: Vec<I>,
    /// Whether a part of it was handed over ([`Translate::part`]).
    parted: bool,
    /// Its items so far.
    count: usize,
}

impl<I> Listing<I> {
    /// A list begins: nothing of one that never ended is kept.
    fn begin(&mut self) {
        (self.open, self.began, self.parted, self.count) = (true, Instant::now(), false, 0);
        self.buffer.clear();
    }

    /// One listed object's item (`None`: left out); a part of the list to
    /// send when [`LIST_PART`] items are held and the consumer takes parts.
    fn add<K, T: Translate<K, Item = I>>(&mut self, item: Option<I>, translate: &T) -> Option<T::Message> {
        if let Some(item) = item {
            self.buffer.push(item);
            self.count += 1;
        }
        if self.buffer.len() < LIST_PART {
            return None;
        }
        let part = translate.part(&mut self.buffer, !self.parted)?;
        self.parted = true;
        Some(part)
    }

    /// The list ended: the message that completes it (its rest after parts,
    /// or the whole list).
    fn end<K, T: Translate<K, Item = I>>(&mut self, translate: &T) -> T::Message {
        self.open = false;
        let items = std::mem::take(&mut self.buffer);
        if std::mem::take(&mut self.parted) {
            translate.rest(items, self.began)
        } else {
            translate.listed(items, self.began)
        }
    }
}

/// Turns watch events into messages until the watch fails; `streaming`
/// when its list is a streaming one.
async fn pump<K, S, T>(
    stream: S,
    (lists, streaming): (&Lists, bool),
    reporter: &mut Reporter,
    translate: &T,
    out: &mpsc::Sender<T::Message>,
) -> End
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
    T: Translate<K>,
{
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    let mut list =
        Listing { open: false, began: Instant::now(), buffer: Vec::new(), parted: false, count: 0 };
    let how = if streaming { "streamed" } else { "paged" };
    let mut relist = std::pin::pin!(translate.relist());
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = &mut relist => return End::Relist,
        };
        // A watcher stream does not end by itself; treat it as a failure.
        let Some(event) = event else { return End::Failed { listed } };
        let (message, complete) = match event {
            Err(e) => {
                // Only the first watch of a streaming list asks for its
                // initial events; a refusal can come before the list only.
                let refusal = match if streaming && !listed { lists.refusal(&e) } else { Refusal::None } {
                    Refusal::None => Refusal::Failed(e.to_string()),
                    refusal => refusal,
                };
                return End::refused(refusal, reporter, listed);
            }
            // A second start: the streaming list ended unfinished.
            Ok(Event::Init) if list.open && streaming => {
                return End::refused(lists.unfinished(), reporter, listed);
            }
            Ok(Event::Init) => {
                // With "watch listed" (which says how it listed), when a
                // (re)list ran and how long it took.
                info!(watch = %reporter.name(), "watch listing");
                list.begin();
                continue;
            }
            Ok(Event::InitApply(k)) => match list.add(translate.item(&k), translate) {
                Some(m) => (m, false),
                None => continue,
            },
            Ok(Event::InitDone) => {
                let (objects, seconds) = (list.count, list.began.elapsed().as_secs_f64());
                info!(watch = %reporter.name(), objects, list = how, seconds, "watch listed");
                listed = true;
                (list.end(translate), true)
            }
            Ok(Event::Apply(k)) => match translate.applied(&k) {
                Some(m) => (m, false),
                None => continue,
            },
            Ok(Event::Delete(k)) => match translate.deleted(&k) {
                Some(m) => (m, false),
                None => continue,
            },
        };
        if out.send(message).await.is_err() {
            return End::Closed;
        }
        if complete {
            // Current again only once the complete list is delivered.
            reporter.ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    /// Objects are strings; a list sends them all, a change sends itself.
    struct Strings {
        /// Whether lists are taken in parts.
        parts: bool,
    }

    impl Translate<String> for Strings {
        fn part(&self, items: &mut Vec<String>, first: bool) -> Option<String> {
            let part = format!("part of {} (first {first})", items.len());
            self.parts.then(|| {
                items.clear();
                part
            })
        }
        type Item = String;
        type Message = String;
        fn item(&self, object: &String) -> Option<String> {
            Some(object.clone())
        }
        fn listed(&self, items: Vec<String>, _: Instant) -> String {
            format!("listed {}", items.join(","))
        }
        fn rest(&self, items: Vec<String>, _: Instant) -> String {
            format!("rest {}", items.join(","))
        }
        fn applied(&self, object: &String) -> Option<String> {
            Some(format!("applied {object}"))
        }
        fn deleted(&self, object: &String) -> Option<String> {
            Some(format!("deleted {object}"))
        }
    }

    fn refused() -> watcher::Error {
        let status = Status::failure(
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "Invalid",
        )
        .with_code(422);
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    }

    /// Runs `pump` over `events` as a streaming list (or not) in `lists`;
    /// how it ended, the messages sent and the watch's error count.
    fn run(
        lists: &Lists,
        streaming: bool,
        events: Vec<Result<Event<String>, watcher::Error>>,
    ) -> (String, Vec<String>, u64) {
        run_with(lists, streaming, events, &Strings { parts: false })
    }

    fn run_with(
        lists: &Lists,
        streaming: bool,
        events: Vec<Result<Event<String>, watcher::Error>>,
        translate: &Strings,
    ) -> (String, Vec<String>, u64) {
        let health = Arc::new(WatchHealth::new("test".to_owned()));
        let mut reporter = Reporter::new(health.clone());
        let (tx, mut rx) = mpsc::channel(16);
        let stream = futures::stream::iter(events).chain(futures::stream::pending());
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let end = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_millis(300),
                pump(stream, (lists, streaming), &mut reporter, translate, &tx),
            )
            .await
        });
        // Still pumping when the events have run out: running.
        let end = end.map_or_else(|_| "running".to_owned(), |end| name(&end));
        drop(tx);
        let mut sent = Vec::new();
        while let Ok(m) = rx.try_recv() {
            sent.push(m);
        }
        (end, sent, health.errors())
    }

    fn name(end: &End) -> String {
        match end {
            End::Closed => "closed".to_owned(),
            End::FallBack => "fall back".to_owned(),
            End::Relist => "relist".to_owned(),
            End::Failed { listed } => format!("failed, listed {listed}"),
        }
    }

    #[test]
    fn auto_falls_back_to_pages_for_every_watch_after_one_refused_stream() {
        let lists = Lists::new(ListMode::Auto, NonZeroU32::new(500));
        let other = lists.clone();
        assert!(lists.streaming() && other.streaming());
        let (end, sent, errors) = run(&lists, true, vec![Err(refused())]);
        assert_eq!(end, "fall back");
        assert!(sent.is_empty());
        assert_eq!(errors, 0, "a refusal in auto mode is no watch failure");
        assert!(!lists.streaming() && !other.streaming(), "one refusal switches every clone");
        let config = other.config(&watcher::Config::default(), other.streaming());
        assert_eq!(config.initial_list_strategy, watcher::InitialListStrategy::ListWatch);
        assert_eq!(config.page_size, Some(500));
        // A watch that had asked for a stream before the switch falls back too.
        assert_eq!(run(&other, true, vec![Err(refused())]).0, "fall back");
    }

    #[test]
    fn stream_mode_fails_on_a_refused_stream_and_keeps_streaming() {
        let lists = Lists::new(ListMode::Stream, None);
        let (end, _, errors) = run(&lists, true, vec![Err(refused())]);
        assert_eq!(end, "failed, listed false");
        assert_eq!(errors, 1);
        assert!(lists.streaming());
        let config = lists.config(&watcher::Config::default().labels("a"), true);
        assert_eq!(config.initial_list_strategy, watcher::InitialListStrategy::StreamingList);
        assert_eq!(config.label_selector.as_deref(), Some("a"));
    }

    #[test]
    fn a_paged_list_refused_with_422_is_an_error_like_any_other() {
        let lists = Lists::new(ListMode::Auto, None);
        let (end, _, errors) = run(&lists, false, vec![Err(refused())]);
        assert_eq!(end, "failed, listed false");
        assert_eq!(errors, 1);
        assert!(lists.streaming(), "only a refused stream switches auto mode");
    }

    #[test]
    fn a_streaming_list_that_starts_again_unfinished_counts_as_refused() {
        let events = || {
            vec![
                Ok(Event::Init),
                Ok(Event::InitApply("a".to_owned())),
                // kube's watcher restarts a stream that ended before its
                // end bookmark: a second start, without an end between.
                Ok(Event::Init),
                Ok(Event::InitApply("a".to_owned())),
            ]
        };
        let auto = Lists::new(ListMode::Auto, None);
        assert_eq!(run(&auto, true, events()).0, "fall back");
        assert!(!auto.streaming());
        let stream = Lists::new(ListMode::Stream, None);
        let (end, sent, errors) = run(&stream, true, events());
        assert_eq!((end.as_str(), sent.len(), errors), ("failed, listed false", 0, 1));
    }

    #[test]
    fn a_finished_stream_then_changes_and_a_relist_are_sent_in_order() {
        let lists = Lists::new(ListMode::Stream, None);
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply("a".to_owned())),
            Ok(Event::InitApply("b".to_owned())),
            Ok(Event::InitDone),
            Ok(Event::Apply("c".to_owned())),
            Ok(Event::Delete("a".to_owned())),
            // A relist after a 410 Gone starts a list again: not a refusal.
            Ok(Event::Init),
            Ok(Event::InitApply("b".to_owned())),
            Ok(Event::InitDone),
        ];
        let (end, sent, errors) = run(&lists, true, events);
        assert_eq!(end, "running");
        assert_eq!(sent, ["listed a,b", "applied c", "deleted a", "listed b"]);
        assert_eq!(errors, 0);
    }

    #[test]
    fn a_long_list_goes_in_parts_to_a_consumer_that_takes_them() {
        let list = |n: usize| {
            let mut events = vec![Ok(Event::Init)];
            events.extend((0..n).map(|i| Ok(Event::InitApply(i.to_string()))));
            events.push(Ok(Event::InitDone));
            events
        };
        let n = 2 * LIST_PART + 3;
        let lists = Lists::new(ListMode::Paged, None);
        let mut events = list(n);
        events.extend(list(LIST_PART + 1));
        let (_, sent, _) = run_with(&lists, false, events, &Strings { parts: true });
        let parts: Vec<&str> =
            sent.iter().map(|m| m.split_once(' ').map_or(m.as_str(), |(a, _)| a)).collect();
        assert_eq!(parts, ["part", "part", "rest", "part", "rest"]);
        assert_eq!(sent[0], format!("part of {LIST_PART} (first true)"));
        assert_eq!(sent[1], format!("part of {LIST_PART} (first false)"));
        assert_eq!(sent[2], format!("rest {}", [n - 3, n - 2, n - 1].map(|i| i.to_string()).join(",")));
        assert_eq!(
            sent[3],
            format!("part of {LIST_PART} (first true)"),
            "a new list starts its parts afresh"
        );
        // A list cut short after a part (a relist begins): the next list,
        // in one piece, ends as a whole list, not as the rest of parts.
        let mut cut = list(LIST_PART);
        cut.pop();
        cut.extend(list(3));
        let (_, sent, _) = run_with(&lists, false, cut, &Strings { parts: true });
        assert_eq!(sent, [format!("part of {LIST_PART} (first true)"), "listed 0,1,2".to_owned()]);
        // A consumer that takes no parts gets the whole list at once.
        let (_, sent, _) = run_with(&lists, false, list(n), &Strings { parts: false });
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].matches(',').count(), n - 1);
    }
}

#[cfg(test)]
mod relist_tests {
    use super::*;

    /// Strings as in `tests`, and a consumer that asks for a list again
    /// once it has seen `after` changes.
    struct Asking {
        after: usize,
        seen: std::sync::atomic::AtomicUsize,
        asked: tokio::sync::Notify,
    }

    impl Translate<String> for Asking {
        type Item = String;
        type Message = String;
        fn item(&self, object: &String) -> Option<String> {
            Some(object.clone())
        }
        fn listed(&self, items: Vec<String>, _: Instant) -> String {
            format!("listed {}", items.join(","))
        }
        fn applied(&self, object: &String) -> Option<String> {
            if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.after {
                self.asked.notify_one();
            }
            Some(format!("applied {object}"))
        }
        fn deleted(&self, _: &String) -> Option<String> {
            None
        }
        fn relist(&self) -> impl Future<Output = ()> + Send + '_ {
            self.asked.notified()
        }
    }

    #[test]
    fn a_consumer_that_asks_for_a_list_again_gets_a_new_watcher_at_once_and_no_error() {
        let asking = Asking { after: 1, seen: Default::default(), asked: tokio::sync::Notify::new() };
        let health = Arc::new(WatchHealth::new("test".to_owned()));
        let (tx, mut rx) = mpsc::channel(16);
        let lists = Lists::new(ListMode::Paged, None);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        // Each watcher lists `a` (then `b` in the second), sends one
        // change, and then waits forever.
        let mut started = 0;
        let start = |_| {
            started += 1;
            let events: Vec<Result<Event<String>, watcher::Error>> = vec![
                Ok(Event::Init),
                Ok(Event::InitApply(if started == 1 { "a" } else { "b" }.to_owned())),
                Ok(Event::InitDone),
                Ok(Event::Apply(format!("change {started}"))),
            ];
            futures::stream::iter(events).chain(futures::stream::pending())
        };
        let run = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_millis(300),
                relist_with(start, &lists, Reporter::new(health.clone()), asking, tx),
            )
            .await
        });
        assert!(run.is_err(), "the watch ended");
        let mut sent = Vec::new();
        while let Ok(m) = rx.try_recv() {
            sent.push(m);
        }
        assert_eq!(sent, ["listed a", "applied change 1", "listed b", "applied change 2"]);
        assert_eq!(health.errors(), 0, "an asked relist is not a watch error");
    }
}
