#!/usr/bin/env python3
"""Slow TCP clients against a fresh one: this server, Knot DNS (knotd) and
NSD, one after the other in one run.

Usage (from the repository root, after a release build):

    cargo build --release --locked
    python3 benches/tcp_hold.py --binary target/release/clusterset-dns \\
        [--connections 2049] [--addresses 250] [--servers knot,knot-cpus,nsd,ours] \\
        [--baseline OTHER_BUILD] [--ours-nofile N] [--rounds 1] [--workdir DIR]

For each server: open CONNECTIONS TCP connections from ADDRESSES loopback
addresses (127.20.x.y, never 127.0.0.1; each client socket bound to its
address before connecting, connection i from address i mod ADDRESSES),
one after the other, each sending one byte, the first of a two-byte length
prefix, as soon as it is connected, and then nothing. Connects are
non-blocking (the next starts after at most 10 ms) and the hold phase ends
after at most --hold-seconds. --settle seconds later, one fresh TCP query
from 127.0.0.1 (A for svc1.ns1.svc.clusterset.local), bounded by
--fresh-seconds. Prints per server:

  opened    hold connects completed. A client's connect() returns on the
            server's SYN-ACK; when the server's accept queue is full its
            kernel drops SYNs (retried by the client after 1, 3, 7 s) and
            the final ACKs of handshakes (the server's side then stays in
            SYN-RECV), so this counts more than the server took
  held      the server's own TCP sockets on its port in ESTABLISHED state
            (accepted: in /proc/PID/fd), and queued ones (ESTABLISHED in
            /proc/net/tcp, not accepted), just before the fresh query
  connect   seconds until the fresh client's connect() returned
  answer    seconds until its answer was read in full (RCODE NOERROR and
            at least one answer record), or "none" within --fresh-seconds
  closed    hold connections the server had closed (EOF or reset) once
            the fresh query was over

Every server runs with its defaults for TCP and one UDP worker, as
benches/peers.py configures them: "knot" also with one TCP
worker, as there; "knot-cpus" with Knot's default worker counts (one TCP
worker per CPU: our TCP connections run on a two-thread runtime whatever
--udp-workers says). --baseline runs another build of ours as server
"ours-before", with the same flags; --ours-nofile N runs both under a
limit of N open files (util-linux's prlimit). Each listens on 127.0.0.1, on a port of its own, and
is killed by this script (also on error or Ctrl-C). The zone is
benches/workload.py's (Knot and NSD serve its zone file, ours
its objects.yaml). Every hold socket is closed before the next server
starts. Needs python3 (stdlib only), knotd, nsd (apt-get install knot
nsd), and CONNECTIONS + 100 open files (the soft limit is raised to that
when the hard one allows).
"""
import argparse
import errno
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proctree  # noqa: E402  (benches/proctree.py)

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "workload.py")
ZONE = "clusterset.local"
PROBE = "svc1.ns1.svc.clusterset.local"


# ---------------------------------------------------------------- DNS bytes

def query(name, qid):
    """An A query without EDNS."""
    q = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack(">HH", 1, 1)


def answered(resp, qid):
    """True for a NOERROR response to qid with at least one answer record."""
    if len(resp) < 12:
        return False
    rid, flags, _, an, _, _ = struct.unpack(">HHHHHH", resp[:12])
    return rid == qid and flags & 0x8000 and flags & 0xF == 0 and an > 0


def udp_answers(port, timeout=0.2):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(query(PROBE, 7), ("127.0.0.1", port))
        try:
            return answered(s.recv(65535), 7)
        except OSError:
            return False


# ---------------------------------------------------------------- processes

