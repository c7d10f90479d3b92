//! Active probes: a TCP connect to every ready endpoint of every balanced
//! service (`--probe`), at an interval with jitter. `fall` consecutive
//! failures mark an address down, `rise` consecutive successes mark it up
//! again; only those transitions reach the store (`Update::EndpointHealth`).
//! A probe that disagrees with the verdict (a failure of a healthy address,
//! a success of a down one) brings the next probe forward to `recheck`
//! (HAProxy's `fastinter`), so a dead backend is confirmed within
//! `interval + (fall - 1) × recheck` while a steady fleet is probed only
//! every `interval`.
//!
//! Probing costs the probed Pods and the network, so it is bounded twice:
//! at most `concurrency` connects in flight (a semaphore), and at most
//! `rate` started per second (a token bucket holding one second's worth).
//! When the budget is short, probes wait: an endpoint is probed less often,
//! never the fleet flooded. The targets are read from the published
//! snapshot (each balanced service's endpoints and probe port), so the
//! prober sees exactly what is answered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::model::ServiceKey;
use crate::pace::{Jitter, TokenBucket};
use crate::store::{Reader, Update};

/// What `--probe-…` configures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeConfig {
    /// Time between two probes of one address (jittered by ±20 %).
    pub interval: Duration,
    /// Time until the next probe while a verdict is being settled (after a
    /// probe that disagrees with it); at most `interval`.
    pub recheck: Duration,
    /// How long a connect may take.
    pub timeout: Duration,
    /// Consecutive failures that mark an address down.
    pub fall: u32,
    /// Consecutive successes that mark a down address up.
    pub rise: u32,
    /// Connects in flight at once.
    pub concurrency: usize,
    /// Connects started per second.
    pub rate: u32,
}

/// One probed address of one service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    service: ServiceKey,
    addr: SocketAddr,
}

#[derive(Debug)]
struct State {
    fails: u32,
    oks: u32,
    up: bool,
    /// When the next probe is due; `None` while one is in flight.
    due: Option<Instant>,
}

impl State {
    /// Time until this address's next probe (before jitter): `recheck`
    /// while the last probe disagreed with the verdict, else `interval`.
    fn next_gap(&self, cfg: &ProbeConfig) -> Duration {
        let settling = if self.up { self.fails > 0 } else { self.oks > 0 };
        if settling { cfg.recheck.min(cfg.interval) } else { cfg.interval }
    }

    /// Counts one probe's result and schedules the next probe; returns the
    /// new verdict (`true`: healthy) when this result changed it.
    fn record(&mut self, ok: bool, cfg: &ProbeConfig) -> Option<bool> {
        let verdict = if ok {
            self.fails = 0;
            self.oks = self.oks.saturating_add(1);
            (!self.up && self.oks >= cfg.rise).then_some(true)
        } else {
            self.oks = 0;
            self.fails = self.fails.saturating_add(1);
            (self.up && self.fails >= cfg.fall).then_some(false)
        };
        self.up = verdict.unwrap_or(self.up);
        // After the verdict: a settled address goes back to the interval.
        self.due = Some(Instant::now() + Jitter::Around.apply(self.next_gap(cfg)));
        verdict
    }
}

/// Makes `list` (a new snapshot's targets) the probed set: a target kept
/// keeps its counts and schedule, a new one starts healthy with its first
/// probe spread over one interval. Returns the targets gone while down.
fn retarget(
    state: &mut HashMap<Target, State>,
    list: Vec<Target>,
    now: Instant,
    cfg: &ProbeConfig,
) -> Vec<Target> {
    let mut next: HashMap<Target, State> = HashMap::with_capacity(list.len());
    for t in list {
        let kept = state.remove(&t).unwrap_or_else(|| State {
            fails: 0,
            oks: 0,
            up: true,
            due: Some(now + Jitter::Full.apply(cfg.interval)),
        });
        next.insert(t, kept);
    }
    let gone_down = state.drain().filter(|(_, s)| !s.up).map(|(t, _)| t).collect();
    *state = next;
    gone_down
}

/// The targets of a snapshot: every address of every ready endpoint of
/// every service answered by endpoints, at its probe port.
fn targets(reader: &Reader) -> (u32, Vec<Target>) {
    let snap = reader.load();
    let mut out = Vec::new();
    for names in snap.services.values() {
        let Some(b) = names.balance() else { continue };
        let Some(port) = b.probe_port else { continue };
        for e in b.endpoints.iter() {
            for ip in names.endpoint_addresses(e) {
                out.push(Target { service: b.service.clone(), addr: SocketAddr::new(ip, port) });
            }
        }
    }
    (snap.serial(), out)
}

