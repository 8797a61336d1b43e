#!/usr/bin/env python3
"""Renders the Helm chart offline and validates what it renders, for the chart tests.

    render.py CHART_DIR VALUES_JSON [RELEASE NAMESPACE]

Prints one JSON object: {"ok": true, "manifests": [...], "lint": [...], "unvalidated": [...]}
when the chart renders, every manifest having passed Kubernetes' own strict schemas (1.30),
or {"ok": false, "error": "..."} when the chart refuses the values. Kinds without a bundled
schema (the Prometheus operator's ServiceMonitor) are listed in "unvalidated".
"""

import json
import sys

import helm_python as helm
import kubernetes_validate
import yaml

KUBE_VERSION = "1.30.0"


def main() -> int:
    chart_dir, values_json = sys.argv[1], sys.argv[2]
    release = sys.argv[3] if len(sys.argv) > 3 else "director"
    namespace = sys.argv[4] if len(sys.argv) > 4 else "forge"
    values = json.loads(values_json)
    chart = helm.Chart.load(chart_dir)
    try:
        chart.validate_schema(chart.merge_values(values))
        rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    except helm.HelmError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 0
    lint = helm.lint(chart_dir, values, strict=True, namespace=namespace, kube_version="v" + KUBE_VERSION)
    manifests, unvalidated, invalid = [], [], []
    for path in sorted(rendered):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if not doc:
                continue
            manifests.append(doc)
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                unvalidated.append(doc["kind"])
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                invalid.append(f"{path}: {doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}")
    out = {
        "ok": True,
        "manifests": manifests,
        "lint": lint,
        "unvalidated": unvalidated,
        "invalid": invalid,
        "defaults": chart.values,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
