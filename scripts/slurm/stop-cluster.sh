#!/usr/bin/env bash
# stop-cluster.sh — stop the local Slurm cluster that start-cluster.sh started. Must run as root.
# Signals only pids recorded in $SLURM_LOCAL_DIR/run/*.pid (checked against /proc/PID/comm)
# and the slurmstepd processes serving OUR slurmd spool dirs (found by their unix sockets).
# Nothing is matched by name, so another Slurm or munged on the host is left alone.
#
# Knobs (environment, all optional):
#   SLURM_LOCAL_DIR          state dir                                   [/var/lib/slurm-local]
#   SLURM_LOCAL_CONF_DIR     where start-cluster.sh wrote slurm.conf     [/etc/slurm]
#   SLURM_LOCAL_KEEP_MUNGE=1 leave munged running (start-cluster.sh uses this on restart)
#   SLURM_LOCAL_KEEP_HOSTS=1 leave our /etc/hosts line in place
#   SLURM_LOCAL_PURGE=1      also delete the state dir and the generated slurm.conf/gres.conf
#   SLURM_LOCAL_TIMEOUT      seconds to wait for a concurrent start/stop's lock  [60]
set -uo pipefail

BASE="${SLURM_LOCAL_DIR:-/var/lib/slurm-local}"
CONF_DIR="${SLURM_LOCAL_CONF_DIR:-/etc/slurm}"
RUN="$BASE/run"
T0=$(date +%s%N)
log() {
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[slurm-local stop %d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}

[[ $EUID -eq 0 ]] || { log "must run as root"; exit 1; }

# pid_of PIDFILE COMM: print the pid if the file names a live process whose comm starts with COMM
pid_of() {
  local pid
  [[ -s "$1" ]] || return 1
  pid="$(tr -dc 0-9 < "$1")"
  [[ -n "$pid" && -r "/proc/$pid/comm" && "$(cat "/proc/$pid/comm")" == "$2"* ]] || return 1
  echo "$pid"
}
# stop_pids PID...: SIGTERM all at once (each Slurm daemon takes ~2 s to exit, so in parallel),
# wait up to 15 s, then SIGKILL what is left
stop_pids() {
  local p left
  [[ $# -gt 0 ]] || return 0
  kill -TERM "$@" 2>/dev/null
  for _ in $(seq 150); do
    left=0
    for p in "$@"; do [[ -d /proc/$p ]] && left=1; done
    [[ $left == 0 ]] && return 0
    sleep 0.1
  done
  for p in "$@"; do
    [[ -d /proc/$p ]] && { log "pid $p ignored SIGTERM; sending SIGKILL"; kill -KILL "$p" 2>/dev/null; }
  done
  sleep 0.2
}
# our_stepds: slurmstepd pids holding a unix socket under our spool dir (inode match, no `ss`)
our_stepds() {
  local inodes p fd link
  [[ -d "$BASE/spool" ]] || return 0
  inodes="$(awk -v d="$BASE/spool/" 'index($8, d) == 1 { printf " %s ", $7 }' /proc/net/unix)"
  [[ -n "$inodes" ]] || return 0
  for p in /proc/[0-9]*; do
    [[ "$(cat "$p/comm" 2>/dev/null)" == slurmstepd* ]] || continue
    for fd in "$p"/fd/*; do
      link="$(readlink "$fd" 2>/dev/null)" || continue
      [[ "$link" =~ ^socket:\[([0-9]+)\]$ && "$inodes" == *" ${BASH_REMATCH[1]} "* ]] || continue
      echo "${p#/proc/}"; break
    done
  done
}

if [[ ! -d "$RUN" ]]; then log "nothing to stop ($RUN missing)"; exit 0; fi
# one start or stop at a time per state dir (start-cluster.sh calls us holding it already)
if [[ "${SLURM_LOCAL_LOCK_HELD:-0}" != 1 ]]; then
  exec 9>"$BASE/.lock"
  flock -w "${SLURM_LOCAL_TIMEOUT:-60}" 9 || { log "another start/stop holds $BASE/.lock"; exit 1; }
fi

# 1. cancel our cluster's jobs while the controller is still up, so steps end cleanly
if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null && [[ -f "$CONF_DIR/slurm.conf" ]]; then
  export SLURM_CONF="$CONF_DIR/slurm.conf"
  jobs="$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')"
  if [[ -n "${jobs// }" ]]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 50); do
      [[ -z "$(timeout 5 squeue -h -t R,CG,PD -o %A 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
fi

# 2. slurmd, then leftover slurmstepd of our nodes + slurmctld + munged (if we started it)
stepds="$(our_stepds)"
pids=()
for f in "$RUN"/slurmd-*.pid; do
  [[ -e "$f" ]] || continue
  if pid="$(pid_of "$f" slurmd)"; then log "stopping slurmd pid $pid ($(basename "$f" .pid))"; pids+=("$pid"); fi
done
stop_pids "${pids[@]}"
rm -f "$RUN"/slurmd-*.pid
pids=()
for p in $(printf '%s\n%s\n' "$stepds" "$(our_stepds)" | sort -u); do
  [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == slurmstepd* ]] || continue
  log "stopping leftover slurmstepd pid $p"; pids+=("$p")
done
if pid="$(pid_of "$RUN/slurmctld.pid" slurmctld)"; then log "stopping slurmctld pid $pid"; pids+=("$pid"); fi
if [[ "${SLURM_LOCAL_KEEP_MUNGE:-0}" != 1 ]] && pid="$(pid_of "$RUN/munged.pid" munged)"; then
  log "stopping munged pid $pid"; pids+=("$pid")
fi
stop_pids "${pids[@]}"
rm -f "$RUN/slurmctld.pid"
[[ "${SLURM_LOCAL_KEEP_MUNGE:-0}" == 1 ]] || rm -f "$RUN/munged.pid"

# 3. the /etc/hosts line start-cluster.sh added (rewritten in place: it may be a bind mount)
mark="# slurm-local $BASE"
if [[ "${SLURM_LOCAL_KEEP_HOSTS:-0}" != 1 ]]; then
  rest="$(awk -v m="$mark" 'substr($0, length($0) - length(m) + 1) != m' /etc/hosts)"
  [[ "$rest" == "$(cat /etc/hosts)" ]] || printf '%s\n' "$rest" > /etc/hosts
fi

if [[ "${SLURM_LOCAL_PURGE:-0}" == 1 ]]; then
  rm -rf "$BASE"
  for f in slurm.conf gres.conf; do
    grep -q '^# Generated by slurm-local' "$CONF_DIR/$f" 2>/dev/null && rm -f "$CONF_DIR/$f"
  done
fi
log "stopped"
