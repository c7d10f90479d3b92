//! How clap reads the values of flags: every flag's enum as a `ValueEnum`
//! (so `--help` lists them and clap refuses others), zones, the structured
//! values (`CIDR=NAME[/ZONE]`, `CLUSTER=REGION`, sizes, DNS addresses, query
//! types) and fractional seconds, each into its typed value. A value
//! refused here exits 64 with clap's `invalid value 'V' for '--flag
//! <NAME>': why`.
//!
//! The enums are those of the modules that act on them (`model`'s answer
//! policies, `k8s`'s list modes, `ops`'s memory action, …), defined once
//! there; their `ValueEnum` impls live here, since those modules know
//! nothing of the command line, and the names and help of the values are
//! the command line's.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use clap::ValueEnum;
use clap::builder::{PossibleValue, TypedValueParser};
use hickory_proto::rr::{Name, RecordType};

use crate::cluster_dns::repair::Mode as WatchMode;
use crate::controller::syncer::MemberLost;
use crate::diagnose::report::Format as ReportFormat;
use crate::k8s::protobuf::KubeEncoding;
use crate::k8s::watch::ListMode;
use crate::model::{Boundary, Cidr, ClusterId, Interop, PolicyKind};
use crate::ops::memory::OnMemoryLimit;

/// RFC 2181 §8: TTLs are at most 2^31 - 1 (`--ttl`, `--negative-ttl`).
pub const MAX_TTL: i64 = i32::MAX as i64;

/// `--shards` at most. The controller's `controller::shard::MAX_SHARDS`,
/// which the command line may not import; a config test holds them equal.
pub const MAX_SHARDS: i64 = 64;

/// `--answer-policy`, in the order `--help` lists them (the default first).
const POLICIES: [PolicyKind; 6] = [
    PolicyKind::Rotation,
    PolicyKind::Random,
    PolicyKind::Weighted,
    PolicyKind::LocalFirst,
    PolicyKind::Topology,
    PolicyKind::All,
];

impl ValueEnum for PolicyKind {
    fn value_variants<'a>() -> &'a [Self] {
        &POLICIES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Self::Rotation => "Every endpoint, the order rotated by one per query",
            Self::Random => "Every endpoint, in a random order per query",
            Self::Weighted => {
                "One cluster first, chosen per query by its weight (annotation clusterset-dns.io/cluster-weights); the others after it"
            }
            Self::LocalFirst => {
                "The client's cluster's endpoints while --local-min-healthy of them are healthy, then the rest"
            }
            Self::Topology => "The client's zone, then its region (or cluster), then any",
            Self::All => "Every endpoint in the same order (by cluster, then endpoint): no load spreading",
        };
        Some(PossibleValue::new(self.as_str()).help(help))
    }
}

/// `--fallback-boundary`, in the order `--help` lists them.
const BOUNDARIES: [Boundary; 4] = [Boundary::Zone, Boundary::Cluster, Boundary::Region, Boundary::None];

impl ValueEnum for Boundary {
    fn value_variants<'a>() -> &'a [Self] {
        &BOUNDARIES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Self::Zone => "The client's zone (--client-cluster CIDR=NAME/ZONE)",
            Self::Cluster => "The client's cluster",
            Self::Region => "The client's region (--cluster-region); its cluster when it has none",
            Self::None => "No boundary: any cluster",
        };
        Some(PossibleValue::new(self.as_str()).help(help))
    }
}

/// A flag's enum whose values are the same on the command line in every
/// case: its variants in `--help`'s order, each with its name and help.
macro_rules! flag_values {
    ($flag:literal, $ty:ty, [$(($variant:ident, $name:literal, $help:literal)),+ $(,)?]) => {
        #[doc = concat!("`", $flag, "`.")]
        impl ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$(Self::$variant),+]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(match self {
                    $(Self::$variant => PossibleValue::new($name).help($help)),+
                })
            }
        }
    };
}

flag_values!(
    "--on-memory-limit",
    OnMemoryLimit,
    [
        (
            KeepServing,
            "keep-serving",
            "Refuse the update, keep serving the last good state, list its source again once it fits"
        ),
        (Exit, "exit", "Stop the server"),
    ]
);

flag_values!(
    "--kube-encoding",
    KubeEncoding,
    [(Auto, "auto", "Protobuf, read as JSON where the API server answers JSON"), (Json, "json", "JSON only"),]
);

flag_values!(
    "--list-mode",
    ListMode,
    [
        (Auto, "auto", "Streaming lists where the API server allows them, else paged after one warning"),
        (
            Stream,
            "stream",
            "Streaming lists (KEP-3157): the objects come from the API server's watch cache as watch events. Its WatchList feature gate is on by default in Kubernetes 1.32 and from 1.34, off in 1.33"
        ),
        (Paged, "paged", "List requests of --list-page-size objects"),
    ]
);

