//! Test harness: a real server on loopback, real sockets, answers rendered
//! as zone-file text so expectations read like `dig` output.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::str::FromStr;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use clusterset_dns::cli::{Cli, Command};
use clusterset_dns::cmd::serve;
use clusterset_dns::config::ServeConfig;
use clusterset_dns::store::Reader;
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};

/// A server started in-process on 127.0.0.1 with a free port, on its own
/// runtime thread; stopped when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub reader: Reader,
    /// Holds the objects directory for the server's lifetime.
    _dir: tempfile::TempDir,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `serve` on loopback ports it picks itself: the start of every test
/// server's command line.
pub const SERVE_ARGV: [&str; 6] =
    ["clusterset-dns", "serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"];

impl TestServer {
    /// Serves `files` (name, YAML) written into a temporary directory, which
    /// is passed as one `--objects` directory.
    pub fn start(files: &[(&str, &str)], args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write fixture");
        }
        let objects = dir.path().to_str().expect("utf-8 path").to_owned();
        Self::start_argv(
            &[&SERVE_ARGV[..], &["--udp-workers", "1", "--objects", &objects], args].concat(),
            dir,
        )
    }

    /// Serves the embedded example fleet.
    pub fn embedded() -> Self {
        Self::embedded_with(&[])
    }

    /// Serves the embedded example fleet with extra `args`.
    pub fn embedded_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_argv(&[&SERVE_ARGV[..], &["--udp-workers", "1"], args].concat(), dir)
    }

    fn start_argv(argv: &[&str], dir: tempfile::TempDir) -> Self {
        let cfg = serve_config(argv);
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let running = serve::start(&cfg).await.expect("server starts");
                ready_tx.send((running.addrs[0], running.reader.clone())).expect("report address");
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                running.stop();
            });
        });
        let (addr, reader) = ready_rx.recv_timeout(Duration::from_secs(20)).expect("server started");
        Self { addr, reader, _dir: dir, stop: Some(stop_tx), thread: Some(thread) }
    }
}

/// `serve`'s configuration from a full command line.
pub fn serve_config(argv: &[&str]) -> ServeConfig {
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("argv").command else { unreachable!() };
    ServeConfig::from_args(&args).expect("config")
}

impl Drop for TestServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A query under construction.
#[derive(Clone)]
pub struct Q {
    pub msg: Message,
}

