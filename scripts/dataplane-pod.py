#!/usr/bin/env python3
"""The programs of the data-path test fleet's "Pods" (scripts/dataplane.sh).

  dataplane-pod.py serve CLUSTER POD PORT...
      answer on every PORT over TCP and UDP, IPv4 and IPv6, with one line saying who answered:
      "CLUSTER POD PROTO PORT PEER_IP" (TCP: on connect, then close; UDP: per
      datagram). The tests read which cluster and Pod a connection reached.

  dataplane-pod.py connect NAME PORT PROTO COUNT [INTERVAL [TIMEOUT [FAMILY]]]
      COUNT attempts (bounded), INTERVAL seconds apart (default 0): each
      resolves NAME through the system resolver (getaddrinfo of FAMILY 4 or 6,
      default 4: the Pod's resolv.conf, as a real Pod), connects and reads the line. Prints
      one line per attempt, "T ok ADDR LINE" or "T err ADDR REASON" (T:
      seconds since start), so the caller can count and time outcomes.

Python 3 standard library only: it runs on a fresh Debian/Ubuntu machine.
"""

import socket
import sys
import threading
import time


def bound(family, kind, port):
    s = socket.socket(family, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        # Its own IPv6 socket: the peer shows as an IPv6 address, never ::ffff:a.b.c.d.
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::", port))
    else:
        s.bind(("0.0.0.0", port))
    return s


def serve(cluster, pod, ports):
    def tcp(family, port):
        s = bound(family, socket.SOCK_STREAM, port)
        s.listen(128)
        while True:
            c, peer = s.accept()
            try:
                c.sendall(f"{cluster} {pod} tcp {port} {peer[0]}\n".encode())
            except OSError:
                pass
            finally:
                c.close()

    def udp(family, port):
        s = bound(family, socket.SOCK_DGRAM, port)
        while True:
            _, peer = s.recvfrom(2048)
            try:
                s.sendto(f"{cluster} {pod} udp {port} {peer[0]}\n".encode(), peer)
            except OSError:
                pass

    threads = []
    for port in ports:
        for f in (tcp, udp):
            for family in (socket.AF_INET, socket.AF_INET6):
                t = threading.Thread(target=f, args=(family, port), daemon=True)
                t.start()
                threads.append(t)
    print(f"serving {cluster} {pod} on {' '.join(map(str, ports))} tcp+udp", flush=True)
    for t in threads:
        t.join()


def attempt(name, port, proto, timeout, family):
    addr = "-"
    try:
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        infos = socket.getaddrinfo(name, port, family, kind)
        addr = infos[0][4][0]
        with socket.socket(family, kind) as s:
            s.settimeout(timeout)
            s.connect((addr, port))
            if proto == "udp":
                s.send(b"hello\n")
                data = s.recv(2048)
            else:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(2048)
                    if not chunk:
                        break
                    data += chunk
        line = data.decode(errors="replace").strip()
        if not line:
            return f"err {addr} empty-reply"
        return f"ok {addr} {line}"
    except (OSError, UnicodeError) as e:
        reason = type(e).__name__ + ":" + str(e).replace(" ", "_")
        return f"err {addr} {reason}"


def connect(name, port, proto, count, interval=0.0, timeout=2.0, family=4.0):
    start = time.monotonic()
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    for i in range(count):
        result = attempt(name, port, proto, timeout, af)
        print(f"{time.monotonic() - start:.3f} {result}", flush=True)
        if interval > 0 and i + 1 < count:
            time.sleep(interval)


def main(argv):
    if len(argv) >= 4 and argv[1] == "serve":
        serve(argv[2], argv[3], [int(p) for p in argv[4:]])
    elif len(argv) in (6, 7, 8, 9) and argv[1] == "connect" and argv[4] in ("tcp", "udp"):
        extra = [float(x) for x in argv[6:]]
        connect(argv[2], int(argv[3]), argv[4], int(argv[5]), *extra)
    else:
        print(__doc__, file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
