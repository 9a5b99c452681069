#!/usr/bin/env bash
# Checks the deployment files offline (deploy/check_deploy.py says what is checked):
#   deploy/k8s/*.yaml and their kustomize build: Kubernetes schemas (kubernetes-validate) and
#     schemas written from KEDA's documentation (deploy/k8s/schemas/), names matched against each other and the code
#   deploy/grafana/*.json: metrics and labels that the code registers, unique panel ids
#   docker-compose.yml: `docker-compose config -q`, when docker-compose is installed
# Installs its Python packages once into target/deploy-check-venv (from PyPI). Exits non-zero
# on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/deploy-check-venv
REQUIREMENTS="kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.3"

# A venv where Debian's python3-venv is installed; otherwise (a fresh machine, where apt is busy
# provisioning in the background) the packages go into a folder of their own on PYTHONPATH.
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQUIREMENTS" ]; then
  rm -rf "$VENV"
  mkdir -p target
  # shellcheck disable=SC2086
  if python3 -m venv "$VENV" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check $REQUIREMENTS || {
      echo "check-deploy: cannot install $REQUIREMENTS into $VENV" >&2; exit 1; }
  else
    rm -rf "$VENV"
    mkdir -p "$VENV/bin"
    python3 -m pip install --quiet --disable-pip-version-check --target "$VENV/lib" $REQUIREMENTS || {
      echo "check-deploy: cannot install $REQUIREMENTS into $VENV/lib" >&2; exit 1; }
    printf '#!/bin/sh\nPYTHONPATH="%s/lib" exec python3 "$@"\n' "$PWD/$VENV" > "$VENV/bin/python"
    chmod +x "$VENV/bin/python"
  fi
  echo "$REQUIREMENTS" > "$VENV/.requirements"
fi

status=0
"$VENV/bin/python" deploy/check_deploy.py || status=1

if command -v docker-compose >/dev/null; then
  if out="$(docker-compose -f docker-compose.yml config -q 2>&1)"; then
    echo "docker-compose.yml: docker-compose config -q passed"
  else
    echo "$out" >&2
    echo "  FAIL docker-compose.yml: docker-compose config -q failed" >&2
    status=1
  fi
else
  echo "docker-compose.yml: docker-compose not installed, not checked"
fi

if [ "$status" -ne 0 ]; then
  echo "check-deploy: FAILED" >&2
  exit 1
fi
echo "check-deploy: deployment files passed"
