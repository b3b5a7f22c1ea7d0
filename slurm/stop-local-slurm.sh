#!/usr/bin/env bash
# Stop tilesweep's local test cluster: only the daemons started by start-local-slurm.sh,
# i.e. those whose pid file under $SLURM_LOCAL_DIR/run names a live process of the expected
# name. Idempotent; waits for a start in progress. Packages and /etc/slurm stay.
# Jobs still queued or running are cancelled first, so no job step outlives slurmd.
# SLURM_LOCAL_PURGE=1 also deletes $SLURM_LOCAL_DIR (job state, logs, accounting DB).
set -uo pipefail
DIR=${SLURM_LOCAL_DIR:-/tmp/tilesweep-slurm}
export SLURM_CONF=/etc/slurm/slurm.conf   # the local cluster's, whatever the caller had
log() { echo "[stop-local-slurm $(date +%T.%3N)] $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "stop-local-slurm.sh must run as root" >&2; exit 1; }
[ -d "$DIR" ] || { log "$DIR does not exist; nothing to stop"; exit 0; }
if [ "${_TILESWEEP_SLURM_LOCKED:-}" != "$DIR" ]; then  # wait for a start in progress (same lock)
  rc=0; _TILESWEEP_SLURM_LOCKED=$DIR flock -o -w 600 -E 75 "$DIR/.lock" "$BASH" "$0" "$@" || rc=$?
  [ $rc != 75 ] || log "$DIR/.lock held for 600 s by another start/stop"
  exit $rc
fi
unset _TILESWEEP_SLURM_LOCKED

# alive PID COMM: the process exists, is named COMM, and is not a zombie
alive() {
  local st; [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] || return 1
  st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [[ $st != Z* ]]
}
stop_one() { # PIDFILE COMM
  local f=$1 comm=$2 p i
  [ -s "$f" ] || return 0
  p=$(cat "$f" 2>/dev/null)
  if [ -n "$p" ] && alive "$p" "$comm"; then
    kill -TERM "$p" 2>/dev/null
    for i in $(seq 1 150); do alive "$p" "$comm" || break; sleep 0.2; done
    if alive "$p" "$comm"; then log "$comm ($p) ignored SIGTERM for 30 s; SIGKILL"; kill -KILL "$p" 2>/dev/null; sleep 0.5; fi
    log "stopped $comm ($p)"
  else
    log "stale pid file for $comm; removing"
  fi
  rm -f "$f"
}

if [ -s "$DIR/run/slurmctld.pid" ] && alive "$(cat "$DIR/run/slurmctld.pid")" slurmctld; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    scancel $jobs 2>/dev/null
    for i in $(seq 1 75); do [ -z "$(squeue -h -t R,CG,S -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi
stop_one "$DIR/run/slurmd.pid" slurmd
stop_one "$DIR/run/slurmctld.pid" slurmctld
stop_one "$DIR/run/slurmdbd.pid" slurmdbd
stop_one "$DIR/run/mysql/mysqld.pid" mariadbd
stop_one "$DIR/run/munge/munged.pid" munged
if [ "${SLURM_LOCAL_PURGE:-0}" = 1 ]; then rm -rf "$DIR"; log "removed $DIR"; fi
exit 0
