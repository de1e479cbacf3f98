#!/usr/bin/env python3
"""A stand-in for an OTLP/HTTP collector, for benchmarks: every POST (a
batch of spans, `/v1/traces`) is read and answered 200 at once, and
counted; GET /stats answers {"requests", "bytes"}.

    bench/otlp_sink.py PORT

With it, `ENV_B="TURNSTORE_OTLP_ENDPOINT=http://127.0.0.1:PORT"
bench/compare` prices traces on against traces off. Its CPU is the
collector's, counted for nobody.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {"requests": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with LOCK:
            STATS["requests"] += 1
            STATS["bytes"] += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        with LOCK:
            body = json.dumps(STATS).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
