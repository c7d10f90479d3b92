#!/usr/bin/env python3
"""Run the Pods KWOK schedules on a test cluster's fake node, for real.

  kwok-pods.py CLUSTERS_DIR I

CLUSTERS_DIR is a directory of scripts/clusters.sh (CLUSTERS_NODES=1, Pod
CIDR CLUSTERS_POD_CIDR) whose data plane scripts/dataplane.sh has built
(CLUSTERS_DIR/dataplane/state). For every Pod of cluster I bound to node-1 that
KWOK has given an IP (KWOK only writes its status; no kubelet, no container
runtime), this:

  - creates a network namespace PREFIX-cI-kN (PREFIX: the data plane's, so
    its teardown and sweep remove it too; N: the last byte of the Pod IP) with
    the Pod IP on eth0, wired to cluster I's node namespace as dataplane.sh
    wires its own Pods (a /32, proxy ARP, a /32 route to the veth), so
    kube-proxy in the node sees every packet;
  - writes /etc/netns/NETNS/resolv.conf as a kubelet would for dnsPolicy
    ClusterFirst: the kube-dns VIP 198.19.I.10, search <ns>.svc.cluster.local
    svc.cluster.local cluster.local, ndots:5;
  - runs each container's command and args (or args alone, when the Pod names
    no command: the image's entrypoint is not known here) with its env (plain
    values and the downward API fields metadata.name, metadata.namespace,
    spec.nodeName, status.podIP, status.podIPs, status.hostIP) in that
    namespace, as root, with the host's file system: the programs the Pod
    would run from its image (sh, socat, nc, nslookup) come from the host;
  - writes a KWOK Exec object named like the Pod, in its namespace, whose env
    CSD_POD_NETNS names the network namespace (and CSD_EXEC_LOG the file
    where scripts/kwok-exec/sh records each exec and its output,
    CLUSTERS_DIR/pods/cluster-I/exec.log): `kubectl exec` reaches KWOK
    (the node's kubelet API), KWOK runs the command on the host with that env
    and the `sh` of scripts/kwok-exec first on its PATH, and that `sh` enters
    the namespace (`ip netns exec`, which also mounts the resolv.conf).

It also serves node-1's kubelet API (kubelet_port of CLUSTERS_DIR/state, HTTPS
with a certificate of its own: the API server checks none) as a proxy to
KWOK's (kwok_port) that turns an exec request's tty=1 into tty=0. KWOK
v0.7.0 crashes on a TTY exec without stdin (its pty tunnel reads the absent
stdin: a nil io.Reader), and the MCS conformance suite execs with TTY and no
stdin. Asked without TTY, KWOK expects the error, stdout and stderr streams;
the client creates error, stdout and resize (a TTY client has no stderr), the
count matches, and the command's output comes back on stdout as before (its
stderr: KWOK keeps it).

A Pod that is deleted, terminating, finished or gets another IP loses its
namespace and processes. On SIGTERM/SIGINT/SIGHUP, or when the process named
by KWOK_PODS_PARENT_PID is gone, every Pod it runs is stopped and removed.
Container output goes to CLUSTERS_DIR/pods/cluster-I/NS_POD_CONTAINER.log; one
line per action to stdout.

Python 3 standard library only.
"""

import http.client
import re
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time

NODE = "node-1"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] kwok-pods: {msg}", flush=True)


def run(*cmd):
    """Run a command; raise with its output on failure."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stdout}{p.stderr}".strip())


class Api:
    """The cluster's API server as its admin (token of tokens.csv)."""

    def __init__(self, cdir, i):
        state = open(os.path.join(cdir, "state")).read().splitlines()[i - 1]
        fields = dict(w.split("=", 1) for w in state.split())
        self.port = int(fields["apiserver_port"])
        cluster = os.path.join(cdir, f"cluster-{i}")
        self.token = open(os.path.join(cluster, "tokens.csv")).read().split(",")[0]
        self.ctx = ssl.create_default_context(cafile=os.path.join(cluster, "pki", "apiserver.crt"))

    def conn(self, timeout=30):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None, ctype="application/json"):
        c = self.conn()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = ctype
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def watch(self, path):
        """Yield the events of a watch, one dict per line, until the server ends it."""
        c = self.conn(timeout=None)
        c.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"watch {path}: {r.status} {r.read()[:300]!r}")
        try:
            while True:
                line = r.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            c.close()


