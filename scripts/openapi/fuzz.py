"""Schemathesis against the real binary (memory store): every response must
be documented (status, content type, headers, schema), no 5xx, and input
the document calls invalid must be refused (see schemathesis.toml).
Usage: fuzz.py <turnstore binary> <openapi.json> [more schemathesis args]"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from server import turnstore

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "use_after_free",
        "ensure_resource_availability",
    ]
)


def main(binary: str, spec: str, *more: str) -> int:
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemathesis.toml")
    spec = os.path.abspath(spec)
    # Schemathesis keeps a cache in its working directory: not in the checkout.
    with turnstore(binary) as base_url, tempfile.TemporaryDirectory() as scratch:
        return subprocess.call(
            [
                os.path.join(os.path.dirname(sys.executable), "schemathesis"),
                "--config-file",
                config,
                "run",
                spec,
                "--url",
                base_url,
                "--checks",
                CHECKS,
                "--max-examples",
                "100",
                "--no-color",
                *more,
            ],
            cwd=scratch,
        )


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
