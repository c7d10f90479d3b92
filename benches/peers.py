#!/usr/bin/env python3
"""What a query costs this server against Knot DNS and NSD (and hickory-dns
when it is on PATH): the same workload, one UDP worker each, one run.

Usage, from the repository root after `cargo build --release --locked`:

    python3 benches/peers.py [--seconds 10] [--ours "COMMAND"]
        [--gen "WORKLOAD ARGS"] [--workdir DIR] [--samples 60]

  --ours     how to start this server in the foreground; {OBJECTS} and
             {PORT} are replaced by the workload's objects file and the port.
             Default: target/release/clusterset-dns serve --objects {OBJECTS}
             --listen 127.0.0.1:{PORT} --udp-workers 1 --lameduck 0
             --http-listen 127.0.0.1:0. An empty string measures the peers only.
  --gen      arguments for benches/workload.py, e.g. the fleet-scale run:
             --gen "--services 100000 --namespaces 100 --clusters 10 --queries 200000"
  --samples  distinct queries whose answers must agree between servers.

What it installs: when knotd, nsd or dnsperf is missing, the Debian packages
knot, nsd and dnsperf (apt-get, through sudo unless root). dig (package
bind9-dnsutils) must be there already; hickory-dns is measured only when it
is on PATH (BENCHMARKS.md says how to build it; run as root, it has needed a
group named `nobody`, which Debian lacks: `groupadd -f nobody`).

What runs: benches/workload.py writes the workload into WORKDIR/wl (a
temporary directory unless --workdir). Knot DNS (udp-workers 1,
tcp-workers 1) and NSD (server-count 1, rate limiting off) serve its zone
file, hickory-dns (--workers 1) too, this server its objects file; each
listens on 127.0.0.1 on a port of its own, with logging at error level.
All are started one after the other and stay up until the end. Nothing is
pinned to a CPU: the figure is CPU time, which is the same wherever the
scheduler puts it.

Before anything is measured, the first SAMPLES distinct lines of
queries.txt are asked of every server with dig, and besides them, for the
first service of each kind, its A, its `_http._tcp.` SRV and its bare
name's SRV, the A of a headless endpoint's name and dns-version's TXT:
the rcode and answer section (records sorted, names lower-cased) must be
the same everywhere; otherwise the servers would not be doing the same
work, and the script stops and prints the difference.

How it counts, for each server in turn (the others idle):
  dnsperf -s 127.0.0.1 -p PORT -d queries.txt -l SECONDS -c 4 -Q 1000000 -q 200
  server_cpu_s   utime + stime from /proc/PID/stat, summed over the
                 server's process and all its descendants (threads are in
                 their process's figure), after minus before the run.
  q_per_cpu_s    queries completed / server_cpu_s: THE figure. On a 2-core
                 machine the load generator, not the server, usually sets
                 the queries per second, so raw qps says little.
  ready_s        from the start of the process to the first A answer for
                 svc1.ns1.svc.clusterset.local (dig every 0.1 s), with the
                 time to load the workload.
  peak_rss_mb    VmHWM summed over the process tree after the load. A
                 forking server (NSD: a parent, xfrd and a server child) has
                 pages the processes share counted once per process, so
                 pss_mb beside it is Pss from /proc/PID/smaps_rollup summed
                 over the tree, which counts each shared page once.
Then the ratio of ours to each peer for q_per_cpu_s, and ready_s and
peak_rss_mb side by side. Exits non-zero when a server does not answer or
the answers differ.
"""
import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import proctree  # noqa: E402  (benches/proctree.py)
import workload  # noqa: E402  (benches/workload.py, beside this file)

OURS = ("target/release/clusterset-dns serve --objects {OBJECTS} --listen 127.0.0.1:{PORT} "
        "--udp-workers 1 --lameduck 0 --http-listen 127.0.0.1:0")
PROBE = f"svc1.ns1.svc.{workload.ZONE}"
TICK = os.sysconf("SC_CLK_TCK")
PORTS = {"knot": 5301, "nsd": 5302, "hickory-dns": 5303, "ours": 5310}
READY_TIMEOUT_S = 300