flag_values!(
    "--on-member-lost",
    MemberLost,
    [
        (
            Keep,
            "keep",
            "Keep its endpoints everywhere, marked on the imports: a partition does not take working endpoints away"
        ),
        (
            Remove,
            "remove",
            "Remove its endpoints after --member-lost-after: a dead cluster stops getting traffic"
        ),
    ]
);

flag_values!(
    "doctor --output",
    ReportFormat,
    [(Text, "text", "For people"), (Json, "json", "For scripts: one JSON object"),]
);

flag_values!(
    "setup-dns --watch",
    WatchMode,
    [
        (Reapply, "reapply", "Write the wiring again when it was removed or rewritten"),
        (Report, "report", "Only report it (metric, Event, log); never write"),
    ]
);

/// `--interop`: a comma-separated list read by [`Interop::parse`] (any
/// letter case, blanks around names and empty entries ignored, so `""` is
/// none), whose names `--help` lists. Not a `ValueEnum` with a delimiter:
/// that would refuse the empty default and `karmada, kosmos`, both taken
/// since the flag exists.
#[derive(Debug, Clone, Copy)]
pub struct InteropList;

impl TypedValueParser for InteropList {
    type Value = Interop;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Interop, clap::Error> {
        // A function parser makes clap's own error, naming the flag and value.
        Interop::parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            [
                PossibleValue::new("karmada").help(
                    "derived-<svc> Services and their EndpointSlices, CrossCluster MultiClusterServices",
                ),
                PossibleValue::new("kosmos").help(
                    "Same-name Services and the root cluster's EndpointSlices (disconnected addresses demoted)",
                ),
            ]
            .into_iter(),
        ))
    }
}

/// `--client-cluster CIDR=NAME[/ZONE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCluster {
    /// The network, as every CIDR flag takes it ([`Cidr`]: host bits set
    /// are refused, naming the network meant).
    pub net: Cidr,
    /// The cluster its clients run in.
    pub cluster: ClusterId,
    /// Their zone, when given (an empty one is none).
    pub zone: Option<String>,
}

/// Parses `CIDR=NAME[/ZONE]`.
pub(super) fn client_cluster(v: &str) -> Result<ClientCluster, String> {
    let (cidr, who) = v.split_once('=').ok_or("not CIDR=NAME[/ZONE]")?;
    let net = Cidr::parse(cidr).map_err(|e| format!("{cidr:?}: {e}"))?;
    let (cluster, zone) = match who.split_once('/') {
        Some((c, z)) if !z.is_empty() => (c, Some(z.to_owned())),
        Some((c, _)) => (c, None),
        None => (who, None),
    };
    let cluster = ClusterId::parse(cluster).map_err(|e| format!("cluster name {e}"))?;
    Ok(ClientCluster { net, cluster, zone })
}

/// Parses `--cluster-region CLUSTER=REGION`.
pub(super) fn cluster_region(v: &str) -> Result<(ClusterId, String), String> {
    let (cluster, region) = v.split_once('=').ok_or("not CLUSTER=REGION")?;
    let cluster = ClusterId::parse(cluster).map_err(|e| format!("cluster name {e}"))?;
    if region.is_empty() {
        return Err("no region".to_owned());
    }
    Ok((cluster, region.to_owned()))
}

/// Longest zone name: room in front of it for the longest fixed name
/// below the apex (`hostmaster.`) within DNS's 255 bytes.
const MAX_ZONE_LEN: usize = 240;

/// Parses a zone (`--zone`, `--also-zone`): a domain name, fully
/// qualified and in lower case, not the root, short enough that the names
/// the server writes below its apex fit.
pub(super) fn zone(v: &str) -> Result<Name, String> {
    let mut zone =
        Name::from_ascii(v).map_err(|e| format!("{v:?} is not a domain name: {e}"))?.to_lowercase();
    zone.set_fqdn(true);
    if zone.is_root() {
        return Err("the root is not a zone clusterset-dns can serve".to_owned());
    }
    if zone.len() > MAX_ZONE_LEN {
        return Err(format!("longer than {MAX_ZONE_LEN} characters"));
    }
    Ok(zone)
}

/// `--memory-limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    /// The cgroup's limit, if any: the container's.
    Auto,
    /// No limit.
    None,
    /// This many bytes.
    Bytes(u64),
}

impl FromStr for MemoryLimit {
    type Err = String;

