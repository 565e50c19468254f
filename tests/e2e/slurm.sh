#!/usr/bin/env bash
# slurm/train.sbatch on a real one-node SLURM cluster that this test starts
# (munged, slurmctld, slurmd; every file under WORKDIR, nothing in /etc) and
# stops: a tiny CPU run on 2 ranks under srun --mpi=pmix gets SLURM's
# time-limit warning (USR1 to the batch shell), checkpoints, exits 75, is
# requeued, resumes and finishes; its metrics.h5 then holds every log step
# exactly once. Needs root (the daemons) and Debian's slurm-wlm and munge.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)

for tool in munged slurmctld slurmd sbatch scontrol; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: $tool is missing; scripts/setup installs slurm-wlm and munge" >&2
    exit 1
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  echo "FAIL: the SLURM test starts slurmd and needs root" >&2
  exit 1
fi

# ---- the cluster
host=$(hostname -s)
mkdir -p "$work"/{munge,state,spool,log}
chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
# Ports from the pid, away from the defaults, so parallel runs do not meet.
port=$((20000 + ($$ % 20000)))
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=mpiformertest
SlurmctldHost=$host(127.0.0.1)
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
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ReturnToService=2
JobRequeue=1
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF

stop_cluster() {
  scancel --quiet --user=root 2>/dev/null || true
  local pidfile
  for pidfile in "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for pidfile in "$work/slurmd.pid" "$work/slurmctld.pid" "$work/munge/munged.pid"; do
    [[ -s $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
}
trap stop_cluster EXIT

# show_logs: what the daemons said, for a failure.
show_logs() {
  local f
  for f in "$work"/log/*.log "$work"/run/train.log "$work"/slurm-*.out; do
    [[ -f $f ]] && { echo "---- $f" >&2; tail -n 25 "$f" >&2; }
  done
  return 0
}

munged --socket="$work/munge/munge.sock" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munged.seed" --force
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
  [[ $state == idle ]] && break
  sleep 1
done
if [[ $state != idle ]]; then
  echo "FAIL: the node did not come up (sinfo says '$state')" >&2
  show_logs
  exit 1
fi
echo "PASS: a one-node cluster is up ($host, $(nproc) CPUs)"

# ---- the job: sbatch from the source tree, as a user would
cd "$src"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 MPIFORMER_BIN=$bin
steps=3000
job=$(sbatch --parsable --ntasks=2 --cpus-per-task=1 --output="$work/slurm-%j.out" \
  slurm/train.sbatch "$work/run" --model lm --synthetic copy --layers 2 --d-model 32 --heads 2 \
  --d-ff 64 --max-len 32 --max-tokens 256 --steps $steps --log-every 10 --eval-every 1000 \
  --checkpoint-every 1000)
echo "submitted job $job"

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
log=$work/run/train.log
wait_for "training to start" 60 grep -qs "^step 100/" "$log"

# What SLURM does before the time limit with --signal=B:USR1@120.
scancel --signal=USR1 --batch "$job"
wait_for "the stop" 60 grep -q "^stopped by SIGUSR1 after step" "$log"
stop_step=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\);.*/\1/p' "$log")
echo "PASS: the run stopped after step $stop_step with a checkpoint"
# SLURM makes a requeued job wait about two minutes before it is eligible
# again; the test lets it start at once.
wait_for "the requeue" 60 bash -c "squeue -h -j $job -o %T | grep -q PENDING"
scontrol update JobId="$job" StartTime=now
wait_for "the resumed run" 90 grep -q "^resumed from .*: step $stop_step," "$log"
echo "PASS: the job was requeued and resumed from step $stop_step"
wait_for "the end of the job" 120 bash -c "! squeue -h -j $job | grep -q ."

failures=0
restarts=$(scontrol show job "$job" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
[[ $restarts == 1 ]] || { echo "FAIL: Restarts=$restarts, expected 1" >&2; failures=$((failures + 1)); }
exit_code=$(scontrol show job "$job" | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p')
[[ $exit_code == 0:0 ]] || { echo "FAIL: ExitCode=$exit_code" >&2; failures=$((failures + 1)); }
grep -q "^final eval" "$log" || { echo "FAIL: no final eval" >&2; failures=$((failures + 1)); }
[[ -e $work/run/checkpoints/$(printf 'step_%08d.h5' "$stop_step") ]] ||
  { echo "FAIL: no checkpoint of step $stop_step" >&2; failures=$((failures + 1)); }

# Every log step once, in order, across the stop.
"$bin" inspect "$work/run/metrics.h5" >"$work/metrics.txt"
awk '/^\/train/ { on = 1; next } /^\/eval/ { on = 0 } on && $1 ~ /^[0-9]/ { print $1 }' \
  "$work/metrics.txt" >"$work/steps.txt"
seq 10 10 $steps >"$work/expected-steps.txt"
if diff -q "$work/steps.txt" "$work/expected-steps.txt" >/dev/null; then
  echo "PASS: metrics.h5 /train/step is 10, 20, ..., $steps: each log step once"
else
  echo "FAIL: metrics.h5 /train/step: $(wc -l <"$work/steps.txt") rows, not 10..$steps once each" >&2
  failures=$((failures + 1))
fi
grep -q "^resumed at   $stop_step\$" "$work/metrics.txt" ||
  { echo "FAIL: metrics.h5 does not record the resume at $stop_step" >&2; failures=$((failures + 1)); }

if [[ $failures -gt 0 ]]; then
  show_logs
  exit 1
fi
echo "slurm: all checks passed"
