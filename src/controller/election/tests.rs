//! The election in process: its rules step by step on a paused clock, and
//! a seeded schedule of faults against three replicas.
use std::sync::Mutex;

use super::fake::FakeLeases;
use super::*;
use crate::fault::{Failures, Task};

/// Wall time that moves with the test's paused clock, and can be
/// stepped by `offset` (seconds).
fn wall(offset: Arc<Mutex<f64>>) -> WallClock {
    let (base, start) = (SystemTime::now(), Instant::now());
    Arc::new(move || {
        let t = base + start.elapsed();
        let o = *offset.lock().unwrap();
        if o >= 0.0 { t + Duration::from_secs_f64(o) } else { t - Duration::from_secs_f64(-o) }
    })
}

fn elector_with(api: &Arc<FakeLeases>, id: &str, shards: u32, duration: u64) -> Elector {
    let cfg = ElectionConfig {
        namespace: "ns".into(),
        name: "sync".into(),
        identity: id.into(),
        shards,
        duration: Duration::from_secs(duration),
    };
    Elector::new(cfg, api.clone(), Shards::elected(shards), Arc::default())
        .with_wall_clock(wall(Arc::default()))
}

fn elector(api: &Arc<FakeLeases>, id: &str, shards: u32) -> Elector {
    elector_with(api, id, shards, 15)
}

fn led(e: &Elector) -> Vec<usize> {
    (0..e.cfg.shards as usize).filter(|i| e.shards.leads(*i)).collect()
}

fn open(e: &Elector) -> Vec<usize> {
    (0..e.cfg.shards as usize).filter(|i| e.shards.fence(*i).may_write()).collect()
}

async fn wait(secs: f64) {
    tokio::time::advance(Duration::from_secs_f64(secs)).await;
}

/// No shard's fence is open in two electors.
fn one_writer(electors: &[&Elector]) {
    let n = electors[0].cfg.shards as usize;
    for i in 0..n {
        let open: Vec<&str> = electors
            .iter()
            .filter(|e| e.shards.fence(i).may_write())
            .map(|e| e.cfg.identity.as_str())
            .collect();
        assert!(open.len() <= 1, "shard {i} open in {open:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn one_replica_leads_every_shard_and_a_second_takes_half() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a", 4);
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0, 1, 2, 3], "alone in a fresh election: takes every shard at once");
    assert_eq!(open(&a), vec![0, 1, 2, 3]);
    assert_eq!(api.holder("sync-2"), "a");
    // B arrives: it sees every shard held (and A alive), takes nothing.
    let mut b = elector(&api, "b", 4);
    b.check().await.unwrap();
    assert_eq!(led(&b), Vec::<usize>::new());
    // A sees B waiting: keeps its fair share (2), releases the rest.
    wait(3.0).await;
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0, 1]);
    assert!(!a.shards.fence(3).may_write(), "a released shard is fenced at once");
    assert_eq!(api.holder("sync-3"), "");
    // B takes the released ones at once: no wait for an expiry.
    b.check().await.unwrap();
    assert_eq!(led(&b), vec![2, 3]);
    for _ in 0..4 {
        wait(3.0).await;
        a.check().await.unwrap();
        b.check().await.unwrap();
        one_writer(&[&a, &b]);
    }
    assert_eq!((led(&a), led(&b)), (vec![0, 1], vec![2, 3]));
}

#[tokio::test(start_paused = true)]
async fn a_dead_replicas_shards_are_taken_only_after_its_fences_closed() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 4), elector(&api, "b", 4));
    for _ in 0..2 {
        a.check().await.unwrap();
        b.check().await.unwrap();
    }
    assert_eq!(led(&a).len() + led(&b).len(), 4);
    let of_a = led(&a);
    // A dies (no more checks). B waits out A's Leases on its own clock.
    wait(14.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b).len(), 2, "not yet expired");
    wait(1.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b), vec![0, 1, 2, 3]);
    assert!(of_a.iter().all(|&i| !a.shards.fence(i).may_write()), "a's fences closed first");
    one_writer(&[&a, &b]);
}

