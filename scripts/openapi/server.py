"""Starts the real turnstore binary on a free port (read from its log) for
the OpenAPI checks; stops it on exit."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def turnstore(binary: str, **env: str) -> Iterator[str]:
    """Yields the base URL of a turnstore serving on the in-memory store."""
    proc = subprocess.Popen(
        [binary, "serve"],
        env={
            **os.environ,
            "TURNSTORE_LISTEN": "127.0.0.1:0",
            "TURNSTORE_LOG_FORMAT": "json",
            "RUST_LOG": "info",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    port: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not port:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                fields = entry.get("fields", entry)
                if fields.get("message") == "turnstore serving":
                    port.append(int(fields["port"]))
                    ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"turnstore did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        proc.terminate()
        proc.wait(10)
