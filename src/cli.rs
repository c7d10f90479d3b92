//! Command-line interface. Values are parsed here, each into its type (an
//! enum `--help` lists, a range, a network; `parse.rs`), and validated once
//! into [`crate::config`] structs, which are passed down explicitly.
// The doc comments here are `--help` text, where `<zone>` and `<svc>` are
// literal placeholders, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use hickory_proto::rr::{Name, RecordType};

use crate::cluster_dns::repair::Mode as WatchMode;
use crate::controller::syncer::MemberLost;
use crate::diagnose::report::Format as ReportFormat;
use crate::k8s::protobuf::KubeEncoding;
use crate::k8s::watch::ListMode;
use crate::model::{Boundary, Cidr, ClusterId, Interop, PolicyKind};
use crate::ops::memory::OnMemoryLimit;

mod parse;

pub use parse::{ClientCluster, InteropList, MAX_SHARDS, MAX_TTL, MemoryLimit};

/// Authoritative DNS for Kubernetes Multi-Cluster Services (clusterset.local).
#[derive(Debug, Parser)]
#[command(name = "clusterset-dns", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// How log lines (stderr) are written: text for people, json (one
    /// object a line) for log pipelines. Every subcommand takes it.
    #[arg(
        long = "log-format",
        value_name = "FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        env = "CLUSTERSET_DNS_LOG_FORMAT",
        global = true
    )]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL TARGET: message key=value…`.
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target` and
    /// `fields` (the message and every key-value, errors under `error`).
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the zone over UDP and TCP.
    Serve(Box<ServeArgs>),
    /// Read objects files and report what would be served, without serving.
    Check(CheckArgs),
    /// Run the MCS sync controller: every member's ServiceExports become a
    /// ServiceImport, MCS EndpointSlices and a clusterset VIP in every member.
    Sync(Box<SyncArgs>),
    /// Hub mode: this member's agent. It publishes what its cluster exports
    /// as ExportRecords in its own namespace of a hub cluster, reads every
    /// member's records from the hub, and writes ServiceImports, MCS
    /// EndpointSlices and clusterset VIPs into its own cluster only
    /// (docs/hub.md).
    Agent(Box<AgentArgs>),
    /// Hub mode's administration of the hub cluster.
    Hub(HubArgs),
    /// Serve DNS and run the sync controller in one process: `--cluster`
    /// names the members synced; DNS answers from this cluster's
    /// ServiceImports (--kubeconfig or --in-cluster).
    Run(Box<RunArgs>),
    /// Ask a running server how it would answer a name: the candidates,
    /// their health, the policy's decision and the exact answer.
    Explain(ExplainArgs),
    /// Diagnose one multi-cluster service across the members: each
    /// member's Service, ServiceExport (conditions), ServiceImport and VIP,
    /// MCS EndpointSlices per source cluster and (with --dns) the answers,
    /// then a list of what is inconsistent and what to do. Only reads (list
    /// requests): the read-only identity of deploy/centralized/rbac.yaml is
    /// enough. Exit code 0: healthy; 1: problems found; 2: a member could
    /// not be read; 64: invalid command line.
    Doctor(DoctorArgs),
    /// Wire this cluster's DNS to clusterset-dns and prove it: find how the
    /// cluster DNS is configured (kubeadm/EKS Corefile, AKS/k3s
    /// coredns-custom, GKE kube-dns stubDomains, OpenShift's DNS operator,
    /// NodeLocal DNSCache; RKE2 is told what to add), show the change as a
    /// diff, apply it idempotently (a marked block or a key of its own;
    /// --remove takes it out), then resolve dns-version.<zone> through the
    /// cluster's DNS Service. Exit 0: proven (or --dry-run); 1: written but
    /// not proven; 2: nothing changed (layout not recognised, a manual step,
    /// or an API error); 64: invalid command line.
    SetupDns(SetupDnsArgs),
}