def install_missing():
    """Installs Knot DNS, NSD and dnsperf from Debian packages when a tool is missing."""
    missing = [pkg for tool, pkg in (("knotd", "knot"), ("nsd", "nsd"), ("dnsperf", "dnsperf"))
               if shutil.which(tool) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        sys.exit(f"missing {' '.join(missing)} and no apt-get to install them with")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"installing {' '.join(missing)} (Debian packages)", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    # Where systemd runs, the packages start services of their own (on port
    # 53, not ours); the servers measured are started by hand below.
    if os.path.isdir("/run/systemd/system"):
        for service in ("knot", "nsd"):
            subprocess.run(sudo + ["systemctl", "disable", "--now", service],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def knot(d, port, zone):
    with open(os.path.join(d, "knot.conf"), "w") as f:
        f.write(f"""server:
    listen: 127.0.0.1@{port}
    rundir: {d}
    udp-workers: 1
    tcp-workers: 1
database:
    storage: {d}
template:
  - id: default
    storage: {d}
    semantic-checks: off
zone:
  - domain: {workload.ZONE}
    file: {zone}
log:
  - target: stderr
    any: error
""")
    return ["knotd", "-c", os.path.join(d, "knot.conf")]


def nsd(d, port, zone):
    with open(os.path.join(d, "nsd.conf"), "w") as f:
        f.write(f"""server:
    ip-address: 127.0.0.1@{port}
    server-count: 1
    username: ""
    zonesdir: {d}
    database: ""
    pidfile: {d}/nsd.pid
    xfrdfile: {d}/xfrd.state
    zonelistfile: {d}/zone.list
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
    verbosity: 0
remote-control:
    control-enable: no
zone:
    name: {workload.ZONE}
    zonefile: {zone}
""")
    return ["nsd", "-d", "-c", os.path.join(d, "nsd.conf")]


def hickory(d, port, zone):
    with open(os.path.join(d, "named.toml"), "w") as f:
        f.write(f'listen_addrs_ipv4 = ["127.0.0.1"]\n[[zones]]\nzone = "{workload.ZONE}"\n'
                f'zone_type = "Primary"\nfile = "{zone}"\n')
    return ["hickory-dns", "-q", "--workers", "1", "-c", os.path.join(d, "named.toml"),
            "-z", d, "-p", str(port)]


def memory_mb(pid):
    """(sum of VmHWM, sum of Pss) over pid's process tree, in MB."""
    hwm = pss = 0
    for p in proctree.descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                hwm += next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
            with open(f"/proc/{p}/smaps_rollup") as f:
                pss += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except OSError:
            continue
    return hwm // 1024, pss // 1024


def dig(port, name, qtype, timeout=1, tries=1):
    """(rcode, sorted answer records) from one dig, or (None, []) without an answer."""
    out = subprocess.run(
        ["dig", "@127.0.0.1", "-p", str(port), f"+time={timeout}", f"+tries={tries}", "+norecurse",
         "+nocookie", "+noall", "+comments", "+answer", name, qtype],
        capture_output=True, text=True).stdout
    rcode = None
    records = []
    for line in out.splitlines():
        if "->>HEADER<<-" in line:
            rcode = line.split("status:")[1].split(",")[0].strip()
        elif line and not line.startswith(";"):
            records.append(" ".join(line.lower().split()))
    return rcode, sorted(records)


class Server:
    def __init__(self, name, argv, port, log):
        self.name, self.port = name, port
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ready_s = None

    def wait_ready(self):
        deadline = self.started + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            rcode, records = dig(self.port, PROBE, "A")
            if rcode == "NOERROR" and records:
                self.ready_s = time.monotonic() - self.started
                return
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: no answer for {PROBE} on port {self.port} "
                         f"(exit status {self.proc.poll()}); see its log in the work directory")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def check_answers(servers, queries, samples, names):
    """The first `samples` distinct queries, and a query of every kind, get
    the same answers everywhere."""
    asked, seen = [], set()
    with open(queries) as f:
        for line in f:
            if len(asked) == samples:
                break
            if line not in seen:
                seen.add(line)
                asked.append(line.split())
    for kind in ("clusterset_ip", "headless"):
        for service in names[kind][:1]:
            name = f"{service}.{workload.ZONE}"
            asked += [[name, "A"], [f"_{workload.PORT_NAME}._tcp.{name}", "SRV"], [name, "SRV"]]
    for host in names["hosts"][:1]:
        asked.append([f"{host}.{workload.ZONE}", "A"])
    asked.append([f"dns-version.{workload.ZONE}", "TXT"])
    first, differ = servers[0], []
    for name, qtype in asked:
        want = dig(first.port, name, qtype, timeout=2, tries=2)
        for s in servers[1:]:
            got = dig(s.port, name, qtype, timeout=2, tries=2)
            if got != want:
                differ.append(f"{name} {qtype}\n  {first.name}: {want}\n  {s.name}: {got}")
    if differ:
        print("\n".join(differ), file=sys.stderr)
        raise SystemExit(f"{len(differ)} answers differ: the servers would not do the same work")
    print(f"answers agree: {len(asked)} distinct queries, {len(servers)} servers", flush=True)


def measure(s, queries, seconds):
    before = proctree.cpu_ticks(s.proc.pid)
    out = subprocess.run(["dnsperf", "-s", "127.0.0.1", "-p", str(s.port), "-d", queries,
                          "-l", str(seconds), "-c", "4", "-Q", "1000000", "-q", "200"],
                         capture_output=True, text=True).stdout
    cpu_s = (proctree.cpu_ticks(s.proc.pid) - before) / TICK

    def field(label, index):
        line = next((l for l in out.splitlines() if label in l), None)
        return line.split()[index] if line else "?"
    completed = int(field("Queries completed", 2))
    hwm, pss = memory_mb(s.proc.pid)
    row = {"qps": int(float(field("Queries per second", 3))), "server_cpu_s": round(cpu_s, 2),
           "q_per_cpu_s": int(completed / cpu_s) if cpu_s else 0,
           "avg_latency_s": field("Average Latency", 3), "lost": field("Queries lost", 2),
           "ready_s": f"{s.ready_s:.2f}", "peak_rss_mb": hwm, "pss_mb": pss}
    print(f"{s.name:<12} " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--ours", default=OURS)
    p.add_argument("--gen", default="")
    p.add_argument("--workdir")
    p.add_argument("--samples", type=int, default=60)
    a = p.parse_args()
    # Killed or hung up: still stop the servers (the `finally` below).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))
    install_missing()
    if shutil.which("dig") is None:
        sys.exit("dig is missing (apt-get install bind9-dnsutils)")
    work = a.workdir or tempfile.mkdtemp(prefix="peers-")
    wl = os.path.join(work, "wl")
    gen = workload.arguments([wl, *shlex.split(a.gen)])
    objects, queries, names = workload.write(gen)
    print(f"workload: {gen.services} services, {objects} objects, {queries} queries in {wl}", flush=True)
    zone = os.path.join(wl, f"{workload.ZONE}.zone")
    peers = [("knot", knot), ("nsd", nsd)]
    if shutil.which("hickory-dns"):
        peers.append(("hickory-dns", hickory))
    servers = []
    try:
        for name, config in peers:
            d = os.path.join(work, name)
            os.makedirs(d, exist_ok=True)
            shutil.copy(zone, d)
            argv = config(d, PORTS[name], os.path.basename(zone))
            servers.append(Server(name, argv, PORTS[name], open(os.path.join(d, "log"), "w")))
            servers[-1].wait_ready()
        if a.ours:
            cmd = a.ours.replace("{OBJECTS}", os.path.join(wl, "objects.yaml"))
            cmd = cmd.replace("{PORT}", str(PORTS["ours"]))
            servers.append(Server("ours", shlex.split(cmd), PORTS["ours"],
                                  open(os.path.join(work, "ours.log"), "w")))
            servers[-1].wait_ready()
        check_answers(servers[::-1], os.path.join(wl, "queries.txt"), a.samples, names)
        rows = {s.name: measure(s, os.path.join(wl, "queries.txt"), a.seconds) for s in servers}
    finally:
        for s in servers:
            s.stop()
    if "ours" in rows:
        ours = rows["ours"]
        for name, row in rows.items():
            if name != "ours" and row["q_per_cpu_s"]:
                print(f"ratio ours/{name} q_per_cpu_s: {ours['q_per_cpu_s'] / row['q_per_cpu_s']:.2f}")
        for name in ("knot", "nsd"):
            row = rows[name]
            print(f"startup ours/{name}: ready_s {ours['ready_s']}/{row['ready_s']}, "
                  f"peak_rss_mb {ours['peak_rss_mb']}/{row['peak_rss_mb']}, "
                  f"pss_mb {ours['pss_mb']}/{row['pss_mb']}")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
