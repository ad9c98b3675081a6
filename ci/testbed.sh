#!/usr/bin/env bash
# The multi-host test bed: turns this machine into N hosts, each a network namespace with its own
# hostname and its own sshd, so that horovodrun's ssh launch runs over real ssh between real
# addresses.
#
#   ci/testbed.sh up N [--netem SPEC]   hosts hvd-h1..hvd-hN (198.18.0.1..N); nothing to do when
#                                       N hosts are already up; --netem shapes every link
#   ci/testbed.sh down                  stops what up started, removes every namespace, interface
#                                       and file of the bed; nothing to do when it is down
#   ci/testbed.sh status                the hosts and whether each sshd answers (exit 3: down)
#   ci/testbed.sh shape SPEC            tc netem SPEC (e.g. "rate 10gbit delay 50us") on both
#                                       ends of every link of a running bed
#   ci/testbed.sh shape-rate RATE [BURST]
#                                       rate limit only, for kernels without netem: tc tbf
#                                       "rate RATE burst BURST latency 5ms" (BURST 256kb by
#                                       default) on both ends of every link of a running bed
#   ci/testbed.sh unshape               removes the shaping (netem or tbf)
#   ci/testbed.sh check                 exit 0 when this machine can host the bed, else 77
#   ci/testbed.sh slurm-up [N]          a Slurm cluster on hosts 1..N of a running bed (default 2):
#                                       slurmctld here, a slurmd per host, one munged; nothing to
#                                       do when it is up. `. $STATE/slurm/env` sets SLURM_CONF
#   ci/testbed.sh slurm-down            stops the Slurm daemons by PID (and what their steps left
#                                       in the hosts) and removes $STATE/slurm; down does it too
#
# Layout: a bridge hvdbr0 (198.18.0.254/24, the launcher's address) in this namespace; host K is
# the namespace hvd-hK whose NIC, the far end of the veth hvdvK on the bridge, is also named
# hvdbr0 (198.18.0.K/24), so that the launcher and every host share an interface name. Its sshd
# runs in its own UTS namespace (hostname hvd-hK) and listens on 198.18.0.K ports 22 and 2222.
# Addresses come only from 198.18.0.0/15 (RFC 2544, benchmarking) and loopback; IPv6 is off on
# the bed's interfaces and no host has a route out of 198.18.0.0/24.
#
# State, in ${HOROVOD_TESTBED_DIR:-/run/horovod-testbed}: the client key id_ed25519 (authorized
# on every host, held by an ssh-agent at agent.sock), unauthorized_ed25519 (authorized nowhere),
# host keys, sshd_config, ssh_config, bin/ssh (ssh with that config: known hosts go to the state
# dir, never ~/.ssh), `env` (source it: PATH and SSH_AUTH_SOCK), `hosts` and `pids` (what up
# started: name, PID and the kernel's start time of the process, so that down never signals a
# recycled PID).
#
# Slurm mode (slurm-up), state in $STATE/slurm: one munged with its own key and socket (munge/)
# serves every daemon and client; slurmctld runs here, in a UTS namespace of its own (hostname
# hvd-ctl), at $LAUNCHER port 16817; host K's slurmd (node hvd-hK, NodeAddr $NET.K, 2 CPUs, port
# 16818) runs in the host's network namespace and in mount and UTS namespaces of its own
# (hostname hvd-hK, /etc/hosts bound from /etc/netns/hvd-hK/hosts): not through ip netns exec,
# whose remounted /sys hides /sys/fs/cgroup, without which slurmd 22.05 does not start. Spool,
# logs, each node's TmpFS and the controller's state are in $STATE/slurm; proctrack/linuxproc, task/none,
# select/cons_tres with CPUs as the resource, ReturnToService=1, one partition "bed".
#
# Exit status: 0 done, 1 error, 2 usage, 3 `status` of a bed that is down, 77 this machine cannot
# do it (not root, no network namespaces, no netem or tbf in the kernel), with a one-line reason.
set -Eeuo pipefail
# Any command that fails unexpectedly says where, instead of a silent exit.
on_error() {  # STATUS LINE
  case $BASH_COMMAND in
    return* | cmd_*) ;;  # a function's own status, already explained
    *) echo "testbed: line $2: \"$BASH_COMMAND\" failed (status $1)" >&2 ;;
  esac
}
trap 'on_error $? $LINENO' ERR

STATE=${HOROVOD_TESTBED_DIR:-/run/horovod-testbed}
readonly STATE
readonly BRIDGE=hvdbr0          # the bridge here, and every host's NIC
readonly NET=198.18.0           # hosts are $NET.K, K = 1..MAX_HOSTS
readonly LAUNCHER=198.18.0.254
readonly MAX_HOSTS=250
readonly SSHD=/usr/sbin/sshd
readonly SSH=/usr/bin/ssh
readonly MARKER=.horovod-testbed
# The environment of each sshd: nothing of the caller's (a test's variables) leaks into sessions.
readonly SSHD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() { echo "testbed: $*" >&2; exit 1; }
unavailable() { echo "testbed: $*" >&2; exit 77; }
say() { echo "testbed: $*" >&2; }

