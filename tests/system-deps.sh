#!/bin/sh
# System packages the tests drive for real: a Prometheus server that scrapes the
# services, headless Chromium for the dashboard, a PostgreSQL server for the
# gateway's history store, openssl for the TLS tests' certificate authority, and
# iproute2 and iptables for the network faults in namespaces (loadtests.netfaults).
# Installed from Debian's packages when missing; without root (or sudo) the script says
# what to install and those tests skip, naming the missing program.
set -eu
missing=""
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"  # the TLS tests' throwaway CA
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"  # namespaces, veth pairs, tc
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"  # loss, partition, NFQUEUE
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1 \
    || missing="$missing postgresql"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo -n"
else
    echo "tests/system-deps.sh: not root: install$missing (Debian packages) for the e2e tests" >&2
    exit 0
fi
echo "tests/system-deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$run apt-get update -q >/dev/null
# shellcheck disable=SC2086  # one word per package
$run apt-get install -y -q --no-install-recommends $missing >/dev/null
