#!/usr/bin/env bash
# Install the headless browser the report page's tests open the page in: Debian's chromium.
# Idempotent: does nothing when chromium is on PATH. Needs root (apt-get); the test command
# (scripts/test.sh) calls it as it starts the SLURM cluster.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "install-browser.sh: chromium is missing and only root can install it (apt-get install chromium)" >&2; exit 1; }
echo "install-browser.sh: installing chromium (Debian package) for the report page's tests" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