/// Runs the prober until the store goes away.
pub async fn run(reader: Reader, cfg: ProbeConfig, updates: mpsc::Sender<Update>) {
    // Fine enough for the rate budget and the schedule, coarse enough to
    // cost nothing when idle.
    let tick = (cfg.interval / 10).clamp(Duration::from_millis(10), Duration::from_millis(100));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let slots = Arc::new(Semaphore::new(cfg.concurrency));
    let (done_tx, mut done) = mpsc::channel::<(Target, bool)>(cfg.concurrency.max(1));
    let mut state: HashMap<Target, State> = HashMap::new();
    // One second's worth, full at the start: the first second may use its
    // whole budget at once.
    let rate = f64::from(cfg.rate);
    let mut bucket = TokenBucket::new(rate, rate, Instant::now());
    let mut serial = None;
    info!(interval = ?cfg.interval, recheck = ?cfg.recheck, timeout = ?cfg.timeout, fall = cfg.fall, rise = cfg.rise,
          concurrency = cfg.concurrency, rate = cfg.rate, "active probes on");
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            Some((target, ok)) = done.recv() => {
                let Some(s) = state.get_mut(&target) else { continue };
                let Some(healthy) = s.record(ok, &cfg) else { continue };
                info!(service = %target.service, address = %target.addr, healthy, "probe verdict changed");
                let update = Update::EndpointHealth { service: target.service, address: target.addr.ip(), healthy };
                if updates.send(update).await.is_err() {
                    return;
                }
                continue;
            }
        }
        let now = Instant::now();
        if serial != Some(reader.load().serial()) {
            let (s, list) = targets(&reader);
            serial = Some(s);
            // Gone from the answers: forget a down verdict, so an address
            // that comes back starts healthy, as new endpoints do.
            for t in retarget(&mut state, list, now, &cfg) {
                let update =
                    Update::EndpointHealth { service: t.service, address: t.addr.ip(), healthy: true };
                if updates.send(update).await.is_err() {
                    return;
                }
            }
        }
        for (target, s) in state.iter_mut() {
            if s.due.is_none_or(|d| d > now) {
                continue;
            }
            let Ok(permit) = slots.clone().try_acquire_owned() else { break };
            if !bucket.try_take(now) {
                break;
            }
            s.due = None;
            let (target, done, timeout) = (target.clone(), done_tx.clone(), cfg.timeout);
            tokio::spawn(async move {
                let ok = matches!(
                    tokio::time::timeout(timeout, tokio::net::TcpStream::connect(target.addr)).await,
                    Ok(Ok(_))
                );
                debug!(address = %target.addr, ok, "probe");
                drop(permit);
                let _ = done.send((target, ok)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicU32, Ordering};

    use hickory_proto::rr::Name;
    use tokio::net::TcpListener;

    use super::*;
    use crate::model::{
        AddressFamily, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port, Protocol, ServiceImport,
        SliceKey,
    };
    use crate::store::{self, AnswerConfig, Object, SourceId, Writer, ZoneConfig};

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    /// Headless service `name` with one endpoint per address, all on `port`.
    fn objects(name: &str, addrs: &[&str], port: u16) -> Vec<Object> {
        vec![
            Object::Import(ServiceImport {
                key: key(name),
                kind: ImportType::Headless,
                ips: Default::default(),
                ports: Default::default(),
                answers: Default::default(),
            }),
            Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: format!("{name}-x") },
                service: key(name),
                cluster: ClusterId::parse("c1").unwrap(),
                family: AddressFamily::V4,
                ports: vec![Port { name: None, protocol: Protocol::Tcp, port }],
                endpoints: addrs
                    .iter()
                    .map(|a| Endpoint::new(vec![a.parse::<std::net::IpAddr>().unwrap()].into(), true))
                    .collect(),
                origin: crate::model::SliceOrigin::Mcs,
                trigger: Default::default(),
            }),
        ]
    }

    /// A store holding `objects`, its writer applying updates from the
    /// returned sender as `serve`'s writer task does.
    fn store_with(objects: Vec<Object>) -> (Reader, mpsc::Sender<Update>) {
        let (reader, mut w): (Reader, Writer) = store::new(ZoneConfig::with_defaults(
            Name::from_ascii("clusterset.local.").unwrap(),
            AnswerConfig::standard(),
        ));
        w.apply(Update::Replace { source: SourceId::Watch(1), objects });
        w.publish();
        let (tx, mut rx) = mpsc::channel::<Update>(64);
        tokio::spawn(async move {
            while let Some(u) = rx.recv().await {
                w.apply(u);
                while let Ok(more) = rx.try_recv() {
                    w.apply(more);
                }
                w.publish();
            }
        });
        (reader, tx)
    }

    /// Whether `addr`'s endpoint of service `name` is healthy now.
    fn healthy(reader: &Reader, name: &str, addr: &str) -> bool {
        let snap = reader.load();
        let names = snap.service(&store::names_key("ns", name)).expect("service");
        let b = names.balance().expect("balanced");
        let ip: IpAddr = addr.parse().unwrap();
        let i =
            b.endpoints.iter().position(|e| names.endpoint_addresses(e).any(|a| a == ip)).expect("endpoint");
        b.healthy[i]
    }

    /// Waits (bounded) until `f` holds; returns how long it took.
    async fn until(what: &str, limit: Duration, f: impl Fn() -> bool) -> Duration {
        let start = Instant::now();
        for _ in 0..limit.as_millis() / 10 {
            if f() {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not within {limit:?}");
    }

    /// Accepts (and drops) connections, counting them.
    fn serve(listener: TcpListener, count: Arc<AtomicU32>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                drop(conn);
            }
        })
    }

    // recheck = interval: the timings below count whole intervals.
    const FAST: ProbeConfig = ProbeConfig {
        interval: Duration::from_millis(100),
        recheck: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        fall: 3,
        rise: 2,
        concurrency: 8,
        rate: 1000,
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_port_leaves_answers_after_fall_failures_and_returns_after_rise_successes() {
        let open = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = open.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicU32::new(0));
        let server = serve(open, accepted.clone());
        // 127.0.0.3:port has no listener: the connect is refused.
        let (reader, tx) = store_with(objects("web", &["127.0.0.2", "127.0.0.3"], port));
        let prober = tokio::spawn(run(reader.clone(), FAST, tx));
        let took = until("closed port marked down", Duration::from_secs(10), || {
            !healthy(&reader, "web", "127.0.0.3")
        })
        .await;
        // Three failures: the first within one interval, two more at least
        // 0.8 interval apart each.
        assert!(took >= FAST.interval.mul_f64(1.6), "down after {took:?}: before 3 failures");
        assert!(healthy(&reader, "web", "127.0.0.2"), "the listening endpoint stays up");
        // Counted when the server task accepts, which on a busy machine may
        // be after the probe's connect succeeded: waited for, not read once.
        until("the open port probed twice", Duration::from_secs(5), || accepted.load(Ordering::Relaxed) >= 2)
            .await;
        let b = reader.load();
        let b = b.service(&store::names_key("ns", "web")).and_then(|s| s.balance()).unwrap();
        assert_eq!(b.healthy_count[0], 1, "answers hold the healthy endpoint only");

        // A listener appears: up again after two successes.
        let now_open = TcpListener::bind(("127.0.0.3", port)).await.unwrap();
        let second = serve(now_open, Arc::new(AtomicU32::new(0)));
        let back = until("reopened port marked up", Duration::from_secs(10), || {
            healthy(&reader, "web", "127.0.0.3")
        })
        .await;
        assert!(back >= FAST.interval.mul_f64(0.8), "up after {back:?}: before 2 successes");
        for t in [prober, server, second] {
            t.abort();
        }
    }

    #[test]
    fn a_probe_that_disagrees_with_the_verdict_brings_the_next_one_forward() {
        let cfg =
            ProbeConfig { interval: Duration::from_secs(2), recheck: Duration::from_millis(500), ..FAST };
        let state = |up, fails, oks| State { fails, oks, up, due: None };
        assert_eq!(state(true, 0, 5).next_gap(&cfg), cfg.interval, "healthy and agreeing");
        assert_eq!(state(true, 1, 0).next_gap(&cfg), cfg.recheck, "healthy, one failure: confirm soon");
        assert_eq!(state(true, 2, 0).next_gap(&cfg), cfg.recheck);
        assert_eq!(state(false, 3, 0).next_gap(&cfg), cfg.interval, "down and agreeing");
        assert_eq!(state(false, 0, 1).next_gap(&cfg), cfg.recheck, "down, one success: confirm soon");
        let slow = ProbeConfig { interval: Duration::from_millis(200), ..cfg };
        assert_eq!(state(true, 1, 0).next_gap(&slow), slow.interval, "never later than the interval");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_budget_bounds_the_probe_rate() {
        let listener = TcpListener::bind("127.0.0.4:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicU32::new(0));
        let server = serve(listener, accepted.clone());
        // 40 targets every 50 ms would be 800 probes a second.
        let all: Vec<Object> =
            (0..40).flat_map(|i| objects(&format!("s{i}"), &["127.0.0.4"], port)).collect();
        let (reader, tx) = store_with(all);
        let cfg = ProbeConfig { interval: Duration::from_millis(50), rate: 20, ..FAST };
        let prober = tokio::spawn(run(reader, cfg, tx));
        let window = Duration::from_secs(2);
        tokio::time::sleep(window).await;
        let n = accepted.load(Ordering::Relaxed);
        // One second's burst, then 20 a second; a little slack for timing.
        let most = cfg.rate * (1 + window.as_secs() as u32) + 5;
        assert!(n <= most, "{n} probes in {window:?} with a budget of {}/s (at most {most})", cfg.rate);
        assert!(n >= cfg.rate, "only {n} probes: the budget was not used");
        prober.abort();
        server.abort();
    }
}
