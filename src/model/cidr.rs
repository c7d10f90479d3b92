//! [`Cidr`]: an IP network as the operator writes it (`10.0.0.0/8`,
//! `2001:db8::/32`, a bare address for one host), on the `ipnet` crate. The
//! one type for every network the server is told about or counts by, with
//! one rule for host bits.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// An IP network, `addr/prefix`: the networks of `--allow-debug`,
/// `--allow-transfer`, `--trust-ecs-from`, `--rrl-exempt` and
/// `--client-cluster`, and the client
/// networks Response Rate Limiting counts by ([`Cidr::network_of`]).
///
/// **Host bits are refused.** [`Cidr::parse`] takes `ADDR/PREFIX`, or a bare
/// address as one host (`/32`, `/128`), and fails when the address has bits
/// set past the prefix (`10.1.2.3/16`), naming the network it would have
/// been (`10.1.0.0/16`). Truncating instead would read a typo (`/16` for
/// `/32`) as a network 65,536 times wider, which on the access flags lets
/// in clients nobody meant to; the error says the one edit that fixes the
/// value. So every `Cidr` holds its network address, and two equal
/// networks compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr(IpNet);

/// Why a text is not a network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The part before `/` is no IPv4 or IPv6 address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The part after `/` is no prefix length of the address's family.
    #[error("prefix {prefix:?} is not 0-{max}")]
    Prefix {
        /// The prefix as written.
        prefix: String,
        /// The family's longest prefix (32 or 128).
        max: u8,
    },
    /// Bits are set past the prefix. The message leaves the value to the
    /// caller, who names it with its flag.
    #[error("bits are set past the /{prefix} (did you mean {0}?)", prefix = .0.prefix_len())]
    HostBits(
        /// The network it would have been: the value with those bits cleared.
        Cidr,
    ),
}

impl Cidr {
    /// Parses `198.51.100.0/24` or `2001:db8::/32`; a bare address is one
    /// host. Bits past the prefix must be zero (see [`Cidr`]).
    pub fn parse(s: &str) -> Result<Self, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| CidrError::Address(addr.to_owned()))?;
        let Some(prefix) = prefix else {
            return Ok(Self::host(ip));
        };
        let max = max_prefix(ip);
        let net = prefix
            .parse::<u8>()
            .ok()
            .and_then(|p| IpNet::new(ip, p).ok())
            .ok_or_else(|| CidrError::Prefix { prefix: prefix.to_owned(), max })?;
        let network = net.trunc();
        if network != net {
            return Err(CidrError::HostBits(Self(network)));
        }
        Ok(Self(net))
    }

    /// The one host `ip` (`/32` or `/128`).
    pub fn host(ip: IpAddr) -> Self {
        Self(IpNet::from(ip))
    }

    /// The network of the first `prefix` bits of `ip` (at most the family's
    /// length): the address with every later bit cleared. Not a parse, so
    /// no host-bit rule: this is how a client address is grouped into its
    /// network (RRL's /24 and /56), once per query, with no allocation.
    pub fn network_of(ip: IpAddr, prefix: u8) -> Self {
        match IpNet::new(ip, prefix.min(max_prefix(ip))) {
            Ok(net) => Self(net.trunc()),
            // Unreachable: the prefix was clamped to the family's length.
            Err(_) => Self::host(ip),
        }
    }

    /// True when `ip` is inside. An address of the other family never is
    /// (an IPv4-mapped IPv6 address is IPv6 here). No allocation: the read
    /// path asks this per query.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }

    /// The rule of an access list (`--allow-debug`, `--allow-transfer`,
    /// `--trust-ecs-from`):
    /// `ip` is in one of `nets`, an IPv4 client of a dual-stack socket
    /// (`::ffff:a.b.c.d`) matched as the IPv4 address it is, or a
    /// loopback-only default would refuse 127.0.0.1 seen through `[::]`.
    pub fn allows(nets: &[Self], ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        nets.iter().any(|c| c.contains(ip))
    }

    /// The network address (host bits zero).
    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }
}

/// The longest prefix of `ip`'s family.
fn max_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        Self::parse(s)
    }
}