def kubelet_proxy(cdir, i, listen_port, kwok_port):
    """Serve 127.0.0.1:listen_port (TLS, socat) and pass each connection to KWOK's kubelet
    API (plain HTTP: KWOK serves both on its port), with tty=true turned into tty=false
    in an exec request's line. Returns the socat process."""
    import socket

    d = os.path.join(cdir, f"cluster-{i}")
    crt, key = os.path.join(d, "kubelet-proxy.crt"), os.path.join(d, "kubelet-proxy.key")
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", crt)

    def pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle(c):
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = c.recv(65536)
                if not chunk:
                    c.close()
                    return
                head += chunk
            line, rest = head.split(b"\r\n", 1)
            if b" /exec/" in line:
                line = re.sub(rb"([?&])tty=(1|true)(?=[& ])", rb"\1tty=0", line)
                log(f"kubelet API: {line.decode(errors='replace')[:400]}")
            u = socket.create_connection(("127.0.0.1", kwok_port))
            u.sendall(line + b"\r\n" + rest)
        except OSError as e:
            log(f"kubelet API: {e}")
            c.close()
            return
        threading.Thread(target=pump, args=(u, c), daemon=True).start()
        pump(c, u)
        c.close()
        u.close()

    srv = socket.create_server(("127.0.0.1", 0))
    srv.listen(64)
    plain = srv.getsockname()[1]

    def serve():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    tls = subprocess.Popen(
        ["setpriv", "--pdeathsig", "TERM", "--", "socat",
         f"OPENSSL-LISTEN:{listen_port},bind=127.0.0.1,reuseaddr,fork,cert={crt},key={key},verify=0",
         f"TCP:127.0.0.1:{plain}"], stdin=subprocess.DEVNULL)
    log(f"kubelet API of node-1 on 127.0.0.1:{listen_port} (socat, TLS), to KWOK's on {kwok_port}")
    return tls


