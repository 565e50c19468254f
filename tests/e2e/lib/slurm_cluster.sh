# shellcheck shell=bash
# Shared by the SLURM tests (slurm.sh, multinode.sh), sourced after
# common.sh: a cluster's configuration and daemons, a fresh checkout to
# submit from, and the waits and checks of a test that follows jobs.
# The caller sets `work` (every file of the cluster lives under it) and may
# define `squeue`, `scontrol` ... as functions (multinode.sh runs them on a
# node); show_logs prints what the daemons and the jobs said.

# require_root_and WHY TOOL...: every TOOL is installed (scripts/setup
# --tests installs them) and this is root (WHY: what needs it); else a
# failure, not a skip, as the suite is meant to run them.
require_root_and() {
  local why=$1 tool
  shift
  for tool in "$@"; do
    command -v "$tool" >/dev/null ||
      { echo "FAIL: $tool is missing; scripts/setup --tests installs it" >&2; exit 1; }
  done
  [[ $(id -u) -eq 0 ]] || { echo "FAIL: $why: it needs root" >&2; exit 1; }
}

# write_slurm_conf CTLD_HOST PORT NODE_LINE...: $work/slurm.conf for a
# cluster whose controller is CTLD_HOST ("name(address)"), on ports from
# PORT; each NODE_LINE is a NodeName= line. Per-node files (spool, pid,
# log) carry the node's name (%n), so daemons on one machine do not meet;
# so does TmpFS, where each node's step daemon makes the directory its
# PMIx clients share (spmix_appdir_UID_JOB.STEP, named by the step alone):
# in one /tmp the step's daemons on both nodes would make, fill and remove
# the same one, as no two nodes of a cluster do.
write_slurm_conf() {
  local controller=$1 port=$2
  shift 2
  export SLURM_CONF=$work/slurm.conf
  mkdir -p "$work"/{state,spool,log,tmp}
  local line
  for line in "$@"; do
    line=${line#NodeName=}
    mkdir -p "$work/spool/${line%% *}" "$work/tmp/${line%% *}"
  done
  {
    cat <<EOF
ClusterName=mpiformertest
SlurmctldHost=$controller
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
TmpFS=$work/tmp/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
ReturnToService=2
JobRequeue=1
KillWait=10
EOF
    printf '%s\n' "$@"
    echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
  } >"$SLURM_CONF"
}

# start_munge: munged with a fresh key, its socket under $work.
start_munge() {
  mkdir -p "$work/munge"
  chmod 700 "$work/munge"
  dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$work/munge/munge.key"
  munged --socket="$work/munge/munge.sock" --key-file="$work/munge/munge.key" \
    --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
    --seed-file="$work/munge/munged.seed" --force
}

# stop_daemons: every daemon with a pid file under $work, TERM then KILL.
stop_daemons() {
  local pidfile
  for pidfile in "$work"/slurmd-*.pid "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for pidfile in "$work"/slurmd-*.pid "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [[ -s $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
}

# daemons_alive: the pids of daemons still running (empty when none).
daemons_alive() {
  local pidfile pid
  for pidfile in "$work"/slurmd-*.pid "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    kill -0 "$pid" 2>/dev/null && echo "$pid"
  done
  return 0
}

# show_logs: what the daemons and jobs said, for a failure.
show_logs() {
  local f
  for f in "$work"/log/*.log "$work"/slurm-*.out "$work"/checkout/slurm-*.out \
    "$work"/checkout/runs/*/train.log "$work"/checkout/runs/*/slurm-*.out \
    "$work"/checkout/runs/*/*/slurm-*.out; do
    [[ -f $f ]] && { echo "---- $f" >&2; tail -n 25 "$f" >&2; }
  done
  return 0
}

# fresh_checkout SRC BIN: $work/checkout, a clone of SRC's HEAD plus its
# uncommitted changes and untracked files, with BIN's directory as build/
# (where the scripts look for the binary); the caller then cd's there.
fresh_checkout() {
  local src=$1 bin=$2 clone=$work/checkout
  git clone --quiet --no-hardlinks "$src" "$clone"
  (cd "$src" && git diff HEAD --binary) | (cd "$clone" && git apply --allow-empty)
  (cd "$src" && git ls-files --others --exclude-standard -z) |
    (cd "$src" && xargs -0 -r cp -R --parents -t "$clone")
  ln -s "$(dirname "$bin")" "$clone/build"
  (cd "$clone" && git add -A >/dev/null && git -c user.name=t -c user.email=t@t commit -qm tree \
    --allow-empty)
}

# wait_for WHAT SECONDS CONDITION...: polls CONDITION once a second.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  for _ in $(seq "$seconds"); do
    "$@" && return 0
    sleep 1
  done
  echo "FAIL: timed out waiting for $what" >&2
  show_logs
  exit 1
}
# gone JOB...: none of the jobs is in the queue any more.
gone() { ! squeue -h -j "$(IFS=,; echo "$*")" 2>/dev/null | grep -q .; }
# start_requeued_now JOB: SLURM holds a requeued job about two minutes, time
# for the last start's step daemons to end on every node (one still ending
# holds the PMIx socket of the step the next start is about to launch,
# named by job and step). The test lets the job start as soon as they have.
start_requeued_now() {
  local job=$1
  steps_ended() { ! pgrep -f "^slurmstepd: \[$job\.[0-9]" >/dev/null; }
  wait_for "job $job's step daemons to end" 60 steps_ended
  scontrol update JobId="$job" StartTime=now
}
# job_field JOB NAME: a field of scontrol show job (ExitCode, Restarts, ...).
job_field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | sed -n 1p; }

failures=0
# expect WHAT CONDITION...: CONDITION holds, or a failure is counted.
expect() {
  local what=$1
  shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what" >&2; failures=$((failures + 1)); fi
}

# train.log begins each line with the time it was said.
stamp='[0-9-]* [0-9:]* '

# logged_steps METRICS BIN: the /train steps of a metrics.h5, one a line.
logged_steps() {
  "$2" inspect "$1" |
    awk '/^\/train/ { on = 1; next } /^\/eval/ { on = 0 } on && $1 ~ /^[0-9]/ { print $1 }'
}