/// `setup-dns` options.
#[derive(Debug, Args)]
pub struct SetupDnsArgs {
    /// The cluster, through this kubeconfig (default: $KUBECONFIG, else
    /// ~/.kube/config).
    #[arg(long, value_name = "PATH", conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of --kubeconfig to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub kube_context: Option<String>,
    /// The cluster this Pod runs in (its service account).
    #[arg(long)]
    pub in_cluster: bool,
    /// clusterset-dns's address, IP or IP:PORT (port 53 by default).
    /// Default: the ClusterIP of Service clusterset-dns/clusterset-dns.
    #[arg(long, value_name = "ADDR", value_parser = parse::dns_server)]
    pub server: Option<SocketAddr>,
    /// The zone to forward.
    #[arg(long, default_value = "clusterset.local", value_parser = parse::zone)]
    pub zone: Name,
    /// Show the change, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Take the change out again.
    #[arg(long)]
    pub remove: bool,
    /// The cluster DNS to prove it through, IP or IP:PORT (port 53 by
    /// default). Default: the ClusterIP of Service kube-system/kube-dns
    /// (reachable from inside the cluster; from outside, pass an address
    /// that reaches it).
    #[arg(long, value_name = "ADDR", value_parser = parse::dns_server)]
    pub verify: Option<SocketAddr>,
    /// Do not prove it.
    #[arg(long, conflicts_with = "verify")]
    pub no_verify: bool,
    /// Seconds to keep asking, 1-3600 (CoreDNS reloads an edited ConfigMap
    /// within about two minutes).
    #[arg(long, value_name = "SECONDS", default_value_t = 150.0, value_parser = parse::seconds(1.0, 3600.0))]
    pub verify_timeout: f64,
    /// Keep the wiring: check it every --interval and at every change of
    /// the objects it wrote into, each check proven as above (at most
    /// --interval of asking). `reapply` (the default) writes it again when
    /// it was removed or rewritten, backing off after 3 rewrites of one
    /// object in 10 minutes (another controller fights it); `report` only
    /// reports (metric clusterset_dns_wiring_ok, an Event, the log) and
    /// never writes. Runs until SIGTERM; /metrics on --http-listen.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "reapply"
    )]
    pub watch: Option<WatchMode>,
    /// --watch: seconds between checks, 1-86400.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub interval: u64,
    /// --watch: HTTP address for /health, /ready (200 once the first check
    /// is done) and /metrics.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9155")]
    pub http_listen: SocketAddr,
}

