#!/usr/bin/env bash
# Bring up a single-node Slurm cluster (with accounting) on this machine, for integration tests.
#
#   sudo bash slurm/dev-cluster/up.sh        # idempotent: re-running is cheap and safe
#   eval "$(bash slurm/dev-cluster/up.sh --print-env)"   # or: source /etc/slurm/kdbench-dev.env
#
# What it does (Debian 12 / Slurm 22.05; needs root, needs no systemd):
#   1. apt-get installs slurmctld slurmd slurm-client munge slurmdbd mariadb-server if missing
#      (with an /usr/sbin/policy-rc.d that exits 101, so packages start no services of their own);
#   2. writes /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf from the templates next to this
#      script, with the node's CPUs / RealMemory taken from nproc and /proc/meminfo;
#   3. starts munged, mariadbd, slurmdbd, slurmctld, slurmd (each only if not already running;
#      the Slurm daemons are restarted when their configuration changed);
#   4. waits until `sinfo` shows the node idle and `sacct` answers; a controller started cold
#      cancels the jobs it recovered from a cluster that died without down.sh;
#   5. writes /etc/slurm/kdbench-dev.env (`export SLURM_CONF=/etc/slurm/slurm.conf`) and prints
#      that line as the last line of standard output.
#
# Tear down with slurm/dev-cluster/down.sh. Environment knobs:
#   KDBENCH_SLURM_CLUSTER (default dev), KDBENCH_SLURM_PARTITION (default debug),
#   KDBENCH_SLURM_MEM_FRACTION (share of MemTotal given to Slurm, default 0.9),
#   KDBENCH_SLURM_TIMEOUT (seconds to wait for the node, default 90).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=slurm/dev-cluster/jobs.sh
. "$HERE/jobs.sh"
ETC=/etc/slurm
SLURM_CONF_PATH="$ETC/slurm.conf"
ENV_FILE="$ETC/kdbench-dev.env"
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
CLUSTER="${KDBENCH_SLURM_CLUSTER:-dev}"
PARTITION="${KDBENCH_SLURM_PARTITION:-debug}"
MEM_FRACTION="${KDBENCH_SLURM_MEM_FRACTION:-0.9}"
TIMEOUT="${KDBENCH_SLURM_TIMEOUT:-90}"
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS_FILE="$ETC/.kdbench-dbpass"
NODE=localhost

if [[ "${1:-}" == "--print-env" ]]; then
    echo "export SLURM_CONF=$SLURM_CONF_PATH"
    exit 0
fi

