#!/usr/bin/env python3
"""Hostile traffic bench: what DNS cookies and Response Rate Limiting cost,
how much a query can be amplified, and what one flooding source gets back;
this server against Knot DNS (knotd) and NSD, all in one run.

Usage (from the repository root, after a release build):

    cargo build --release --locked
    python3 benches/abuse.py --binary target/release/clusterset-dns \\
        [--runs 3] [--seconds 10] [--flood-rate 5000] [--flood-seconds 5] \\
        [--rrl-rate 100] [--rrl-slip 2] [--parts cost,amp,flood] [--workdir DIR]

The workload is benches/workload.py's (1,000 services, every
10th headless with 4 endpoints in each of 3 clusters; 100,000 queries).
Knot and NSD serve its zone file, we serve its objects.yaml; every server
gets one UDP worker and listens on 127.0.0.1 only, each configuration on a
port of its own, one server at a time, started and killed by this script
(also on error or Ctrl-C). Parts:

  cost   dnsperf (-l SECONDS -c 4 -Q 1000000 -q 200, as benches/peers.py) against
         each configuration: Knot plain (queries without and with a client
         cookie, which it ignores) / with mod-rrl (a rate it never reaches)
         / with mod-cookies and queries carrying client + server cookie
         (mod-cookies answers a client cookie alone with BADCOOKIE); NSD
         with rrl-ratelimit 0 and with a rate it never reaches; ours
         default (queries without cookies), with queries carrying a client
         cookie, or client + server cookie, --cookies false (queries
         without and with a client cookie), --rrl-rate it never reaches.
         Figure: queries per server CPU-second (utime + stime of the server
         and its children from /proc), and its ratio to plain Knot in the
         same run. The order of configurations rotates between runs.
  amp    one query per (name, type) over UDP: no EDNS, EDNS offering 4096,
         EDNS 4096 + a client cookie. Prints response/query size ratios.
  flood  one source (one UDP socket) sends FLOOD_RATE q/s for FLOOD_SECONDS
         s, with RRL off and on (--rrl-rate/--rrl-slip and the same for Knot
         and NSD): the workload's query mix, and, repeated, the query with
         the largest response/query ratio with EDNS 4096 for that server. Counts full answers, truncated (TC) ones,
         and lost queries, bytes out / bytes in, and server CPU. dnsperf at
         the same rate (-Q, -l) cross-checks the answered/lost counts.

Needs python3 (stdlib only), dnsperf, knotd, nsd. Prints raw lines while it
runs, then Markdown tables; all figures also go to WORKDIR/results.json.
"""
import argparse
import json
import os
import random
import re
import select
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
COOKIE_HEX = "0123456789abcdef"  # the 8-byte client cookie of cookie-carrying queries
TICK = os.sysconf("SC_CLK_TCK")
HIGH_RATE = 1000000  # an RRL rate no single source reaches here

QTYPES = {"A": 1, "NS": 2, "SOA": 6, "TXT": 16, "AAAA": 28, "SRV": 33, "ANY": 255}


# ---------------------------------------------------------------- DNS bytes

def encode_name(name):
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def query(name, qtype, qid=0, edns=None, cookie=False):
    """A query message; edns is the UDP size offered (None: no OPT record)."""
    arcount = 1 if edns else 0
    msg = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, arcount)
    msg += encode_name(name) + struct.pack(">HH", QTYPES[qtype], 1)
    if edns:
        opts = b""
        if cookie:
            opts = struct.pack(">HH", 10, 8) + bytes.fromhex(COOKIE_HEX)
        msg += b"\0" + struct.pack(">HHIH", 41, edns, 0, len(opts)) + opts
    return msg


def header(resp):
    """(id, tc, rcode, ancount) of a response."""
    qid, flags, _qd, an, _ns, _ar = struct.unpack(">HHHHHH", resp[:12])
    return qid, bool(flags & 0x0200), flags & 0x000F, an


def skip_name(msg, i):
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += n + 1


def cookie_of(resp):
    """The COOKIE option data (client + server cookie) of a response, or None."""
    _id, _fl, qd, an, ns, ar = struct.unpack(">HHHHHH", resp[:12])
    i = 12
    for _ in range(qd):
        i = skip_name(resp, i) + 4
    for n in range(an + ns + ar):
        i = skip_name(resp, i)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", resp[i:i + 10])
        i += 10
        if rtype == 41 and n >= an + ns:
            j = i
            while j + 4 <= i + rdlen:
                code, olen = struct.unpack(">HH", resp[j:j + 4])
                if code == 10:
                    return resp[j + 4:j + 4 + olen]
                j += 4 + olen
        i += rdlen
    return None