/// `serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// File or directory of Kubernetes objects (ServiceImports, EndpointSlices;
    /// multi-document YAML or JSON). Repeatable. Watched for changes; SIGHUP
    /// forces a reload. Without any, the embedded example fleet is served.
    #[arg(long = "objects", value_name = "PATH")]
    pub objects: Vec<PathBuf>,
    /// Watch a Kubernetes API server through this kubeconfig: ServiceImports
    /// and MCS EndpointSlices. Combines with --objects.
    #[arg(long, value_name = "PATH", conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of --kubeconfig to use (default: its current context).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub kube_context: Option<String>,
    /// Watch the API server of the cluster this Pod runs in (its service account).
    #[arg(long)]
    pub in_cluster: bool,
    /// Namespace to watch (repeatable); all namespaces when none is given.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Also read the objects these fleet managers write in a member cluster
    /// (comma-separated, e.g. karmada,kosmos): an import without spec.ips
    /// answers the cluster IP of its backing Service (Karmada's
    /// derived-<svc>, Kosmos's same-name Service), their EndpointSlices
    /// give headless answers, Karmada's CrossCluster MultiClusterService
    /// Services are served, Kosmos's disconnected addresses are demoted.
    /// Watches Services and EndpointSlices without MCS labels (RBAC:
    /// services list/watch). Applies to --objects and the embedded example too.
    #[arg(long, value_name = "LIST", default_value = "", value_parser = InteropList)]
    pub interop: Interop,
    /// Objects per list request when a watch (re)lists in pages (see
    /// --list-mode; 0: one request for all). Paged lists hold less at once but are read from etcd page by
    /// page; one request is served from the API server's watch cache.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub list_page_size: u32,
    /// How watches get their complete lists.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = ListMode::Auto)]
    pub list_mode: ListMode,
    /// How EndpointSlices are asked for: `auto` asks for Kubernetes
    /// protobuf (a fraction of JSON's CPU in the API server and here) and
    /// reads a JSON answer as JSON (counted in
    /// clusterset_dns_watch_json_answers_total); `json` asks for JSON.
    /// ServiceImports and Services are always JSON (CRDs have no protobuf).
    #[arg(long, value_enum, value_name = "ENCODING", default_value_t = KubeEncoding::Auto)]
    pub kube_encoding: KubeEncoding,
    /// Member clusters to answer for directly (centralized mode): their
    /// ServiceExports, Services and EndpointSlices, no ServiceImports needed.
    #[command(flatten)]
    pub members: MembersArgs,
    /// Centralized mode from a hub (docs/hub.md): answer for the fleet from
    /// the ExportRecords the members' agents publish on the hub, one watch
    /// through this kubeconfig instead of one per member (instead of
    /// --cluster/--members). A member whose heartbeat stands still for
    /// --cluster-dead-after has its endpoints demoted. Its identity reads
    /// records and heartbeats only (deploy/hub/serve.yaml; `clusterset-dns
    /// hub reader` writes its kubeconfig).
    #[arg(long, value_name = "PATH")]
    pub hub_kubeconfig: Option<PathBuf>,
    /// Seconds to keep answering after SIGTERM while /ready fails, so load
    /// balancers stop sending queries before the server goes (0: stop at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub lameduck: u64,
    /// HTTP address for /health, /ready and /metrics.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9153")]
    pub http_listen: SocketAddr,
    /// Also put the per-service series on /metrics:
    /// clusterset_dns_endpoints{service,cluster,state} and
    /// clusterset_dns_answers_total{service,cluster}, a series per service
    /// and cluster (200,000 at 100,000 services in 10 clusters). By default
    /// /metrics sums them per cluster and /debug/metrics serves them.
    #[arg(long)]
    pub metrics_per_service: bool,
    /// Address to answer on, UDP and TCP. Repeatable (e.g. one IPv4, one IPv6).
    /// Port 0 picks a free port (logged at start).
    #[arg(long = "listen", value_name = "ADDR:PORT", default_value = "127.0.0.1:1053")]
    pub listen: Vec<SocketAddr>,
    /// The zone served.
    #[arg(long, default_value = "clusterset.local", value_parser = parse::zone)]
    pub zone: Name,
    /// Also answer every multi-cluster service under this zone, e.g.
    /// `cluster.local`: `<svc>.<ns>.svc.cluster.local` and the names below
    /// it, as in --zone, for a cluster DNS that falls through to this server
    /// for names it does not have (docs/interop.md: "The same name in every
    /// cluster"). Other names there: NXDOMAIN below `svc`, else REFUSED.
    #[arg(long, value_name = "ZONE", value_parser = parse::zone)]
    pub also_zone: Option<Name>,
    /// TTL of answers, in seconds (at most 2147483647, RFC 2181).
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=MAX_TTL))]
    pub ttl: u32,
    /// TTL of negative answers (the SOA minimum), in seconds, at most as
    /// --ttl's. Defaults to --ttl.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(0..=MAX_TTL))]
    pub negative_ttl: Option<u32>,
    /// Id of the cluster this server answers for (used by locality-aware answers).
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<String>,
    /// UDP worker threads, each with its own SO_REUSEPORT socket (at least
    /// 1). Defaults to the number of CPUs.
    #[arg(long, value_name = "N", value_parser = at_least_one())]
    pub udp_workers: Option<usize>,
    /// Largest UDP response sent to EDNS clients, whatever size they offer:
    /// 512-4096.
    #[arg(long, value_name = "BYTES", default_value_t = 1232, value_parser = clap::value_parser!(u16).range(512..=4096))]
    pub max_udp_payload: u16,
    /// Address of this server, answered as glue for `ns.dns.<zone>`. Repeatable.
    #[arg(long = "advertise-address", value_name = "IP")]
    pub advertise_address: Vec<IpAddr>,
    /// Seconds a TCP connection may stay idle before it is closed (at least 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub tcp_idle_timeout: u64,
    /// TCP connections served at once (at least 1); past it, each new connection closes
    /// one open connection to make room (one waiting for its client, from
    /// the address holding the most, the longest waiting). Lowered at start
    /// when the open files limit cannot hold it.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = at_least_one())]
    pub tcp_max_connections: usize,
    /// TCP connections open at once from one client address (at least 1);
    /// more are closed at once.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = at_least_one())]
    pub tcp_max_per_client: usize,
    /// Seconds a started TCP message may take to arrive in full, and a
    /// response to be written, 0.05-60 (a client sending a byte at a time,
    /// or never reading, is cut off after this).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = parse::seconds(0.05, 60.0))]
    pub tcp_io_timeout: f64,
    /// Answer DNS Cookies (RFC 7873): clients that send one get a server
    /// cookie, which exempts them from --rrl-rate.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub cookies: bool,
    /// Secret of the server cookies, 32 hex digits; give every replica the
    /// same one so a client's cookie is valid at each. Default: random at
    /// start.
    #[arg(long, value_name = "HEX", env = "CLUSTERSET_DNS_COOKIE_SECRET", hide_env_values = true)]
    pub cookie_secret: Option<String>,
    /// Response Rate Limiting: UDP responses per second to one client
    /// network (see --rrl-ipv4-prefix); 0 turns it off. Off by default:
    /// behind CoreDNS `forward`, all queries come from a few forwarders.
    #[arg(long, value_name = "PER_SECOND", default_value_t = 0)]
    pub rrl_rate: u32,
    /// Error responses (NXDOMAIN, REFUSED, FORMERR, …) per second to one
    /// client network. Defaults to --rrl-rate.
    #[arg(long, value_name = "PER_SECOND")]
    pub rrl_errors_rate: Option<u32>,
    /// Every N-th response over the limit is sent truncated (TC) so real
    /// clients retry over TCP; to a client with a DNS cookie, BADCOOKIE
    /// with a server cookie. 0: drop them all; 1: truncate them all; at
    /// most 10.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub rrl_slip: u32,
    /// Prefix length that groups IPv4 clients into one network (0-32).
    #[arg(long, value_name = "BITS", default_value_t = 24, value_parser = clap::value_parser!(u8).range(0..=32))]
    pub rrl_ipv4_prefix: u8,
    /// Prefix length that groups IPv6 clients into one network (0-128).
    #[arg(long, value_name = "BITS", default_value_t = 56, value_parser = clap::value_parser!(u8).range(0..=128))]
    pub rrl_ipv6_prefix: u8,
    /// Clients in CIDR are never rate limited (e.g. the cluster's own
    /// CoreDNS Pods). Repeatable.
    #[arg(long = "rrl-exempt", value_name = "CIDR")]
    pub rrl_exempt: Vec<Cidr>,
    /// This server's name in `dig CH TXT id.server` / `hostname.bind` and
    /// in NSID (`dig +nsid`), so replicas can be told apart. Default: the
    /// Pod name ($HOSTNAME), else the host name.
    #[arg(long, value_name = "ID")]
    pub server_id: Option<String>,
    /// Refuse `version.server` / `version.bind` instead of answering the
    /// version.
    #[arg(long)]
    pub hide_version: bool,
    /// Clients in CIDR may ask `dig CH TXT <name>` (how the name would be
    /// answered to them, and why) and `dig CH TXT whoami.<zone>`; others
    /// are refused. Repeatable. Default: loopback only.
    #[arg(long = "allow-debug", value_name = "CIDR", default_values = ["127.0.0.0/8", "::1"])]
    pub allow_debug: Vec<Cidr>,
    /// Clients in CIDR may transfer the zone (`dig axfr clusterset.local`):
    /// every name and record the server answers, from one snapshot, over
    /// TCP. Others are refused. Repeatable. Default: loopback only.
    #[arg(long = "allow-transfer", value_name = "CIDR", default_values = ["127.0.0.0/8", "::1"])]
    pub allow_transfer: Vec<Cidr>,
    /// Resolvers in CIDR are believed when a query carries an EDNS Client
    /// Subnet: the answer policies and consumer-clusters then see the
    /// subnet's cluster. From any other sender the option is ignored and
    /// the packet's source address decides. Trust only resolvers that set
    /// the option themselves: one that passes its clients' on lets them
    /// claim any cluster. Repeatable. Default: loopback only.
    #[arg(long = "trust-ecs-from", value_name = "CIDR", default_values = ["127.0.0.0/8", "::1"])]
    pub trust_ecs_from: Vec<Cidr>,
    /// Buckets of the rate-limiting table (8 bytes each), 1-16777216.
    #[arg(long, value_name = "N", default_value_t = 65536, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 24))]
    pub rrl_table_size: usize,
    /// How the endpoints of a headless service (or of a ClusterSetIP service
    /// answered with endpoints) are chosen. The annotation
    /// clusterset-dns.io/answer-policy overrides it per service.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = PolicyKind::Rotation)]
    pub answer_policy: PolicyKind,
    /// Most endpoints in one A/AAAA answer (0: every one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_answers: u16,
    /// Healthy endpoints the client's locality needs before local-first and
    /// topology answers stop spilling over to the next locality (at least 1).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub local_min_healthy: u16,
    /// When every endpoint of a service is unhealthy, answer them all (true)
    /// or none (false).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub fail_open: bool,
    /// Answer every ClusterSetIP service with its ready endpoints instead of
    /// its VIP (fleets without a cross-cluster VIP data path). Per service:
    /// the annotation clusterset-dns.io/endpoint-answers.
    #[arg(long)]
    pub endpoint_answers: bool,
    /// Queries from (or with an EDNS Client Subnet inside) CIDR come from
    /// cluster NAME, optionally in ZONE. Repeatable; the longest prefix wins.
    #[arg(long = "client-cluster", value_name = "CIDR=NAME[/ZONE]", value_parser = parse::client_cluster)]
    pub client_clusters: Vec<ClientCluster>,
    /// How far from the asking client the topology and local-first policies
    /// may answer. Inside it, unhealthy endpoints are answered when none is
    /// healthy (with --fail-open); outside it never. The annotation
    /// clusterset-dns.io/fallback-boundary overrides it per service.
    #[arg(long, value_enum, value_name = "SCOPE", default_value_t = Boundary::None)]
    pub fallback_boundary: Boundary,
    /// The region of a cluster, for the topology policy and the region
    /// boundary. Repeatable.
    #[arg(long = "cluster-region", value_name = "CLUSTER=REGION", value_parser = parse::cluster_region)]
    pub cluster_regions: Vec<(ClusterId, String)>,
    /// Seconds a member cluster (--cluster) may fail to answer (its watches
    /// failing or its API not responding), or its heartbeat on the hub
    /// (--hub-kubeconfig) stand still, before its endpoints are demoted in
    /// every answer, 1-3600; they return once it answers and has relisted
    /// (its heartbeat moves again).
    #[arg(long, value_name = "SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub cluster_dead_after: u64,
    /// Memory the server may use: a size (512Mi, 2Gi, bytes), `auto` (the
    /// container's limit: the cgroup's memory.max), or `none`. An update that
    /// would take the server past 90 % of it is weighed before it is read
    /// and refused, its source listed again once it fits (see
    /// --on-memory-limit); an edit or a removal is never refused. A first
    /// load that does not fit fails the start, naming the size reached,
    /// rather than be OOM-killed.
    #[arg(long, value_name = "SIZE", default_value = "auto")]
    pub memory_limit: MemoryLimit,
    /// What to do when an update would take the server past 90 % of
    /// --memory-limit once it serves: refuse that update and keep serving
    /// the last good state, listing its source again once it fits
    /// (`keep-serving`), or stop (`exit`). A first load that does not fit
    /// always fails the start.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnMemoryLimit::KeepServing)]
    pub on_memory_limit: OnMemoryLimit,
    /// Probe every ready endpoint actively (TCP connect to its port) and
    /// leave endpoints that fail out of answers while others are healthy.
    #[arg(long)]
    pub probe: bool,
    /// Seconds between two probes of one endpoint (each jittered by ±20 %).
    /// Every --probe-… flag is checked even without --probe, and each of
    /// its seconds is 0.01-3600.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = parse::seconds(0.01, 3600.0))]
    pub probe_interval: f64,
    /// Seconds until the next probe after one that disagrees with the
    /// endpoint's state (a failure of a healthy one, a success of a down
    /// one), until --probe-fall or --probe-rise decide; at most the interval.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.5, value_parser = parse::seconds(0.01, 3600.0))]
    pub probe_recheck: f64,
    /// Seconds a probe's TCP connect may take before it counts as failed.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse::seconds(0.01, 3600.0))]
    pub probe_timeout: f64,
    /// Consecutive failed probes that mark an endpoint down (at least 1).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub probe_fall: u32,
    /// Consecutive successful probes that mark a down endpoint up again (at
    /// least 1).
    #[arg(long, value_name = "M", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub probe_rise: u32,
    /// Probes in flight at once (at least 1).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = at_least_one())]
    pub probe_concurrency: usize,
    /// Most probes started per second (a token bucket; bursts up to one
    /// second's worth; at least 1).
    #[arg(long, value_name = "PER_SECOND", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub probe_rate: u32,
}

