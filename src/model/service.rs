//! Services and endpoints as the DNS sees them.

use std::net::IpAddr;
use std::sync::Arc;

use super::{ClusterId, DnsLabel, Overrides, SliceOrigin};

/// A service across the clusterset: `<name>.<namespace>.svc.<zone>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The namespace (the same in every cluster: namespace sameness).
    pub namespace: DnsLabel,
    /// The service (and ServiceImport) name.
    pub name: DnsLabel,
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An EndpointSlice's identity: namespace and object name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceKey {
    /// The namespace (that of the service it belongs to).
    pub namespace: String,
    /// The EndpointSlice's object name.
    pub name: String,
}

impl std::fmt::Display for SliceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `ServiceImport.spec.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportType {
    /// Answers are the clusterset VIPs in `spec.ips`.
    ClusterSetIp,
    /// Answers are the ready endpoints of every cluster.
    Headless,
}

/// A port's transport protocol; the SRV name uses it lower-cased (`_tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (also when the object omits the protocol).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Reads the API value in any letter case (`TCP`, `udp`); unset or empty
    /// means TCP, the Service API's default.
    pub fn from_api(value: Option<&str>) -> Option<Self> {
        match value.map(str::to_ascii_uppercase).as_deref() {
            None | Some("") | Some("TCP") => Some(Self::Tcp),
            Some("UDP") => Some(Self::Udp),
            Some("SCTP") => Some(Self::Sctp),
            Some(_) => None,
        }
    }

    /// The SRV label without its underscore: `tcp`, `udp`, `sctp`.
    pub fn srv_label(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// A service or endpoint port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port {
    /// The port name; unnamed ports get no `_<port>._<proto>` SRV name.
    pub name: Option<DnsLabel>,
    /// The protocol.
    pub protocol: Protocol,
    /// The port number.
    pub port: u16,
}

/// A ServiceImport: what every cluster sees of an exported service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceImport {
    /// Which service.
    pub key: ServiceKey,
    /// ClusterSetIP or Headless.
    pub kind: ImportType,
    /// The clusterset VIPs (at most one per family): nearly always one, kept
    /// inline, so an import needs no heap block for its VIP.
    pub ips: Addresses,
    /// The merged ports, shared by the store between every import and slice
    /// with equal ports, so 100,000 imports with the same ports hold one list.
    pub ports: Arc<[Port]>,
    /// What its `clusterset-dns.io/…` annotations (and
    /// `spec.trafficDistribution`) change about its answers.
    pub answers: Overrides,
}

/// The IP family of an EndpointSlice (`addressType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    /// IPv4: A records.
    V4,
    /// IPv6: AAAA records.
    V6,
}

/// An endpoint's addresses, or an import's VIPs, in the order given.
///
/// Nearly always exactly one: the EndpointSlice API lets consumers use only
/// the first, and an import has at most one VIP per family, most only one.
/// One is kept inline, so the 400,000 endpoints and 100,000 imports of a
/// 100,000-service fleet cost no allocation each (a `Vec` of one address is
/// a 32-byte heap block beside its 24 bytes; see docs/benchmarks-history.md,
/// "Where the bytes go, by structure").
#[derive(Clone, PartialEq, Eq)]
pub struct Addresses(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One(IpAddr),
    /// None, or two and more.
    Other(Box<[IpAddr]>),
}

impl Addresses {
    /// The addresses as a slice.
    pub fn as_slice(&self) -> &[IpAddr] {
        match &self.0 {
            Repr::One(ip) => std::slice::from_ref(ip),
            Repr::Other(all) => all,
        }
    }
}

/// No address (no allocation).
impl Default for Addresses {
    fn default() -> Self {
        Self(Repr::Other(Box::default()))
    }
}

impl std::ops::Deref for Addresses {
    type Target = [IpAddr];

    fn deref(&self) -> &[IpAddr] {
        self.as_slice()
    }
}

impl From<Vec<IpAddr>> for Addresses {
    fn from(all: Vec<IpAddr>) -> Self {
        match all[..] {
            [one] => Self(Repr::One(one)),
            _ => Self(Repr::Other(all.into())),
        }
    }
}

impl From<&[IpAddr]> for Addresses {
    fn from(all: &[IpAddr]) -> Self {
        match all {
            [one] => Self(Repr::One(*one)),
            _ => Self(Repr::Other(all.into())),
        }
    }
}