def established_on(port):
    """Inodes of the ESTABLISHED TCP sockets whose local port is `port`:
    the server's side of every connection, accepted or still queued."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "01" and int(local.split(":")[1], 16) == port:
                inodes.add(inode)
    return inodes


def socket_inodes(pid):
    """Inodes of every socket open in pid and its descendants."""
    inodes = set()
    for p in proctree.descendants(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


class Server:
    """A server process in its own process group, killed on stop()."""

    live = []

    def __init__(self, name, argv, port, log):
        self.name, self.port = name, port
        self.logf = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        Server.live.append(self)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            if udp_answers(port):
                return
            time.sleep(0.1)
        self.stop()
        with open(log) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"{name} did not answer on port {port}:\n{tail}")

    def stop(self):
        if self in Server.live:
            Server.live.remove(self)
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
        self.logf.close()

    @classmethod
    def stop_all(cls):
        for s in list(cls.live):
            s.stop()


def start(kind, binary, baseline, nofile, work, wl, port):
    d = os.path.join(work, f"{kind}-{port}")
    os.makedirs(d, exist_ok=True)
    if kind in ("knot", "knot-cpus"):
        # "knot" as peers.py runs it; "knot-cpus" with Knot's own default
        # worker counts (one TCP worker per CPU).
        workers = "    udp-workers: 1\n    tcp-workers: 1\n" if kind == "knot" else ""
        shutil.copy(os.path.join(wl, f"{ZONE}.zone"), d)
        with open(os.path.join(d, "knot.conf"), "w") as f:
            f.write(f"server:\n    listen: 127.0.0.1@{port}\n    rundir: {d}\n{workers}"
                    f"database:\n    storage: {d}\n"
                    f"template:\n  - id: default\n    storage: {d}\n    semantic-checks: off\n"
                    f"zone:\n  - domain: {ZONE}\n    file: {ZONE}.zone\n"
                    f"log:\n  - target: stderr\n    any: error\n")
        argv = ["knotd", "-c", os.path.join(d, "knot.conf")]
    elif kind == "nsd":
        shutil.copy(os.path.join(wl, f"{ZONE}.zone"), d)
        with open(os.path.join(d, "nsd.conf"), "w") as f:
            f.write(f"server:\n    ip-address: 127.0.0.1@{port}\n    server-count: 1\n"
                    f"    username: \"\"\n    zonesdir: {d}\n    database: \"\"\n"
                    f"    pidfile: {d}/nsd.pid\n    xfrdfile: {d}/xfrd.state\n"
                    f"    zonelistfile: {d}/zone.list\n"
                    f"    rrl-ratelimit: 0\n    rrl-whitelist-ratelimit: 0\n"
                    f"remote-control:\n    control-enable: no\n"
                    f"zone:\n    name: {ZONE}\n    zonefile: {ZONE}.zone\n")
        argv = ["nsd", "-d", "-c", os.path.join(d, "nsd.conf")]
    else:
        binary = baseline if kind == "ours-before" else binary
        argv = [binary, "serve", "--objects", os.path.join(wl, "objects.yaml"),
                "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0",
                "--udp-workers", "1", "--lameduck", "0"]
        if nofile:
            argv = ["prlimit", f"--nofile={nofile}:{nofile}", "--"] + argv
    return Server(kind, argv, port, os.path.join(d, "log"))


# ---------------------------------------------------------------- the scenario

def source(i, addresses):
    """The loopback address of hold connection i: 127.20.x.y, y in 1..250."""
    k = i % addresses
    return f"127.20.{k // 250}.{k % 250 + 1}"


def hold(port, connections, addresses, seconds):
    """Opens the hold connections one after the other, non-blocking: each
    sends its byte as soon as its connect completes (waiting at most 10 ms
    for that before the next one starts; later completions are served
    while the others are opened). Returns (sockets, connects completed,
    failed connects)."""
    sel = selectors.DefaultSelector()
    socks, done = [], {"opened": 0, "failed": 0}
    deadline = time.monotonic() + seconds

    def serve_ready(timeout):
        for key, _ in sel.select(timeout=timeout):
            s = key.fileobj
            sel.unregister(s)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                done["failed"] += 1
                continue
            done["opened"] += 1
            try:
                s.send(b"\0")  # the first byte of a length prefix, never the second
            except OSError:
                pass

    for i in range(connections):
        if time.monotonic() >= deadline:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        socks.append(s)
        s.setblocking(False)
        s.bind((source(i, addresses), 0))
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            done["failed"] += 1
            continue
        sel.register(s, selectors.EVENT_WRITE)
        # This one's completion, if it comes at once, and any earlier ones.
        wait_until = min(deadline, time.monotonic() + 0.01)
        while s in sel.get_map() and time.monotonic() < wait_until:
            serve_ready(max(0.0, wait_until - time.monotonic()))
        serve_ready(0)
    while sel.get_map() and time.monotonic() < deadline:
        serve_ready(max(0.0, deadline - time.monotonic()))
    sel.close()
    return socks, done["opened"], done["failed"]


def server_closed(s):
    """True when the server closed s (EOF or reset); False while it is open."""
    try:
        return s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def fresh(port, seconds, qid):
    """One query on a new connection from 127.0.0.1: (connect s, answer s or
    None), both from the start of the connect."""
    msg = query(PROBE, qid)
    t0 = time.monotonic()
    deadline = t0 + seconds
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(seconds)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return None, None
        connect = time.monotonic() - t0
        buf = b""
        try:
            s.sendall(struct.pack(">H", len(msg)) + msg)
            while time.monotonic() < deadline:
                s.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = s.recv(65537)
                if not chunk:
                    break
                buf += chunk
                if len(buf) >= 2 and len(buf) >= 2 + struct.unpack(">H", buf[:2])[0]:
                    n = struct.unpack(">H", buf[:2])[0]
                    if answered(buf[2:2 + n], qid):
                        return connect, time.monotonic() - t0
                    break
        except OSError:
            pass
        return connect, None


def run_one(kind, a, work, wl, port, round_):
    srv = start(kind, a.binary, a.baseline, a.ours_nofile, work, wl, port)
    socks = []
    try:
        before = established_on(port)
        t0 = time.monotonic()
        socks, opened, failed = hold(port, a.connections, a.addresses, a.hold_seconds)
        hold_s = time.monotonic() - t0
        time.sleep(a.settle)
        est = established_on(port) - before
        mine = socket_inodes(srv.proc.pid)
        accepted = len(est & mine)
        queued = len(est) - accepted
        connect, answer = fresh(port, a.fresh_seconds, 4242 + round_)
        closed = sum(1 for s in socks if server_closed(s))
        row = dict(server=kind, round=round_ + 1, opened=opened, failed=failed,
                   hold_s=hold_s, accepted=accepted, queued=queued,
                   connect=connect, answer=answer, closed=closed)
        show = lambda v: "none" if v is None else f"{v:.4f}"
        print(f"{kind:9} round={round_ + 1} opened={opened} failed={failed} hold_s={hold_s:.2f} "
              f"held_accepted={accepted} held_queued={queued} connect_s={show(connect)} "
              f"answer_s={show(answer)} closed_by_server={closed}", flush=True)
        return row
    finally:
        for s in socks:
            s.close()
        srv.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="target/release/clusterset-dns")
    p.add_argument("--connections", type=int, default=2049)
    p.add_argument("--addresses", type=int, default=250)
    p.add_argument("--servers", default="knot,knot-cpus,nsd,ours")
    p.add_argument("--baseline", help="another build of ours, run as server ours-before")
    p.add_argument("--ours-nofile", type=int,
                   help="run ours (both builds) under this limit of open files (prlimit)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--hold-seconds", type=float, default=5.0,
                   help="the hold phase ends after this, connected or not")
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds between the hold phase and the fresh query")
    p.add_argument("--fresh-seconds", type=float, default=10.0)
    p.add_argument("--base-port", type=int, default=5500)
    p.add_argument("--workdir")
    a = p.parse_args()
    if not (1 <= a.connections <= 20000 and 1 <= a.addresses <= 250 * 250
            and 1 <= a.rounds <= 10 and 0 < a.hold_seconds <= 30 and 0 < a.fresh_seconds <= 30
            and 0 <= a.settle <= 10):
        p.error("--connections 1-20000, --addresses 1-62500, --rounds 1-10, "
                "--hold-seconds and --fresh-seconds up to 30, --settle up to 10")
    servers = a.servers.split(",")
    if a.baseline:
        servers.append("ours-before")
        a.baseline = os.path.abspath(a.baseline)
    if not set(servers) <= {"knot", "knot-cpus", "nsd", "ours", "ours-before"}:
        p.error("--servers: a comma list of knot, knot-cpus, nsd, ours")
    for tool, kind in (("knotd", "knot"), ("knotd", "knot-cpus"), ("nsd", "nsd")):
        if kind in servers and not shutil.which(tool):
            p.error(f"{tool} is not on PATH (apt-get install knot nsd)")
    a.binary = os.path.abspath(a.binary)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.connections + 100
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            p.error(f"the file descriptor limit ({hard}) is below {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    work = a.workdir or tempfile.mkdtemp(prefix="tcp-hold-")
    wl = os.path.join(work, "wl")
    subprocess.run([sys.executable, GEN, wl, "--queries", "10"], check=True, stdout=subprocess.DEVNULL)
    rows, port = [], a.base_port
    for r in range(a.rounds):
        for kind in servers:
            port += 1
            rows.append(run_one(kind, a, work, wl, port, r))
    show = lambda v: "none" if v is None else (f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s")
    print()
    print("| server | round | connects completed | held: accepted + queued | "
          "fresh query: connected | fresh query: answered | hold connections closed by the server |")
    print("|---|---|---|---|---|---|---|")
    for w in rows:
        print(f"| {w['server']} | {w['round']} | {w['opened']} | {w['accepted']} + {w['queued']} | "
              f"{show(w['connect'])} | {show(w['answer'])} | {w['closed']} |")


if __name__ == "__main__":
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        main()
    finally:
        Server.stop_all()
