#!/usr/bin/env python3
"""A proxy in front of a kube-apiserver that asks it for JSON only.

Usage: json-proxy.py KUBECONFIG   (prints "LISTENING PORT" once it listens)

Plain HTTP on 127.0.0.1 (a free port) to the clients, HTTPS to the API
server of KUBECONFIG's first cluster (verified with its CA). Every request
is sent on with its Accept header replaced by `application/json`, so a
client that asks for Kubernetes protobuf gets JSON, as it would from a
proxy or aggregated server that does not serve protobuf; responses
(watches included) are streamed back as they arrive. tests/it/protobuf.rs
runs it; it exits when its stdin closes, so a killed test leaves nothing.
"""

import base64
import http.client
import http.server
import os
import re
import socketserver
import ssl
import sys
import tempfile
import threading
import urllib.parse


def upstream_of(kubeconfig):
    text = open(kubeconfig).read()
    server = re.search(r"server:\s*(\S+)", text).group(1)
    ca = re.search(r"certificate-authority-data:\s*(\S+)", text).group(1)
    ca_file = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")
    ca_file.write(base64.b64decode(ca))
    ca_file.close()
    context = ssl.create_default_context(cafile=ca_file.name)
    os.unlink(ca_file.name)
    url = urllib.parse.urlparse(server)
    return url.hostname, url.port, context


HOST, PORT, CONTEXT = upstream_of(sys.argv[1])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        upstream = http.client.HTTPSConnection(HOST, PORT, context=CONTEXT, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("accept", "host", "connection")}
        headers["Accept"] = "application/json"
        upstream.request("GET", self.path, headers=headers)
        response = upstream.getresponse()
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            upstream.close()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(f"LISTENING {server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


if __name__ == "__main__":
    main()