/// `explain` options.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The name to explain, e.g. web.shop.svc.clusterset.local.
    pub name: String,
    /// The query type: A, AAAA, SRV, PTR, TXT, … (a DNS type's name, any
    /// letter case).
    #[arg(long = "type", value_name = "TYPE", default_value = "A", value_parser = parse::qtype)]
    pub qtype: RecordType,
    /// Explain the answer for a client in this cluster.
    #[arg(long, value_name = "CLUSTER")]
    pub from_cluster: Option<String>,
    /// The running server's --http-listen address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9153")]
    pub server: SocketAddr,
}

/// `doctor` options.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The service: `NAME.NAMESPACE` or `NAME.NAMESPACE.svc.ZONE`, e.g.
    /// web.shop or web.shop.svc.clusterset.local.
    pub name: String,
    /// The members to inspect (read only).
    #[command(flatten)]
    pub members: MembersArgs,
    /// Ask this member's DNS (clusterset-dns, or the cluster's CoreDNS
    /// forwarding to it) for the name's A, AAAA and SRV records, and compare
    /// the answers with that member's ServiceImport and endpoints.
    /// ADDR is IP or IP:PORT (default port 53). Repeatable.
    #[arg(long = "dns", value_name = "CLUSTER=ADDR", value_parser = parse::member_dns)]
    pub dns: Vec<(String, SocketAddr)>,
    /// The zone the names are served in.
    #[arg(long, default_value = "clusterset.local", value_parser = parse::zone)]
    pub zone: Name,
    /// Seconds each member's reads, and each DNS query, may take: 0.1-300.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse::seconds(0.1, 300.0))]
    pub timeout: f64,
    /// How the report is written.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ReportFormat::Text)]
    pub output: ReportFormat,
}