log() { echo "[dev-cluster] $*" >&2; }
die() { echo "[dev-cluster] ERROR: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts system daemons)"
START=$(date +%s.%N)

alive() {  # alive PIDFILE : the process named in PIDFILE is running
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# ---------------------------------------------------------------- 1. packages
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    created_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    ((created_policy)) && rm -f /usr/sbin/policy-rc.d
fi

# ---------------------------------------------------------------- 2. configuration
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
REAL_MB=$(awk -v m="$MEM_MB" -v f="$MEM_FRACTION" 'BEGIN {print int(m * f)}')
DEF_MEM_PER_CPU=$((REAL_MB / CPUS))
CTLD_HOST=$(hostname -s)

mkdir -p "$ETC" "$LOG_DIR" "$RUN_DIR" /var/spool/slurmctld /var/spool/slurmd
if [[ ! -s "$DB_PASS_FILE" ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_PASS_FILE")
fi
DB_PASS=$(cat "$DB_PASS_FILE")

render() {  # render TEMPLATE DEST MODE : returns 0 when DEST changed
    local tmp
    tmp=$(mktemp)
    sed -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@CTLD_HOST@|$CTLD_HOST|g" -e "s|@NODE@|$NODE|g" \
        -e "s|@CPUS@|$CPUS|g" -e "s|@REAL_MB@|$REAL_MB|g" -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g" \
        -e "s|@PARTITION@|$PARTITION|g" -e "s|@LOG_DIR@|$LOG_DIR|g" -e "s|@RUN_DIR@|$RUN_DIR|g" \
        -e "s|@DB_NAME@|$DB_NAME|g" -e "s|@DB_USER@|$DB_USER|g" -e "s|@DB_PASS@|$DB_PASS|g" \
        "$1" >"$tmp"
    if [[ -f "$2" ]] && cmp -s "$tmp" "$2"; then
        rm -f "$tmp"
        return 1
    fi
    install -m "$3" -o root -g root "$tmp" "$2"
    rm -f "$tmp"
    return 0
}
conf_changed=0
render "$HERE/slurm.conf.in" "$SLURM_CONF_PATH" 0644 && conf_changed=1
render "$HERE/slurmdbd.conf.in" "$ETC/slurmdbd.conf" 0600 && conf_changed=1
export SLURM_CONF="$SLURM_CONF_PATH"

# ---------------------------------------------------------------- 3. daemons
# munge: the package's postinst normally creates the key; make one if it did not.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating munge key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --force >&2; else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge
chown munge:munge /run/munge
chmod 0711 /run/munge
if ! alive /run/munge/munged.pid; then
    log "starting munged"
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged --force
fi

# mariadb
mkdir -p /run/mysqld
chown mysql:mysql /run/mysqld
if [[ ! -d /var/lib/mysql/mysql ]]; then
    log "initialising the MariaDB data folder"
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
fi
if ! alive /run/mysqld/mysqld.pid; then
    log "starting mariadbd"
    nohup /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
        --socket=/run/mysqld/mysqld.sock --skip-networking=0 --bind-address=127.0.0.1 \
        >"$LOG_DIR/mariadb.log" 2>&1 </dev/null &
fi
for _ in $(seq 1 "$TIMEOUT"); do
    mariadb -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.5
done
mariadb -uroot -e 'SELECT 1' >/dev/null || die "MariaDB did not start (see $LOG_DIR/mariadb.log)"
mariadb -uroot <<SQL
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
SQL

stop_pidfile() {  # stop_pidfile PIDFILE
    if alive "$1"; then
        local pid
        pid=$(cat "$1")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}
if ((conf_changed)); then
    for d in slurmd slurmctld slurmdbd; do
        if alive "$RUN_DIR/$d.pid"; then log "configuration changed: restarting $d"; fi
        stop_pidfile "$RUN_DIR/$d.pid"
    done
fi

if ! alive "$RUN_DIR/slurmdbd.pid"; then
    log "starting slurmdbd"
    /usr/sbin/slurmdbd
fi
for _ in $(seq 1 $((TIMEOUT * 2))); do
    sacctmgr -n show cluster >/dev/null 2>&1 && break
    sleep 0.5
done
sacctmgr -n show cluster >/dev/null || die "slurmdbd does not answer (see $LOG_DIR/slurmdbd.log)"
if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

cold_start=0
if ! alive "$RUN_DIR/slurmctld.pid"; then
    log "starting slurmctld"
    /usr/sbin/slurmctld
    pgrep -x slurmstepd >/dev/null || cold_start=1
fi
if ! alive "$RUN_DIR/slurmd.pid"; then
    log "starting slurmd"
    /usr/sbin/slurmd -N "$NODE"
fi

# ---------------------------------------------------------------- 4. wait until usable
state=""
for _ in $(seq 1 $((TIMEOUT * 2))); do
    state=$(sinfo -h -n "$NODE" -o '%t' 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mix|alloc) break ;;
        down*|drain*|drng*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
[[ "$state" =~ ^(idle|mix|alloc)$ ]] || die "node $NODE is '$state', not idle (see $LOG_DIR/slurmctld.log, slurmd.log)"
sacct -n -X -S now-1minute >/dev/null || die "sacct does not work (see $LOG_DIR/slurmdbd.log)"

# down.sh cancels every job before it stops the controller, so a controller started cold recovers
# queued or running jobs only from a cluster that died without down.sh (a killed session, a
# rebooted VM). No job step is alive, yet the recovered jobs hold the node (or run a dead session's
# scripts), and new jobs stay pending for many minutes: cancel them. (Not `slurmctld -c`: that
# would also restart job ids at 1, and sacct would then mix old and new jobs of the same id.)
if ((cold_start)) && [[ -n "$(dev_cluster_jobs "$CLUSTER")" ]]; then
    log "the controller recovered jobs of an earlier cluster that was not brought down"
    cancel_dev_cluster_jobs "$CLUSTER" "$TIMEOUT" \
        || die "jobs of an earlier cluster are still queued: $(dev_cluster_jobs "$CLUSTER")"
    state=$(sinfo -h -n "$NODE" -o '%t' | head -n1)
fi

echo "export SLURM_CONF=$SLURM_CONF_PATH" >"$ENV_FILE"
ELAPSED=$(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
log "cluster '$CLUSTER' up in ${ELAPSED}s: node $NODE ($CPUS CPUs, ${REAL_MB} MB), partition $PARTITION ($state)"
echo "export SLURM_CONF=$SLURM_CONF_PATH"