    /// `auto`, `none`, or a size in bytes with an optional suffix (`Ki`,
    /// `Mi`, `Gi`, `K`, `M`, `G`), as Kubernetes writes quantities; at least
    /// 16 MiB.
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "auto" => return Ok(Self::Auto),
            "none" => return Ok(Self::None),
            _ => {}
        }
        let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
        let (digits, suffix) = value.split_at(split);
        let unit: u64 = match suffix {
            "" => 1,
            "K" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            _ => {
                return Err("not a size (bytes, or a number with Ki, Mi, Gi, K, M or G), auto or none".into());
            }
        };
        let n: u64 = digits.parse().map_err(|_| "not a size")?;
        let bytes = n.checked_mul(unit).ok_or("too large")?;
        if bytes < 16 << 20 {
            return Err("less than 16Mi cannot hold the server".into());
        }
        Ok(Self::Bytes(bytes))
    }
}

/// A number of seconds in `lo..=hi`, fractions allowed (clap's ranges are
/// for integers only).
pub(super) fn seconds(
    lo: f64,
    hi: f64,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s| {
        let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
        if v.is_finite() && (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is outside {lo}-{hi} seconds"))
        }
    }
}

/// `--kube-qps`: requests per second, 0 or more (0: no limit).
pub(super) fn rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 0.0 { Ok(v) } else { Err(format!("{v} is not a rate (0 or more per second)")) }
}

/// `--otlp-endpoint`: an `http://HOST[:PORT]/PATH` URL, taken as the
/// whole address spans are posted to (OTLP/HTTP's `…/v1/traces`).
pub(super) fn otlp_endpoint(value: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = value.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https is not supported: reach the collector over plain http (in the cluster, or a sidecar)"
                    .into(),
            );
        }
        _ => return Err("not an http:// URL (e.g. http://otel-collector:4318/v1/traces)".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("names no host".into());
    }
    if uri.path() == "/" {
        return Err("names no path: OTLP/HTTP takes spans at …/v1/traces".into());
    }
    Ok(uri)
}

/// A DNS server: `IP` or `IP:PORT` (port 53 by default).
pub(super) fn dns_server(value: &str) -> Result<SocketAddr, String> {
    value
        .parse::<SocketAddr>()
        .or_else(|_| value.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| "not IP or IP:PORT".to_owned())
}

/// `doctor --dns CLUSTER=ADDR`: the member's name as given (it must be one
/// of the members, which the configuration checks) and its DNS server.
pub(super) fn member_dns(value: &str) -> Result<(String, SocketAddr), String> {
    let (member, addr) = value.split_once('=').ok_or("not CLUSTER=ADDR")?;
    let addr = dns_server(addr).map_err(|e| format!("{addr:?}: {e}"))?;
    Ok((member.to_owned(), addr))
}