def ask(port, msg, timeout=1.0, tries=2):
    """Sends one query over UDP and returns the response bytes or None."""
    for _ in range(tries):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            s.sendto(msg, ("127.0.0.1", port))
            try:
                while True:
                    data, _ = s.recvfrom(65535)
                    if data[:2] == msg[:2]:
                        return data
            except socket.timeout:
                continue
    return None


# ---------------------------------------------------------------- processes

def cpu_seconds(pid):
    """utime + stime of pid and its descendants, in seconds."""
    return proctree.cpu_ticks(pid) / TICK


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
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            r = ask(port, query(PROBE, "A", 7), timeout=0.2, tries=1)
            if r and header(r)[3] > 0:
                return
            time.sleep(0.1)
        self.stop()
        with open(log) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"{name} did not answer on port {port}:\n{tail}")

    def cpu(self):
        return cpu_seconds(self.proc.pid)

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


# ---------------------------------------------------------------- configurations

def knot_conf(d, port, rrl=None, cookies=False):
    mods, globals_ = "", []
    if rrl:
        mods += f"mod-rrl:\n  - id: bench\n    rate-limit: {rrl[0]}\n    slip: {rrl[1]}\n"
        globals_.append("mod-rrl/bench")
    if cookies:
        mods += "mod-cookies:\n  - id: bench\n"
        globals_.append("mod-cookies/bench")
    glob = f"    global-module: [{', '.join(globals_)}]\n" if globals_ else ""
    return (f"server:\n    listen: 127.0.0.1@{port}\n    rundir: {d}\n"
            f"    udp-workers: 1\n    tcp-workers: 1\n"
            f"database:\n    storage: {d}\n{mods}"
            f"template:\n  - id: default\n    storage: {d}\n    semantic-checks: off\n{glob}"
            f"zone:\n  - domain: {ZONE}\n    file: {ZONE}.zone\n"
            f"log:\n  - target: stderr\n    any: error\n")


def nsd_conf(d, port, rrl=None):
    rate, slip = rrl if rrl else (0, 2)
    white = HIGH_RATE if rrl else 0
    return (f"server:\n    ip-address: 127.0.0.1@{port}\n    server-count: 1\n"
            f"    username: \"\"\n    zonesdir: {d}\n    database: \"\"\n"
            f"    pidfile: {d}/nsd.pid\n    xfrdfile: {d}/xfrd.state\n"
            f"    zonelistfile: {d}/zone.list\n"
            f"    rrl-ratelimit: {rate}\n    rrl-slip: {slip}\n"
            f"    rrl-whitelist-ratelimit: {white}\n"
            f"remote-control:\n    control-enable: no\n"
            f"zone:\n    name: {ZONE}\n    zonefile: {ZONE}.zone\n")


