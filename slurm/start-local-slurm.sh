#!/usr/bin/env bash
# Start tilesweep's local test cluster: a single-node SLURM 22.05 (munge + mariadb + slurmdbd
# + slurmctld + slurmd) on this machine, as root, without systemd, with fake GPUs as GRES.
# Installs the Debian packages if missing. Idempotent: a daemon already started by this script
# (live pid file under $SLURM_LOCAL_DIR/run) is left alone; concurrent calls serialise on a lock.
# Stop with stop-local-slurm.sh. Tested on Debian 12 (Slurm 22.05.8, MariaDB 10.11).
# Adapted from the shared local-slurm recipe; see docs/slurm-notes.md for what submitit does here.
#
# Partitions: gpu (default) and cpu, no time limit; short, MaxTime=$SLURM_LOCAL_SHORT_MAX_TIME
# minutes, and EnforcePartLimits=ALL, so sbatch rejects a longer --time at once (as many sites do).
# A job's own --time (submitit: timeout_min) is enforced with OverTimeLimit=0 and KillWait=5:
# SIGTERM at the limit (slurmctld checks limits every ~30 s), SIGKILL 5 s later.
#
# Environment knobs (all optional):
#   SLURM_LOCAL_DIR        state/log/pid dir                       (default /tmp/tilesweep-slurm)
#   SLURM_LOCAL_ACCOUNTING 1 = mariadb + slurmdbd, so `sacct` works (submitit polls job
#                          state with sacct); 0 = no accounting               (default 1)
#   SLURM_LOCAL_GPUS       number of fake GPUs (GRES gpu) on the node          (default 4)
#   SLURM_LOCAL_CPUS       CPUs to declare; may exceed the real count
#                          (SlurmdParameters=config_overrides)        (default max(real, 8))
#   SLURM_LOCAL_MAX_ARRAY_SIZE  MaxArraySize: array indices must be < this    (default 10001)
#                          (read the running value: scontrol show config | grep MaxArraySize)
#   SLURM_LOCAL_SHORT_MAX_TIME  MaxTime of partition "short", minutes            (default 1)
#   SLURM_LOCAL_TIMEOUT    seconds to wait for each daemon and for the node  (default 120)
# Changing a knob that alters slurm.conf while the cluster runs is refused: stop it first.
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/tilesweep-slurm}
ACCT=${SLURM_LOCAL_ACCOUNTING:-1}
NGPU=${SLURM_LOCAL_GPUS:-4}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-120}
MAXARRAY=${SLURM_LOCAL_MAX_ARRAY_SIZE:-10001}
SHORTMAX=${SLURM_LOCAL_SHORT_MAX_TIME:-1}
CLUSTER=localcluster
DBPORT=3307
DBPASS=slurmdbpass
CONF=/etc/slurm          # default path of the Debian build: clients need no SLURM_CONF
export SLURM_CONF=$CONF/slurm.conf   # ours, even if the caller points SLURM_CONF at another cluster

