#!/usr/bin/env bash
# Install what the real-cluster tests (tests/clusters, marker `cluster`) need; safe to run again.
#
#   scripts/install-cluster-deps.sh
#
# Debian's Slurm 22.05 (slurmctld, slurmd, slurm-client), munge and OpenSSH's server, without
# recommends. A policy-rc.d that exits 101 keeps the packages' postinst scripts from starting
# the daemons (sshd on 0.0.0.0:22, munged, slurmd) on this machine: the tests start their own,
# one per network namespace, and stop them. Not root and no sudo: say so and exit 0 (the tests
# skip with that reason).
set -euo pipefail

packages=(slurmctld slurmd slurm-client munge openssh-server openssh-client iproute2 util-linux)
missing=()
for binary in slurmctld slurmd srun munged sshd ssh ip nsenter unshare; do
    command -v "$binary" >/dev/null || [[ -x "/usr/sbin/$binary" ]] || missing+=("$binary")
done
if [[ ${#missing[@]} == 0 ]]; then
    echo "install-cluster-deps: slurm, munge and sshd are installed"
    exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null || ! sudo -n true 2>/dev/null; then
        echo "install-cluster-deps: ${missing[*]} missing and apt-get needs root; the cluster tests will skip" >&2
        exit 0
    fi
    sudo="sudo -n"
fi
policy=/usr/sbin/policy-rc.d
made_policy=""
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    made_policy=1
fi
trap '[[ -n "$made_policy" ]] && $sudo rm -f "$policy"' EXIT
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
echo "install-cluster-deps: installed ${packages[*]}"
