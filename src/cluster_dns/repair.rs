//! `setup-dns --watch`: what one check decides, as a pure function of what
//! the check found and what earlier checks did, so the whole policy (keep
//! the wiring, report instead in `report` mode, never fight another
//! controller in a loop) is unit tested without a cluster.
//!
//! A check reads the layout and plans as `setup-dns` does; the plan's
//! changes are the drift. The first wiring of an object is not a rewrite;
//! once the wiring was seen in place, every change found is someone else's
//! rewrite. After [`MAX_REPAIRS`] repairs of one object within [`WINDOW`]
//! the next rewrite is not repaired: the watcher backs off (the first wait
//! [`BACKOFF_FIRST`], doubled at each further fight, at most
//! [`BACKOFF_MAX`]) and reports, then tries once more.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::pace::{Backoff, Jitter};

/// What `--watch` does when the wiring is removed or rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Write it again (the default).
    Reapply,
    /// Only report it (metric, Event, log): nothing is ever written.
    Report,
}

/// Repairs of one object allowed within [`WINDOW`] before backing off.
pub const MAX_REPAIRS: usize = 3;
/// The window repairs are counted in.
pub const WINDOW: Duration = Duration::from_secs(600);
/// The first wait after a fight is noticed.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(300);
/// The longest wait: another controller that keeps rewriting is asked
/// about at least hourly, in case it stopped.
pub const BACKOFF_MAX: Duration = Duration::from_secs(3600);

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Everything is as wanted.
    Wired,
    /// These objects (e.g. `kube-system/coredns Corefile`) differ from
    /// the wiring.
    Drift(Vec<String>),
    /// The cluster DNS cannot be wired this way: why, and the fix.
    Unwireable(String),
}

/// What to do about one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the wiring is in place.
    Ok,
    /// Write the wiring; `repair`: it was there before, so someone removed
    /// or rewrote it (counted against the fight limit).
    Write {
        /// A rewrite being repaired, not the first wiring.
        repair: bool,
    },
    /// `report` mode: say what changed, write nothing.
    Report,
    /// Another controller keeps rewriting these objects: write nothing
    /// until `until`.
    BackOff {
        /// The objects fought over.
        objects: Vec<String>,
        /// When one more repair is tried.
        until: Instant,
        /// True on the check that decided it (say it once, loudly).
        new: bool,
    },
    /// The cluster DNS cannot be changed this way: report why and the fix.
    Unwireable(String),
}

/// One object's recent repairs and backoff.
#[derive(Debug, Default)]
struct Fight {
    repairs: Vec<Instant>,
    /// Backoffs so far in this fight; 0: no fight.
    step: u32,
    until: Option<Instant>,
    /// The backoff ran out: one repair is allowed before deciding again.
    retry: bool,
    /// When a repair was last made or a backoff last ended.
    last: Option<Instant>,
}

impl Fight {
    /// Forgets what is older than the window; a quiet window since the
    /// last repair or backoff ends the fight.
    fn age(&mut self, now: Instant) {
        self.repairs.retain(|t| now.duration_since(*t) < WINDOW);
        if let Some(u) = self.until.filter(|u| now >= *u) {
            self.until = None;
            self.retry = true;
            self.last = Some(u);
        }
        if self.until.is_none() && self.last.is_none_or(|l| now.duration_since(l) >= WINDOW) {
            self.step = 0;
            self.retry = false;
        }
    }

    /// A rewrite at `now`: repair it (`None`), or wait until the time
    /// returned (with true when this rewrite started the wait).
    fn rewritten(&mut self, now: Instant) -> Option<(Instant, bool)> {
        if let Some(u) = self.until {
            return Some((u, false));
        }
        // In a fight, the one repair after a backoff is the only one.
        let fighting = if self.step > 0 { !self.retry } else { self.repairs.len() >= MAX_REPAIRS };
        if fighting {
            // No jitter: one watcher per cluster, and the tests pin the schedule.
            const FIGHTS: Backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX, Jitter::None);
            let wait = FIGHTS.after(self.step.saturating_add(1));
            self.step += 1;
            let until = now + wait;
            self.until = Some(until);
            return Some((until, true));
        }
        None
    }

    fn repaired(&mut self, now: Instant) {
        self.retry = false;
        self.repairs.push(now);
        self.last = Some(now);
    }
}

/// The watcher's memory across checks.
#[derive(Debug)]
pub struct Repairs {
    mode: Mode,
    /// The wiring was seen in place (or written) once: changes since are
    /// rewrites.
    wired_once: bool,
    fights: BTreeMap<String, Fight>,
}

impl Repairs {
    /// A watcher that has seen nothing yet.
    pub fn new(mode: Mode) -> Self {
        Self { mode, wired_once: false, fights: BTreeMap::new() }
    }

    /// Decides what to do about `found` at `now`.
    pub fn decide(&mut self, found: &Found, now: Instant) -> Action {
        for fight in self.fights.values_mut() {
            fight.age(now);
        }
        let objects = match found {
            Found::Wired => {
                self.wired_once = true;
                return Action::Ok;
            }
            Found::Unwireable(why) => return Action::Unwireable(why.clone()),
            Found::Drift(objects) => objects,
        };
        if self.mode == Mode::Report {
            return Action::Report;
        }
        if !self.wired_once {
            return Action::Write { repair: false };
        }
        let mut wait: Option<(Instant, bool)> = None;
        for o in objects {
            if let Some((until, new)) = self.fights.entry(o.clone()).or_default().rewritten(now) {
                wait = Some(wait.map_or((until, new), |(u, n)| (u.max(until), n || new)));
            }
        }
        if let Some((until, new)) = wait {
            return Action::BackOff { objects: objects.clone(), until, new };
        }
        for o in objects {
            self.fights.entry(o.clone()).or_default().repaired(now);
        }
        Action::Write { repair: true }
    }

