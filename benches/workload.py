#!/usr/bin/env python3
"""The benchmark workload: one fleet of multi-cluster services, written
three ways so that every server is measured on the same data and queries.

    python3 benches/workload.py OUTDIR [--services 1000] [--namespaces 10]
        [--clusters 3] [--headless-every 10] [--endpoints 4]
        [--queries 100000] [--seed 1]

Writes into OUTDIR:

  objects.yaml           what this server reads (`serve --objects`): a
                         ServiceImport per service and, for a headless one,
                         an MCS EndpointSlice per cluster (one JSON document
                         per YAML document).
  clusterset.local.zone  the same fleet as a zone file (RFC 1035 master
                         format) for servers that read zone files (Knot DNS,
                         NSD, hickory-dns): the records docs/answers.md says
                         this server answers for these objects, so that a
                         query gets the same answer section from each.
  queries.txt            dnsperf's input: QUERIES lines drawn with SEED
                         (the same file for the same arguments).

The fleet: service i is `svc<i>` in namespace `ns<i % NAMESPACES>` with one
TCP port named `http`, number 80 + i % 7. Every HEADLESS_EVERY-th service
(i = 0, K, 2K, ...) is headless with ENDPOINTS ready endpoints in each of
CLUSTERS clusters (`cluster0`...), IPv4 addresses counted up from 10.64.0.0,
no hostnames; the others are ClusterSetIP services with the VIP
10.200.0.0 + i.

The query mix: 70 % A of a ClusterSetIP service, 10 % A of a headless
service (CLUSTERS x ENDPOINTS records), 10 % SRV `_http._tcp.` of any
service (a headless one: one record per endpoint, targets in the
additional section), 10 % A of a name that does not exist (NXDOMAIN).
Names are drawn uniformly within each kind.
"""
import argparse
import ipaddress
import json
import os
import random

ZONE = "clusterset.local"
TTL = 5
# What `serve` answers without flags: `--ttl 5`, `--negative-ttl 5`, the
# SOA timers of src/store/names.rs and the schema version of the spec.
SOA = f"ns.dns.{ZONE}. hostmaster.{ZONE}. 1 7200 1800 86400 {TTL}"
SCHEMA_VERSION = "1.0.0"
VIP_BASE = int(ipaddress.IPv4Address("10.200.0.0"))
POD_BASE = int(ipaddress.IPv4Address("10.64.0.0"))
PORT_NAME = "http"


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--clusters", type=int, default=3)
    p.add_argument("--headless-every", type=int, default=10,
                   help="every K-th service is headless (0: none)")
    p.add_argument("--endpoints", type=int, default=4,
                   help="ready endpoints per cluster of a headless service")
    p.add_argument("--queries", type=int, default=100000)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def endpoint_label(ip):
    """The endpoint's name label when it has no hostname: its address with
    `.` as `-` (docs/answers.md)."""
    return str(ip).replace(".", "-")


def srv_weight(records):
    """The weight this server gives every record of an SRV RRset of
    `records` distinct records (src/store/names.rs)."""
    return max(1, 100 // records)


def build(a):
    """The fleet as (objects, zone lines, names by query kind)."""
    objects = []
    zone = [
        f"$ORIGIN {ZONE}.",
        f"$TTL {TTL}",
        f"@ IN SOA {SOA}",
        f"@ IN NS ns.dns.{ZONE}.",
        "ns.dns IN A 127.0.0.1",
        f'dns-version 28800 IN TXT "{SCHEMA_VERSION}"',
    ]
    clusterset_ip, headless, srv, hosts = [], [], [], []
    next_pod = POD_BASE
    for i in range(a.services):
        name, namespace = f"svc{i}", f"ns{i % a.namespaces}"
        service = f"{name}.{namespace}.svc"
        port = 80 + i % 7
        ports = [{"name": PORT_NAME, "protocol": "TCP", "port": port}]
        is_headless = a.headless_every > 0 and i % a.headless_every == 0
        spec = {"type": "Headless" if is_headless else "ClusterSetIP", "ports": ports}
        if is_headless:
            targets = []
            for c in range(a.clusters):
                cluster = f"cluster{c}"
                addresses = [ipaddress.IPv4Address(next_pod + e) for e in range(a.endpoints)]
                next_pod += a.endpoints
                objects.append({
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{name}-{cluster}",
                        "namespace": namespace,
                        "labels": {
                            "multicluster.kubernetes.io/service-name": name,
                            "multicluster.kubernetes.io/source-cluster": cluster,
                        },
                    },
                    "addressType": "IPv4",
                    "ports": ports,
                    "endpoints": [{"addresses": [str(ip)], "conditions": {"ready": True}}
                                  for ip in addresses],
                })
                for ip in addresses:
                    host = f"{endpoint_label(ip)}.{cluster}.{service}"
                    zone.append(f"{service} IN A {ip}")
                    zone.append(f"{host} IN A {ip}")
                    targets.append(host)
            weight = srv_weight(len(targets))
            for owner in (f"_{PORT_NAME}._tcp.{service}", service):
                zone.extend(f"{owner} IN SRV 0 {weight} {port} {t}.{ZONE}." for t in targets)
            headless.append(service)
            hosts.append(targets[0])
        else:
            vip = ipaddress.IPv4Address(VIP_BASE + i)
            spec["ips"] = [str(vip)]
            zone.append(f"{service} IN A {vip}")
            for owner in (f"_{PORT_NAME}._tcp.{service}", service):
                zone.append(f"{owner} IN SRV 0 {srv_weight(1)} {port} {service}.{ZONE}.")
            clusterset_ip.append(service)
        srv.append(f"_{PORT_NAME}._tcp.{service}")
        objects.append({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ServiceImport",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        })
    # hosts: the first endpoint name of each headless service.
    names = {"clusterset_ip": clusterset_ip, "headless": headless, "srv": srv, "hosts": hosts}
    return objects, zone, names


def queries(a, names):
    """QUERIES dnsperf lines, drawn with SEED."""
    rng = random.Random(a.seed)
    for _ in range(a.queries):
        draw = rng.random()
        if draw < 0.7 and names["clusterset_ip"]:
            yield f"{rng.choice(names['clusterset_ip'])}.{ZONE} A"
        elif draw < 0.8 and names["headless"]:
            yield f"{rng.choice(names['headless'])}.{ZONE} A"
        elif draw < 0.9:
            yield f"{rng.choice(names['srv'])}.{ZONE} SRV"
        else:
            yield f"missing{rng.randrange(10**6)}.ns0.svc.{ZONE} A"


def write(a):
    """Writes the three files into OUTDIR; returns the counts of objects and
    queries, and the services' names by kind."""
    objects, zone, names = build(a)
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "objects.yaml"), "w") as f:
        f.write("\n---\n".join(json.dumps(o, indent=2) for o in objects) + "\n")
    with open(os.path.join(a.outdir, f"{ZONE}.zone"), "w") as f:
        f.write("\n".join(zone) + "\n")
    n = 0
    with open(os.path.join(a.outdir, "queries.txt"), "w") as f:
        for line in queries(a, names):
            f.write(line + "\n")
            n += 1
    return len(objects), n, names


if __name__ == "__main__":
    args = arguments()
    count, n, _ = write(args)
    print(f"{args.services} services, {count} objects, {n} queries -> {args.outdir}")