impl fmt::Display for Cidr {
    /// Always `addr/prefix`, also for one host: what the operator would write.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn net(s: &str) -> Cidr {
        Cidr::parse(s).expect("cidr")
    }

    #[test]
    fn an_address_with_host_bits_is_refused_naming_its_network() {
        let e = Cidr::parse("10.1.2.3/16").expect_err("host bits");
        assert_eq!(e, CidrError::HostBits(net("10.1.0.0/16")));
        assert_eq!(e.to_string(), "bits are set past the /16 (did you mean 10.1.0.0/16?)");
        let e = Cidr::parse("fd00::1/64").expect_err("host bits");
        assert!(e.to_string().contains("did you mean fd00::/64?"), "{e}");
        assert!(
            Cidr::parse("0.0.0.1/0").expect_err("/0 has no network bits").to_string().contains("0.0.0.0/0")
        );
    }

    #[test]
    fn a_bare_address_is_one_host() {
        assert_eq!(net("192.0.2.7"), net("192.0.2.7/32"));
        assert_eq!(net("::1"), net("::1/128"));
        assert_eq!(net("::1").prefix_len(), 128);
        assert_eq!(net("192.0.2.7").to_string(), "192.0.2.7/32");
    }

    #[test]
    fn bad_addresses_and_prefixes_are_named() {
        assert_eq!(Cidr::parse("nope/8"), Err(CidrError::Address("nope".into())));
        assert_eq!(Cidr::parse("10.0.0.0/33"), Err(CidrError::Prefix { prefix: "33".into(), max: 32 }));
        assert_eq!(Cidr::parse("::/129"), Err(CidrError::Prefix { prefix: "129".into(), max: 128 }));
        assert_eq!(Cidr::parse("10.0.0.0/"), Err(CidrError::Prefix { prefix: String::new(), max: 32 }));
        assert_eq!(Cidr::parse("10.0.0.0/-1"), Err(CidrError::Prefix { prefix: "-1".into(), max: 32 }));
        assert_eq!(Cidr::parse("10.0.0.0/8/8"), Err(CidrError::Prefix { prefix: "8/8".into(), max: 32 }));
    }

    #[test]
    fn ipv4_networks_hold_their_addresses_and_no_others() {
        let c = net("10.1.0.0/16");
        assert!(c.contains(ip("10.1.0.0")) && c.contains(ip("10.1.200.3")) && c.contains(ip("10.1.255.255")));
        assert!(!c.contains(ip("10.2.0.1")) && !c.contains(ip("10.0.255.255")));
        assert!(!c.contains(ip("::1")) && !c.contains(ip("::ffff:10.1.0.1")), "IPv6 is another family");
        // A prefix inside a byte (the old `prefix_eq` boundaries): 10.160.0.0/12.
        let c = net("10.160.0.0/12");
        assert!(c.contains(ip("10.175.9.9")) && !c.contains(ip("10.176.9.9")));
    }

    #[test]
    fn ipv6_networks_hold_their_addresses_and_no_others() {
        let c = net("2001:db8::/32");
        assert!(c.contains(ip("2001:db8::1")) && c.contains(ip("2001:db8:ffff::1")));
        assert!(!c.contains(ip("2001:db9::1")) && !c.contains(ip("10.0.0.1")));
        assert_eq!(c.addr(), ip("2001:db8::"));
        assert_eq!(c.prefix_len(), 32);
    }

    #[test]
    fn slash_zero_holds_its_whole_family_and_a_host_only_itself() {
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")) && net("0.0.0.0/0").contains(ip("99.0.0.0")));
        assert!(!net("0.0.0.0/0").contains(ip("::1")));
        assert!(net("::/0").contains(ip("2001:db8::1")) && !net("::/0").contains(ip("10.0.0.1")));
        assert!(net("10.0.0.1/32").contains(ip("10.0.0.1")) && !net("10.0.0.1/32").contains(ip("10.0.0.2")));
        assert!(net("fd00::1/128").contains(ip("fd00::1")) && !net("fd00::1/128").contains(ip("fd00::2")));
    }

    #[test]
    fn a_client_address_is_grouped_into_its_network() {
        assert_eq!(Cidr::network_of(ip("198.51.100.7"), 24), net("198.51.100.0/24"));
        assert_eq!(Cidr::network_of(ip("2001:db8:0:1::1"), 56), net("2001:db8::/56"));
        assert_eq!(Cidr::network_of(ip("198.51.100.7"), 0), net("0.0.0.0/0"));
        assert_eq!(Cidr::network_of(ip("198.51.100.7"), 32), net("198.51.100.7/32"));
        assert_eq!(Cidr::network_of(ip("198.51.100.7"), 56), net("198.51.100.7/32"), "clamped to the family");
        assert_eq!(Cidr::network_of(ip("fd00::1"), 200), net("fd00::1/128"));
    }
}
