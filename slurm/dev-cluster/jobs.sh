# Sourced by up.sh and down.sh: the dev cluster's jobs, as its own controller lists them.

dev_cluster_jobs() {  # dev_cluster_jobs CLUSTER : the cluster's job ids (an array's id once), space-separated
    timeout 10 squeue --noheader --format=%F --clusters="$1" 2>/dev/null | grep -E '^[0-9]+$' | sort -un \
        | tr '\n' ' ' || true
}

cancel_dev_cluster_jobs() {  # cancel_dev_cluster_jobs CLUSTER WAIT_S : scancel them, wait until none is queued
    local cluster=$1 wait_s=$2 jobs
    jobs=$(dev_cluster_jobs "$cluster")
    [[ -n "$jobs" ]] || return 0
    echo "[dev-cluster] cancelling the dev cluster's jobs: $jobs" >&2
    # shellcheck disable=SC2086
    timeout 10 scancel --clusters="$cluster" $jobs 2>/dev/null || true
    for _ in $(seq 1 $((wait_s * 2))); do
        [[ -z "$(dev_cluster_jobs "$cluster")" ]] && return 0
        sleep 0.5
    done
    [[ -z "$(dev_cluster_jobs "$cluster")" ]]
}