/// The member clusters of a fleet.
#[derive(Debug, Args, Clone, Default)]
pub struct MembersArgs {
    /// A member cluster: NAME=KUBECONFIG, optionally NAME=KUBECONFIG#CONTEXT.
    /// Repeatable. Its cluster id is its `cluster.clusterset.k8s.io`
    /// ClusterProperty when it has one, else NAME.
    #[arg(long = "cluster", value_name = "NAME=KUBECONFIG")]
    pub clusters: Vec<String>,
    /// A YAML file listing members instead:
    /// `members: [{name: a, kubeconfig: /path, context: ctx}]`.
    #[arg(long = "members", value_name = "FILE")]
    pub members_file: Option<PathBuf>,
}

/// `sync` options.
#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The member clusters to sync.
    #[command(flatten)]
    pub members: MembersArgs,
    /// HTTP address for /health, /ready (200 while leading or standing by
    /// healthy) and /metrics.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9154")]
    pub http_listen: SocketAddr,
    /// Namespace to sync (repeatable); all namespaces when none is given.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Members from a cluster inventory, beside --cluster.
    #[command(flatten)]
    pub profiles: ProfilesArgs,
    /// Leader election and the rest of the controller's behaviour.
    #[command(flatten)]
    pub options: SyncOptions,
}

