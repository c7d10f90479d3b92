//! Response Rate Limiting for UDP, as Knot DNS, NSD and BIND do it: each
//! client network (/24 for IPv4, /56 for IPv6 by default) gets a budget of
//! identical responses per second (the same name and type), and one budget
//! for all its errors (NXDOMAIN, REFUSED, FORMERR, …: random names share
//! it, as BIND counts NXDOMAIN per zone), so a spoofed flood cannot turn
//! this server into an amplifier aimed at its victim, while a resolver
//! asking for many different names is not held back. Over the limit a response is dropped,
//! except every `slip`-th one, which is sent truncated (TC, no records) so
//! a real client behind that network retries over TCP and is answered.
//!
//! Opt-in (`--rrl-rate`): behind CoreDNS `forward` every query comes from a
//! handful of forwarders, which a per-network limit would starve. TCP,
//! `--rrl-exempt` networks and clients with a valid DNS cookie are never
//! limited.
//!
//! The table is a fixed array of atomic words, one bucket each, found by a
//! hash of (network, class): no lock and no allocation per query. Two
//! networks that share a bucket share a budget until one takes it over;
//! that only ever limits less, never more.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::model::Cidr;

/// Settings of the limiter.
#[derive(Debug, Clone)]
pub struct RrlConfig {
    /// Responses per second per client network.
    pub rate: u32,
    /// Error responses per second per client network.
    pub errors_rate: u32,
    /// Every `slip`-th limited response is sent truncated (0: none, 1: all).
    pub slip: u32,
    /// Prefix length of an IPv4 client network.
    pub ipv4_prefix: u8,
    /// Prefix length of an IPv6 client network.
    pub ipv6_prefix: u8,
    /// Networks never limited.
    pub exempt: Vec<Cidr>,
    /// Buckets in the table.
    pub table_size: usize,
}

/// What a response counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class<'q> {
    /// NOERROR, with records or without (NODATA): counted per (lower-case
    /// wire name, type).
    Response(&'q [u8], u16),
    /// Every error code: one budget per network.
    Error,
}

/// What to do with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Within the budget: send it.
    Send,
    /// Over it: send nothing.
    Drop,
    /// Over it, but send a truncated response (or, to a client that sent a
    /// cookie, BADCOOKIE with a server cookie) so real clients get through.
    Slip,
}

/// The shared table of buckets.
#[derive(Debug)]
pub struct RateLimiter {
    cfg: RrlConfig,
    buckets: Box<[AtomicU64]>,
    epoch: Instant,
}

/// A bucket: the upper 32 bits of the key's hash (its tag), the second the
/// count is for (16 bits, wrapping), and the count (16 bits, saturating).
fn pack(tag: u32, second: u16, count: u16) -> u64 {
    (u64::from(tag) << 32) | (u64::from(second) << 16) | u64::from(count)
}

impl RateLimiter {
    /// A limiter with `cfg.table_size` buckets.
    pub fn new(cfg: RrlConfig) -> Self {
        let buckets = (0..cfg.table_size.max(1)).map(|_| AtomicU64::new(0)).collect();
        Self { cfg, buckets, epoch: Instant::now() }
    }

    /// The settings.
    pub fn config(&self) -> &RrlConfig {
        &self.cfg
    }

    /// Counts one response of `class` to `ip` now and says what to do.
    pub fn check(&self, ip: IpAddr, class: Class<'_>) -> Action {
        let second = (self.epoch.elapsed().as_secs() & 0xFFFF) as u16;
        self.check_at(ip, class, second)
    }

    /// [`RateLimiter::check`] at a given second (for tests).
    pub fn check_at(&self, ip: IpAddr, class: Class<'_>, second: u16) -> Action {
        if self.cfg.exempt.iter().any(|c| c.contains(ip)) {
            return Action::Send;
        }
        let limit = match class {
            Class::Response(..) => self.cfg.rate,
            Class::Error => self.cfg.errors_rate,
        };
        let mut h = rustc_hash::FxHasher::default();
        let prefix = if ip.is_ipv4() { self.cfg.ipv4_prefix } else { self.cfg.ipv6_prefix };
        key_of(Cidr::network_of(ip, prefix)).hash(&mut h);
        class.hash(&mut h);
        let hash = h.finish();
        let tag = (hash >> 32) as u32;
        let slot = &self.buckets[(hash as usize) % self.buckets.len()];
        let mut current = slot.load(Ordering::Relaxed);
        let count = loop {
            let (t, s, c) = ((current >> 32) as u32, (current >> 16) as u16, current as u16);
            let count = if t == tag && s == second { c.saturating_add(1) } else { 1 };
            match slot.compare_exchange_weak(
                current,
                pack(tag, second, count),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break count,
                Err(now) => current = now,
            }
        };
        let over = u32::from(count).saturating_sub(limit);
        if over == 0 {
            Action::Send
        } else if self.cfg.slip > 0 && over % self.cfg.slip == 0 {
            Action::Slip
        } else {
            Action::Drop
        }
    }
}

