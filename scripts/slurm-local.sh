#!/usr/bin/env bash
# slurm-local.sh: a one-node Slurm cluster on this machine, for tests and for
# trying sbatch scripts (docs/cluster.md). Loopback only; installs nothing
# (bash scripts/setup-debian.sh --slurm installs slurm-wlm and munge).
#
#   bash scripts/slurm-local.sh start    write the config, start munged, slurmctld
#                                        and slurmd, wait (bounded) until the node is idle
#   bash scripts/slurm-local.sh status   the daemons' pids and `sinfo`; exit 0 when all run
#   bash scripts/slurm-local.sh stop     stop every daemon it started, remove its directory
#   bash scripts/slurm-local.sh env      print `export SLURM_CONF=...` (eval it to use sinfo,
#                                        srun, sbatch against this cluster)
#
# Everything lives in $MOE_SLURM_DIR (default /tmp/moe-slurm): slurm.conf, a
# munge key made for it, munged's socket, Slurm's state and spool, every log
# and pid file. The system's /etc/munge and /etc/slurm are not used or changed.
# The node is "localhost" (127.0.0.1) with $MOE_SLURM_CPUS CPUs (default: the
# larger of 4 and nproc; SlurmdParameters=config_overrides lets it claim more
# CPUs than the machine has, so 4 tasks fit on 2 cores). Ports:
# $MOE_SLURM_PORT (slurmctld, default 16817) and the next one (slurmd).
# Must run as root (slurmd launches tasks as the submitting user).
set -euo pipefail

DIR=${MOE_SLURM_DIR:-/tmp/moe-slurm}
PORT=${MOE_SLURM_PORT:-16817}
WAIT_S=${MOE_SLURM_WAIT_S:-30}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
  echo "slurm-local: $*" >&2
  exit 1
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

cpus() {
  local n
  n=$(nproc 2>/dev/null || echo 1)
  if [[ -n "${MOE_SLURM_CPUS:-}" ]]; then n=$MOE_SLURM_CPUS; elif ((n < 4)); then n=4; fi
  echo "$n"
}

write_conf() {
  local c
  c=$(cpus)
  [[ "$c" =~ ^[1-9][0-9]*$ ]] || die "MOE_SLURM_CPUS must be a positive integer (got '$c')"
  cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: one node on localhost, for tests.
ClusterName=moe-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
# Open MPI (the default build) speaks PMIx; MPICH needs srun --mpi=pmi2.
MpiDefault=pmix
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$c State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=60 State=UP OverSubscribe=NO
EOF
}

# wait_for SECONDS CMD...: run CMD every 0.5 s until it succeeds; 1 on timeout.
wait_for() {
  local limit=$1 t=0
  shift
  while ! "$@" >/dev/null 2>&1; do
    if ((t >= limit * 2)); then return 1; fi
    sleep 0.5
    t=$((t + 1))
  done
}

node_idle() { grep -qx "idle" <<<"$(sinfo -h -N -o "%T" 2>/dev/null)"; }

show_logs() {
  local f
  for f in "$DIR"/munged.log "$DIR"/slurmctld.log "$DIR"/slurmd.log; do
    [[ -f "$f" ]] && { echo "--- $f (last lines)"; tail -n 15 "$f"; } >&2
  done
  return 0
}

start() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd launches tasks as the submitting user)"
  local b
  for b in munged slurmctld slurmd sinfo srun; do
    command -v "$b" >/dev/null ||
      die "$b not found (Debian: bash scripts/setup-debian.sh --slurm, or apt-get install slurm-wlm munge)"
  done
  if pid_alive "$DIR/slurmctld.pid" || pid_alive "$DIR/slurmd.pid" || pid_alive "$DIR/munged.pid"; then
    die "already running in $DIR (bash $0 stop first)"
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
  chmod 700 "$DIR/munge"
  export SLURM_CONF=$DIR/slurm.conf
  write_conf

  # 1. munged with its own key and socket.
  dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge.key" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed" ||
    {
      show_logs
      die "munged did not start"
    }
  wait_for 10 test -S "$DIR/munge/munge.socket" || {
    show_logs
    stop_daemons
    die "munged's socket did not appear within 10 s"
  }

  # 2. slurmctld, then slurmd (both fork into the background; -N names the node).
  slurmctld -f "$SLURM_CONF" || {
    show_logs
    stop_daemons
    die "slurmctld did not start"
  }
  slurmd -f "$SLURM_CONF" -N localhost || {
    show_logs
    stop_daemons
    die "slurmd did not start"
  }

  # 3. bounded wait until the node is idle.
  if ! wait_for "$WAIT_S" node_idle; then
    sinfo -N >&2 || true
    show_logs
    stop_daemons
    die "the node did not become idle within $WAIT_S s (logs above)"
  fi
  echo "slurm-local: running in $DIR ($(cpus) CPUs on localhost, ports $PORT-$((PORT + 1)));" \
    "use: export SLURM_CONF=$SLURM_CONF"
}

# Stops the daemons whose pid files are in $DIR: TERM, then KILL after 10 s.
stop_daemons() {
  local name f p t
  for name in slurmd slurmctld munged; do
    f=$DIR/$name.pid
    pid_alive "$f" || continue
    p=$(cat "$f")
    kill -TERM "$p" 2>/dev/null || true
    t=0
    while kill -0 "$p" 2>/dev/null && ((t < 20)); do
      sleep 0.5
      t=$((t + 1))
    done
    if kill -0 "$p" 2>/dev/null; then
      echo "slurm-local: $name ($p) ignored TERM for 10 s; killing it" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  return 0
}

stop() {
  [[ -d "$DIR" ]] || {
    echo "slurm-local: nothing to stop ($DIR does not exist)"
    return 0
  }
  export SLURM_CONF=$DIR/slurm.conf
  # 1. cancel the jobs still there and wait (bounded) until they are gone.
  if pid_alive "$DIR/slurmctld.pid"; then
    scancel --full --quiet --partition=local 2>/dev/null || true
    wait_for 15 no_jobs || echo "slurm-local: jobs still listed after 15 s; stopping anyway" >&2
  fi
  # 2. the daemons.
  stop_daemons
  # 3. slurmstepd processes left by this cluster's slurmd (they carry its SLURM_CONF).
  local p
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if grep -qz "^SLURM_CONF=$DIR/slurm.conf\$" "/proc/$p/environ" 2>/dev/null; then
      echo "slurm-local: killing leftover slurmstepd $p" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$DIR"
  echo "slurm-local: stopped"
}

no_jobs() { [[ -z "$(squeue -h -o %i 2>/dev/null)" ]]; }

status() {
  local ok=0 name
  for name in munged slurmctld slurmd; do
    if pid_alive "$DIR/$name.pid"; then echo "$name: running (pid $(cat "$DIR/$name.pid"))"; else
      echo "$name: not running"
      ok=1
    fi
  done
  if ((ok == 0)); then SLURM_CONF=$DIR/slurm.conf sinfo -N || ok=1; fi
  return $ok
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