/// `clusterset-dns agent`: one per member (hub mode).
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// This member's name on the hub, also its cluster id (a DNS label):
    /// its hub namespace is clusterset-member-NAME.
    #[arg(long, value_name = "NAME")]
    pub member: String,
    /// Kubeconfig of this member's own cluster (default: the cluster this
    /// Pod runs in, its service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the hub, as this member's hub identity (it may write
    /// only its own namespace there, and read the others').
    #[arg(long, value_name = "PATH")]
    pub hub_kubeconfig: PathBuf,
    /// HTTP address for /health, /ready and /metrics.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9155")]
    pub http_listen: SocketAddr,
    /// Namespace to sync (repeatable); all namespaces when none is given.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Leader election (in this member's cluster) and the rest of the
    /// controller's behaviour.
    #[command(flatten)]
    pub options: SyncOptions,
}

/// `clusterset-dns hub`.
#[derive(Debug, Args)]
pub struct HubArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: HubCommand,
}

/// `clusterset-dns hub …`.
#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Enrol a member on the hub: the hub's ExportRecord CRD and roles
    /// (deploy/hub/), the member's namespace clusterset-member-NAME, its hub
    /// identity (ServiceAccount clusterset-hub/member-NAME) allowed to write
    /// that namespace only and read the others', and a kubeconfig of that
    /// identity for its agent (--out). Enrolling again changes nothing but
    /// the token.
    Enrol(EnrolArgs),
    /// The read-only hub identity of a centralized `serve --hub-kubeconfig`
    /// (deploy/hub/serve.yaml: ServiceAccount
    /// clusterset-hub/clusterset-dns-serve, reading every member's records
    /// and heartbeats, writing nothing) and a kubeconfig of it (--out).
    /// Running it again changes nothing but the token.
    Reader(ReaderArgs),
}

