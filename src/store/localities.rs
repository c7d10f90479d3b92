//! Who asks: client networks (CIDR → cluster and zone) and regions,
//! interned once from the [`AnswerConfig`] so that the read path matches
//! prefixes and compares small integers, never strings.

use std::net::IpAddr;

use super::answer_config::AnswerConfig;
use super::intern::{Interner, intern};
use crate::model::{Cidr, ClusterId};

/// Client networks and localities, interned once: the read path compares
/// small integers, never strings.
#[derive(Debug)]
pub struct Localities {
    /// Interned clusters: the index is the id. Those of the configuration
    /// come first; the writer adds the clusters its slices name.
    pub(crate) clusters: Vec<ClusterId>,
    /// Interned zones, the same way.
    pub(crate) zones: Vec<String>,
    /// Region id of each configured cluster.
    pub(crate) regions: Vec<(u16, u16)>,
    /// Names of the regions.
    pub(crate) region_names: Vec<String>,
    nets: Vec<Net>,
    default_cluster: Option<u16>,
}

#[derive(Debug)]
struct Net {
    net: Cidr,
    cluster: u16,
    zone: Option<u16>,
}

/// Who asks, as far as the policies care.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Client {
    /// Interned cluster id.
    pub cluster: Option<u16>,
    /// Interned zone id.
    pub zone: Option<u16>,
    /// Region id.
    pub region: Option<u16>,
    /// Prefix length of the network that identified the client (the ECS
    /// scope of an answer that depends on it); 0 when none did.
    pub prefix: u8,
}

/// The address of `bytes`, the leading bytes of an IPv4 (`v6` false) or
/// IPv6 address, the rest zero: an EDNS Client Subnet carries only the
/// bytes its prefix covers.
fn address(bytes: &[u8], v6: bool) -> IpAddr {
    fn padded<const N: usize>(bytes: &[u8]) -> [u8; N] {
        let mut b = [0; N];
        let n = bytes.len().min(N);
        b[..n].copy_from_slice(&bytes[..n]);
        b
    }
    if v6 { IpAddr::from(padded::<16>(bytes)) } else { IpAddr::from(padded::<4>(bytes)) }
}

impl Localities {
    pub(crate) fn new(cfg: &AnswerConfig) -> Self {
        let mut l = Self {
            clusters: Vec::new(),
            zones: Vec::new(),
            regions: Vec::new(),
            region_names: Vec::new(),
            nets: Vec::new(),
            default_cluster: None,
        };
        for n in &cfg.clients {
            let cluster = intern(&mut l.clusters, &n.cluster);
            let zone = n.zone.as_ref().map(|z| intern(&mut l.zones, z));
            l.nets.push(Net { net: n.net, cluster, zone });
        }
        // Most specific first: the first match is the longest prefix.
        l.nets.sort_by_key(|n| std::cmp::Reverse(n.net.prefix_len()));
        for (cluster, region) in &cfg.regions {
            let c = intern(&mut l.clusters, cluster);
            let r = intern(&mut l.region_names, region);
            l.regions.push((c, r));
        }
        l.default_cluster = cfg.default_cluster.as_ref().map(|c| intern(&mut l.clusters, c));
        l
    }

    /// An interner that continues from these ids (for the writer).
    pub(crate) fn interner(&self) -> Interner {
        Interner { clusters: self.clusters.clone(), zones: self.zones.clone() }
    }

    /// The id of a cluster, when it is known here.
    pub fn cluster_id(&self, name: &str) -> Option<u16> {
        self.clusters.iter().position(|c| c.as_str() == name).map(|i| i as u16)
    }

    /// The name of an interned cluster.
    pub fn cluster_name(&self, id: u16) -> Option<&ClusterId> {
        self.clusters.get(usize::from(id))
    }

    /// The name of an interned zone.
    pub fn zone_name(&self, id: u16) -> Option<&str> {
        self.zones.get(usize::from(id)).map(String::as_str)
    }

    /// The name of an interned region.
    pub fn region_name(&self, id: u16) -> Option<&str> {
        self.region_names.get(usize::from(id)).map(String::as_str)
    }