log() { echo "[start-local-slurm $(date +%T.%3N)] $*" >&2; }
# die MESSAGE [LOGFILE...]: print the message, the tail of the given logs (default: all), exit 1
die() {
  local msg=$1 f; shift; log "ERROR: $msg"
  [ $# -gt 0 ] || set -- "$DIR"/log/*.log
  for f in "$@"; do [ -s "$f" ] && { echo "--- last lines of $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}
[ "$(id -u)" = 0 ] || { echo "start-local-slurm.sh must run as root" >&2; exit 1; }
[[ $MAXARRAY =~ ^[0-9]+$ && $SHORTMAX =~ ^[0-9]+$ ]] \
  || { echo "SLURM_LOCAL_MAX_ARRAY_SIZE and SLURM_LOCAL_SHORT_MAX_TIME must be integers" >&2; exit 1; }

# One start or stop at a time (CI and several test sessions may call this together). The
# script re-runs itself under `flock -o`, which holds the lock in the flock process and closes
# it in the child: daemons started below must not inherit the lock fd, or it is never freed.
if [ "${_TILESWEEP_SLURM_LOCKED:-}" != "$DIR" ]; then
  mkdir -p "$DIR"
  rc=0; _TILESWEEP_SLURM_LOCKED=$DIR flock -o -w "$((TIMEOUT * 3))" -E 75 "$DIR/.lock" "$BASH" "$0" "$@" || rc=$?
  [ $rc != 75 ] || echo "start-local-slurm.sh: $DIR/.lock held for $((TIMEOUT * 3)) s by another start/stop" >&2
  exit $rc
fi
unset _TILESWEEP_SLURM_LOCKED
# Nor any other descriptor of the caller: under `flock LOCK bash scripts/test.sh` (how the suite
# and landings serialise) munged, mariadbd and slurmdbd, which keep what they inherit, would hold
# LOCK for as long as they run. Keep stdin, stdout, stderr and bash's own 255.
for fd in $(ls /proc/$$/fd); do
  case $fd in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
done

# pid_alive PIDFILE COMM: the pid in PIDFILE is a live (non-zombie) process named COMM
pid_alive() {
  local p st; [ -s "$1" ] || return 1; p=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] || return 1
  st=$(ps -o stat= -p "$p" 2>/dev/null) && [ -n "$st" ] && [[ $st != Z* ]]
}
# wait_up NAME PIDFILE COMM LOG CMD...: poll CMD every 0.2 s until it succeeds; fail at
# once if the daemon's pid file names a dead process, or after $TIMEOUT s
wait_up() {
  local name=$1 pf=$2 comm=$3 lf=$4; shift 4; local end=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1 && pid_alive "$pf" "$comm"; do
    if [ -s "$pf" ] && ! pid_alive "$pf" "$comm"; then die "$name exited during startup" "$lf"; fi
    [ $SECONDS -lt $end ] || die "timed out after ${TIMEOUT}s waiting for $name" "$lf"
    sleep 0.2
  done
  log "$name started (pid $(cat "$pf"))"
}

# ------------------------------------------------------------------ install if missing
pkgs=(slurmctld slurmd slurm-client munge)
need=0
for c in slurmctld slurmd sbatch sacct munged; do command -v $c >/dev/null || need=1; done
if [ "$ACCT" = 1 ]; then
  pkgs+=(slurmdbd mariadb-server)
  for c in slurmdbd mariadbd mariadb-install-db; do command -v $c >/dev/null || need=1; done
fi
if [ $need = 1 ]; then
  log "installing ${pkgs[*]}"
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then     # keep package scripts from starting services
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  [ $made_policy = 0 ] || rm -f /usr/sbin/policy-rc.d
fi

# ------------------------------------------------------------------ configuration
NODE=$(hostname -s)
mkdir -p "$DIR"/{ctld,d,log,run,fakegpu} "$CONF"
read -r BOARDS SOCKETS CORES THREADS CPUS_HW MEM_HW < <(slurmd -C | head -1 | tr ' ' '\n' |
  awk -F= '{v[$1]=$2} END {print v["Boards"], v["SocketsPerBoard"], v["CoresPerSocket"], v["ThreadsPerCore"], v["CPUs"], v["RealMemory"]}')
MEM=$((MEM_HW * 9 / 10))
CPUS=${SLURM_LOCAL_CPUS:-$((CPUS_HW > 8 ? CPUS_HW : 8))}
if [ "$CPUS" = "$CPUS_HW" ]; then
  NODECPU="Boards=$BOARDS SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS"; OVR=""
else   # declare more (or fewer) CPUs than the hardware has; slurmd would drain the node without config_overrides
  NODECPU="CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1"; OVR="SlurmdParameters=config_overrides"
fi
# Slurm 22.05's gres/gpu drops GPUs declared without File= ("Removing file-less GPU"),
# and warns about File= paths that are not device nodes, so each fake GPU is a
# character device cloned from /dev/null (c 1:3).
GRES_NODE=""; GRES_TYPES=""
if [ "$NGPU" -gt 0 ]; then
  for ((i = 0; i < NGPU; i++)); do
    [ -c "$DIR/fakegpu/gpu$i" ] || { rm -f "$DIR/fakegpu/gpu$i"; mknod -m 666 "$DIR/fakegpu/gpu$i" c 1 3; }
  done
  GRES_NODE="Gres=gpu:$NGPU"; GRES_TYPES="GresTypes=gpu"
fi
if [ "$ACCT" = 1 ]; then
  ACCT_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT_CONF="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

new=$(mktemp)
cat > "$new" <<EOF
# generated by start-local-slurm.sh
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
# batch_sched_delay=0: start queued jobs within ~1 s of a slot freeing (default 3 s);
# sched_interval/bf_interval=5: periodic passes every 5 s (defaults 60/30 s), so e.g. a
# requeued job starts soon after its BeginTime
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
$ACCT_CONF
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
# a job over its --time: SIGTERM (and submitit's USR2 warning, if still due), SIGKILL 5 s later
OverTimeLimit=0
KillWait=5
Waittime=0
# sbatch rejects a request over a partition limit instead of leaving it PENDING forever
EnforcePartLimits=ALL
MaxArraySize=$MAXARRAY
$OVR
$GRES_TYPES
NodeName=$NODE NodeAddr=127.0.0.1 $NODECPU RealMemory=$MEM $GRES_NODE State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
PartitionName=short Nodes=$NODE Default=NO MaxTime=$SHORTMAX DefaultTime=$SHORTMAX State=UP
EOF
changed=0
cmp -s "$new" "$CONF/slurm.conf" || changed=1
if [ $changed = 1 ] && { pid_alive "$DIR/run/slurmctld.pid" slurmctld || pid_alive "$DIR/run/slurmd.pid" slurmd; }; then
  rm -f "$new"; die "slurm.conf would change while slurmctld/slurmd run; run stop-local-slurm.sh first" /dev/null
fi
install -m 644 "$new" "$CONF/slurm.conf"; rm -f "$new"
if [ "$NGPU" -gt 0 ]; then
  echo "Name=gpu File=$DIR/fakegpu/gpu[0-$((NGPU - 1))]" > "$CONF/gres.conf"
else
  : > "$CONF/gres.conf"
fi
if [ "$ACCT" = 1 ]; then
  cat > "$CONF/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DBPORT
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$CONF/slurmdbd.conf"
fi

# ------------------------------------------------------------------ munged
if pid_alive "$DIR/run/munge/munged.pid" munged; then
  log "munged already running (ours)"
elif munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "a munged not started by this script answers; using it (stop-local-slurm.sh leaves it alone)"
else
  [ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key   # normally made by the package
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge "$DIR/run/munge"
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  rm -f "$DIR/run/munge/munged.pid"
  runuser -u munge -- /usr/sbin/munged --pid-file="$DIR/run/munge/munged.pid" </dev/null >/dev/null 2>&1 \
    || die "munged failed to start" /var/log/munge/munged.log
  wait_up munged "$DIR/run/munge/munged.pid" munged /var/log/munge/munged.log sh -c 'munge -n | unmunge'
fi

# ------------------------------------------------------------------ mariadb + slurmdbd
if [ "$ACCT" = 1 ]; then
  DB="$DIR/mysql"; SOCK="$DIR/run/mysql/mysqld.sock"
  install -d -o mysql -g mysql -m 755 "$DIR/run/mysql"
  if pid_alive "$DIR/run/mysql/mysqld.pid" mariadbd; then
    log "mariadb already running (ours)"
  else
    if [ ! -d "$DB/mysql" ]; then
      log "initialising a private mariadb datadir in $DB"
      install -d -o mysql -g mysql -m 750 "$DB"
      mariadb-install-db --user=mysql --datadir="$DB" --auth-root-authentication-method=socket \
        --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed" "$DIR/log/mariadb-install.log"
    fi
    rm -f "$DIR/run/mysql/mysqld.pid"
    # private instance: own datadir, socket and port (3307 on 127.0.0.1), no /etc/mysql config
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB" --socket="$SOCK" \
      --pid-file="$DIR/run/mysql/mysqld.pid" --port=$DBPORT --bind-address=127.0.0.1 \
      --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 --log-error="$DIR/log/mariadb.log" \
      </dev/null >/dev/null 2>&1 &
    wait_up mariadb "$DIR/run/mysql/mysqld.pid" mariadbd "$DIR/log/mariadb.log" \
      mariadb --no-defaults -S "$SOCK" -u root -e 'select 1'
  fi
  mariadb --no-defaults -S "$SOCK" -u root -e "
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "mariadb user setup failed" "$DIR/log/mariadb.log"
  if pid_alive "$DIR/run/slurmdbd.pid" slurmdbd; then
    log "slurmdbd already running (ours)"
  else
    rm -f "$DIR/run/slurmdbd.pid"
    slurmdbd </dev/null >/dev/null 2>&1 || die "slurmdbd failed to start" "$DIR/log/slurmdbd.log"
    wait_up slurmdbd "$DIR/run/slurmdbd.pid" slurmdbd "$DIR/log/slurmdbd.log" sacctmgr -n list cluster
  fi
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" \
    || sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed" "$DIR/log/slurmdbd.log"
fi

# ------------------------------------------------------------------ slurmctld + slurmd
if pid_alive "$DIR/run/slurmctld.pid" slurmctld; then
  log "slurmctld already running (ours)"
else
  rm -f "$DIR/run/slurmctld.pid"
  slurmctld </dev/null >/dev/null 2>&1 || die "slurmctld failed to start" "$DIR/log/slurmctld.log"
  wait_up slurmctld "$DIR/run/slurmctld.pid" slurmctld "$DIR/log/slurmctld.log" scontrol ping
fi
if pid_alive "$DIR/run/slurmd.pid" slurmd; then
  log "slurmd already running (ours)"
else
  rm -f "$DIR/run/slurmd.pid"
  slurmd </dev/null >/dev/null 2>&1 || die "slurmd failed to start" "$DIR/log/slurmd.log"
  wait_up slurmd "$DIR/run/slurmd.pid" slurmd "$DIR/log/slurmd.log" true
fi

# ------------------------------------------------------------------ wait for the node
node_state() { scontrol -o show node "$NODE" 2>/dev/null | tr ' ' '\n' | sed -n 's/^State=//p'; }
end=$((SECONDS + TIMEOUT)); resumed=0; st=""
while :; do
  st=$(node_state)
  case "$st" in
    IDLE | MIXED | ALLOCATED) break ;;
    *DRAIN* | DOWN*)                      # e.g. left over from a crash: ask once to resume
      if [ $resumed = 0 ]; then scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true; resumed=1; fi ;;
  esac
  if ! pid_alive "$DIR/run/slurmd.pid" slurmd; then die "slurmd died while the node registered" "$DIR/log/slurmd.log"; fi
  if [ $SECONDS -ge $end ]; then
    scontrol show node "$NODE" >&2 || true
    die "node $NODE not usable after ${TIMEOUT}s (state '$st')" "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log"
  fi
  sleep 0.2
done
log "cluster up: node $NODE state $st; partitions $(sinfo -h -o %P | tr '\n' ' ')"