/// `clusterset-dns hub reader`.
#[derive(Debug, Args)]
pub struct ReaderArgs {
    /// The hub, and where the kubeconfig goes.
    #[command(flatten)]
    pub hub: HubIdentityArgs,
}

/// `clusterset-dns hub enrol`.
#[derive(Debug, Args)]
pub struct EnrolArgs {
    /// The member's name (a DNS label: its cluster id).
    #[arg(value_name = "NAME")]
    pub member: String,
    /// The hub, and where the kubeconfig goes.
    #[command(flatten)]
    pub hub: HubIdentityArgs,
}

/// What `hub enrol` and `hub reader` take alike: they make a hub identity
/// and write a kubeconfig of it.
#[derive(Debug, Args)]
pub struct HubIdentityArgs {
    /// Kubeconfig of the hub, as an identity that may create the objects
    /// above (cluster admin).
    #[arg(long, value_name = "PATH")]
    pub hub_kubeconfig: PathBuf,
    /// Where to write the kubeconfig of the identity made (the agent's or
    /// serve's --hub-kubeconfig).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// Seconds its token is valid, 600-31622400 (the hub may cap it; renew
    /// by running the command again before it ends).
    #[arg(long, value_name = "SECONDS", default_value_t = 31_536_000, value_parser = clap::value_parser!(i64).range(600..=31_622_400))]
    pub token_seconds: i64,
}

/// Members from the ClusterProfiles of a hub cluster (sigs.k8s.io
/// cluster-inventory-api, KEP-4322), reached through the access providers
/// of KEP-5339.
#[derive(Debug, Args, Clone, Default)]
pub struct ProfilesArgs {
    /// Take members from the ClusterProfiles in this namespace of the hub
    /// (the namespace a fleet manager labels multicluster.x-k8s.io/clusterset),
    /// followed live: a profile created, deleted or whose ControlPlaneHealthy
    /// turns False adds, removes or marks unreachable that member. The
    /// member's name is the profile's.
    #[arg(long, value_name = "NS", requires = "cluster_profile_providers")]
    pub cluster_profiles: Option<String>,
    /// The access providers (KEP-5339's provider file, JSON: `{"providers":
    /// [{"name", "execConfig": {exec plugin}}]}`): the first one a profile
    /// offers gives its credentials, from its exec plugin.
    #[arg(long, value_name = "FILE", requires = "cluster_profiles")]
    pub cluster_profile_providers: Option<PathBuf>,
    /// Kubeconfig of the hub holding the ClusterProfiles (default: the
    /// cluster this Pod runs in, its service account).
    #[arg(long, value_name = "PATH", requires = "cluster_profiles")]
    pub hub_kubeconfig: Option<PathBuf>,
}

/// `run` options: `serve`'s, with `--cluster`/`--members` and `--namespace`
/// also scoping the controller, plus the controller's own.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// DNS.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// HTTP address of the controller's /health, /ready and /metrics.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9154")]
    pub sync_http_listen: SocketAddr,
    /// The controller.
    #[command(flatten)]
    pub sync: SyncOptions,
}

