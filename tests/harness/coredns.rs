//! Stock CoreDNS for the tests and the benches: the binary
//! `scripts/k8s-bins.sh coredns` builds (v1.12.4, every in-tree plugin,
//! cached), and a port to give it, since it is told its port rather than
//! picking one. The tests' CoreDNS (`tests/it/coredns.rs`) and the
//! incumbent of `benches/scale.rs` both start from here.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The stock CoreDNS binary, built (once, cached) by `scripts/k8s-bins.sh`.
pub fn coredns_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-bins.sh");
        let out = Command::new(&script).arg("coredns").output().expect("run scripts/k8s-bins.sh");
        assert!(
            out.status.success(),
            "scripts/k8s-bins.sh coredns failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = stdout.lines().last().expect("k8s-bins.sh prints the bin directory").trim();
        let bin = Path::new(dir).join("coredns");
        assert!(bin.is_file(), "{} missing", bin.display());
        bin
    })
}

/// A port free for both UDP and TCP on 127.0.0.1 (at the time of asking),
/// for a program that is told its port (CoreDNS).
///
/// Taken below the kernel's ephemeral range, where no `bind(port 0)`
/// lands: our servers under test bind port 0 with SO_REUSEPORT, and so
/// does CoreDNS its port, so a CoreDNS given a port the kernel had just
/// handed to one of our servers would join that server's socket group
/// and take a share of its queries (a test then sees answers from the
/// wrong server). And below 20000, where `scripts/clusters.sh` picks the
/// control planes' ports.
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000usize, usize::from(ephemeral).clamp(10_100, 20_000));
    // Stepping from a per-process start, so that two test binaries at
    // once rarely try the same ports.
    let start = std::process::id() as usize * 7919;
    for _ in 0..200 {
        let step = NEXT.fetch_add(1, Ordering::Relaxed) * 101;
        let port = u16::try_from(low + (start + step) % (high - low)).unwrap_or(0);
        if let (Ok(_tcp), Ok(_udp)) =
            (TcpListener::bind(("127.0.0.1", port)), UdpSocket::bind(("127.0.0.1", port)))
            && port != 0
        {
            return port;
        }
    }
    panic!("no port below {high} free for both UDP and TCP on 127.0.0.1");
}
