#!/usr/bin/env bash
# The chart tests render the Helm chart without a `helm` binary: helm-python-sdk (Helm's
# SDK, offline) and kubernetes-validate (Kubernetes' own strict schemas), in a virtual
# environment. Creates it (default target/chart-venv) when missing and prints its Python.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-target/chart-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'helm-python-sdk==0.2.2' 'kubernetes-validate==1.37.0' >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