class Bench:
    def __init__(self, args):
        self.a = args
        self.work = args.workdir or tempfile.mkdtemp(prefix="abuse-")
        self.wl = os.path.join(self.work, "wl")
        self.next_port = args.base_port

    def port(self):
        self.next_port += 1
        return self.next_port

    def start(self, kind, tag, rrl=None, cookies=True, knot_cookies=False):
        """Starts one server configuration; returns the Server."""
        port = self.port()
        d = os.path.join(self.work, f"{tag}-{port}")
        os.makedirs(d, exist_ok=True)
        log = os.path.join(d, "log")
        if kind == "knot":
            shutil.copy(os.path.join(self.wl, f"{ZONE}.zone"), d)
            with open(os.path.join(d, "knot.conf"), "w") as f:
                f.write(knot_conf(d, port, rrl, knot_cookies))
            argv = ["knotd", "-c", os.path.join(d, "knot.conf")]
        elif kind == "nsd":
            shutil.copy(os.path.join(self.wl, f"{ZONE}.zone"), d)
            with open(os.path.join(d, "nsd.conf"), "w") as f:
                f.write(nsd_conf(d, port, rrl))
            argv = ["nsd", "-d", "-c", os.path.join(d, "nsd.conf")]
        else:
            argv = [self.a.binary, "serve", "--objects", os.path.join(self.wl, "objects.yaml"),
                    "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0",
                    "--udp-workers", "1", "--lameduck", "0",
                    "--cookies", "true" if cookies else "false"]
            if rrl:
                argv += ["--rrl-rate", str(rrl[0]), "--rrl-slip", str(rrl[1])]
        return Server(tag, argv, port, log)

    # ------------------------------------------------------------ dnsperf

    def dnsperf(self, port, qfile, seconds, qps, extra=(), clients=4, outstanding=200):
        argv = ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", qfile, "-l", str(seconds),
                "-c", str(clients), "-Q", str(qps), "-q", str(outstanding), *extra]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout

        def grab(pattern, cast=float):
            m = re.search(pattern, out)
            return cast(m.group(1)) if m else None
        return {
            "sent": grab(r"Queries sent:\s+(\d+)", int),
            "completed": grab(r"Queries completed:\s+(\d+)", int),
            "lost": grab(r"Queries lost:\s+(\d+)", int),
            "qps": grab(r"Queries per second:\s+([\d.]+)"),
            "latency": grab(r"Average Latency \(s\):\s+([\d.]+)"),
            "rcodes": (re.search(r"Response codes:\s+(.*)", out) or [None, ""])[1].strip(),
        }

    # ------------------------------------------------------------ part: cost

    # tag, kind, start kwargs, queries' COOKIE option: None, "client" (a
    # client cookie only) or "server" (client cookie + the server cookie this
    # server gave it, as a cookie-speaking resolver sends after its first query)
    COST = [
        ("knot", "knot", {}, None),
        ("ours", "ours", {}, None),
        ("nsd", "nsd", {}, None),
        ("ours-cookieq", "ours", {}, "client"),
        ("knot-rrl", "knot", {"rrl": (HIGH_RATE, 2)}, None),
        ("ours-nocookies", "ours", {"cookies": False}, None),
        ("knot-cookieq", "knot", {}, "client"),
        ("ours-servercookieq", "ours", {}, "server"),
        ("knot-cookies-servercookieq", "knot", {"knot_cookies": True}, "server"),
        ("ours-nocookies-cookieq", "ours", {"cookies": False}, "client"),
        ("nsd-rrl", "nsd", {"rrl": (HIGH_RATE, 2)}, None),
        ("ours-rrl", "ours", {"rrl": (HIGH_RATE, 2)}, None),
    ]

    def cost(self, run):
        order = self.COST[run * 3 % len(self.COST):] + self.COST[:run * 3 % len(self.COST)]
        if run % 2:
            order.reverse()
        res = {}
        for tag, kind, kw, cookieq in order:
            srv = self.start(kind, tag, **kw)
            try:
                extra = []
                if cookieq == "client":
                    extra = ["-E", f"10:{COOKIE_HEX}"]
                elif cookieq == "server":
                    r = ask(srv.port, query(PROBE, "A", 9, 4096, cookie=True))
                    ck = cookie_of(r) if r else None
                    if not ck or len(ck) < 16:
                        raise RuntimeError(f"{tag}: no server cookie in {r!r}")
                    extra = ["-E", f"10:{ck.hex()}"]
                c0 = srv.cpu()
                r = self.dnsperf(srv.port, os.path.join(self.wl, "queries.txt"), self.a.seconds,
                                 1000000, extra)
                cpu = srv.cpu() - c0
            finally:
                srv.stop()
            r["cpu_s"] = cpu
            r["q_per_cpu_s"] = (r["completed"] or 0) / cpu if cpu > 0 else 0
            res[tag] = r
            print(f"cost run={run + 1} {tag:24s} qps={r['qps']:.0f} server_cpu_s={cpu:.2f} "
                  f"q_per_cpu_s={r['q_per_cpu_s']:.0f} lost={r['lost']} rcodes={r['rcodes']}",
                  flush=True)
        return res

    # ------------------------------------------------------------ part: amp

    def amp_questions(self):
        h, c = "svc0.ns0.svc." + ZONE, "svc1.ns1.svc." + ZONE
        qs = [(ZONE, t) for t in ("SOA", "NS", "ANY", "TXT", "A", "AAAA")]
        qs += [("ns.dns." + ZONE, "A")]
        qs += [(c, t) for t in ("A", "AAAA", "SRV", "ANY", "TXT")]
        qs += [("_http._tcp." + c, "SRV")]
        qs += [(h, t) for t in ("A", "AAAA", "SRV", "ANY", "TXT")]
        qs += [("_http._tcp." + h, "SRV"), ("missing1.ns0.svc." + ZONE, "A")]
        return qs

    MODES = [("plain", None, False), ("edns4096", 4096, False), ("edns4096+cookie", 4096, True)]

    def amp(self):
        res = {}
        for kind in ("ours", "knot", "nsd"):
            srv = self.start(kind, f"amp-{kind}")
            try:
                rows = []
                for name, qt in self.amp_questions():
                    for mode, edns, ck in self.MODES:
                        q = query(name, qt, random.randrange(65536), edns, ck)
                        r = ask(srv.port, q)
                        if r is None:
                            rows.append([name, qt, mode, len(q), 0, None, None, None])
                            continue
                        _, tc, rcode, an = header(r)
                        rows.append([name, qt, mode, len(q), len(r), tc, rcode, an])
            finally:
                srv.stop()
            res[kind] = rows
            for row in rows:
                print(f"amp {kind:5s} {row[0]:42s} {row[1]:5s} {row[2]:16s} q={row[3]:3d} "
                      f"r={row[4]:5d} ratio={row[4] / row[3]:.2f} tc={row[5]} rcode={row[6]} an={row[7]}")
        return res

    # ------------------------------------------------------------ part: flood

    def flood(self, port, packets, rate, seconds):
        """One socket sends rate q/s for seconds s, cycling through packets,
        then waits 1 s for late answers. Returns counts and bytes."""
        total = int(rate * seconds)
        assert 0 < total <= 65536, "ids must stay unique: rate * seconds <= 65536"
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        seen = set()
        st = {"sent": 0, "bytes_in": 0, "full": 0, "truncated": 0, "badcookie": 0,
              "bytes_out": 0, "dup": 0, "send_errors": 0}

        def drain():
            while True:
                try:
                    data = s.recv(65535)
                except BlockingIOError:
                    return
                qid, tc, rcode, _an = header(data)
                if qid in seen:
                    st["dup"] += 1
                    continue
                seen.add(qid)
                st["bytes_out"] += len(data)
                if tc:
                    st["truncated"] += 1
                else:
                    st["full"] += 1

        try:
            t0 = time.monotonic()
            hard_stop = t0 + seconds * 3 + 5
            while st["sent"] < total and time.monotonic() < hard_stop:
                due = min(total, int((time.monotonic() - t0) * rate) + 1)
                while st["sent"] < due:
                    i = st["sent"]
                    p = packets[i % len(packets)]
                    msg = struct.pack(">H", i) + p[2:]
                    try:
                        s.sendto(msg, ("127.0.0.1", port))
                        st["bytes_in"] += len(msg)
                    except OSError:
                        st["send_errors"] += 1
                    st["sent"] += 1
                drain()
                select.select([s], [], [], 0.0005)
            st["send_seconds"] = time.monotonic() - t0
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                select.select([s], [], [], 0.05)
                drain()
        finally:
            s.close()
        st["answered"] = st["full"] + st["truncated"]
        st["lost"] = st["sent"] - st["answered"]
        return st

    def flood_part(self, run, worst):
        wl = []
        with open(os.path.join(self.wl, "queries.txt")) as f:
            for line in f:
                name, qt = line.split()
                wl.append(query(name, qt))
                if len(wl) >= 65536:
                    break
        rrl = (self.a.rrl_rate, self.a.rrl_slip)
        configs = [(k, on) for on in (False, True) for k in ("ours", "knot", "nsd")]
        if run % 2:
            configs.reverse()
        res = {}
        for kind, on in configs:
            tag = f"{kind}-rrl" if on else kind
            srv = self.start(kind, f"flood-{tag}", rrl=rrl if on else None)
            w = worst.get(kind, worst["ours"])
            sets = [("mix", wl), ("worst", [query(w[0], w[1], 0, 4096)])]
            try:
                for set_name, packets in sets:
                    c0 = srv.cpu()
                    st = self.flood(srv.port, packets, self.a.flood_rate, self.a.flood_seconds)
                    st["cpu_s"] = srv.cpu() - c0
                    res[f"{tag}/{set_name}"] = st
                    print(f"flood run={run + 1} {tag:9s} {set_name:5s} sent={st['sent']} "
                          f"full={st['full']} tc={st['truncated']} lost={st['lost']} "
                          f"bytes_in={st['bytes_in']} bytes_out={st['bytes_out']} "
                          f"out/in={st['bytes_out'] / max(1, st['bytes_in']):.2f} "
                          f"server_cpu_s={st['cpu_s']:.2f} send_s={st['send_seconds']:.2f}",
                          flush=True)
                    time.sleep(1.1)  # a fresh RRL second for the next set
                r = self.dnsperf(srv.port, os.path.join(self.wl, "queries.txt"),
                                 self.a.flood_seconds, self.a.flood_rate, clients=1,
                                 outstanding=self.a.flood_rate)
                res[f"{tag}/dnsperf"] = r
                print(f"flood run={run + 1} {tag:9s} dnsperf -Q {self.a.flood_rate} "
                      f"-l {self.a.flood_seconds}: sent={r['sent']} completed={r['completed']} "
                      f"lost={r['lost']} rcodes={r['rcodes']}", flush=True)
            finally:
                srv.stop()
        return res

    # ------------------------------------------------------------ main

    def main(self):
        parts = self.a.parts.split(",")
        subprocess.run([sys.executable, GEN, self.wl], check=True, stdout=subprocess.DEVNULL)
        results = {"args": vars(self.a), "runs": []}
        # The flood's "worst" query: per server, the largest response/query
        # ratio with EDNS 4096 found by the amp part.
        worst = {"ours": ("svc0.ns0.svc." + ZONE, "SRV")}
        if "amp" in parts:
            results["amp"] = self.amp()
            for kind, rows in results["amp"].items():
                best = max((r for r in rows if r[4] and r[2] == "edns4096"), key=lambda r: r[4] / r[3])
                worst[kind] = (best[0], best[1])
                print(f"amp: largest EDNS ratio of {kind}: {best[0]} {best[1]} "
                      f"{best[4]}/{best[3]} = {best[4] / best[3]:.2f}", flush=True)
        results["worst"] = worst
        for run in range(self.a.runs):
            one = {"load": os.getloadavg()[0]}
            if "cost" in parts:
                one["cost"] = self.cost(run)
            if "flood" in parts:
                one["flood"] = self.flood_part(run, worst)
            results["runs"].append(one)
            with open(os.path.join(self.work, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
        self.report(results)
        print(f"results: {os.path.join(self.work, 'results.json')}")

    def report(self, res):
        runs = res["runs"]
        if runs and "cost" in runs[0]:
            tags = [t for t, *_ in self.COST]
            print("\n| configuration | " + " | ".join(f"run {i + 1} q/cpu-s (÷ Knot)"
                                                     for i in range(len(runs))) + " |")
            print("|---|" + "---|" * len(runs))
            for t in tags:
                cells = []
                for r in runs:
                    c = r["cost"]
                    cells.append(f"{c[t]['q_per_cpu_s']:,.0f} ({c[t]['q_per_cpu_s'] / c['knot']['q_per_cpu_s']:.2f})")
                print(f"| {t} | " + " | ".join(cells) + " |")
        if "amp" in res:
            print("\n| server | mode | largest response/query | query |")
            print("|---|---|---|---|")
            for kind, rows in res["amp"].items():
                for mode, *_ in self.MODES:
                    rs = [r for r in rows if r[2] == mode and r[4]]
                    b = max(rs, key=lambda r: r[4] / r[3])
                    print(f"| {kind} | {mode} | {b[4]}/{b[3]} = {b[4] / b[3]:.2f} | {b[0]} {b[1]} |")
        if runs and "flood" in runs[0]:
            print("\n| run | server | queries | sent | full | TC | lost | answers/s | out/in bytes | dnsperf completed/lost |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for i, r in enumerate(runs):
                for key, st in r["flood"].items():
                    tag, set_name = key.split("/")
                    if set_name == "dnsperf":
                        continue
                    dp = r["flood"][f"{tag}/dnsperf"]
                    secs = self.a.flood_seconds
                    print(f"| {i + 1} | {tag} | {set_name} | {st['sent']} | {st['full']} | "
                          f"{st['truncated']} | {st['lost']} | {st['answered'] / secs:,.0f} | "
                          f"{st['bytes_out'] / max(1, st['bytes_in']):.2f} | "
                          f"{dp['completed']}/{dp['lost']} |")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="target/release/clusterset-dns")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10, help="dnsperf -l of the cost part")
    p.add_argument("--flood-rate", type=int, default=5000)
    p.add_argument("--flood-seconds", type=int, default=5)
    p.add_argument("--rrl-rate", type=int, default=100)
    p.add_argument("--rrl-slip", type=int, default=2)
    p.add_argument("--parts", default="cost,amp,flood")
    p.add_argument("--workdir")
    p.add_argument("--base-port", type=int, default=5400)
    a = p.parse_args()
    if not 1 <= a.runs <= 10 or not 1 <= a.seconds <= 60 or not 1 <= a.flood_seconds <= 30:
        p.error("--runs 1-10, --seconds 1-60, --flood-seconds 1-30")
    if a.flood_rate * a.flood_seconds > 65536:
        p.error("--flood-rate × --flood-seconds must be at most 65,536 (one query id each)")
    for tool in ("dnsperf", "knotd", "nsd"):
        if not shutil.which(tool):
            p.error(f"{tool} is not on PATH (apt-get install dnsperf knot nsd)")
    a.binary = os.path.abspath(a.binary)
    return a


if __name__ == "__main__":
    args = parse_args()

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        Bench(args).main()
    finally:
        Server.stop_all()
