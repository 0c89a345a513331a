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
      nftables sudo libssl-dev libvulkan-dev haproxy shellcheck)  # shellcheck: scripts/gpu-check.sh is linted (tests/accel); nftables: tests/isolation load the loopback rules in a private network namespace; sudo: the become tests; libssl-dev: llama-server's dev build with OpenSSL, as main's builds had it; libvulkan-dev: the Vulkan header check (tests/accel); haproxy: the front's tests (tests/server)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
mkdir -p /run/sshd

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q -e '.[test]'