usage() {
  sed -n '6,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- processes: recorded as "ROLE NAME PID STARTTIME" lines in $STATE/pids -----------------------

# Reads /proc/PID/stat into PROC_STATE (R, S, Z, ...) and PROC_START (the kernel's start time,
# field 22), both empty if there is no such process. Builtins only (no fork): see record_pid.
proc_stat() {
  PROC_STATE="" PROC_START=""
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
  # Fields after the command name, which may itself hold spaces and parentheses: state is the 1st.
  stat=${stat##*) }
  # shellcheck disable=SC2086  # split on purpose
  set -- $stat
  PROC_STATE=$1 PROC_START=${20}
}

start_time() {  # PID: prints its start time, nothing if there is no such process
  proc_stat "$1"
  echo "$PROC_START"
}

# True if PID is alive (not a zombie) and started at START.
alive() {
  proc_stat "$1"
  [ -n "$PROC_START" ] && [ "$PROC_START" = "$2" ] && [ "$PROC_STATE" != Z ]
}

# True if PID exists and is not a zombie.
running() {
  proc_stat "$1"
  [ -n "$PROC_STATE" ] && [ "$PROC_STATE" != Z ]
}

# Signals that arrive between starting a process and recording its PID wait until it is recorded
# (a handler, not "ignore": the started process must keep the default handling of SIGTERM).
interrupted=""
defer_signals() {
  trap 'interrupted=INT' INT
  trap 'interrupted=TERM' TERM
  trap 'interrupted=HUP' HUP
}

resume_signals() {
  trap - INT TERM HUP
  if [ -n "$interrupted" ]; then
    say "interrupted (SIG$interrupted); 'ci/testbed.sh down' removes what was made"
    exit 130
  fi
}

# Appends "ROLE NAME PID START" to $STATE/pids. Older lines of ROLE NAME stay (their processes
# are gone: live_pid and down check the start time). Builtins only, so that it runs to its end
# between defer_signals and resume_signals even when the whole process group is signalled.
record_pid() {  # ROLE NAME PID
  proc_stat "$3"
  if [ -z "$PROC_START" ]; then
    resume_signals
    die "$1 of $2 (PID $3) exited right after it started"
  fi
  echo "$1 $2 $3 $PROC_START" >>"$STATE/pids"
}

# Prints "PID START" of ROLE NAME if it is recorded and still alive.
live_pid() {  # ROLE NAME
  [ -f "$STATE/pids" ] || return 1
  local role name pid start
  while read -r role name pid start; do
    if [ "$role" = "$1" ] && [ "$name" = "$2" ] && alive "$pid" "$start"; then
      echo "$pid $start"
      return 0
    fi
  done <"$STATE/pids"
  return 1
}

# SIGTERM to each "PID START" pair given, SIGKILL to what is still alive 3 s later.
stop_processes() {
  local -a pairs=("$@")
  local i pid start left
  [ ${#pairs[@]} -gt 0 ] || return 0
  for ((i = 0; i < ${#pairs[@]}; i += 2)); do
    if alive "${pairs[i]}" "${pairs[i + 1]}"; then kill -TERM "${pairs[i]}" 2>/dev/null || true; fi
  done
  for _ in $(seq 30); do
    left=0
    for ((i = 0; i < ${#pairs[@]}; i += 2)); do
      if alive "${pairs[i]}" "${pairs[i + 1]}"; then left=1; fi
    done
    [ "$left" = 1 ] || return 0
    sleep 0.1
  done
  for ((i = 0; i < ${#pairs[@]}; i += 2)); do
    pid=${pairs[i]} start=${pairs[i + 1]}
    if alive "$pid" "$start"; then
      say "PID $pid ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

# Stops every process in namespace NS (ip netns pids: those whose network namespace it is).
stop_namespace() {  # NS
  local pid start
  local -a pairs=()
  for pid in $(ip netns pids "$1" 2>/dev/null || true); do
    start=$(start_time "$pid")
    [ -z "$start" ] || pairs+=("$pid" "$start")
  done
  if [ ${#pairs[@]} -gt 0 ]; then
    say "stopping $((${#pairs[@]} / 2)) process(es) left in $1"
    stop_processes "${pairs[@]}"
  fi
}

# --- names ---------------------------------------------------------------------------------------

namespaces() {  # the bed's namespaces, whatever state dir made them
  ip netns list 2>/dev/null | awk '$1 ~ /^hvd-h[0-9]+$/ {print $1}'
}

host_count() {  # hosts recorded by up
  if [ -f "$STATE/hosts" ]; then wc -l <"$STATE/hosts"; else echo 0; fi
}

ns_exists() { ip netns list 2>/dev/null | awk -v ns="$1" '$1 == ns {found = 1} END {exit !found}'; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# --- preflight -----------------------------------------------------------------------------------

check_machine() {
  [ "$(id -u)" -eq 0 ] || unavailable "needs root (network namespaces, veths and a bridge); running as uid $(id -u)"
  command -v ip >/dev/null || die "ip is missing: run ci/install-system-deps.sh (package iproute2)"
  command -v unshare >/dev/null || die "unshare is missing (package util-linux)"
  local err
  if ! err=$(unshare --net --uts true 2>&1); then
    unavailable "cannot create network namespaces here (no CAP_SYS_ADMIN?): ${err//$'\n'/ }"
  fi
  if ! err=$(ip link add hvdprobe0 type veth peer name hvdprobe1 2>&1); then
    unavailable "cannot create veth interfaces here: ${err//$'\n'/ }"
  fi
  ip link del hvdprobe0 2>/dev/null || true
}

check_tools() {
  local tool
  for tool in "$SSHD" "$SSH" ssh-keygen ssh-agent ssh-add tc ss nsenter setsid timeout python3 hostname; do
    command -v "$tool" >/dev/null ||
      die "$tool is missing: run ci/install-system-deps.sh (openssh-server, openssh-client, iproute2)"
  done
}

check_state_dir() {
  case $STATE in
    /*) ;;
    *) die "HOROVOD_TESTBED_DIR must be an absolute path, not '$STATE'" ;;
  esac
  # It goes into sshd_config and ssh_config unquoted, where spaces and % mean something.
  [[ $STATE =~ ^[A-Za-z0-9._/-]+$ ]] || die "HOROVOD_TESTBED_DIR may hold only letters, digits and ._/- ('$STATE')"
  if [ -d "$STATE" ] && [ ! -f "$STATE/$MARKER" ] && [ -n "$(ls -A "$STATE")" ]; then
    die "$STATE exists, is not empty and is not a test bed's state dir; choose another HOROVOD_TESTBED_DIR"
  fi
}

# The bed's names are fixed: a bed of another state dir, or one whose state dir is gone, is in the way.
bridge_alias() {  # up names the bridge "horovod-testbed:STATE_DIR"
  ip -o link show dev "$BRIDGE" 2>/dev/null | sed -n 's/.* alias \(.*\)$/\1/p' || true
}

check_foreign() {
  local ns alias conflict
  alias=$(bridge_alias)
  if link_exists "$BRIDGE" && [ "$alias" != "horovod-testbed:$STATE" ]; then
    die "a bridge $BRIDGE exists that this state dir ($STATE) did not make (${alias:-no alias}); run 'ci/testbed.sh down' with its HOROVOD_TESTBED_DIR first"
  fi
  if [ ! -f "$STATE/$MARKER" ]; then
    ns=$(namespaces | head -n 1)
    [ -z "$ns" ] || die "namespace $ns exists but $STATE holds no test bed; run 'ci/testbed.sh down' first"
  fi
  conflict=$(ip -o -4 addr show | awk -v br="$BRIDGE" '$2 != br && $4 ~ /^198\.18\.0\./ {printf "%s %s; ", $2, $4}')
  [ -z "$conflict" ] || die "another interface here already has an address in 198.18.0.0/24: $conflict"
}

# --- shaping: netem, or tbf (a rate limit only) --------------------------------------------------

# Runs tc (ARGS...) and turns "no QDISC in this kernel" into exit 77, any other error into exit 1.
tc_qdisc() {  # QDISC ARGS...
  local qdisc=$1 err
  shift
  if ! err=$(tc "$@" 2>&1); then
    if [[ $err == *"qdisc kind is unknown"* ]]; then
      unavailable "tc $qdisc is not available: this kernel has no sch_$qdisc ($err)"
    fi
    die "tc $*: $err"
  fi
}

check_netem() {  # SPEC, tried on a throwaway veth before anything is made
  ip link add hvdprobe0 type veth peer name hvdprobe1
  # shellcheck disable=SC2086  # SPEC is a list of tc words
  (tc_qdisc netem qdisc replace dev hvdprobe0 root netem $1) || { local rc=$?; ip link del hvdprobe0; exit "$rc"; }
  ip link del hvdprobe0
}

# QDISC (netem or tbf) with SPEC on both ends of every host's veth, recorded in $STATE/shaping as
# "QDISC SPEC" (up applies it again, also to hosts it adds).
shape_links() {  # QDISC SPEC
  local k
  for ((k = 1; k <= $(host_count); k++)); do
    # shellcheck disable=SC2086
    tc_qdisc "$1" qdisc replace dev "hvdv$k" root "$1" $2
    # shellcheck disable=SC2086
    tc_qdisc "$1" -n "hvd-h$k" qdisc replace dev "$BRIDGE" root "$1" $2
  done
  echo "$1 $2" >"$STATE/shaping"
}

unshape_links() {
  local k
  for ((k = 1; k <= $(host_count); k++)); do
    tc qdisc del dev "hvdv$k" root 2>/dev/null || true
    tc -n "hvd-h$k" qdisc del dev "$BRIDGE" root 2>/dev/null || true
  done
  rm -f "$STATE/shaping"
}

# --- up ------------------------------------------------------------------------------------------

# An ed25519 key pair without passphrase at PATH and PATH.pub, unless both are there (an
# interrupted ssh-keygen may have left one of them).
make_key() {  # PATH COMMENT
  [ -s "$1" ] && [ -s "$1.pub" ] && return 0
  rm -f "$1" "$1.pub"
  ssh-keygen -q -t ed25519 -N '' -C "$2" -f "$1"
}

write_files() {
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  touch "$STATE/$MARKER"
  mkdir -p "$STATE/bin"
  make_key "$STATE/id_ed25519" horovod-testbed
  make_key "$STATE/unauthorized_ed25519" horovod-testbed-unauthorized
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"

  # ListenAddress and HostKey are given per host on sshd's command line.
  cat >"$STATE/sshd_config" <<EOF
# horovod test bed: one sshd per host namespace (ci/testbed.sh)
Port 22
Port 2222
AddressFamily inet
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile $STATE/authorized_keys
StrictModes no
PrintMotd no
PrintLastLog no
UseDNS no
X11Forwarding no
PidFile none
MaxStartups 100:30:200
MaxSessions 100
Subsystem sftp internal-sftp
EOF

  cat >"$STATE/ssh_config" <<EOF
# horovod test bed: the client side (ci/testbed.sh); used through $STATE/bin/ssh
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile $STATE/known_hosts
    UpdateHostKeys no
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 10
EOF

  cat >"$STATE/bin/ssh" <<EOF
#!/bin/sh
# ssh with the test bed's client config: host keys go to $STATE/known_hosts, not ~/.ssh.
exec $SSH -F $STATE/ssh_config "\$@"
EOF
  chmod 755 "$STATE/bin/ssh"

  cat >"$STATE/env" <<EOF
# Source this file to use the test bed: ssh is the bed's wrapper and the agent holds its key.
export PATH=$STATE/bin:\$PATH
export SSH_AUTH_SOCK=$STATE/agent.sock
EOF
}

# Makes PATH (a directory) and notes it in $STATE/created, so that down removes only what up made.
make_system_dir() {
  [ -d "$1" ] && return 0
  mkdir -m 755 "$1"
  echo "$1" >>"$STATE/created"
}

start_agent() {
  if live_pid agent - >/dev/null; then
    # An up interrupted before ssh-add left the agent without the key.
    SSH_AUTH_SOCK="$STATE/agent.sock" ssh-add -q "$STATE/id_ed25519" 2>&1 || die "ssh-add failed"
    return 0
  fi
  rm -f "$STATE/agent.sock"
  # Recorded at once (same PID and start time after the execs), so that an interrupted up leaves
  # nothing down does not know of.
  defer_signals
  setsid ssh-agent -D -a "$STATE/agent.sock" </dev/null >>"$STATE/agent.log" 2>&1 9<&- &
  local pid=$!
  record_pid agent - "$pid"
  resume_signals
  for _ in $(seq 50); do
    [ -S "$STATE/agent.sock" ] && break
    sleep 0.1
  done
  [ -S "$STATE/agent.sock" ] || die "ssh-agent did not create $STATE/agent.sock: $(tail -n 3 "$STATE/agent.log")"
  SSH_AUTH_SOCK="$STATE/agent.sock" ssh-add -q "$STATE/id_ed25519" 2>&1 || die "ssh-add failed"
}

# Writes 1 to disable_ipv6 of DEV, in namespace NS if given: no link-local IPv6 addresses.
no_ipv6() {  # DEV [NS]
  if [ -n "${2:-}" ]; then
    ip netns exec "$2" sh -c "echo 1 >/proc/sys/net/ipv6/conf/$1/disable_ipv6" 2>/dev/null || true
  elif [ -e "/proc/sys/net/ipv6/conf/$1/disable_ipv6" ]; then
    echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6"
  fi
}

make_bridge() {
  if ! link_exists "$BRIDGE"; then
    ip link add "$BRIDGE" type bridge
    ip link set dev "$BRIDGE" alias "horovod-testbed:$STATE"
  fi
  no_ipv6 "$BRIDGE"
  ip addr replace "$LAUNCHER/24" dev "$BRIDGE"
  ip link set dev "$BRIDGE" up
}

make_host_network() {  # K
  local k=$1 ns=hvd-h$1
  if ! ns_exists "$ns"; then
    make_system_dir /run/netns
    ip netns add "$ns"
  fi
  ip -n "$ns" link set lo up
  # New interfaces there (the veth's end moved in) start without IPv6; lo keeps ::1.
  no_ipv6 default "$ns"
  # A veth whose far end is not in the namespace as $BRIDGE (an interrupted up) is made again.
  if link_exists "hvdv$k" && ! ip -n "$ns" link show dev "$BRIDGE" >/dev/null 2>&1; then
    ip link del "hvdv$k"
  fi
  if ! link_exists "hvdv$k"; then
    ip link del "hvdp$k" 2>/dev/null || true
    ip link add "hvdv$k" type veth peer name "hvdp$k"
    no_ipv6 "hvdv$k"
    ip link set dev "hvdp$k" netns "$ns"
    ip -n "$ns" link set dev "hvdp$k" name "$BRIDGE"
  fi
  no_ipv6 "$BRIDGE" "$ns"
  ip link set dev "hvdv$k" master "$BRIDGE" up
  ip -n "$ns" addr replace "$NET.$k/24" dev "$BRIDGE"
  ip -n "$ns" link set dev "$BRIDGE" up
}

# The hosts resolve each other's names: /etc/netns/hvd-hK/hosts, which ip netns exec bind-mounts
# on /etc/hosts for the sshd and so for every session. Written in place (same inode), so that
# hosts added later show in the files already mounted.
readonly HOSTS_MARKER="# horovod test bed (ci/testbed.sh): the hosts' names"
write_etc_hosts() {  # N
  local k j file
  make_system_dir /etc/netns
  for ((k = 1; k <= $1; k++)); do
    make_system_dir "/etc/netns/hvd-h$k"
    file=/etc/netns/hvd-h$k/hosts
    if [ -e "$file" ] && [ "$(head -n 1 "$file")" != "$HOSTS_MARKER" ]; then
      die "$file exists and is not the test bed's"
    fi
    {
      echo "$HOSTS_MARKER"
      echo "127.0.0.1 localhost"
      echo "::1 localhost ip6-localhost ip6-loopback"
      for ((j = 1; j <= $1; j++)); do echo "$NET.$j hvd-h$j"; done
    } >"$file"
  done
}

start_sshd() {  # K
  local k=$1 ns=hvd-h$1 addr=$NET.$1 dir=$STATE/hvd-h$1 pid exe err listening
  live_pid sshd "$ns" >/dev/null && return 0
  stop_namespace "$ns"  # left from an interrupted up: an sshd there would hold the ports
  mkdir -p "$dir"
  make_key "$dir/ssh_host_ed25519_key" "$ns"
  local -a args=(-f "$STATE/sshd_config" -o "ListenAddress=$addr" -o "HostKey=$dir/ssh_host_ed25519_key")
  err=$("$SSHD" -t "${args[@]}" 2>&1) || die "sshd rejects the configuration of $ns: $err"
  # ip netns exec, unshare (no --fork), env and sh all exec: $! is the sshd's own PID.
  defer_signals
  # shellcheck disable=SC2016  # $0 and $@ are sh's
  setsid ip netns exec "$ns" unshare --uts \
    env -i PATH="$SSHD_PATH" LANG=C.UTF-8 \
    sh -c 'hostname "$0" && exec "$@"' "$ns" "$SSHD" -D -e "${args[@]}" \
    </dev/null >>"$dir/sshd.log" 2>&1 9<&- &
  pid=$!
  record_pid sshd "$ns" "$pid"
  resume_signals
  for _ in $(seq 100); do
    running "$pid" || die "sshd of $ns exited: $(tail -n 5 "$dir/sshd.log")"
    listening=$(ss -N "$ns" -Hltn 2>/dev/null | awk '{print $4}' | sort | tr '\n' ' ')
    [ "$listening" != "$addr:22 $addr:2222 " ] || break
    sleep 0.1
  done
  [ "$listening" = "$addr:22 $addr:2222 " ] ||
    die "sshd of $ns listens on '$listening', not on $addr:22 and :2222, after 10 s: $(tail -n 5 "$dir/sshd.log")"
  running "$pid" || die "sshd of $ns exited: $(tail -n 5 "$dir/sshd.log")"
  exe=$(readlink "/proc/$pid/exe" || true)
  [ "$exe" = "$(readlink -f "$SSHD")" ] || die "PID $pid of $ns is $exe, not sshd: the recorded PID would be wrong"
}

# Every host's key under its address for both ports: many ssh clients at once then never append
# to known_hosts concurrently (StrictHostKeyChecking stays off for other names of the hosts).
write_known_hosts() {  # N
  local k key
  : >"$STATE/known_hosts.new"
  for ((k = 1; k <= $1; k++)); do
    read -r key < <(cut -d' ' -f1,2 "$STATE/hvd-h$k/ssh_host_ed25519_key.pub")
    echo "$NET.$k $key" >>"$STATE/known_hosts.new"
    echo "[$NET.$k]:2222 $key" >>"$STATE/known_hosts.new"
  done
  mv "$STATE/known_hosts.new" "$STATE/known_hosts"
}

# --- checks --------------------------------------------------------------------------------------

# TCP connect from namespace NS (empty: here) to ADDR:PORT within 3 s.
tcp_ok() {  # NS ADDR PORT
  local -a prefix=()
  [ -z "$1" ] || prefix=(ip netns exec "$1")
  "${prefix[@]}" timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null
}

# Every host to the launcher's address: a listener there, a connection from each namespace.
launcher_reachable() {  # N; prints the first host that cannot connect
  python3 - "$1" "$LAUNCHER" <<'PY'
import socket, subprocess, sys
n, launcher = int(sys.argv[1]), sys.argv[2]
with socket.socket() as s:
    s.bind((launcher, 0))
    s.listen(n)
    s.settimeout(3)
    port = s.getsockname()[1]
    for k in range(1, n + 1):
        connect = ["ip", "netns", "exec", f"hvd-h{k}", "timeout", "3", "bash", "-c",
                   f"exec 3<>/dev/tcp/{launcher}/{port}"]
        try:
            if subprocess.run(connect, stderr=subprocess.DEVNULL).returncode:
                raise OSError
            s.accept()[0].close()
        except OSError:
            print(f"hvd-h{k}")
            break
PY
}

# Lists what does not connect: "host-host", "launcher-host", "host-launcher".
blocked_paths() {  # N
  local n=$1 k next blocked=()
  for ((k = 1; k <= n; k++)); do
    tcp_ok "" "$NET.$k" 22 || { blocked+=(launcher-host); break; }
  done
  if [ "$n" -ge 2 ]; then
    for ((k = 1; k <= n; k++)); do
      next=$((k % n + 1))
      tcp_ok "hvd-h$k" "$NET.$next" 22 || { blocked+=(host-host); break; }
    done
  fi
  [ -z "$(launcher_reachable "$n")" ] || blocked+=(host-launcher)
  echo "${blocked[*]}"
}

# A firewall that drops the bed's traffic: an ACCEPT rule for the bridge only, recorded for down.
# Bridged frames reach iptables' FORWARD chain because of bridge netfilter
# (net.bridge.bridge-nf-call-iptables); traffic to and from the launcher goes through INPUT/OUTPUT.
accept_rule() {  # CHAIN MATCH...
  iptables -w -C "$@" -m comment --comment horovod-testbed -j ACCEPT 2>/dev/null && return 0
  iptables -w -I "$@" -m comment --comment horovod-testbed -j ACCEPT || return 1
  echo "$*" >>"$STATE/firewall"
  say "firewall: inserted 'iptables -I $* -j ACCEPT' (removed again by down)"
}

close_firewall() {
  [ -f "$STATE/firewall" ] || return 0
  local rule
  while read -r rule; do
    # shellcheck disable=SC2086
    iptables -w -D $rule -m comment --comment horovod-testbed -j ACCEPT 2>/dev/null ||
      say "could not remove the firewall rule '$rule' (already gone?)"
  done <"$STATE/firewall"
  rm -f "$STATE/firewall"
}

# TCP between the hosts and between them and the launcher; a firewall in the way gets the fewest
# rules that let it through, one at a time while something is still blocked.
check_network() {  # N
  local n=$1 blocked nf rule
  blocked=" $(blocked_paths "$n") "
  [ -n "${blocked// /}" ] || return 0
  if command -v iptables >/dev/null; then
    for rule in "FORWARD -i $BRIDGE -o $BRIDGE" "INPUT -i $BRIDGE" "OUTPUT -o $BRIDGE"; do
      case $rule in
        FORWARD*) [[ $blocked == *" host-host "* ]] || continue ;;
        *) [[ $blocked == *" launcher-host "* || $blocked == *" host-launcher "* ]] || continue ;;
      esac
      # shellcheck disable=SC2086  # CHAIN and match words
      accept_rule $rule || break
      blocked=" $(blocked_paths "$n") "
      [ -n "${blocked// /}" ] || return 0
    done
  fi
  nf=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo "n/a")
  blocked=${blocked# } && blocked=${blocked% }
  die "TCP over the bridge $BRIDGE is blocked ($blocked) and iptables $(command -v iptables >/dev/null && echo "rules did not help" || echo "is not installed"); net.bridge.bridge-nf-call-iptables is $nf (bridged traffic goes through the FORWARD chain when 1): allow '-i $BRIDGE -o $BRIDGE' in FORWARD and '-i $BRIDGE' in INPUT, or run 'ci/testbed.sh down'"
}

# ssh as the tests use it: from here to host K on both ports through the agent, and from host K
# to the next one.
check_ssh_host() {  # K N
  local k=$1 n=$2 port out next err=$STATE/hvd-h$1/check.err
  for port in 22 2222; do
    out=$(SSH_AUTH_SOCK="$STATE/agent.sock" "$STATE/bin/ssh" -p "$port" "$NET.$k" hostname 2>"$err" </dev/null) ||
      die "ssh to $NET.$k port $port failed: $(cat "$err")"
    [ "$out" = "hvd-h$k" ] || die "ssh to $NET.$k port $port reached '$out', not hvd-h$k ($(cat "$err"))"
  done
  if [ "$n" -ge 2 ]; then
    next=$((k % n + 1))
    out=$(ip netns exec "hvd-h$k" env SSH_AUTH_SOCK="$STATE/agent.sock" "$STATE/bin/ssh" "$NET.$next" hostname \
      2>"$err" </dev/null) || die "ssh from hvd-h$k to $NET.$next failed: $(cat "$err")"
    [ "$out" = "hvd-h$next" ] || die "ssh from hvd-h$k to $NET.$next reached '$out', not hvd-h$next ($(cat "$err"))"
  fi
  [ ! -s "$err" ] || say "ssh checks of hvd-h$k wrote to stderr: $(cat "$err")"
  rm -f "$err"
}

check_ssh() {  # N: every host at once
  local n=$1 k job failed=0
  local -a jobs=()
  for ((k = 1; k <= n; k++)); do
    check_ssh_host "$k" "$n" &
    jobs+=("$!")
  done
  for job in "${jobs[@]}"; do
    wait "$job" || failed=1
  done
  [ "$failed" = 0 ] || die "the bed is up but ssh does not work as above; 'ci/testbed.sh down' removes it"
}

# --- Slurm mode ----------------------------------------------------------------------------------

readonly SLURM_DIR=$STATE/slurm
readonly SLURMCTLD_PORT=16817
readonly SLURMD_PORT=16818
readonly SLURM_CPUS=2
readonly SLURM_CONTROLLER=hvd-ctl

check_slurm_tools() {
  local tool
  for tool in slurmctld slurmd munged srun sinfo scontrol nsenter unshare mount; do
    command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null ||
      unavailable "$tool is missing: run ci/install-system-deps.sh (slurmctld, slurmd, slurm-client, munge)"
  done
}

slurm_nodes() {  # the nodes slurm-up configured, one a line
  [ -f "$SLURM_DIR/nodes" ] && cat "$SLURM_DIR/nodes"
  return 0
}

write_slurm_files() {  # N
  local n=$1 k
  mkdir -p "$SLURM_DIR/ctld" "$SLURM_DIR/munge"
  # munged checks that no one else can write where its files are; clients need o+x on the socket's folder.
  chmod 755 "$SLURM_DIR"
  chmod 711 "$SLURM_DIR/munge"
  if [ ! -s "$SLURM_DIR/munge/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom >"$SLURM_DIR/munge/munge.key")
  fi
  : >"$SLURM_DIR/nodes"
  for ((k = 1; k <= n; k++)); do
    mkdir -p "$SLURM_DIR/hvd-h$k/spool" "$SLURM_DIR/hvd-h$k/tmp"
    echo "hvd-h$k" >>"$SLURM_DIR/nodes"
  done
  {
    echo "# horovod test bed: Slurm mode (ci/testbed.sh slurm-up)"
    echo "ClusterName=hvdbed"
    echo "SlurmctldHost=$SLURM_CONTROLLER($LAUNCHER)"
    echo "SlurmctldPort=$SLURMCTLD_PORT"
    echo "SlurmdPort=$SLURMD_PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$SLURM_DIR/munge/munge.socket"
    echo "StateSaveLocation=$SLURM_DIR/ctld"
    echo "SlurmctldPidFile=$SLURM_DIR/ctld/slurmctld.pid"
    echo "SlurmctldLogFile=$SLURM_DIR/slurmctld.log"
    echo "SlurmdSpoolDir=$SLURM_DIR/%n/spool"
    echo "SlurmdPidFile=$SLURM_DIR/%n/slurmd.pid"
    echo "SlurmdLogFile=$SLURM_DIR/%n/slurmd.log"
    # The nodes' temporary folder (srun --mpi=pmix puts each step's client folder there, named
    # after the job and step only): the hosts share /tmp, so each node gets a folder of its own.
    echo "TmpFS=$SLURM_DIR/%n/tmp"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=1"
    echo "MpiDefault=none"
    echo "SchedulerType=sched/builtin"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "KillWait=2"
    echo "InactiveLimit=0"
    echo "MinJobAge=10"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    for ((k = 1; k <= n; k++)); do
      echo "NodeName=hvd-h$k NodeAddr=$NET.$k NodeHostname=hvd-h$k CPUs=$SLURM_CPUS State=UNKNOWN"
    done
    echo "PartitionName=bed Nodes=$(paste -sd, "$SLURM_DIR/nodes") Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_DIR/slurm.conf"
  cat >"$SLURM_DIR/env" <<EOF
# Source this file to use the test bed's Slurm cluster (srun, salloc, sbatch, scontrol, squeue).
export SLURM_CONF=$SLURM_DIR/slurm.conf
EOF
}

start_munged() {
  live_pid munged - >/dev/null && return 0
  rm -f "$SLURM_DIR/munge/munge.socket" "$SLURM_DIR/munge/munge.socket.lock"
  defer_signals
  setsid env -i PATH="$SSHD_PATH" LANG=C.UTF-8 /usr/sbin/munged -F --force \
    --key-file="$SLURM_DIR/munge/munge.key" --socket="$SLURM_DIR/munge/munge.socket" \
    --pid-file="$SLURM_DIR/munge/munged.pid" --log-file="$SLURM_DIR/munge/munged.log" \
    --seed-file="$SLURM_DIR/munge/munged.seed" </dev/null >>"$SLURM_DIR/munge/munged.out" 2>&1 9<&- &
  local pid=$!
  record_pid munged - "$pid"
  resume_signals
  for _ in $(seq 100); do
    [ -S "$SLURM_DIR/munge/munge.socket" ] && return 0
    running "$pid" || break
    sleep 0.1
  done
  die "munged did not create its socket: $(tail -n 5 "$SLURM_DIR/munge/munged.out" "$SLURM_DIR/munge/munged.log" 2>/dev/null)"
}

slurm_client() {  # COMMAND ARGS...: a Slurm client command with the bed's configuration
  SLURM_CONF=$SLURM_DIR/slurm.conf timeout 20 "$@"
}

start_slurmctld() {
  live_pid slurmctld - >/dev/null && return 0
  defer_signals
  # shellcheck disable=SC2016  # $0 and $@ are sh's
  setsid unshare --uts env -i PATH="$SSHD_PATH" LANG=C.UTF-8 \
    sh -c 'hostname "$0" && exec "$@"' "$SLURM_CONTROLLER" \
    /usr/sbin/slurmctld -D -c -f "$SLURM_DIR/slurm.conf" \
    </dev/null >>"$SLURM_DIR/slurmctld.out" 2>&1 9<&- &
  local pid=$!
  record_pid slurmctld - "$pid"
  resume_signals
  for _ in $(seq 100); do
    running "$pid" || die "slurmctld exited: $(tail -n 5 "$SLURM_DIR/slurmctld.log" "$SLURM_DIR/slurmctld.out" 2>/dev/null)"
    slurm_client scontrol ping 2>/dev/null | grep -q 'is UP' && return 0
    sleep 0.2
  done
  die "slurmctld does not answer after 20 s: $(tail -n 5 "$SLURM_DIR/slurmctld.log")"
}

start_slurmd() {  # K
  local k=$1 ns=hvd-h$1
  live_pid slurmd "$ns" >/dev/null && return 0
  defer_signals
  # nsenter and unshare (no --fork), env and sh all exec: $! is slurmd's own PID.
  # shellcheck disable=SC2016  # $0, $1 and $@ are sh's
  setsid nsenter --net="/run/netns/$ns" unshare --mount --uts env -i PATH="$SSHD_PATH" LANG=C.UTF-8 \
    sh -c 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' "$ns" "/etc/netns/$ns/hosts" \
    /usr/sbin/slurmd -D -c -N "$ns" -f "$SLURM_DIR/slurm.conf" \
    </dev/null >>"$SLURM_DIR/$ns/slurmd.out" 2>&1 9<&- &
  local pid=$!
  record_pid slurmd "$ns" "$pid"
  resume_signals
}

# Waits until every node is idle (registered with the controller), 30 s at most.
wait_slurm_nodes() {  # N
  local n=$1 k idle states pid start
  for _ in $(seq 150); do
    for ((k = 1; k <= n; k++)); do
      live_pid slurmd "hvd-h$k" >/dev/null ||
        die "slurmd of hvd-h$k exited: $(tail -n 5 "$SLURM_DIR/hvd-h$k/slurmd.log" "$SLURM_DIR/hvd-h$k/slurmd.out" 2>/dev/null)"
    done
    states=$(slurm_client sinfo -h -N -o '%N %T' 2>/dev/null || true)
    idle=$(awk '$2 == "idle"' <<<"$states" | wc -l)
    [ "$idle" -lt "$n" ] || return 0
    sleep 0.2
  done
  die "the Slurm nodes are not idle after 30 s: $(tr '\n' ';' <<<"$states")"
}

slurm_healthy() {  # N
  local k
  [ -f "$SLURM_DIR/slurm.conf" ] && [ "$(slurm_nodes | wc -l)" -eq "$1" ] || return 1
  live_pid munged - >/dev/null && live_pid slurmctld - >/dev/null || return 1
  for ((k = 1; k <= $1; k++)); do live_pid slurmd "hvd-h$k" >/dev/null || return 1; done
}

cmd_slurm_up() {
  local n=${1:-2} k
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "slurm-up needs a number of nodes, not '$n'"
  [ "$(id -u)" -eq 0 ] || unavailable "needs root"
  check_state_dir
  check_slurm_tools
  healthy "$n" || die "slurm-up needs a bed of at least $n hosts: 'ci/testbed.sh up $n' first"
  if slurm_healthy "$n"; then
    say "Slurm already up: $n nodes"
    return 0
  fi
  [ ! -d "$SLURM_DIR" ] || cmd_slurm_down
  write_slurm_files "$n"
  start_munged
  start_slurmctld
  for ((k = 1; k <= n; k++)); do
    start_slurmd "$k"
  done
  wait_slurm_nodes "$n"
  say "Slurm up: nodes hvd-h1..hvd-h$n ($SLURM_CPUS CPUs each), controller $LAUNCHER:$SLURMCTLD_PORT; '. $SLURM_DIR/env' to use it"
}

cmd_slurm_down() {
  local role name pid start ns sshd
  local -a pairs=()
  [ "$(id -u)" -eq 0 ] || die "slurm-down needs root"
  check_state_dir
  if [ -f "$STATE/pids" ]; then
    while read -r role name pid start; do
      case $role in slurmd | slurmctld | munged) pairs+=("$pid" "$start") ;; esac
    done <"$STATE/pids"
  fi
  stop_processes "${pairs[@]}"
  # What steps left on the nodes (slurmstepd outlives slurmd): every process there but the sshd.
  for ns in $(slurm_nodes); do
    pairs=()
    sshd=$(live_pid sshd "$ns" | cut -d' ' -f1 || true)
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
      [ "$pid" != "$sshd" ] || continue
      start=$(start_time "$pid")
      [ -z "$start" ] || pairs+=("$pid" "$start")
    done
    if [ ${#pairs[@]} -gt 0 ]; then
      say "stopping $((${#pairs[@]} / 2)) process(es) left on Slurm node $ns"
      stop_processes "${pairs[@]}"
    fi
  done
  rm -rf "$SLURM_DIR"
}

# --- commands ------------------------------------------------------------------------------------

healthy() {  # N: the first N hosts and the agent are up
  local k
  [ -f "$STATE/$MARKER" ] && [ "$(host_count)" -ge "$1" ] || return 1
  live_pid agent - >/dev/null || return 1
  link_exists "$BRIDGE" || return 1
  for ((k = 1; k <= $1; k++)); do
    ns_exists "hvd-h$k" && link_exists "hvdv$k" && live_pid sshd "hvd-h$k" >/dev/null || return 1
  done
}

cmd_up() {
  local n="" netem="" k
  while [ $# -gt 0 ]; do
    case $1 in
      --netem) [ $# -ge 2 ] || usage; netem=$2; shift 2 ;;
      --netem=*) netem=${1#--netem=}; shift ;;
      -*) usage ;;
      *) [ -z "$n" ] || usage; n=$1; shift ;;
    esac
  done
  if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt "$MAX_HOSTS" ]; then
    die "up needs a number of hosts from 1 to $MAX_HOSTS, not '${n}'"
  fi
  check_machine
  check_tools
  check_state_dir
  if healthy "$n"; then
    [ -z "$netem" ] || shape_links netem "$netem"
    say "already up: $(host_count) hosts"
    return 0
  fi
  check_foreign
  [ -z "$netem" ] || check_netem "$netem"

  [ "$(host_count)" -le "$n" ] || n=$(host_count)
  write_files
  make_system_dir /run/sshd
  start_agent
  make_bridge
  for ((k = 1; k <= n; k++)); do
    make_host_network "$k"
  done
  : >"$STATE/hosts.new"
  for ((k = 1; k <= n; k++)); do
    echo "hvd-h$k $NET.$k" >>"$STATE/hosts.new"
  done
  mv "$STATE/hosts.new" "$STATE/hosts"
  write_etc_hosts "$n"
  for ((k = 1; k <= n; k++)); do
    start_sshd "$k"
  done
  write_known_hosts "$n"
  if [ -n "$netem" ]; then
    shape_links netem "$netem"
  elif [ -f "$STATE/shaping" ]; then
    local qdisc spec
    read -r qdisc spec <"$STATE/shaping"
    shape_links "$qdisc" "$spec"
  fi
  check_network "$n"
  check_ssh "$n"
  say "up: $n hosts (hvd-h1 $NET.1 .. hvd-h$n $NET.$n), launcher $LAUNCHER on $BRIDGE; '. $STATE/env' to use them"
}

cmd_down() {
  local role name pid start ns link dir alias file
  local -a pairs=()
  [ "$(id -u)" -eq 0 ] || die "down needs root"
  check_state_dir
  alias=$(bridge_alias)
  case $alias in
    "" | "horovod-testbed:$STATE") ;;
    horovod-testbed:*) die "the bed was made with HOROVOD_TESTBED_DIR=${alias#horovod-testbed:}: run down with that" ;;
    *) die "the bridge $BRIDGE is not the test bed's (alias '$alias'); remove it yourself if it is a leftover" ;;
  esac
  # What up recorded (sshds, the agent), then whatever else still runs in a host's namespace:
  # sessions' children that outlived them, or commands run there by tests.
  if [ -f "$STATE/pids" ]; then
    while read -r role name pid start; do
      pairs+=("$pid" "$start")
    done <"$STATE/pids"
  fi
  stop_processes "${pairs[@]}"
  for ns in $(namespaces); do
    stop_namespace "$ns"
  done
  if [ -d "$STATE" ] && [ -f "$STATE/$MARKER" ]; then close_firewall; fi
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^hvd(v|p)[0-9]+$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  for ns in $(namespaces); do
    ip netns del "$ns" || say "could not delete namespace $ns"
  done
  if link_exists "$BRIDGE"; then ip link del "$BRIDGE"; fi
  for file in /etc/netns/hvd-h*/hosts; do
    if [ -f "$file" ] && [ "$(head -n 1 "$file")" = "$HOSTS_MARKER" ]; then rm -f "$file"; fi
  done
  if [ -f "$STATE/created" ]; then
    # Last made, first removed: /etc/netns/hvd-h1 before /etc/netns.
    while read -r dir; do
      if [ "$dir" = /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
        # ip netns bind-mounts /run/netns on itself.
        while mountpoint -q /run/netns 2>/dev/null; do umount /run/netns || break; done
      fi
      rmdir "$dir" 2>/dev/null || true
    done < <(tac "$STATE/created")
  fi
  if [ -d "$STATE" ]; then
    if [ -f "$STATE/$MARKER" ]; then
      rm -rf "$STATE"
    elif [ -z "$(ls -A "$STATE")" ]; then
      rmdir "$STATE"
    fi
  fi
  if [ -n "$(namespaces)" ]; then die "namespaces left: $(namespaces | tr '\n' ' ')"; fi
  return 0
}

cmd_status() {
  local n k ns addr pid start answers port others rc=0
  n=$(host_count)
  if [ "$n" -eq 0 ] && [ -z "$(namespaces)" ]; then
    echo "test bed: down"
    return 3
  fi
  echo "test bed: $n hosts, state $STATE, launcher $LAUNCHER on $BRIDGE, shaping: $(cat "$STATE/shaping" 2>/dev/null || echo none)"
  if read -r pid start < <(live_pid agent -); then
    echo "ssh-agent: PID $pid, $STATE/agent.sock"
  else
    echo "ssh-agent: not running"; rc=1
  fi
  for ((k = 1; k <= n; k++)); do
    ns=hvd-h$k addr=$NET.$k
    if ! read -r pid start < <(live_pid sshd "$ns"); then
      echo "$ns $addr: sshd not running"; rc=1; continue
    fi
    answers=""
    for port in 22 2222; do
      if SSH_AUTH_SOCK="$STATE/agent.sock" timeout 15 "$STATE/bin/ssh" -p "$port" "$addr" true </dev/null >/dev/null 2>&1; then
        answers+=" port $port ok"
      else
        answers+=" port $port FAILS"; rc=1
      fi
    done
    others=$(ip netns pids "$ns" 2>/dev/null | grep -cvx "$pid" || true)
    echo "$ns $addr: sshd PID $pid,$answers; $others other process(es)"
  done
  for ns in $(namespaces); do
    [ "${ns#hvd-h}" -le "$n" ] || { echo "$ns: namespace left over (not in $STATE/hosts)"; rc=1; }
  done
  return "$rc"
}

cmd_shape() {
  if [ $# -ne 1 ] || [ -z "$1" ]; then usage; fi
  [ "$(id -u)" -eq 0 ] || unavailable "needs root"
  [ "$(host_count)" -gt 0 ] || die "the test bed is down: 'ci/testbed.sh up N --netem SPEC'"
  shape_links netem "$1"
}

# A rate limit without netem: tbf, whose bucket of BURST bytes must hold a segmentation-offloaded
# packet (64 KiB) and more, or it splits them and falls short of RATE (256kb reached 9.4 of 10
# Gbit/s of TCP here, 64kb 4.9).
cmd_shape_rate() {
  if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
  local rate=$1 burst=${2:-256kb}
  [[ $rate =~ ^[0-9]+(\.[0-9]+)?[A-Za-z]*$ ]] || die "shape-rate needs a tc rate such as 10gbit, not '$rate'"
  [[ $burst =~ ^[0-9]+[A-Za-z]*$ ]] || die "shape-rate needs a tc size such as 256kb as BURST, not '$burst'"
  [ "$(id -u)" -eq 0 ] || unavailable "needs root"
  [ "$(host_count)" -gt 0 ] || die "the test bed is down: 'ci/testbed.sh up N' first"
  shape_links tbf "rate $rate burst $burst latency 5ms"
}

cmd_unshape() {
  [ "$(id -u)" -eq 0 ] || unavailable "needs root"
  [ "$(host_count)" -gt 0 ] || return 0
  unshape_links
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1
  shift
  # One invocation at a time: the lock is this file (children started below close fd 9).
  exec 9<"${BASH_SOURCE[0]}"
  flock 9
  case $cmd in
    up) cmd_up "$@" ;;
    down) [ $# -eq 0 ] || usage; cmd_down ;;
    status) [ $# -eq 0 ] || usage; cmd_status ;;
    shape) cmd_shape "$@" ;;
    shape-rate) cmd_shape_rate "$@" ;;
    unshape) [ $# -eq 0 ] || usage; cmd_unshape ;;
    check) [ $# -eq 0 ] || usage; check_machine; check_tools ;;
    slurm-up) [ $# -le 1 ] || usage; cmd_slurm_up "$@" ;;
    slurm-down) [ $# -eq 0 ] || usage; cmd_slurm_down ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
