#!/usr/bin/env bash
# Installs what tunnelspec and its tests need on a fresh Debian/Ubuntu machine (as root):
# system packages, then a virtualenv in .venv with tunnelspec and its test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "run as root (the lab starts systemd-nspawn containers)" >&2
  exit 2
fi

export DEBIAN_FRONTEND=noninteractive
pkgs=(python3 python3-venv python3-pip git openssh-server openssh-client systemd-container debootstrap
      iproute2 zstd ca-certificates cmake g++ make ccache procps curl
      nftables sudo libssl-dev libvulkan-dev haproxy shellcheck
      prometheus)  # prometheus: promtool checks and unit-tests monitoring/'s alert rules, and the metrics lab test runs its own loopback Prometheus (the package's daemon is kept off, below); shellcheck: scripts/gpu-check.sh is linted (tests/accel); nftables: tests/isolation load the loopback rules in a private network namespace; sudo: the become tests; libssl-dev: llama-server's dev build with OpenSSL, as main's builds had it; libvulkan-dev: the Vulkan header check (tests/accel); haproxy: the front's tests (tests/server)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -q
  # Debian's prometheus package starts prometheus.service on 0.0.0.0:9090 at install: nothing of the
  # tests may listen off loopback, so no service starts during this install (unless the machine has
  # its own policy already) and the daemon stays disabled (the tests run /usr/bin/prometheus themselves).
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
if [ -e /lib/systemd/system/prometheus.service ]; then
  if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  else systemctl disable prometheus.service >/dev/null 2>&1 || true; fi
fi
mkdir -p /run/sshd

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q -e '.[test]'
