#!/usr/bin/env bash
# Stop the single-node dev cluster started by up.sh (slurmd, slurmctld, slurmdbd, mariadbd, munged).
# Packages, configuration, the accounting database and job state stay, so the next up.sh is warm.
#   bash slurm/dev-cluster/down.sh            # stop daemons
#   bash slurm/dev-cluster/down.sh --purge    # also forget job state (spool) and logs
set -uo pipefail
RUN_DIR=/run/slurm
# shellcheck source=slurm/dev-cluster/jobs.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/jobs.sh"
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
# Cancel the jobs of this dev cluster only: by id, as listed by the controller that up.sh started
# (its pid file is alive and it answers as cluster $CLUSTER). Another Slurm reachable from this
# machine, and jobs of other users or clusters, are never touched.
CLUSTER="${KDBENCH_SLURM_CLUSTER:-dev}"
export SLURM_CONF=/etc/slurm/slurm.conf
ctld_pid=$(cat "$RUN_DIR/slurmctld.pid" 2>/dev/null || true)
if [[ -n "$ctld_pid" ]] && kill -0 "$ctld_pid" 2>/dev/null && command -v squeue >/dev/null \
        && timeout 10 scontrol show config 2>/dev/null | grep -E "^ClusterName +=[ ]+$CLUSTER\$" >/dev/null; then
    cancel_dev_cluster_jobs "$CLUSTER" 1 || true
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