    pub(crate) fn region_of(&self, cluster: u16) -> Option<u16> {
        self.regions.iter().find(|(c, _)| *c == cluster).map(|(_, r)| *r)
    }

    /// The client a cluster name stands for (`explain --from-cluster`).
    pub fn client_in(&self, cluster: u16) -> Client {
        Client { cluster: Some(cluster), zone: None, region: self.region_of(cluster), prefix: 0 }
    }

    /// Who sent a query: the most specific client network holding `addr`
    /// (the first `bits` bits of it: an EDNS Client Subnet's source prefix),
    /// else `--cluster-id`, else unknown. `addr` holds 4 bytes for IPv4.
    pub fn client(&self, addr: &[u8], v6: bool, bits: u8) -> Client {
        let ip = address(addr, v6);
        for n in &self.nets {
            // A network longer than what the client revealed cannot be matched.
            if n.net.prefix_len() <= bits && n.net.contains(ip) {
                return Client {
                    cluster: Some(n.cluster),
                    zone: n.zone,
                    region: self.region_of(n.cluster),
                    prefix: n.net.prefix_len(),
                };
            }
        }
        match self.default_cluster {
            Some(c) => Client { cluster: Some(c), zone: None, region: self.region_of(c), prefix: 0 },
            None => Client::default(),
        }
    }

    /// [`Localities::client`] for a socket's peer address.
    pub fn client_at(&self, addr: IpAddr) -> Client {
        match addr {
            IpAddr::V4(a) => self.client(&a.octets(), false, 32),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => self.client(&v4.octets(), false, 32),
                None => self.client(&a.octets(), true, 128),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ClientNet;

    fn cfg(nets: &[(&str, u8, &str)]) -> AnswerConfig {
        let mut c = AnswerConfig::standard();
        c.clients = nets
            .iter()
            .map(|(a, p, cl)| ClientNet {
                net: Cidr::parse(&format!("{a}/{p}")).unwrap(),
                cluster: ClusterId::parse(cl).unwrap(),
                zone: None,
            })
            .collect();
        c
    }

    #[test]
    fn the_most_specific_client_network_wins() {
        let l = Localities::new(&cfg(&[
            ("10.0.0.0", 8, "wide"),
            ("10.1.0.0", 16, "narrow"),
            ("fd00::", 16, "six"),
        ]));
        let name = |c: Client| c.cluster.and_then(|i| l.cluster_name(i)).map(|c| c.to_string());
        assert_eq!(name(l.client_at("10.1.2.3".parse().unwrap())).as_deref(), Some("narrow"));
        assert_eq!(l.client_at("10.1.2.3".parse().unwrap()).prefix, 16);
        assert_eq!(name(l.client_at("10.2.2.3".parse().unwrap())).as_deref(), Some("wide"));
        assert_eq!(name(l.client_at("fd00:1::1".parse().unwrap())).as_deref(), Some("six"));
        assert_eq!(name(l.client_at("::ffff:10.1.0.1".parse().unwrap())).as_deref(), Some("narrow"));
        assert_eq!(l.client_at("192.0.2.1".parse().unwrap()), Client::default());
        // An ECS /12 does not reveal enough to match the /16.
        assert_eq!(name(l.client(&[10, 1, 0, 0], false, 12)).as_deref(), Some("wide"));
    }

    #[test]
    fn ecs_addresses_carry_only_their_prefix_bytes() {
        let l = Localities::new(&cfg(&[("10.160.0.0", 12, "twelve"), ("2001:db8::", 32, "six")]));
        let name = |c: Client| c.cluster.and_then(|i| l.cluster_name(i)).map(|c| c.to_string());
        assert_eq!(name(l.client(&[10, 0b1010_1111], false, 16)).as_deref(), Some("twelve"));
        assert_eq!(name(l.client(&[10, 0b1011_0000], false, 16)), None);
        assert_eq!(name(l.client(&[0x20, 0x01, 0x0d, 0xb8, 0x01], true, 40)).as_deref(), Some("six"));
        assert_eq!(name(l.client(&[], false, 0)), None, "a /0 reveals nothing");
    }
}
