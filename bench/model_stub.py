#!/usr/bin/env python3
"""A stand-in for an OpenAI-compatible model, for benchmarks: every chat
completion answers the same short summary at once, with its usage.

    bench/model_stub.py PORT

bench/compare gives it to Motorhead (OPENAI_API_BASE), which summarizes a
session once it passes its window: without a model each of those runs
fails and Motorhead stalls, so growing sessions (KEEP=1) could not be
compared. Its CPU is the model's, counted for nobody.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "The user asked questions about the product; the assistant answered them.",
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 15, "total_tokens": 115},
    }
).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
