//! The container image: `scripts/image.sh` builds it from the `Dockerfile`
//! with Debian's buildah (a `FROM scratch` image, no registry), and podman
//! runs it with runc as Kubernetes runs `deploy/` and the chart: user 65532,
//! read-only root file system, every capability dropped but
//! `NET_BIND_SERVICE`, no new privileges. `dig` gets the embedded example's
//! answer on port 53, over UDP and TCP; the process is not root, its root
//! mount is read-only, and it holds `NET_BIND_SERVICE` only (from the file
//! capability). Without `NET_BIND_SERVICE` the container cannot start.
//!
//! Networking is the host's, on a loopback address of its own. Containers
//! and images carry the label [`LABEL`] and are removed before the test (what
//! a killed run left) and after it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::harness::served::dig;

const LABEL: &str = "clusterset-dns-it-image";

/// Within this machine's limits (`ulimit -n`, `-u`); podman's defaults are not.
const ULIMITS: [&str; 4] = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=1024:1024"];

fn podman(args: &[&str]) -> Output {
    // runc: Debian's crun refuses this host's hybrid cgroup setup.
    Command::new("podman")
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run podman (scripts/test.sh installs it): {e}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Removes every container and image of this test, running or not.
fn clean() {
    let filter = format!("label={LABEL}");
    let ids = podman(&["ps", "-a", "-q", "--filter", &filter]);
    for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
        podman(&["rm", "-f", "-t", "0", id]);
    }
    let ids = podman(&["images", "-q", "--filter", &filter]);
    for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
        podman(&["rmi", "-f", id]);
    }
}

struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        clean();
    }
}

/// A loopback address no other test uses, and a free TCP port on it.
fn address() -> (Ipv4Addr, u16) {
    let id = std::process::id();
    let ip = Ipv4Addr::new(127, 53, (id % 250) as u8 + 1, (id / 250 % 250) as u8 + 1);
    let port = TcpListener::bind((ip, 0)).and_then(|l| l.local_addr()).expect("a free port").port();
    (ip, port)
}

/// `/proc/PID/status` field `key`.
fn status(pid: &str, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .trim()
        .to_owned()
}

#[test]
fn the_image_builds_with_buildah_and_serves_port_53_as_non_root_read_only() {
    clean();
    let _cleanup = Cleanup;
    let tag = format!("localhost/clusterset-dns-it:{}", std::process::id());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image.sh");
    let built = Command::new(&script)
        .arg(&tag)
        .env("IMAGE_PROFILE", "dev")
        .env("IMAGE_LABEL", format!("{LABEL}=1"))
        .output()
        .expect("run scripts/image.sh");
    assert!(built.status.success(), "scripts/image.sh failed:\n{}", text(&built));
    let size = podman(&["image", "inspect", "--format", "{{.Size}}", &tag]);
    assert!(size.status.success(), "{}", text(&size));
    eprintln!("image {tag}: {} bytes", String::from_utf8_lossy(&size.stdout).trim());

    let (ip, http) = address();
    let name = format!("clusterset-dns-it-{}", std::process::id());
    let listen = format!("{ip}:53");
    let http_listen = format!("{ip}:{http}");
    let label = format!("{LABEL}=1");
    let mut run = vec!["run", "-d", "--name", &name, "--label", &label, "--network", "host"];
    run.extend(["--user", "65532:65532", "--read-only", "--security-opt", "no-new-privileges"]);
    run.extend(["--cap-drop", "ALL", "--cap-add", "NET_BIND_SERVICE"]);
    run.extend(ULIMITS);
    run.extend([tag.as_str(), "serve", "--listen", &listen, "--http-listen", &http_listen]);
    let started = podman(&run);
    assert!(started.status.success(), "podman run:\n{}", text(&started));

    let server = SocketAddr::from((ip, 53));
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let answer = dig(server, &["web.shop.svc.clusterset.local", "A", "+short", "+tries=1", "+time=1"]);
        if answer.trim() == "10.42.0.10" || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let logs = text(&podman(&["logs", &name]));
    assert_eq!(answer.trim(), "10.42.0.10", "dig over UDP on {server}; container log:\n{logs}");
    let tcp = dig(server, &["web.shop.svc.clusterset.local", "A", "+short", "+tcp"]);
    assert_eq!(tcp.trim(), "10.42.0.10", "dig over TCP");

    // The process as the kernel sees it.
    let pid = text(&podman(&["inspect", "--format", "{{.State.Pid}}", &name])).trim().to_owned();
    assert!(pid.parse::<u32>().is_ok_and(|p| p > 0), "container pid: {pid}");
    assert!(status(&pid, "Uid").split_whitespace().all(|u| u == "65532"), "Uid: {}", status(&pid, "Uid"));
    assert!(status(&pid, "Gid").split_whitespace().all(|g| g == "65532"), "Gid: {}", status(&pid, "Gid"));
    assert_eq!(status(&pid, "NoNewPrivs"), "1");
    // NET_BIND_SERVICE (bit 10) and nothing else, effective through the file capability.
    assert_eq!(status(&pid, "CapEff"), "0000000000000400");
    assert_eq!(status(&pid, "CapBnd"), "0000000000000400");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("read mountinfo");
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no root mount:\n{mountinfo}"));
    let options = root.split_whitespace().nth(5).unwrap_or_default();
    assert!(options.split(',').any(|o| o == "ro"), "the root file system is not read-only: {root}");
    podman(&["rm", "-f", "-t", "0", &name]);

    // Control: without NET_BIND_SERVICE the binary with the file capability
    // cannot even be executed, whatever port it would listen on.
    let denied = format!("{name}-denied");
    let mut run = vec!["run", "--name", &denied, "--label", &label, "--network", "host"];
    run.extend(["--user", "65532:65532", "--read-only", "--cap-drop", "ALL"]);
    run.extend(ULIMITS);
    run.extend([tag.as_str(), "serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]);
    let out = podman(&run);
    assert!(
        !out.status.success() && text(&out).contains("operation not permitted"),
        "without NET_BIND_SERVICE the container started:\n{}",
        text(&out)
    );
}
