"""Every example in the OpenAPI document is valid against its schema: the
schemas' own examples, media-type and parameter examples, and the examples
of the shared problem responses. Usage: check_examples.py openapi.json"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterator

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012


def examples(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(where, schema, example) for every example the document gives."""
    for name, schema in doc["components"]["schemas"].items():
        for i, example in enumerate(schema.get("examples", [])):
            yield f"schemas/{name}/examples/{i}", schema, example
        if "example" in schema:
            yield f"schemas/{name}/example", schema, schema["example"]

    def media(where: str, content: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Any]]:
        for kind, m in content.items():
            if "example" in m:
                yield f"{where}/{kind}/example", m["schema"], m["example"]
            for key, ex in m.get("examples", {}).items():
                yield f"{where}/{kind}/examples/{key}", m["schema"], ex["value"]

    for name, response in doc["components"].get("responses", {}).items():
        yield from media(f"responses/{name}", response.get("content", {}))
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            for p in op.get("parameters", []):
                if "example" in p:
                    yield f"{where} parameter {p['name']}", p["schema"], p["example"]
            body = op.get("requestBody", {}).get("content", {})
            yield from media(f"{where} body", body)
            for status, response in op["responses"].items():
                yield from media(f"{where} {status}", response.get("content", {}))


def main(path: str) -> int:
    doc = json.load(open(path))
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(doc, default_specification=DRAFT202012)
    )
    failures = 0
    count = 0
    for where, schema, example in examples(doc):
        count += 1
        schema = json.loads(json.dumps(schema).replace('"#/', '"urn:openapi#/'))
        validator = Draft202012Validator(schema, registry=registry)
        for error in validator.iter_errors(example):
            failures += 1
            print(f"{where}: {error.message} at {list(error.absolute_path)}", file=sys.stderr)
    # A check that checks nothing is no check.
    if count < 20:
        print(f"only {count} examples found", file=sys.stderr)
        return 1
    print(f"{count} examples valid against their schemas" if not failures else f"{failures} invalid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