#[tokio::test(start_paused = true)]
async fn another_shards_value_is_refused_naming_both() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a", 4);
    a.check().await.unwrap();
    let mut b = elector(&api, "b", 2);
    let e = b.check().await.unwrap_err();
    assert!(matches!(e, ElectionError::Mismatch { mine: 2, theirs: 4, .. }), "{e}");
    assert!(e.to_string().contains("--shards 2, but replica \"a\" runs with --shards 4"), "{e}");
    assert_eq!(led(&b), Vec::<usize>::new(), "nothing taken");
    assert_eq!(b.status.anomalies(Anomaly::OtherShards), 1);
    // The one that ran first leads on, and names the newcomer too.
    wait(3.0).await;
    a.check().await.unwrap();
    assert_eq!(led(&a).len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_shard_lease_written_by_someone_else_is_given_up_at_once() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a", 1);
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0]);
    // Someone else makes itself the holder (a hand edit, or a replica that
    // judged by another rule).
    api.edit("sync", |l| l.spec.as_mut().unwrap().holder_identity = Some("z".into()));
    wait(1.0).await;
    a.check().await.unwrap();
    assert_eq!(led(&a), Vec::<usize>::new());
    assert!(!a.shards.fence(0).may_write());
    assert_eq!(a.status.anomalies(Anomaly::Overwritten), 1, "its fence was still open: not the rule");
}

#[tokio::test(start_paused = true)]
async fn a_lease_emptied_by_hand_is_waited_out_not_taken_at_once() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 1), elector(&api, "b", 1));
    a.check().await.unwrap();
    b.check().await.unwrap();
    assert_eq!((led(&a), led(&b)), (vec![0], vec![]));
    // `kubectl edit`: holder removed, as our release does but without
    // saying it was released.
    api.edit("sync", |l| l.spec.as_mut().unwrap().holder_identity = None);
    wait(1.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b), Vec::<usize>::new(), "taken while a's fence may be open");
    one_writer(&[&a, &b]);
    a.check().await.unwrap();
    assert_eq!(led(&a), Vec::<usize>::new(), "a stops at once");
    assert_eq!(a.status.anomalies(Anomaly::Overwritten), 1);
    for _ in 0..6 {
        wait(3.0).await;
        b.check().await.unwrap();
        a.check().await.unwrap();
        one_writer(&[&a, &b]);
    }
    assert_eq!(led(&a).len() + led(&b).len(), 1, "taken again once waited out");
}

#[tokio::test(start_paused = true)]
async fn a_lease_deleted_by_hand_is_waited_out_then_taken_by_one() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 1), elector(&api, "b", 1));
    a.check().await.unwrap();
    b.check().await.unwrap();
    api.remove("sync");
    wait(1.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b), Vec::<usize>::new(), "created while a's fence may be open");
    a.check().await.unwrap();
    assert_eq!(led(&a), Vec::<usize>::new());
    assert_eq!(a.status.anomalies(Anomaly::Deleted), 1);
    for _ in 0..6 {
        wait(3.0).await;
        b.check().await.unwrap();
        a.check().await.unwrap();
        one_writer(&[&a, &b]);
    }
    assert_eq!(led(&a).len() + led(&b).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shorter_duration_written_by_hand_does_not_shorten_the_wait() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 1), elector(&api, "b", 1));
    a.check().await.unwrap();
    b.check().await.unwrap();
    api.edit("sync", |l| l.spec.as_mut().unwrap().lease_duration_seconds = Some(1));
    // a is frozen from here on; b, which first sees the edit at 3 s,
    // must still wait its own 15 s from then.
    for _ in 0..5 {
        wait(3.0).await;
        b.check().await.unwrap();
        assert_eq!(led(&b), Vec::<usize>::new());
        one_writer(&[&a, &b]);
    }
    wait(3.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b), vec![0]);
    one_writer(&[&a, &b]);
}

