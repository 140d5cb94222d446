#!/usr/bin/env bash
# Emulated multi-node cluster on one Linux host: network namespaces, bridges,
# veth links shaped with HTB, and an Open MPI launcher that treats every
# namespace as a separate host. Needs root, iproute2 (ip, tc), util-linux
# (unshare, flock) and Open MPI. See docs/emulated-cluster.md.
#
#   cluster.sh up     [flags]            create the cluster
#   cluster.sh run    [flags] -- CMD...  mpirun CMD over the emulated hosts
#   cluster.sh status [flags]            show configuration and link counters
#   cluster.sh down   [flags]            delete everything named with the prefix
#
# Flags (environment variable in brackets; a flag wins over the variable):
#   --nodes N            emulated nodes, 1..8                      [MOECL_NODES, 2]
#   --ranks-per-node G   MPI ranks per node, 1..8, N*G <= 16   [MOECL_RANKS_PER_NODE, 2]
#   --inter-gbit R       node <-> hub link rate, Gbit/s, (0, 10]   [MOECL_INTER_GBIT, 1]
#   --intra-mode M       shm: ranks of a node share a namespace (Open MPI shared memory)
#                        shaped: one namespace per rank, intra-node links shaped too
#                                                              [MOECL_INTRA_MODE, shm]
#   --intra-gbit R2      rank <-> node-bridge rate in shaped mode, (0, 10]
#                                              [MOECL_INTRA_GBIT, min(2*R, 10)]
#   --prefix NAME        name prefix, [a-z][a-z0-9]{0,7}           [MOECL_PREFIX, moecl]
#   --timeout S          run: kill mpirun after S seconds          [MOECL_TIMEOUT, 300]
#
# Extra mpirun options: MOECL_MPIRUN_EXTRA (split on spaces).
#
# Exit status: 0 ok, 2 bad usage or limits, 1 other failure; `run` returns the
# status of mpirun (124 or 137 when the timeout hit); `status` returns 3 when
# the cluster is down. After a crash, `down` with the same prefix cleans up.
# shellcheck disable=SC2016,SC2054 # generated sh text in single quotes; MCA values contain commas
set -euo pipefail

readonly PROG=cluster.sh
readonly SUBNET=10.77.0.0/24
readonly NET3=10.77.0
readonly HUB_IP=10.77.0.254
readonly STATE_ROOT=/run/moe-cluster
readonly LOCK=/run/lock/moe-cluster.lock
readonly ACK_BFIFO_BYTES=262144
readonly DATA_BFIFO_BYTES=4194304 # 4 MiB: smaller queues caused tail drops and RTOs
readonly NOTSENT_LOWAT=131072

usage() {
  awk 'NR == 1 { next } !/^#/ || /^# shellcheck/ { exit } { sub(/^# ?/, ""); print }' "$0"
}
die() { # usage or limit error
  echo "$PROG: $*" >&2
  exit 2
}
fail() {
  echo "$PROG: $*" >&2
  exit 1
}
log() { echo "$PROG: $*" >&2; }

# ---- configuration -----------------------------------------------------------------------

cmd=${1:-}
[[ -n $cmd ]] || {
  usage >&2
  exit 2
}
shift
case $cmd in
  up | down | status | run) ;;
  -h | --help | help)
    usage
    exit 0
    ;;
  *) die "unknown command '$cmd' (up|down|status|run)" ;;
esac

NODES=${MOECL_NODES:-2}
G=${MOECL_RANKS_PER_NODE:-2}
INTER=${MOECL_INTER_GBIT:-1}
MODE=${MOECL_INTRA_MODE:-shm}
INTRA=${MOECL_INTRA_GBIT:-}
PREFIX=${MOECL_PREFIX:-moecl}
TIMEOUT=${MOECL_TIMEOUT:-300}
topo_flags=() # topology flags given explicitly (checked against the saved config by `run`)