    /// The first wiring was written (by this check): later changes are
    /// rewrites.
    pub fn written(&mut self) {
        self.wired_once = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift() -> Found {
        Found::Drift(vec!["kube-system/coredns Corefile".into()])
    }

    #[test]
    fn the_first_wiring_is_written_and_is_not_a_repair() {
        let mut w = Repairs::new(Mode::Reapply);
        let t = Instant::now();
        assert_eq!(w.decide(&drift(), t), Action::Write { repair: false });
        w.written();
        assert_eq!(w.decide(&Found::Wired, t), Action::Ok);
        assert_eq!(w.decide(&drift(), t), Action::Write { repair: true });
    }

    #[test]
    fn report_mode_never_writes_even_the_first_wiring() {
        let mut w = Repairs::new(Mode::Report);
        let t = Instant::now();
        assert_eq!(w.decide(&drift(), t), Action::Report);
        assert_eq!(w.decide(&Found::Wired, t), Action::Ok);
        for _ in 0..5 {
            assert_eq!(w.decide(&drift(), t), Action::Report);
        }
    }

    #[test]
    fn a_layout_it_cannot_wire_is_reported_in_either_mode() {
        for mode in [Mode::Reapply, Mode::Report] {
            let mut w = Repairs::new(mode);
            let a = w.decide(&Found::Unwireable("no layout; add the block".into()), Instant::now());
            assert_eq!(a, Action::Unwireable("no layout; add the block".into()));
        }
    }

    #[test]
    fn a_fourth_rewrite_within_ten_minutes_backs_off_then_retries_once_and_doubles() {
        let mut w = Repairs::new(Mode::Reapply);
        let t0 = Instant::now();
        assert_eq!(w.decide(&Found::Wired, t0), Action::Ok);
        // Issue 31: "backs off and reports after 3 rewrites in 10 min".
        for i in 0..3 {
            assert_eq!(w.decide(&drift(), t0 + Duration::from_secs(i)), Action::Write { repair: true });
        }
        let t = t0 + Duration::from_secs(10);
        let Action::BackOff { until, new: true, objects } = w.decide(&drift(), t) else { panic!() };
        assert_eq!(until, t + BACKOFF_FIRST);
        assert_eq!(objects, ["kube-system/coredns Corefile"]);
        // Meanwhile: still backing off, said once.
        let again = w.decide(&drift(), t + Duration::from_secs(60));
        assert!(matches!(again, Action::BackOff { new: false, .. }), "{again:?}");
        // Once it ran out: one more repair...
        assert_eq!(w.decide(&drift(), until), Action::Write { repair: true });
        // ...rewritten again within the window: twice as long.
        let t2 = until + Duration::from_secs(1);
        let Action::BackOff { until: u2, new: true, .. } = w.decide(&drift(), t2) else { panic!() };
        assert_eq!(u2, t2 + 2 * BACKOFF_FIRST);
    }

    #[test]
    fn rewrites_spread_over_more_than_ten_minutes_are_all_repaired() {
        let mut w = Repairs::new(Mode::Reapply);
        let t0 = Instant::now();
        w.decide(&Found::Wired, t0);
        for i in 0..10u32 {
            let t = t0 + WINDOW / 2 * i;
            assert_eq!(w.decide(&drift(), t), Action::Write { repair: true }, "rewrite {i}");
        }
    }

    #[test]
    fn the_backoff_never_exceeds_an_hour() {
        let mut w = Repairs::new(Mode::Reapply);
        let mut t = Instant::now();
        w.decide(&Found::Wired, t);
        let mut longest = Duration::ZERO;
        for _ in 0..40 {
            t += Duration::from_secs(1);
            match w.decide(&drift(), t) {
                Action::BackOff { until, new: true, .. } => {
                    longest = longest.max(until - t);
                    t = until;
                }
                Action::Write { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(longest, BACKOFF_MAX);
    }

    #[test]
    fn a_quiet_window_after_a_fight_starts_the_count_over() {
        let mut w = Repairs::new(Mode::Reapply);
        let t0 = Instant::now();
        w.decide(&Found::Wired, t0);
        for i in 0..=MAX_REPAIRS as u64 {
            w.decide(&drift(), t0 + Duration::from_secs(i));
        }
        let Action::BackOff { until, .. } = w.decide(&drift(), t0 + Duration::from_secs(9)) else { panic!() };
        assert_eq!(w.decide(&drift(), until), Action::Write { repair: true }, "the retry");
        let quiet = until + WINDOW;
        assert_eq!(w.decide(&Found::Wired, quiet), Action::Ok);
        for i in 0..MAX_REPAIRS as u64 {
            let a = w.decide(&drift(), quiet + Duration::from_secs(i));
            assert_eq!(a, Action::Write { repair: true }, "repair {i} of a new fight");
        }
        let Action::BackOff { until: u, .. } = w.decide(&drift(), quiet + Duration::from_secs(5)) else {
            panic!()
        };
        assert_eq!(u, quiet + Duration::from_secs(5) + BACKOFF_FIRST, "the first wait again");
    }
}