impl std::fmt::Debug for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// One endpoint of an EndpointSlice.
///
/// Its `hostname`, `zone` and `targetRef` are kept in one string (with two
/// lengths), not three: a fleet holds hundreds of thousands of endpoints,
/// most with none of the three or with a zone and a targetRef only, and
/// three `Option<Box<str>>` were 48 bytes each and a heap block per value
/// present (docs/benchmarks-history.md, "Packed endpoints, addresses read
/// from records, a slimmer index and reverse map"). Read them with
/// [`Endpoint::hostname`], [`Endpoint::zone`] and [`Endpoint::target`].
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its addresses (all of the slice's family).
    pub addresses: Addresses,
    /// `conditions.ready`; unset counts as ready.
    pub ready: bool,
    /// The hostname, the zone and the target, one after the other; `None`
    /// when all three are absent or empty.
    names: Option<Box<str>>,
    /// Length of the hostname in `names` (a DNS label: at most 63 bytes).
    hostname_len: u8,
    /// Length of the zone in `names`.
    zone_len: u32,
    /// Which of the three are present ([`HOSTNAME`], [`ZONE`], [`TARGET`]):
    /// a present empty zone is not an absent one.
    present: u8,
}

/// [`Endpoint::present`] bits.
const HOSTNAME: u8 = 1;
const ZONE: u8 = 2;
const TARGET: u8 = 4;

impl Endpoint {
    /// An endpoint with these addresses and readiness, no hostname, zone or
    /// target.
    pub fn new(addresses: Addresses, ready: bool) -> Self {
        Self { addresses, ready, names: None, hostname_len: 0, zone_len: 0, present: 0 }
    }

    /// The same endpoint with this `hostname`, `zone` and `targetRef`
    /// (`kind/namespace/name`).
    ///
    /// A zone of 4 GiB or more is left out: no API object or objects file
    /// this server can read holds one.
    pub fn with_names(
        mut self,
        hostname: Option<&DnsLabel>,
        zone: Option<&str>,
        target: Option<&str>,
    ) -> Self {
        let zone = zone.filter(|z| u32::try_from(z.len()).is_ok());
        let hostname = hostname.map(DnsLabel::as_str);
        // Sized exactly: no second block when it is boxed.
        let mut text =
            String::with_capacity([hostname, zone, target].iter().flatten().map(|p| p.len()).sum());
        self.present = 0;
        for (bit, part) in [(HOSTNAME, hostname), (ZONE, zone), (TARGET, target)] {
            if let Some(part) = part {
                self.present |= bit;
                text.push_str(part);
            }
        }
        // A DNS label is at most 63 bytes; the zone's length was checked.
        self.hostname_len = hostname.map_or(0, |h| h.len().min(usize::from(u8::MAX)) as u8);
        self.zone_len = zone.map_or(0, |z| z.len() as u32);
        self.names = (!text.is_empty()).then(|| text.into_boxed_str());
        self
    }

    /// The part of `names` from `start`, `len` bytes long, if `bit` is present.
    fn part(&self, bit: u8, start: usize, len: usize) -> Option<&str> {
        if self.present & bit == 0 {
            return None;
        }
        Some(self.names.as_deref().and_then(|n| n.get(start..start + len)).unwrap_or(""))
    }

    /// `hostname`, which names it as `<hostname>.<clusterid>.<svc>…`.
    pub fn hostname(&self) -> Option<&str> {
        self.part(HOSTNAME, 0, usize::from(self.hostname_len))
    }

    /// `zone`, for locality-aware answers.
    pub fn zone(&self) -> Option<&str> {
        self.part(ZONE, usize::from(self.hostname_len), self.zone_len as usize)
    }

    /// `targetRef` as `kind/namespace/name`: the same Pod's endpoints in the
    /// IPv4 and the IPv6 slice share it, which pairs their A and AAAA answers.
    pub fn target(&self) -> Option<&str> {
        let start = usize::from(self.hostname_len) + self.zone_len as usize;
        let len = self.names.as_deref().map_or(0, str::len).saturating_sub(start);
        self.part(TARGET, start, len)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addresses", &self.addresses)
            .field("hostname", &self.hostname())
            .field("ready", &self.ready)
            .field("zone", &self.zone())
            .field("target", &self.target())
            .finish()
    }
}

