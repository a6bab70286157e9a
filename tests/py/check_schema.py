"""Validates a JSON document against a JSON Schema (draft 2020-12) with the `jsonschema` package, independently of
quantfarm. Usage: check_schema.py SCHEMA.json DOCUMENT.json. Prints every error (path and message) and exits 1 when
there is one; prints "valid" otherwise."""

import json
import sys

from jsonschema import Draft202012Validator


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)
    Draft202012Validator.check_schema(schema)
    with open(sys.argv[2], encoding="utf-8") as f:
        doc = json.load(f)
    errors = sorted(Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    for e in errors:
        print(f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}")
    if not errors:
        print("valid")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