#[tokio::test(start_paused = true)]
async fn a_shard_lease_that_cannot_be_renewed_stops_that_shard_only() {
    let api = Arc::new(FakeLeases::default());
    // A short lease: fences open 2.5 s after a renewal, renewals due
    // after 1 s.
    let mut a = elector_with(&api, "a", 3, 3);
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0, 1, 2]);
    api.refused.lock().unwrap().push("sync-1".into());
    wait(1.1).await;
    // Shards 0 and 2 renewed; 1 refused, its fence still open.
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0, 1, 2]);
    wait(1.5).await;
    assert!(!a.shards.fence(1).may_write(), "shard 1 kept writing past its Lease");
    a.check().await.unwrap();
    assert_eq!(led(&a), vec![0, 2], "only the shard that could not be renewed is given up");
    assert_eq!(open(&a), vec![0, 2]);
}

#[tokio::test(start_paused = true)]
async fn renewals_that_hang_delay_no_other_renewal() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a", 4);
    a.check().await.unwrap();
    // Three of the four renewals will never be answered (each ends at
    // its 5 s deadline): one after another, the fourth would be sent
    // 15 s late, past its fence.
    *api.hung.lock().unwrap() = vec!["sync-0".into(), "sync-1".into(), "sync-2".into()];
    wait(5.0).await;
    let sent = Instant::now();
    a.check().await.unwrap();
    assert_eq!(sent.elapsed(), Duration::from_secs(5), "the check waited on its writes together");
    assert_eq!(a.shards.fence(3).remaining(), Some(Duration::from_millis(14_500) - sent.elapsed()));
    assert!(led(&a).contains(&3));
}

