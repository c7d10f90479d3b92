//! Validated configuration. Every check names the flag it concerns, and runs
//! once at start: a bad value stops the server before it answers anything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hickory_proto::rr::Name;

use crate::cli::ServeArgs;
use crate::model::{ClusterId, DnsLabel};
use crate::source::kube::{Connection, KubeSource};
use crate::store::ZoneConfig;
use crate::wire::WireConfig;
use crate::wire::tcp::TcpConfig;

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {problem}")]
pub struct ConfigError {
    /// The flag, e.g. `--zone`.
    pub flag: &'static str,
    /// What is wrong.
    pub problem: String,
}

fn bad(flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError { flag, problem: problem.into() }
}

/// RFC 2181 §8: TTLs are at most 2^31 - 1.
const MAX_TTL: u32 = i32::MAX as u32;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Objects files and directories; empty means the embedded example.
    pub objects: Vec<PathBuf>,
    /// The Kubernetes API server to watch, if any.
    pub kube: Option<KubeSource>,
    /// Addresses to answer on.
    pub listen: Vec<SocketAddr>,
    /// Address of the HTTP endpoints.
    pub http_listen: SocketAddr,
    /// How long to keep answering after SIGTERM while /ready fails.
    pub lameduck: Duration,
    /// The zone.
    pub zone: ZoneConfig,
    /// This server's cluster, when set.
    pub cluster_id: Option<ClusterId>,
    /// UDP worker threads per listen address.
    pub udp_workers: usize,
    /// Wire settings.
    pub wire: WireConfig,
    /// TCP settings.
    pub tcp: TcpConfig,
}

impl ServeConfig {
    /// Validates command-line values.
    pub fn from_args(a: &ServeArgs) -> Result<Self, ConfigError> {
        let mut origin = Name::from_ascii(&a.zone)
            .map_err(|e| bad("--zone", format!("{:?} is not a domain name: {e}", a.zone)))?;
        origin.set_fqdn(true);
        if origin.is_root() {
            return Err(bad("--zone", "the root zone cannot be served"));
        }
        // Room for the longest fixed name below the apex (`hostmaster.`).
        if origin.len() > 240 {
            return Err(bad("--zone", "longer than 240 characters"));
        }
        for (flag, ttl) in [("--ttl", a.ttl), ("--negative-ttl", a.negative_ttl.unwrap_or(a.ttl))] {
            if ttl > MAX_TTL {
                return Err(bad(flag, format!("{ttl} is above the largest TTL, {MAX_TTL}")));
            }
        }
        if !(512..=4096).contains(&a.max_udp_payload) {
            return Err(bad("--max-udp-payload", format!("{} is outside 512-4096", a.max_udp_payload)));
        }
        if a.listen.is_empty() {
            return Err(bad("--listen", "at least one address is needed"));
        }
        let cluster_id =
            a.cluster_id.as_deref().map(ClusterId::parse).transpose().map_err(|e| {
                bad("--cluster-id", format!("{:?} {e}", a.cluster_id.as_deref().unwrap_or("")))
            })?;
        let udp_workers = match a.udp_workers {
            Some(0) => return Err(bad("--udp-workers", "must be at least 1")),
            Some(n) => n,
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        };
        if a.tcp_max_connections == 0 {
            return Err(bad("--tcp-max-connections", "must be at least 1"));
        }
        if a.tcp_idle_timeout == 0 {
            return Err(bad("--tcp-idle-timeout", "must be at least 1 second"));
        }
        let connection = match (&a.kubeconfig, a.in_cluster) {
            (Some(path), _) => {
                Some(Connection::Kubeconfig { path: path.clone(), context: a.kube_context.clone() })
            }
            (None, true) => Some(Connection::InCluster),
            (None, false) => None,
        };
        if connection.is_none() && !a.namespaces.is_empty() {
            return Err(bad("--namespace", "needs --kubeconfig or --in-cluster"));
        }
        for ns in &a.namespaces {
            DnsLabel::parse(ns).map_err(|e| bad("--namespace", format!("{ns:?} {e}")))?;
        }
        Ok(Self {
            objects: a.objects.clone(),
            kube: connection.map(|connection| KubeSource { connection, namespaces: a.namespaces.clone() }),
            listen: a.listen.clone(),
            http_listen: a.http_listen,
            lameduck: Duration::from_secs(a.lameduck),
            zone: ZoneConfig {
                origin: origin.to_lowercase(),
                ttl: a.ttl,
                negative_ttl: a.negative_ttl.unwrap_or(a.ttl),
                advertise: a.advertise_address.clone(),
            },
            cluster_id,
            udp_workers,
            wire: WireConfig { max_udp_payload: a.max_udp_payload },
            tcp: TcpConfig {
                idle_timeout: Duration::from_secs(a.tcp_idle_timeout),
                max_connections: a.tcp_max_connections,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn config(args: &[&str]) -> Result<ServeConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["clusterset-dns", "serve"], args].concat()).unwrap();
        let Command::Serve(a) = cli.command else { unreachable!() };
        ServeConfig::from_args(&a)
    }

    #[test]
    fn defaults_serve_the_example_on_an_unprivileged_port() {
        let c = config(&[]).unwrap();
        assert_eq!(c.zone.origin.to_string(), "clusterset.local.");
        assert_eq!((c.zone.ttl, c.zone.negative_ttl), (5, 5));
        assert_eq!(c.listen, ["127.0.0.1:1053".parse().unwrap()]);
        assert!(c.objects.is_empty());
        assert_eq!(c.wire.max_udp_payload, 1232);
    }

    #[test]
    fn bad_values_name_their_flag() {
        assert_eq!(config(&["--zone", "a..b"]).unwrap_err().flag, "--zone");
        assert_eq!(config(&["--ttl", "4294967295"]).unwrap_err().flag, "--ttl");
        assert_eq!(config(&["--cluster-id", "bad_id"]).unwrap_err().flag, "--cluster-id");
        assert_eq!(config(&["--max-udp-payload", "100"]).unwrap_err().flag, "--max-udp-payload");
        assert_eq!(config(&["--udp-workers", "0"]).unwrap_err().flag, "--udp-workers");
        assert_eq!(config(&["--namespace", "shop"]).unwrap_err().flag, "--namespace");
        assert_eq!(config(&["--in-cluster", "--namespace", "Not_OK"]).unwrap_err().flag, "--namespace");
    }

    #[test]
    fn zone_names_are_folded_to_lower_case() {
        assert_eq!(config(&["--zone", "Fleet.Example."]).unwrap().zone.origin.to_string(), "fleet.example.");
    }
}
