#!/usr/bin/env python3
"""Validates Kubernetes manifests (a JSON array on standard input) against Kubernetes' own
strict schemas (1.30). Prints a JSON array of what is wrong; empty when all pass."""

import json
import sys

import kubernetes_validate

problems = []
for doc in json.load(sys.stdin):
    try:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        problems.append(f"{doc.get('kind')}: {where}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError:
        problems.append(f"{doc.get('kind')}: no schema")
print(json.dumps(problems))