#[tokio::test(start_paused = true)]
async fn released_leases_are_taken_at_once() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 2), elector(&api, "b", 2));
    a.check().await.unwrap();
    b.check().await.unwrap();
    a.release().await;
    assert_eq!(led(&a), Vec::<usize>::new());
    assert!(open(&a).is_empty());
    assert!(api.get(&a.cfg.replica_lease()).is_none(), "its own Lease deleted");
    wait(1.0).await;
    b.check().await.unwrap();
    assert_eq!(led(&b), vec![0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_step_of_the_wall_clock_moves_no_tenure() {
    let api = Arc::new(FakeLeases::default());
    let offset = Arc::new(Mutex::new(0.0));
    let mut a = elector(&api, "a", 2).with_wall_clock(wall(offset.clone()));
    let mut b = elector(&api, "b", 2);
    a.check().await.unwrap();
    b.check().await.unwrap();
    wait(3.0).await;
    a.check().await.unwrap();
    b.check().await.unwrap();
    let (of_a, of_b) = (led(&a), led(&b));
    assert_eq!(of_a.len() + of_b.len(), 2);
    let renewed = |e: &Elector| {
        let l = api.get(&e.cfg.shard_lease(led(e)[0])).unwrap();
        renew_time(&l).unwrap().0
    };
    let before = renewed(&a);
    for step in [3600.0, -3600.0, -7200.0] {
        *offset.lock().unwrap() += step;
        for _ in 0..4 {
            wait(2.0).await;
            a.check().await.unwrap();
            b.check().await.unwrap();
            one_writer(&[&a, &b]);
            assert_eq!((led(&a), led(&b)), (of_a.clone(), of_b.clone()), "a step moved a shard");
            assert_eq!(open(&a), of_a, "a's fences moved with the wall clock");
        }
    }
    assert_eq!(a.status.anomalies(Anomaly::ClockStep), 3, "each step named");
    assert_eq!(b.status.anomalies(Anomaly::ClockStep), 0);
    // renewTime follows the wall clock, for people reading the Lease.
    assert!(renewed(&a) < before, "{} {before}", renewed(&a));
}

#[tokio::test(start_paused = true)]
async fn a_list_that_arrives_late_counts_from_its_arrival() {
    let api = Arc::new(FakeLeases::default());
    let (mut a, mut b) = (elector(&api, "a", 1), elector(&api, "b", 1));
    a.check().await.unwrap();
    b.check().await.unwrap();
    wait(4.0).await;
    // b asks at 4 s; its answer comes at 6 s and holds a's renewal of
    // 5 s. Counted from the asking, b would take the shard at 19 s,
    // while a's fence holds until 19.5 s.
    *api.list_delay.lock().unwrap() = Duration::from_secs(2);
    let renew_a = async {
        wait(1.0).await;
        *api.list_delay.lock().unwrap() = Duration::ZERO;
        a.check().await.unwrap();
    };
    let (r, ()) = tokio::join!(b.check(), renew_a);
    r.unwrap();
    // a is frozen from here on.
    loop {
        wait(0.25).await;
        b.check().await.unwrap();
        one_writer(&[&a, &b]);
        if !led(&b).is_empty() {
            break;
        }
    }
    assert!(!a.shards.fence(0).may_write());
}

/// A seeded schedule of faults against three replicas for ten minutes
/// of (paused) time: freezes past the Lease, kills and restarts, writes
/// never answered, lists answered late, hand edits. At every step no
/// shard's fence is open in two replicas; once the faults end, every
/// shard is led again.
#[tokio::test(start_paused = true)]
async fn no_fault_schedule_opens_one_shard_in_two_replicas() {
    for seed in 1..=20 {
        schedule(seed).await;
    }
}

/// One replica of [`schedule`], as the fault schedule controls it.
#[derive(Default)]
struct Control {
    frozen_until: Option<Instant>,
    /// Frozen for this long right after its next check: the worst
    /// moment, its Leases just renewed.
    freeze_after_check: Option<Duration>,
    killed: bool,
}

async fn schedule(seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let api = Arc::new(FakeLeases::default());
    *api.list_jitter.lock().unwrap() = Some(fastrand::Rng::with_seed(seed));
    let ids = ["a", "b", "c"];
    // Each replica's shards (replaced when it is killed and restarted).
    let live: Arc<Mutex<Vec<Arc<Shards>>>> = Arc::default();
    let controls: Vec<Arc<Mutex<Control>>> = ids.iter().map(|_| Arc::default()).collect();
    let end = Instant::now() + Duration::from_secs(600);
    let mut replicas = Vec::new();
    for (r, id) in ids.iter().enumerate() {
        let (api, live, control) = (api.clone(), live.clone(), controls[r].clone());
        let first = elector_with(&api, id, 4, 6);
        live.lock().unwrap().push(first.shards.clone());
        replicas.push(tokio::spawn(async move {
            let mut e = first;
            loop {
                let frozen = control.lock().unwrap().frozen_until.filter(|t| *t > Instant::now());
                if let Some(t) = frozen {
                    tokio::time::sleep_until(t).await;
                }
                if std::mem::take(&mut control.lock().unwrap().killed) {
                    // A new process: nothing kept; the old one writes nothing.
                    for i in 0..4 {
                        e.shards.fence(i).close();
                    }
                    e = elector_with(&api, ids[r], 4, 6);
                    live.lock().unwrap()[r] = e.shards.clone();
                }
                e.check().await.unwrap();
                let freeze = control.lock().unwrap().freeze_after_check.take();
                if let Some(d) = freeze {
                    tokio::time::sleep(d).await;
                }
                tokio::time::sleep(e.cfg.period()).await;
                if Instant::now() >= end + Duration::from_secs(60) {
                    return (0..4).filter(|i| e.shards.leads(*i)).count();
                }
            }
        }));
    }
    let one_writer = |live: &[Arc<Shards>]| {
        for i in 0..4 {
            let open = live.iter().filter(|s| s.fence(i).may_write()).count();
            assert!(open <= 1, "seed {seed}: shard {i} open in {open} replicas");
        }
    };
    let mut faults = 0;
    while Instant::now() < end {
        if rng.u32(0..20) == 0 {
            faults += 1;
            let r = rng.usize(0..3);
            match rng.u32(0..6) {
                // Frozen past its Lease (a SIGSTOP): no checks.
                0 => {
                    let t = Instant::now() + Duration::from_secs(rng.u64(1..20));
                    controls[r].lock().unwrap().frozen_until = Some(t);
                }
                5 => {
                    let d = Duration::from_millis(rng.u64(3000..20_000));
                    controls[r].lock().unwrap().freeze_after_check = Some(d);
                }
                // Killed and restarted.
                1 => controls[r].lock().unwrap().killed = true,
                // One Lease's writes never answered for a while.
                2 => *api.hung.lock().unwrap() = vec![format!("sync-{}", rng.u32(0..4))],
                // Lists answered late.
                3 => *api.list_delay.lock().unwrap() = Duration::from_millis(rng.u64(0..3000)),
                _ => {
                    api.hung.lock().unwrap().clear();
                    *api.list_delay.lock().unwrap() = Duration::ZERO;
                }
            }
        }
        one_writer(&live.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api.hung.lock().unwrap().clear();
    *api.list_delay.lock().unwrap() = Duration::ZERO;
    let mut led = 0;
    for r in replicas {
        while !r.is_finished() {
            one_writer(&live.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        led += r.await.unwrap();
    }
    assert_eq!(led, 4, "seed {seed}: every shard led once the faults ended");
    assert!(faults > 300, "seed {seed}: {faults} faults");
}

#[test]
fn a_panic_in_the_election_fails_the_process() {
    let failures = Failures::new();
    let cfg = ElectionConfig {
        namespace: "ns".into(),
        name: "sync".into(),
        identity: "a".into(),
        shards: 1,
        duration: Duration::from_secs(15),
    };
    let connect: Connect = Box::new(|| Box::pin(async { panic!("the elector died") }));
    let _running = spawn(cfg, connect, Shards::elected(1), Arc::default(), failures.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let reason = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), failures.wait_fatal()).await.map(str::to_owned)
        })
        .expect("recorded");
    assert!(reason.contains("election") && reason.contains("the elector died"), "{reason}");
    assert_eq!(failures.panics(Task::Election), 1);
}

/// The election runs on a thread of its own: a runtime of the controller's
/// that blocks (a join that hangs, a reconcile that spins) delays no
/// renewal. Real time: the blocking is a real thread's.
#[test]
fn renewals_go_on_while_the_controllers_runtime_is_blocked() {
    let api = Arc::new(FakeLeases::default());
    let cfg = ElectionConfig {
        namespace: "ns".into(),
        name: "sync".into(),
        identity: "a".into(),
        shards: 1,
        duration: Duration::from_secs(5),
    };
    let leases: Arc<dyn LeaseApi> = api.clone();
    let connect: Connect = Box::new(move || Box::pin(async move { Ok(leases) }));
    let shards = Shards::elected(1);
    let running = spawn(cfg, connect, shards.clone(), Arc::default(), Failures::new()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !shards.leads(0) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(shards.leads(0), "the shard taken");
        let before = api.get("sync").unwrap().metadata.resource_version;
        // This runtime's only thread is blocked for longer than the Lease.
        std::thread::sleep(Duration::from_secs(6));
        let after = api.get("sync").unwrap().metadata.resource_version;
        assert_ne!(before, after, "renewed meanwhile");
        assert!(shards.leads(0) && shards.fence(0).may_write(), "still the holder");
        running.stop(Duration::from_secs(5)).await;
        assert_eq!(api.holder("sync"), "", "released at the stop");
    });
}