/// The content of one MCS EndpointSlice: one cluster's endpoints of one
/// service, in one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSet {
    /// The slice's identity.
    pub slice: SliceKey,
    /// The service it belongs to (label `multicluster.kubernetes.io/service-name`,
    /// or the fleet manager's equivalent).
    pub service: ServiceKey,
    /// The cluster the endpoints run in (label `multicluster.kubernetes.io/source-cluster`,
    /// or where the fleet manager records it).
    pub cluster: ClusterId,
    /// IPv4 or IPv6.
    pub family: AddressFamily,
    /// The slice's ports (SRV answers use these numbers).
    pub ports: Vec<Port>,
    /// The endpoints.
    pub endpoints: Vec<Endpoint>,
    /// Who wrote the slice: MCS, or a fleet manager read with `--interop`.
    pub origin: SliceOrigin,
    /// When the change it carries began (its
    /// `endpoints.kubernetes.io/last-change-trigger-time`): what `serve`
    /// measures the time to answer it from. Not part of what is answered.
    pub trigger: super::ChangeTrigger,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_keep_every_address_in_order() {
        let v4: IpAddr = "10.0.0.1".parse().expect("ip");
        let v6: IpAddr = "fd00::1".parse().expect("ip");
        for all in [vec![], vec![v4], vec![v4, v6], vec![v6, v4, v6]] {
            let a = Addresses::from(all.clone());
            assert_eq!((a.as_slice(), a.len(), a.is_empty()), (&all[..], all.len(), all.is_empty()));
            assert_eq!(Addresses::from(&all[..]), a);
        }
        // One address needs no heap block: the type is no larger than a `Vec`.
        assert!(std::mem::size_of::<Addresses>() <= std::mem::size_of::<Vec<IpAddr>>());
    }

    #[test]
    fn an_import_keeps_its_vip_inline_and_shares_its_ports() {
        let vip: IpAddr = "10.0.0.1".parse().expect("ip");
        let http = Port { name: DnsLabel::parse("http").ok(), protocol: Protocol::Tcp, port: 80 };
        let import = ServiceImport {
            key: ServiceKey {
                namespace: DnsLabel::parse("shop").expect("label"),
                name: DnsLabel::parse("web").expect("label"),
            },
            kind: ImportType::ClusterSetIp,
            ips: vec![vip].into(),
            ports: vec![http].into(),
            answers: Overrides::default(),
        };
        // The one VIP lies inside the import itself: no heap block for it.
        let start = std::ptr::from_ref(&import) as usize;
        let inside = start..start + std::mem::size_of::<ServiceImport>();
        assert!(inside.contains(&(import.ips.as_ptr() as usize)), "the VIP is on the heap");
        assert_eq!(&import.ips[..], &[vip]);
        // A clone (resolving a backed import makes one) copies no port list.
        assert!(Arc::ptr_eq(&import.ports, &import.clone().ports));
        // 88 bytes: the two labels 32, the inline VIP 24, the port list 16, the
        // overrides 8, the kind 1 and padding. With a `Vec` each for the VIPs
        // and the ports it was 96 and two heap blocks more per import; a
        // fleet holds 100,000 imports (docs/benchmarks-history.md, "Slices
        // filed under their service, one port list for all").
        let size = std::mem::size_of::<ServiceImport>();
        assert!(size <= 88, "ServiceImport grew to {size} bytes");
    }

    #[test]
    fn an_endpoint_keeps_each_of_hostname_zone_and_target_apart() {
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        let host = DnsLabel::parse("db-0").expect("label");
        let (h, z, t) = (Some(&host), Some("eu-1a"), Some("Pod/shop/db-0"));
        // Every combination, and an empty zone, which is not an absent one.
        for hostname in [None, h] {
            for zone in [None, Some(""), z] {
                for target in [None, t] {
                    let e = Endpoint::new(vec![ip].into(), true).with_names(hostname, zone, target);
                    let got = (e.hostname(), e.zone(), e.target());
                    assert_eq!(got, (hostname.map(DnsLabel::as_str), zone, target), "{e:?}");
                    let again = Endpoint::new(vec![ip].into(), true).with_names(hostname, zone, target);
                    assert_eq!(e, again);
                }
            }
        }
        let plain = Endpoint::new(vec![ip].into(), true);
        assert_ne!(plain, plain.clone().with_names(None, Some(""), None));
        assert_ne!(
            plain.clone().with_names(None, Some("ab"), None),
            plain.clone().with_names(None, None, Some("ab")),
            "the same text as zone or as target"
        );
        // Three optional strings cost 16 bytes inline, not 48 (see the type's docs).
        assert!(std::mem::size_of::<Endpoint>() <= 48, "{}", std::mem::size_of::<Endpoint>());
    }
}