class Runner:
    def __init__(self, cdir, i):
        self.cdir, self.i = cdir, i
        self.api = Api(cdir, i)
        node = None
        for line in open(os.path.join(cdir, "dataplane", "state")):
            f = dict(w.split("=", 1) for w in line.split())
            if f.get("kind") == "node" and f.get("cluster") == f"cluster-{i}":
                node = f["netns"]
        if not node:
            raise SystemExit(f"no node of cluster-{i} in {cdir}/dataplane/state")
        self.node = node
        self.prefix = node[: -len(f"-c{i}-node")]
        self.logs = os.path.join(cdir, "pods", f"cluster-{i}")
        os.makedirs(self.logs, exist_ok=True)
        self.pods = {}  # uid -> {"ip", "netns", "link", "procs", "name"}
        self.lock = threading.Lock()

    # --- one Pod ---------------------------------------------------------------------

    def wanted(self, pod):
        st, spec, meta = pod.get("status", {}), pod.get("spec", {}), pod["metadata"]
        return (
            spec.get("nodeName") == NODE
            and not spec.get("hostNetwork")
            and not meta.get("deletionTimestamp")
            and st.get("phase") in ("Pending", "Running")
            and bool(st.get("podIP"))
        )

    def env_of(self, pod, container):
        st, meta = pod.get("status", {}), pod["metadata"]
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "status.podIP": st.get("podIP", ""),
            "status.podIPs": ",".join(p["ip"] for p in st.get("podIPs", [])),
            "status.hostIP": st.get("hostIP", ""),
        }
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": meta["name"],
            "HOME": "/root",
        }
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = fields.get(e["valueFrom"]["fieldRef"]["fieldPath"], "")
        return env

    def setup(self, pod):
        meta, ip = pod["metadata"], pod["status"]["podIP"]
        last = ip.split(".")[-1] if "." in ip else ip.split(":")[-1]
        netns, link = f"{self.prefix}-c{self.i}-k{last}", f"vk{last}"
        who = f"{meta['namespace']}/{meta['name']}"
        rec = {"ip": ip, "netns": netns, "link": link, "procs": [], "name": who}
        self.pods[meta["uid"]] = rec
        run("ip", "netns", "add", netns)
        run("ip", "-n", self.node, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", netns, "addr", "add", f"{ip}/32", "dev", "eth0")
        run("ip", "-n", netns, "link", "set", "eth0", "up")
        run("ip", "-n", netns, "route", "add", "default", "dev", "eth0")
        run("ip", "netns", "exec", self.node, "sysctl", "-qw",
            f"net.ipv4.conf.{link}.proxy_arp=1", f"net.ipv4.neigh.{link}.proxy_delay=0")
        run("ip", "-n", self.node, "link", "set", link, "up")
        run("ip", "-n", self.node, "route", "replace", f"{ip}/32", "dev", link)
        os.makedirs(f"/etc/netns/{netns}", exist_ok=True)
        ns = meta["namespace"]
        with open(f"/etc/netns/{netns}/resolv.conf", "w") as f:
            f.write(f"search {ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                    f"nameserver 198.19.{self.i}.10\noptions ndots:5\n")
        for c in pod["spec"].get("containers", []):
            argv = list(c.get("command") or []) + list(c.get("args") or [])
            out = os.path.join(self.logs, f"{ns}_{meta['name']}_{c['name']}.log")
            if not argv:
                log(f"{who} {c['name']}: no command or args; not run")
                continue
            with open(out, "ab") as f:
                p = subprocess.Popen(
                    ["ip", "netns", "exec", netns, "setpriv", "--pdeathsig", "TERM", "--"] + argv,
                    env=self.env_of(pod, c), stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                    start_new_session=True, cwd="/")
            rec["procs"].append(p)
        # kubectl exec: KWOK's exec target for this Pod, any container.
        exec_obj = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Exec",
            "metadata": {"name": meta["name"], "namespace": ns},
            "spec": {"execs": [{"local": {"envs": [
                {"name": "CSD_POD_NETNS", "value": netns},
                {"name": "CSD_EXEC_LOG", "value": os.path.join(self.logs, "exec.log")}]}}]},
        }
        self.api.request(
            "PATCH", f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{ns}/execs/{meta['name']}"
            "?fieldManager=kwok-pods&force=true", exec_obj, "application/apply-patch+yaml")
        log(f"{who}: running {len(rec['procs'])} containers at {ip} in {netns}")

    def teardown(self, uid):
        rec = self.pods.pop(uid, None)
        if rec is None:
            return
        for p in rec["procs"]:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # Everything left in the namespace (a listener's forks).
        pids = subprocess.run(["ip", "netns", "pids", rec["netns"]], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for p in rec["procs"]:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run(["ip", "-n", self.node, "route", "del", f"{rec['ip']}/32", "dev", rec["link"]],
                       capture_output=True)
        subprocess.run(["ip", "netns", "del", rec["netns"]], capture_output=True)
        subprocess.run(["rm", "-rf", f"/etc/netns/{rec['netns']}"])
        log(f"{rec['name']}: stopped, {rec['netns']} removed")

    def apply(self, pod):
        uid = pod["metadata"]["uid"]
        with self.lock:
            if not self.wanted(pod):
                self.teardown(uid)
                return
            ip = pod["status"]["podIP"]
            cur = self.pods.get(uid)
            if cur is not None and cur["ip"] == ip:
                return
            self.teardown(uid)
            for other in [u for u, r in self.pods.items() if r["ip"] == ip]:
                self.teardown(other)  # an IP KWOK handed on to a new Pod
            try:
                self.setup(pod)
            except Exception as e:  # noqa: BLE001 - reported, the Pod stays down
                log(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: setup failed: {e}")
                self.teardown(uid)

    # --- the watch -------------------------------------------------------------------

    def loop(self):
        sel = f"fieldSelector=spec.nodeName%3D{NODE}"
        while True:
            try:
                lst = self.api.request("GET", f"/api/v1/pods?{sel}")
                seen = set()
                for pod in lst["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self.apply(pod)
                with self.lock:
                    for uid in [u for u in self.pods if u not in seen]:
                        self.teardown(uid)
                rv = lst["metadata"]["resourceVersion"]
                for ev in self.api.watch(f"/api/v1/pods?{sel}&watch=1&resourceVersion={rv}&timeoutSeconds=600"):
                    if ev.get("type") == "ERROR":
                        break
                    pod = ev["object"]
                    if ev["type"] == "DELETED":
                        with self.lock:
                            self.teardown(pod["metadata"]["uid"])
                    else:
                        self.apply(pod)
            except Exception as e:  # noqa: BLE001 - the API server restarting, a dropped watch
                log(f"watch: {e}; again in 1 s")
                time.sleep(1)

    def stop_all(self):
        with self.lock:
            for uid in list(self.pods):
                self.teardown(uid)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    runner = Runner(os.path.abspath(sys.argv[1]), int(sys.argv[2]))
    parent = int(os.environ.get("KWOK_PODS_PARENT_PID", "0") or 0)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())
    threading.Thread(target=runner.loop, daemon=True).start()
    ports = dict(w.split("=", 1) for w in open(os.path.join(runner.cdir, "state")).read().splitlines()[runner.i - 1].split())
    tls = kubelet_proxy(runner.cdir, runner.i, int(ports["kubelet_port"]), int(ports["kwok_port"]))
    log(f"cluster-{runner.i}: running the Pods of {NODE} (node namespace {runner.node})")
    while not stop.wait(0.5):
        if parent:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                log(f"parent {parent} is gone")
                break
    tls.terminate()
    runner.stop_all()
    tls.wait()
    log("stopped")


if __name__ == "__main__":
    main()
