#!/usr/bin/env python3
"""TCP answers and /health while `serve` reloads a large objects file.

Starts BINARY `serve --objects DIR` on loopback, waits until it is ready,
then keeps one TCP connection asking `A` for a name of the fleet every 5 ms
and polls `/health` every 20 ms, each request timed, while SIGHUP makes the
server read, parse, apply and publish every object again. Prints p50, p99
and max of both during the reload (from SIGHUP to the log line saying the
file was loaded plus the publish after it) and outside it.

Bounded: at most --seconds of load, every request has a 2 s timeout, the
server is killed at the end (and when this script is killed: it runs in the
script's own process group, SIGKILLed by the trap in --help's usage).

usage: benches/reload_latency.py BINARY OBJECTS_DIR NAME [--seconds 60] [--swap FILE]
  OBJECTS_DIR from python3 benches/workload.py DIR --services 100000
  NAME: a name the fleet answers, e.g. svc1.ns1.svc.clusterset.local
"""
import argparse, os, signal, socket, struct, subprocess, sys, threading, time, urllib.request

p = argparse.ArgumentParser()
p.add_argument("binary")
p.add_argument("objects")
p.add_argument("name")
p.add_argument("--seconds", type=float, default=60.0)
p.add_argument("--swap", help="instead of SIGHUP, rename this file over OBJECTS_DIR/objects.yaml (a real change)")
a = p.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


dns_port, http_port = free_port(), free_port()
server = subprocess.Popen(
    [a.binary, "serve", "--objects", a.objects, "--memory-limit", "none",
     "--listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
log = []
threading.Thread(target=lambda: [log.append((time.monotonic(), l)) for l in server.stderr], daemon=True).start()


def stop(*_):
    server.kill()
    sys.exit(1)


signal.signal(signal.SIGTERM, stop)
deadline = time.monotonic() + a.seconds


def get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=2) as r:
        return r.status


started = time.monotonic()
while True:
    try:
        if get("/ready") == 200:
            break
    except Exception:
        pass
    if time.monotonic() > deadline or server.poll() is not None:
        print("server not ready", file=sys.stderr)
        stop()
    time.sleep(0.05)
print(f"ready after {time.monotonic() - started:.1f} s")


def query(name):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", 1, 1)
    return struct.pack(">H", len(q)) + q


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


tcp, health = [], []
stop_load = threading.Event()


def tcp_loop():
    msg = query(a.name)
    s = None
    while not stop_load.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            if s is None:
                s = socket.create_connection(("127.0.0.1", dns_port), timeout=2)
            s.sendall(msg)
            n = struct.unpack(">H", recv_exact(s, 2))[0]
            recv_exact(s, n)
            tcp.append((t0, time.monotonic() - t0))
        except OSError:
            tcp.append((t0, 2.0))
            s = None
        time.sleep(0.005)


def health_loop():
    while not stop_load.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            get("/health")
            health.append((t0, time.monotonic() - t0))
        except Exception:
            health.append((t0, 2.0))
        time.sleep(0.02)


threads = [threading.Thread(target=tcp_loop), threading.Thread(target=health_loop)]
for t in threads:
    t.start()
time.sleep(2)
hup = time.monotonic()
before = len(log)
if a.swap:
    os.rename(a.swap, os.path.join(a.objects, "objects.yaml"))
else:
    server.send_signal(signal.SIGHUP)
done = None
while time.monotonic() < deadline and done is None:
    for at, line in log[before:]:
        if "loaded objects" in line:
            done = at
    time.sleep(0.05)
time.sleep(2)
stop_load.set()
for t in threads:
    t.join()
server.kill()
if done is None:
    print("reload not finished in time", file=sys.stderr)
    sys.exit(1)
# The publish follows the load line; the window ends 2 s later at most.
end = done + 1.0


def report(what, samples):
    inside = sorted(d for t, d in samples if hup <= t <= end)
    outside = sorted(d for t, d in samples if t < hup or t > end)

    def q(v, f):
        return v[min(len(v) - 1, int(f * len(v)))] * 1000 if v else float("nan")

    for where, v in (("during the reload", inside), ("outside it", outside)):
        print(f"| {what} {where} | {len(v)} | {q(v, .5):.1f} ms | {q(v, .99):.1f} ms | {(v[-1] * 1000 if v else float('nan')):.1f} ms |")


print(f"reload: file loaded {done - hup:.2f} s after SIGHUP")
print("| what | n | p50 | p99 | max |\n|---|---|---|---|---|")
report("TCP query", tcp)
report("/health", health)