/// `explain --type`: a DNS type's name in any letter case, as the server's
/// `/debug/explain` reads it.
pub(super) fn qtype(value: &str) -> Result<RecordType, String> {
    RecordType::from_str(&value.to_ascii_uppercase()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_otlp_endpoint_is_a_plain_http_url_with_a_path() {
        let ok = otlp_endpoint("http://otel-collector.monitoring:4318/v1/traces").unwrap();
        assert_eq!(
            (ok.host(), ok.port_u16(), ok.path()),
            (Some("otel-collector.monitoring"), Some(4318), "/v1/traces")
        );
        for (bad, says) in [
            ("https://collector:4318/v1/traces", "https is not supported"),
            ("collector:4318", "not an http:// URL"),
            ("http://collector:4318", "names no path"),
            ("http:///v1/traces", "not a URL"),
            ("http://a b/v1/traces", "not a URL"),
        ] {
            let e = otlp_endpoint(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn every_policy_and_boundary_is_listed_under_its_model_name() {
        for p in PolicyKind::ALL {
            assert!(POLICIES.contains(&p), "{p} is not listed");
            assert_eq!(<PolicyKind as ValueEnum>::from_str(p.as_str(), false), Ok(p));
        }
        for b in Boundary::ALL {
            assert!(BOUNDARIES.contains(&b), "{b} is not listed");
            assert_eq!(<Boundary as ValueEnum>::from_str(b.as_str(), false), Ok(b));
        }
        assert_eq!(POLICIES[0], PolicyKind::Rotation, "the default first");
    }

    #[test]
    fn interop_lists_are_read_as_before_and_their_names_listed() {
        let names: Vec<String> =
            InteropList.possible_values().into_iter().flatten().map(|v| v.get_name().to_owned()).collect();
        assert_eq!(names, ["karmada", "kosmos"]);
        for name in &names {
            assert!(Interop::parse(name).is_ok_and(|i| i.any()), "{name}");
        }
    }

    #[test]
    fn client_clusters_and_regions_split_as_written() {
        let c = client_cluster("10.1.0.0/16=cluster-a/zone-1").unwrap();
        assert_eq!(
            (c.net.prefix_len(), c.cluster.as_str(), c.zone.as_deref()),
            (16, "cluster-a", Some("zone-1"))
        );
        assert_eq!(client_cluster("fd00::/64=b/").unwrap().zone, None, "an empty zone is none");
        assert_eq!(client_cluster("10.0.0.0/8").unwrap_err(), "not CIDR=NAME[/ZONE]");
        let e = client_cluster("10.1.2.3/16=a").unwrap_err();
        assert!(e.contains("did you mean 10.1.0.0/16?"), "{e}");
        let e = client_cluster("10.0.0.0/8=Bad_Name").unwrap_err();
        assert_eq!(e, "cluster name \"Bad_Name\" has a character other than letters, digits and '-'");
        let (cluster, region) = cluster_region("East=eu-1").unwrap();
        assert_eq!((cluster.as_str(), region.as_str()), ("east", "eu-1"));
        assert_eq!(cluster_region("east").unwrap_err(), "not CLUSTER=REGION");
        assert_eq!(cluster_region("east=").unwrap_err(), "no region");
    }

    #[test]
    fn sizes_read_as_kubernetes_writes_them() {
        let size = |s: &str| s.parse::<MemoryLimit>();
        assert_eq!(size("512Mi"), Ok(MemoryLimit::Bytes(512 << 20)));
        assert_eq!(size("2Gi"), Ok(MemoryLimit::Bytes(2 << 30)));
        assert_eq!(size("1G"), Ok(MemoryLimit::Bytes(1_000_000_000)));
        assert_eq!(size("67108864"), Ok(MemoryLimit::Bytes(64 << 20)));
        assert_eq!((size("auto"), size("none")), (Ok(MemoryLimit::Auto), Ok(MemoryLimit::None)));
        assert!(size("1Mi").unwrap_err().contains("less than 16Mi"));
        assert!(size("12Pb").unwrap_err().contains("not a size"));
        assert!(size("Mi").is_err());
        assert_eq!(size("99999999999Gi").unwrap_err(), "too large");
    }

    #[test]
    fn seconds_and_rates_refuse_what_is_not_a_finite_number_in_range() {
        let s = seconds(0.05, 60.0);
        assert_eq!(s("0.05"), Ok(0.05));
        assert_eq!(s("60"), Ok(60.0));
        assert_eq!(s("0.04").unwrap_err(), "0.04 is outside 0.05-60 seconds");
        for bad in ["NaN", "inf", "61"] {
            assert!(s(bad).is_err(), "{bad}");
        }
        assert!(s("soon").is_err());
        assert_eq!(rate("0"), Ok(0.0));
        assert_eq!(rate("2.5"), Ok(2.5));
        for bad in ["-1", "NaN", "inf"] {
            assert!(rate(bad).unwrap_err().contains("is not a rate"), "{bad}");
        }
    }

    #[test]
    fn dns_addresses_default_to_port_53() {
        assert_eq!(dns_server("10.0.0.10"), Ok("10.0.0.10:53".parse().unwrap()));
        assert_eq!(dns_server("[fd00::a]:5353"), Ok("[fd00::a]:5353".parse().unwrap()));
        assert_eq!(dns_server("nowhere").unwrap_err(), "not IP or IP:PORT");
        assert_eq!(member_dns("a=127.0.0.1:5353"), Ok(("a".to_owned(), "127.0.0.1:5353".parse().unwrap())));
        assert_eq!(member_dns("a").unwrap_err(), "not CLUSTER=ADDR");
        assert!(member_dns("a=nowhere").unwrap_err().contains("\"nowhere\""));
    }

    #[test]
    fn zones_are_read_fully_qualified_in_lower_case_and_the_root_is_refused() {
        for written in ["Fleet.Example", "fleet.example.", "FLEET.EXAMPLE."] {
            assert_eq!(zone(written).map(|z| z.to_string()), Ok("fleet.example.".to_owned()), "{written}");
        }
        assert!(zone("a..b").unwrap_err().starts_with("\"a..b\" is not a domain name"));
        assert_eq!(zone(".").unwrap_err(), "the root is not a zone clusterset-dns can serve");
        let long = ["a".repeat(60), "b".repeat(60), "c".repeat(60), "d".repeat(60)].join(".");
        assert_eq!(zone(&long).unwrap_err(), "longer than 240 characters");
        assert!(zone(&long[..230]).is_ok());
    }

    #[test]
    fn query_types_are_dns_type_names_in_any_case() {
        assert_eq!(qtype("aaaa"), Ok(RecordType::AAAA));
        assert_eq!(qtype("SRV"), Ok(RecordType::SRV));
        assert!(qtype("AAA").is_err());
    }
}
