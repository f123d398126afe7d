#!/usr/bin/env bash
# Stop the single-node dev cluster started by up.sh (slurmd, slurmctld, slurmdbd, mariadbd, munged).
# Packages, configuration, the accounting database and job state stay, so the next up.sh is warm.
#   bash slurm/dev-cluster/down.sh            # stop daemons
#   bash slurm/dev-cluster/down.sh --purge    # also forget job state (spool) and logs
set -uo pipefail
RUN_DIR=/run/slurm
[[ $(id -u) -eq 0 ]] || { echo "[dev-cluster] ERROR: must run as root" >&2; exit 1; }

stop() {  # stop NAME PIDFILE
    local name=$1 pidfile=$2 pid
    [[ -s "$pidfile" ]] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        echo "[dev-cluster] stopping $name ($pid)" >&2
        kill "$pid" 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$pidfile"
}
if [[ -f /etc/slurm/slurm.conf ]] && command -v scancel >/dev/null; then
    SLURM_CONF=/etc/slurm/slurm.conf timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    sleep 1
fi
stop slurmd "$RUN_DIR/slurmd.pid"
stop slurmctld "$RUN_DIR/slurmctld.pid"
stop slurmdbd "$RUN_DIR/slurmdbd.pid"
stop mariadbd /run/mysqld/mysqld.pid
stop munged /run/munge/munged.pid
if [[ "${1:-}" == "--purge" ]]; then
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/* /var/log/slurm/*
fi
echo "[dev-cluster] down" >&2
