#!/usr/bin/env bash
# Installs the real servers and tools the tests and benchmarks start:
# PostgreSQL (+ pgbench), MariaDB, etcd, libfaketime, wrk and Python's venv. Debian packages;
# only what is missing is installed, so a second run costs nothing.
set -euo pipefail

packages=(
  postgresql postgresql-contrib
  mariadb-server mariadb-client
  etcd-server etcd-client
  openssl                # scripts/etcd.sh --jwt: the key pair etcd signs tokens with
  faketime libfaketime
  wrk
  python3 python3-venv   # scripts/api-fuzz.sh: schemathesis in a venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