/// What a client network is hashed as: its family and address bits. Not
/// the `Cidr` itself: FxHash is a weak mix, and hashed as `ipnet`'s type
/// two neighbouring /56s got the same bucket and tag (one budget, so one
/// limited the other); this key is the one the table has always used.
fn key_of(net: Cidr) -> (u8, u128) {
    match net.addr() {
        IpAddr::V4(a) => (4, u128::from(u32::from(a))),
        IpAddr::V6(a) => (6, u128::from(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rate: u32, slip: u32) -> RateLimiter {
        RateLimiter::new(RrlConfig {
            rate,
            errors_rate: 2,
            slip,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
            exempt: vec![Cidr::parse("192.0.2.0/24").expect("cidr")],
            table_size: 1024,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_network_gets_its_rate_per_second_then_drops_with_every_slip_th_truncated() {
        let l = limiter(5, 2);
        let actions: Vec<Action> = (0..10)
            .map(|i| l.check_at(ip(&format!("198.51.100.{i}")), Class::Response(b"\x03web\x00", 1), 7))
            .collect();
        use Action::*;
        assert_eq!(actions, [Send, Send, Send, Send, Send, Drop, Slip, Drop, Slip, Drop], "one /24");
        assert_eq!(
            l.check_at(ip("198.51.101.1"), Class::Response(b"\x03web\x00", 1), 7),
            Send,
            "another /24"
        );
        assert_eq!(
            l.check_at(ip("198.51.100.1"), Class::Response(b"\x03web\x00", 1), 8),
            Send,
            "the next second"
        );
    }

    #[test]
    fn each_name_and_type_has_its_own_budget_and_errors_share_one() {
        let l = limiter(1, 0);
        let a = ip("198.51.100.1");
        assert_eq!(l.check_at(a, Class::Response(b"\x03web\x00", 1), 1), Action::Send);
        assert_eq!(l.check_at(a, Class::Response(b"\x03web\x00", 1), 1), Action::Drop);
        assert_eq!(l.check_at(a, Class::Response(b"\x03web\x00", 28), 1), Action::Send, "another type");
        assert_eq!(l.check_at(a, Class::Response(b"\x03api\x00", 1), 1), Action::Send, "another name");
        let e = limiter(100, 0);
        assert_eq!(e.check_at(a, Class::Error, 1), Action::Send);
        assert_eq!(e.check_at(a, Class::Error, 1), Action::Send);
        assert_eq!(e.check_at(a, Class::Error, 1), Action::Drop, "every error of the network counts");
    }

    #[test]
    fn errors_have_their_own_budget_and_exempt_networks_none() {
        let l = limiter(100, 0);
        let a = ip("203.0.113.9");
        assert_eq!(l.check_at(a, Class::Error, 1), Action::Send);
        assert_eq!(l.check_at(a, Class::Error, 1), Action::Send);
        assert_eq!(l.check_at(a, Class::Error, 1), Action::Drop, "errors: 2 a second, no slip");
        assert_eq!(
            l.check_at(a, Class::Response(b"\x03web\x00", 1), 1),
            Action::Send,
            "responses still pass"
        );
        for _ in 0..1000 {
            assert_eq!(l.check_at(ip("192.0.2.1"), Class::Error, 1), Action::Send, "exempt");
        }
    }

    #[test]
    fn exempt_ranges_parse_strictly() {
        let c = Cidr::parse("10.1.0.0/16").expect("cidr");
        assert!(c.contains(ip("10.1.200.3")) && !c.contains(ip("10.2.0.1")) && !c.contains(ip("::1")));
        assert!(Cidr::parse("::1").expect("host").contains(ip("::1")));
        assert!(Cidr::parse("10.1.0.1/16").expect_err("host bits").to_string().contains("10.1.0.0/16"));
        assert!(Cidr::parse("10.1.0.0/33").is_err());
        assert!(Cidr::parse("nope/8").is_err());
    }

    #[test]
    fn ipv6_clients_are_grouped_by_their_56() {
        let l = limiter(1, 0);
        assert_eq!(l.check_at(ip("2001:db8:0:1::1"), Class::Response(b"\x03web\x00", 1), 3), Action::Send);
        assert_eq!(
            l.check_at(ip("2001:db8:0:2::1"), Class::Response(b"\x03web\x00", 1), 3),
            Action::Drop,
            "same /56"
        );
        assert_eq!(
            l.check_at(ip("2001:db8:0:100::1"), Class::Response(b"\x03web\x00", 1), 3),
            Action::Send,
            "another /56"
        );
    }
}