while [[ $# -gt 0 ]]; do
  arg=$1
  case $arg in
    --) shift; break ;;
    -h | --help) usage; exit 0 ;;
    --*=*) name=${arg%%=*} val=${arg#*=}; shift ;;
    --*)
      name=$arg
      [[ $# -ge 2 ]] || die "$name needs a value"
      val=$2
      shift 2
      ;;
    *) die "unexpected argument '$arg' (commands for run go after --)" ;;
  esac
  case $name in
    --nodes) NODES=$val; topo_flags+=(NODES) ;;
    --ranks-per-node) G=$val; topo_flags+=(G) ;;
    --inter-gbit) INTER=$val; topo_flags+=(INTER) ;;
    --intra-mode) MODE=$val; topo_flags+=(MODE) ;;
    --intra-gbit) INTRA=$val; topo_flags+=(INTRA) ;;
    --prefix) PREFIX=$val ;;
    --timeout) TIMEOUT=$val ;;
    *) die "unknown flag '$name'" ;;
  esac
done
run_argv=("$@")

[[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--prefix '$PREFIX': use 1-8 characters [a-z0-9], starting with a letter"

check_int() { # name value lo hi
  [[ $2 =~ ^[0-9]{1,3}$ ]] || die "$1 '$2' is not an integer"
  ((10#$2 >= $3 && 10#$2 <= $4)) || die "$1 $2 is out of range [$3, $4]"
}
check_rate() { # name value
  [[ $2 =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] || die "$1 '$2' is not a number of Gbit/s"
  awk -v r="$2" 'BEGIN { exit !(r > 0 && r <= 10) }' || die "$1 $2 Gbit/s is out of range (0, 10]"
}
# Rate in kbit/s as an integer (tc accepts it exactly).
kbit() { awk -v r="$1" 'BEGIN { printf "%d", r * 1000000 + 0.5 }'; }

validate_topology() {
  check_int --nodes "$NODES" 1 8
  check_int --ranks-per-node "$G" 1 8
  NODES=$((10#$NODES))
  G=$((10#$G))
  ((NODES * G <= 16)) || die "--nodes $NODES x --ranks-per-node $G = $((NODES * G)) ranks; at most 16"
  check_rate --inter-gbit "$INTER"
  case $MODE in
    shm | shaped) ;;
    *) die "--intra-mode '$MODE': use shm or shaped" ;;
  esac
  if [[ -z $INTRA ]]; then
    INTRA=$(awk -v r="$INTER" 'BEGIN { v = 2 * r; if (v > 10) v = 10; printf "%g", v }')
  fi
  check_rate --intra-gbit "$INTRA"
  if [[ $MODE == shm ]] && [[ " ${topo_flags[*]} " == *" INTRA "* ]]; then
    log "note: --intra-gbit only applies to --intra-mode shaped (shm uses shared memory)"
  fi
}
validate_timeout() {
  if ! [[ $TIMEOUT =~ ^[0-9]{1,6}$ ]] || ((10#$TIMEOUT < 1)); then
    die "--timeout '$TIMEOUT': use a whole number of seconds >= 1"
  fi
  TIMEOUT=$((10#$TIMEOUT))
}

STATE=$STATE_ROOT/$PREFIX
TMPROOT=/tmp/moe-cluster-$PREFIX
NS_HUB=$PREFIX-hub

[[ $(id -u) -eq 0 ]] || fail "must run as root (network namespaces, tc, sysctl)"
for tool in ip tc unshare flock timeout awk; do
  command -v "$tool" >/dev/null || fail "'$tool' not found"
done

# Namespaces that belong to this prefix, exactly: <prefix>-hub, <prefix>-n<k>, <prefix>-n<k>r<j>.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^${PREFIX}-(hub|n[0-9]+(r[0-9]+)?)\$" || true
}

# ---- the congestion-control sysctl (global; shared by all prefixes) ------------------------
# Namespaces may only choose an algorithm listed in the root namespace's
# tcp_allowed_congestion_control. `up` appends cubic when missing and remembers
# the old value; the last cluster to go down restores it. Serialised with flock,
# as are the creation and removal of the shared directories $STATE_ROOT and
# /etc/netns (removed when the last cluster goes down and they are empty).

with_lock() {
  mkdir -p "$(dirname "$LOCK")"
  (
    flock -w 60 9 || fail "could not lock $LOCK"
    "$@"
  ) 9>"$LOCK"
}
acquire_locked() { # fails when the prefix is taken (checked under the lock: two concurrent `up`s)
  if [[ -e $STATE_ROOT/users/$PREFIX || -n $(our_namespaces) ]]; then
    fail "cluster '$PREFIX' is already up (or left over): run '$PROG down --prefix $PREFIX' first"
  fi
  mkdir -p "$STATE_ROOT/users" "$STATE"
  touch "$STATE_ROOT/users/$PREFIX"
  local cur
  cur=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
  if ! [[ " $cur " == *" cubic "* ]]; then
    [[ -f $STATE_ROOT/cc_allowed.orig ]] || printf '%s\n' "$cur" >"$STATE_ROOT/cc_allowed.orig"
    sysctl -qw "net.ipv4.tcp_allowed_congestion_control=$cur cubic"
  fi
}
release_locked() {
  rm -f "$STATE_ROOT/users/$PREFIX"
  if [[ -d $STATE_ROOT/users && -n $(ls -A "$STATE_ROOT/users") ]]; then
    return 0 # other clusters are up
  fi
  if [[ -f $STATE_ROOT/cc_allowed.orig ]]; then
    local orig
    orig=$(cat "$STATE_ROOT/cc_allowed.orig")
    sysctl -qw "net.ipv4.tcp_allowed_congestion_control=$orig" ||
      log "warning: could not restore tcp_allowed_congestion_control='$orig'"
    rm -f "$STATE_ROOT/cc_allowed.orig"
  fi
  rmdir "$STATE_ROOT/users" "$STATE_ROOT" /etc/netns 2>/dev/null || true # each only when empty
}
write_hosts_locked() { # $hosts_text into /etc/netns/<ns>/hosts for every namespace of ours
  local ns
  for ns in $(our_namespaces); do
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "$hosts_text" >"/etc/netns/$ns/hosts"
  done
}

# ---- teardown ----------------------------------------------------------------------------

kill_ns_pids() { # ns...: TERM, wait up to 3 s, then KILL
  local ns pids=() p i
  for ns in "$@"; do
    while read -r p; do
      if [[ -n $p ]]; then pids+=("$p"); fi
    done < <(ip netns pids "$ns" 2>/dev/null || true)
  done
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    local alive=()
    for p in "${pids[@]}"; do
      if kill -0 "$p" 2>/dev/null; then alive+=("$p"); fi
    done
    ((${#alive[@]})) || return 0
    sleep 0.1
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

teardown() {
  local nss=() ns
  mapfile -t nss < <(our_namespaces)
  if ((${#nss[@]})); then
    kill_ns_pids "${nss[@]}"
    for ns in "${nss[@]}"; do
      ip netns del "$ns" 2>/dev/null || log "warning: could not delete namespace $ns"
    done
  fi
  # /etc/netns/<ns> directories we made (also for namespaces already gone).
  local d
  for d in /etc/netns/"$PREFIX"-*; do
    if [[ -d $d && $(basename "$d") =~ ^${PREFIX}-(hub|n[0-9]+(r[0-9]+)?)$ ]]; then rm -rf -- "$d"; fi
  done
  rm -rf -- "$STATE" "$TMPROOT"
  with_lock release_locked
  local left
  left=$(our_namespaces)
  [[ -z $left ]] || fail "namespaces left behind: $left"
}

# ---- bring-up ----------------------------------------------------------------------------

ns_setup() { # ns: loopback up, cubic, notsent_lowat, no IPv6, no bridge netfilter
  local ns=$1
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control=cubic \
    net.ipv4.tcp_notsent_lowat=$NOTSENT_LOWAT net.ipv4.tcp_slow_start_after_idle=0 \
    net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 >/dev/null
  local k
  for k in call-iptables call-ip6tables call-arptables; do
    ip netns exec "$ns" sysctl -qw "net.bridge.bridge-nf-$k=0" >/dev/null 2>&1 || true
  done
}

# Egress shaping of one interface (tc batch lines on stdout): HTB at the rate, a
# byte-limited FIFO for data, and strict priority for payload-free TCP ACKs only
# (IPv4 total length == 20 + 4*doff, no IP options). Prioritising every small
# packet would reorder MPI headers against their payload.
# Burst: 16 us at the rate, at least 4 KiB. tc's default (about one MTU with
# high-resolution timers) lost 8% of a 2 Gbit/s link to timer lateness; bursts of
# 16-64 KiB let short messages through well above the rate on an idle link.
shape_lines() { # dev rate_kbit
  local dev=$1 r=$2 ack data doff burst
  ack=$((r / 20)) # 5% guaranteed to ACKs, which may borrow up to the link rate
  ((ack >= 1000)) || ack=1000
  data=$((r - ack))
  burst=$((r * 16 / 8000)) # bytes in 16 us (r in kbit/s)
  ((burst >= 4096)) || burst=4096
  local common="ceil ${r}kbit burst $burst cburst $burst quantum 65536"
  echo "qdisc replace dev $dev root handle 1: htb default 20"
  echo "class add dev $dev parent 1: classid 1:1 htb rate ${r}kbit $common"
  echo "class add dev $dev parent 1:1 classid 1:10 htb rate ${ack}kbit $common prio 0"
  echo "class add dev $dev parent 1:1 classid 1:20 htb rate ${data}kbit $common prio 1"
  echo "qdisc add dev $dev parent 1:10 handle 10: bfifo limit $ACK_BFIFO_BYTES"
  echo "qdisc add dev $dev parent 1:20 handle 20: bfifo limit $DATA_BFIFO_BYTES"
  for ((doff = 5; doff <= 15; doff++)); do
    echo "filter add dev $dev parent 1: protocol ip prio 1 u32" \
      "match u8 0x45 0xff at 0 match u8 0x06 0xff at 9" \
      "match u16 $((20 + 4 * doff)) 0xffff at 2 match u8 $((doff << 4)) 0xf0 at 32 flowid 1:10"
  done
}
shape() { # ns dev rate_gbit
  local f
  f=$(mktemp "$STATE/tc.XXXXXX")
  shape_lines "$2" "$(kbit "$3")" >"$f"
  tc -n "$1" -batch "$f"
  rm -f "$f"
  echo "$1 $2 $3" >>"$STATE/links"
}

# veth pair: end a (in ns_a) and end b (in ns_b).
veth() { # ns_a dev_a ns_b dev_b
  ip -n "$1" link add "$2" type veth peer name "$4" netns "$3"
}

write_config() {
  {
    echo "NODES=$NODES"
    echo "G=$G"
    echo "INTER=$INTER"
    echo "MODE=$MODE"
    echo "INTRA=$INTRA"
  } >"$STATE/config"
}
load_config() {
  [[ -f $STATE/config ]] || fail "no cluster '$PREFIX' is up (run: $PROG up --prefix $PREFIX ...)"
  local given_nodes=$NODES given_g=$G given_inter=$INTER given_mode=$MODE given_intra=$INTRA k v
  while IFS='=' read -r k v; do
    case $k in
      NODES) NODES=$v ;; G) G=$v ;; INTER) INTER=$v ;; MODE) MODE=$v ;; INTRA) INTRA=$v ;;
    esac
  done <"$STATE/config"
  local f
  for f in ${topo_flags[@]+"${topo_flags[@]}"}; do
    local want
    case $f in
      NODES) want=$given_nodes ;; G) want=$given_g ;; INTER) want=$given_inter ;;
      MODE) want=$given_mode ;; INTRA) want=$given_intra ;;
    esac
    [[ $want == "${!f}" ]] || awk -v a="$want" -v b="${!f}" 'BEGIN { exit !(a + 0 == b + 0 && a ~ /^[0-9.]+$/) }' ||
      die "cluster '$PREFIX' is up with $f=${!f}, not $want (bring it down first)"
  done
}

up() {
  validate_topology
  [[ -z $(our_namespaces) ]] || fail "cluster '$PREFIX' is already up (or left over): run '$PROG down --prefix $PREFIX' first"
  ip netns list >/dev/null
  local k j r d
  for d in /etc/netns/"$PREFIX"-*; do # left by a crashed run: `ip netns exec` would bind them
    if [[ -d $d && $(basename "$d") =~ ^${PREFIX}-(hub|n[0-9]+(r[0-9]+)?)$ ]]; then rm -rf -- "$d"; fi
  done
  with_lock acquire_locked # exits here, before the trap, when the prefix is taken
  trap 'rc=$?; trap - EXIT; if ((rc != 0)); then log "up failed, tearing down"; teardown || true; fi; exit $rc' EXIT
  mkdir -p "$TMPROOT"
  : >"$STATE/links"

  # hosts: name -> namespace; ip
  local -a hnames=() hns=() hips=()
  if [[ $MODE == shm ]]; then
    for ((k = 0; k < NODES; k++)); do
      hnames+=("node$k") hns+=("$PREFIX-n$k") hips+=("$NET3.$((k + 1))")
    done
  else
    for ((k = 0; k < NODES; k++)); do
      for ((j = 0; j < G; j++)); do
        r=$((k * G + j))
        hnames+=("node$k-r$j") hns+=("$PREFIX-n${k}r$j") hips+=("$NET3.$((r + 1))")
      done
    done
  fi

  # hub: a bridge with the launcher's address
  ns_setup "$NS_HUB"
  ip -n "$NS_HUB" link add "${PREFIX}br" type bridge stp_state 0 forward_delay 0
  ip -n "$NS_HUB" addr add "$HUB_IP/24" dev "${PREFIX}br"
  ip -n "$NS_HUB" link set "${PREFIX}br" up

  if [[ $MODE == shm ]]; then
    # node k: one namespace, veth <prefix>n<k> to hub port <prefix>h<k>, both ends at INTER
    for ((k = 0; k < NODES; k++)); do
      local ns=$PREFIX-n$k
      ns_setup "$ns"
      veth "$NS_HUB" "${PREFIX}h$k" "$ns" "${PREFIX}n$k"
      ip -n "$ns" addr add "${hips[k]}/24" dev "${PREFIX}n$k"
      ip -n "$ns" link set "${PREFIX}n$k" up
      ip -n "$NS_HUB" link set "${PREFIX}h$k" master "${PREFIX}br" up
      shape "$ns" "${PREFIX}n$k" "$INTER"            # node upload
      shape "$NS_HUB" "${PREFIX}h$k" "$INTER"        # node download
    done
  else
    # node k: a bridge namespace <prefix>-n<k> holding bridge <prefix>b<k>, uplink
    # <prefix>u<k> <-> hub port <prefix>d<k> at INTER (the node's NIC); rank r in
    # namespace <prefix>-n<k>r<j> with <prefix>r<r> <-> bridge port <prefix>p<r> at INTRA.
    for ((k = 0; k < NODES; k++)); do
      local nb=$PREFIX-n$k
      ns_setup "$nb"
      ip -n "$nb" link add "${PREFIX}b$k" type bridge stp_state 0 forward_delay 0
      ip -n "$nb" link set "${PREFIX}b$k" up
      veth "$nb" "${PREFIX}u$k" "$NS_HUB" "${PREFIX}d$k"
      ip -n "$nb" link set "${PREFIX}u$k" master "${PREFIX}b$k" up
      ip -n "$NS_HUB" link set "${PREFIX}d$k" master "${PREFIX}br" up
      shape "$nb" "${PREFIX}u$k" "$INTER"            # node upload
      shape "$NS_HUB" "${PREFIX}d$k" "$INTER"        # node download
      for ((j = 0; j < G; j++)); do
        r=$((k * G + j))
        local rn=$PREFIX-n${k}r$j
        ns_setup "$rn"
        veth "$rn" "${PREFIX}r$r" "$nb" "${PREFIX}p$r"
        ip -n "$rn" addr add "${hips[r]}/24" dev "${PREFIX}r$r"
        ip -n "$rn" link set "${PREFIX}r$r" up
        ip -n "$nb" link set "${PREFIX}p$r" master "${PREFIX}b$k" up
        shape "$rn" "${PREFIX}r$r" "$INTRA"          # rank upload
        shape "$nb" "${PREFIX}p$r" "$INTRA"          # rank download
      done
    done
  fi

  # name resolution inside the namespaces (ip netns exec bind-mounts /etc/netns/<ns>/hosts)
  hosts_text=$(
    echo "127.0.0.1 localhost"
    echo "$HUB_IP hub"
    for ((r = 0; r < ${#hnames[@]}; r++)); do echo "${hips[r]} ${hnames[r]}"; done
  )
  with_lock write_hosts_locked

  # hostfile: G slots per node (shm) or 1 per rank host (shaped), in rank order
  : >"$STATE/hostfile"
  for ((r = 0; r < ${#hnames[@]}; r++)); do
    if [[ $MODE == shm ]]; then
      echo "${hnames[r]} slots=$G" >>"$STATE/hostfile"
    else
      echo "${hnames[r]} slots=1" >>"$STATE/hostfile"
    fi
  done

  # rsh agent for Open MPI: host -> `ip netns exec <ns> unshare --uts`, hostname set,
  # per-host TMPDIR, then the daemon command line as ssh would run it (sh -c "$*").
  {
    echo '#!/bin/sh'
    echo "# generated by $PROG up --prefix $PREFIX; Open MPI plm_rsh_agent"
    echo 'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done'
    echo 'host=$1; shift'
    echo 'case $host in'
    for ((r = 0; r < ${#hnames[@]}; r++)); do
      echo "  ${hnames[r]}) ns=${hns[r]} ;;"
    done
    echo '  *) echo "cluster agent: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo "tmp=$TMPROOT/\$host"
    echo 'mkdir -p "$tmp" || exit 255'
    echo 'exec ip netns exec "$ns" unshare --uts -- /bin/sh -c '"'"'hostname "$1" || exit 255; TMPDIR=$2; export TMPDIR; shift 2; exec /bin/sh -c "$*"'"'"' agent "$host" "$tmp" "$@"'
  } >"$STATE/agent"
  chmod 755 "$STATE/agent"
  write_config

  # reachability: from the hub, a TCP connect to a closed port must be refused
  # (an RST came back) rather than time out
  for ((r = 0; r < ${#hnames[@]}; r++)); do
    local out
    out=$(timeout 5 ip netns exec "$NS_HUB" bash -c "exec 3<>/dev/tcp/${hips[r]}/9" 2>&1 || true)
    [[ $out == *"refused"* ]] || fail "host ${hnames[r]} (${hips[r]}) not reachable from the hub: ${out:-timeout}"
  done
  trap - EXIT
  local desc="$NODES node(s) x $G rank(s), inter $INTER Gbit/s"
  if [[ $MODE == shaped ]]; then
    desc+=", intra $INTRA Gbit/s (shaped, one namespace per rank)"
  else
    desc+=", intra: shared memory"
  fi
  log "cluster '$PREFIX' up: $desc"
}

# ---- run ---------------------------------------------------------------------------------

run() {
  validate_timeout
  load_config
  ((${#run_argv[@]})) || die "run: give the command after --"
  local np=$((NODES * G)) cores
  cores=$(nproc)
  local -a mca=(
    --mca plm_rsh_agent "$STATE/agent" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl self,vader,tcp
    --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
    --mca btl_tcp_flags send,inplace,need-ack,need-csum
  )
  if ((np > cores)); then
    mca+=(--mca mpi_yield_when_idle 1)
  fi
  local -a extra=()
  if [[ -n ${MOECL_MPIRUN_EXTRA:-} ]]; then
    read -r -a extra <<<"$MOECL_MPIRUN_EXTRA"
  fi
  mkdir -p "$TMPROOT/hub"
  local rc=0 pid
  # In the background so that INT/TERM reach us: timeout puts mpirun in its own
  # process group, which a terminal's Ctrl-C would not reach.
  env TMPDIR="$TMPROOT/hub" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    MOE_RANKS_PER_NODE="$G" MOECL_NODES="$NODES" MOECL_RANKS_PER_NODE="$G" \
    MOECL_INTER_GBIT="$INTER" MOECL_INTRA_MODE="$MODE" MOECL_INTRA_GBIT="$INTRA" \
    timeout -k 15 "$TIMEOUT" \
    ip netns exec "$NS_HUB" unshare --uts -- /bin/sh -c 'hostname hub && exec "$@"' sh \
    mpirun -np "$np" --hostfile "$STATE/hostfile" --map-by slot --bind-to none \
    "${mca[@]}" \
    -x MOE_RANKS_PER_NODE -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
    -x MOECL_NODES -x MOECL_RANKS_PER_NODE -x MOECL_INTER_GBIT -x MOECL_INTRA_MODE -x MOECL_INTRA_GBIT \
    ${extra[@]+"${extra[@]}"} "${run_argv[@]}" </dev/null &
  pid=$!
  got_sig=
  trap 'got_sig=INT; kill -TERM "$pid" 2>/dev/null || true' INT
  trap 'got_sig=TERM; kill -TERM "$pid" 2>/dev/null || true' TERM
  trap 'got_sig=HUP; kill -TERM "$pid" 2>/dev/null || true' HUP
  local i
  for ((i = 0; i < 100; i++)); do # wait returns early when a trapped signal arrives
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  if ((rc == 124 || rc == 137)); then
    log "run: timed out after $TIMEOUT s; killing what is left in the node namespaces"
  fi
  if ((rc != 0)); then
    local nss=() ns
    for ns in $(our_namespaces); do [[ $ns == "$NS_HUB" ]] || nss+=("$ns"); done
    kill_ns_pids "$NS_HUB" ${nss[@]+"${nss[@]}"}
  fi
  trap - INT TERM HUP
  if [[ -n $got_sig ]]; then
    # die of the same signal, so that a calling shell sees it and stops too
    log "run: interrupted (SIG$got_sig)"
    kill -s "$got_sig" $$
    rc=130
  fi
  return "$rc"
}

# ---- status ------------------------------------------------------------------------------

status() {
  local nss
  nss=$(our_namespaces)
  if [[ ! -f $STATE/config ]]; then
    if [[ -n $nss ]]; then
      echo "cluster '$PREFIX': namespaces without state (run down): $nss"
      return 1
    fi
    echo "cluster '$PREFIX': down"
    return 3
  fi
  load_config
  echo "cluster '$PREFIX': up; mode $MODE, $NODES node(s) x $G rank(s), inter $INTER Gbit/s$([[ $MODE == shaped ]] && echo ", intra $INTRA Gbit/s")"
  echo "namespaces: $(echo "$nss" | tr '\n' ' ')"
  echo "hostfile:"
  sed 's/^/  /' "$STATE/hostfile"
  echo "links (egress side: sent bytes, packets, drops, overlimits of the HTB root):"
  local ns dev rate
  while read -r ns dev rate; do
    [[ -n $ns ]] || continue
    tc -n "$ns" -s qdisc show dev "$dev" 2>/dev/null | awk -v w="$ns/$dev" -v r="$rate" '
      /^qdisc htb 1: root/ { getline; printf "  %-22s %5s Gbit/s  sent %s B %s pkt, dropped %s overlimits %s\n", w, r, $2, $4, $7, $9; exit }' |
      tr -d ','
  done <"$STATE/links"
}

case $cmd in
  up) validate_timeout; up ;;
  down) teardown; log "cluster '$PREFIX' down" ;;
  status) status ;;
  run) run ;;
esac