/// A query for `name` and `rtype` ("A", "SRV", …), RD set, EDNS on (1232).
pub fn q(name: &str, rtype: &str) -> Q {
    let mut msg = Message::query();
    msg.metadata.id = 0x4242;
    msg.metadata.recursion_desired = true;
    // from_ascii keeps the letter case (from_str folds it through IDNA).
    let rtype = match rtype {
        "IXFR" => RecordType::IXFR,
        other => RecordType::from_str(other).expect("type"),
    };
    msg.add_query(Query::query(Name::from_ascii(name).expect("name"), rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    msg.set_edns(edns);
    Q { msg }
}

impl Q {
    /// Without an OPT record (classic 512-byte DNS).
    pub fn no_edns(mut self) -> Self {
        self.msg.edns = None;
        self
    }

    /// With an OPT offering `size` bytes.
    pub fn payload(mut self, size: u16) -> Self {
        let mut edns = Edns::new();
        edns.set_max_payload(size);
        self.msg.set_edns(edns);
        self
    }

    /// The wire bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.msg.to_vec().expect("encode query")
    }

    /// Sends over UDP and decodes the answer.
    pub fn udp(&self, addr: SocketAddr) -> Message {
        decode(&udp_raw(addr, &self.bytes()).expect("a UDP response"))
    }

    /// Sends over TCP and decodes the answer.
    pub fn tcp(&self, addr: SocketAddr) -> Message {
        decode(&tcp_raw(addr, &self.bytes()).expect("a TCP response"))
    }

    /// [`Q::udp`] from the local address `from`.
    pub fn udp_from(&self, from: IpAddr, addr: SocketAddr) -> Message {
        decode(&udp_raw_from(from, addr, &self.bytes()).expect("a UDP response"))
    }

    /// [`Q::tcp`] from the local address `from`.
    pub fn tcp_from(&self, from: IpAddr, addr: SocketAddr) -> Message {
        decode(&tcp_raw_from(from, addr, &self.bytes()).expect("a TCP response"))
    }
}

pub fn decode(bytes: &[u8]) -> Message {
    Message::from_vec(bytes).unwrap_or_else(|e| panic!("response does not decode: {e}: {bytes:02x?}"))
}

/// Sends raw bytes over UDP; `None` when nothing comes back within 1 s.
pub fn udp_raw(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    udp_raw_from(Ipv4Addr::LOCALHOST.into(), addr, bytes)
}

/// [`udp_raw`] from the local address `from` (every address of
/// 127.0.0.0/8 is this host's: a second client on loopback).
pub fn udp_raw_from(from: IpAddr, addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind(SocketAddr::new(from, 0)).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    sock.send_to(bytes, addr).expect("send");
    let mut buf = vec![0u8; 65535];
    match sock.recv_from(&mut buf) {
        Ok((n, _)) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

/// Sends one length-prefixed message over a new TCP connection.
pub fn tcp_raw(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    tcp_raw_from(Ipv4Addr::LOCALHOST.into(), addr, bytes)
}

/// [`tcp_raw`] over a connection from the local address `from`.
pub fn tcp_raw_from(from: IpAddr, addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)
        .expect("socket");
    sock.bind(&SocketAddr::new(from, 0).into()).expect("bind");
    sock.connect(&addr.into()).expect("connect");
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).expect("write");
    read_frame(&mut s)
}

/// Reads one length-prefixed message.
pub fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The response as text: a status line, then each section's records in
/// zone-file form (`name ttl IN TYPE rdata`), sections marked like dig.
pub fn render(m: &Message) -> String {
    let md = &m.metadata;
    let mut flags = Vec::new();
    for (on, f) in [
        (md.authoritative, "aa"),
        (md.truncation, "tc"),
        (md.recursion_desired, "rd"),
        (md.recursion_available, "ra"),
    ] {
        if on {
            flags.push(f);
        }
    }
    let mut out = format!("{:?} {}", md.response_code, flags.join(" "));
    for (title, records) in
        [("ANSWER", &m.answers), ("AUTHORITY", &m.authorities), ("ADDITIONAL", &m.additionals)]
    {
        if !records.is_empty() {
            out += &format!("\n;; {title}");
            for r in records {
                out += &format!("\n{}", r.to_string().trim_end());
            }
        }
    }
    out
}

/// Asserts a rendered response equals `expected` (leading/trailing blank
/// lines and indentation ignored), printing both in full when not.
#[track_caller]
pub fn check(m: &Message, expected: &str) {
    let got = render(m);
    let want: Vec<&str> = expected.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let want = want.join("\n");
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}\n");
}

/// Sorts the records within each section of a rendered response (the
/// status line and the `;;` section headers stay in place).
fn sort_sections(lines: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut section: Vec<&str> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if i == 0 || line.starts_with(";;") {
            section.sort_unstable();
            out.append(&mut section);
            out.push(line);
        } else {
            section.push(line);
        }
    }
    section.sort_unstable();
    out.append(&mut section);
    out.join("\n")
}

/// [`check`] ignoring the order of records within each section: for
/// answers whose order a policy chooses (the contract leaves it open).
#[track_caller]
pub fn check_unordered(m: &Message, expected: &str) {
    let rendered = render(m);
    let got = sort_sections(&rendered.lines().collect::<Vec<_>>());
    let want: Vec<&str> = expected.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let want = sort_sections(&want);
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}\n");
}

/// `n` ClusterSetIP services in `n / 100` namespaces, one VIP and one
/// named port each, as ServiceImports.
pub fn many_services(n: usize) -> String {
    let mut yaml = String::new();
    for i in 0..n {
        yaml.push_str(&format!(
            "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata:\n  name: svc-{i}\n  namespace: ns-{}\nspec:\n  type: ClusterSetIP\n  ips: [10.{}.{}.{}]\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n---\n",
            i / 100,
            100 + i / 65536,
            (i / 256) % 256,
            i % 256,
        ));
    }
    yaml
}