/// What the sync controller does, besides whom it syncs.
#[derive(Debug, Args, Clone)]
pub struct SyncOptions {
    /// Kubeconfig of the cluster holding the leader-election Lease (default:
    /// the first --cluster member's, else the hub's of --cluster-profiles).
    #[arg(long, value_name = "PATH")]
    pub lease_kubeconfig: Option<PathBuf>,
    /// Namespace of the Lease.
    #[arg(long, value_name = "NS", default_value = "clusterset-dns")]
    pub lease_namespace: String,
    /// Name of the Lease.
    #[arg(long, value_name = "NAME", default_value = "clusterset-dns-sync")]
    pub lease_name: String,
    /// Seconds a leader holds the Lease without renewing it, 5-3600; a
    /// standby takes over within this time after the leader dies (the
    /// longer of the leader's and its own, if they differ).
    #[arg(long, value_name = "SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub lease_duration: u64,
    /// This replica's identity in the Lease (default: $POD_NAME, else the
    /// host name and process id).
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,
    /// Run without leader election (one replica only).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Split the services into this many shards, each led by one replica
    /// on a Lease of its own (`<lease-name>-i`; 1: the single Lease
    /// `<lease-name>`); replicas share the shards out evenly. Every replica
    /// of a fleet must have the same value. 1-64.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_SHARDS))]
    pub shards: u32,
    /// What happens to the endpoints of a member whose API stays
    /// unreachable.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = MemberLost::Keep)]
    pub on_member_lost: MemberLost,
    /// Seconds a member must stay unreachable before --on-member-lost=remove
    /// removes its endpoints (at least 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub member_lost_after: u64,
    /// Seconds between full resyncs: every member's objects of ours are read
    /// whole again and every service is reconciled against them, so a
    /// change no event announced is repaired by then (at start and at every
    /// leadership change this happens anyway). At least 10.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(10..))]
    pub resync_interval: u64,
    /// Services reconciled at once, 1-1024 (each writes its members, every
    /// member in a lane of its own): the members' API servers, not the
    /// controller, should set the pace.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrent_syncs: u64,
    /// Export every Service in namespaces whose name starts with this
    /// (repeatable). Services annotated `clusterset-dns.io/export: "true"`
    /// (or Kosmos's `kosmos.io/auto-create-mcs: "true"`) are exported
    /// wherever they are.
    #[arg(long = "auto-export-namespace-prefix", value_name = "PREFIX")]
    pub auto_export_namespace_prefixes: Vec<String>,
    /// Requests per second the controller sends to each member's API server
    /// at most, sustained (a token bucket per member client; 0: no limit).
    /// The limit is per member because each member's API server carries only
    /// its own share: in a 100-cluster fleet one service's change is a few
    /// writes to each of 100 servers, and 100 × 50/s is more than one
    /// controller process makes. 50 is kubelet's default, a rate every API
    /// server is sized to take from each of its nodes; it binds when one
    /// member gets a storm (a start or relist with thousands of services),
    /// which then takes minutes instead of flooding that server.
    #[arg(long, value_name = "QPS", default_value_t = 50.0, value_parser = parse::rate, allow_negative_numbers = true)]
    pub kube_qps: f64,
    /// Requests each member's client may send at once after a quiet spell,
    /// beyond --kube-qps: 100 lets about 20 services change together (a
    /// service is ~5 writes per member) without waiting.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub kube_burst: u32,
    /// Send the controller's spans (each reconcile with its service, shard,
    /// reason, members written and outcome; a span per member and per
    /// write inside it) to an OpenTelemetry collector at this OTLP/HTTP URL
    /// (protobuf, HTTP/1, plain http), e.g.
    /// `http://otel-collector.monitoring:4318/v1/traces`. Off when not given.
    #[arg(long, value_name = "URL", value_parser = parse::otlp_endpoint)]
    pub otlp_endpoint: Option<http::Uri>,
}

/// `check` options.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// File or directory of Kubernetes objects. Repeatable.
    #[arg(long = "objects", value_name = "PATH", required = true)]
    pub objects: Vec<PathBuf>,
    /// Read these fleet managers' shapes too, as `serve --interop` does
    /// (comma-separated).
    #[arg(long, value_name = "LIST", default_value = "", value_parser = InteropList)]
    pub interop: Interop,
}

/// A count of at least 1 held in a `usize` (clap's ranges read `u64`).
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}
