#!/usr/bin/env bash
# slurm/train.sbatch and slurm/sweep.sbatch on a real one-node SLURM cluster
# that this test starts (munged, slurmctld, slurmd; every file under WORKDIR,
# nothing in /etc) and stops, submitted as a user would: from a fresh
# checkout (HEAD plus this tree's changes), with the flags the scripts also
# set (--out, --threads, --resume) among the user's own.
# - A tiny CPU run on 2 ranks under srun --mpi=pmix gets SLURM's time-limit
#   warning (USR1 to the batch shell), checkpoints, exits 75, is requeued,
#   resumes (its --resume none was for the first start only) and finishes;
#   its metrics.h5 then holds every log step exactly once, and its
#   slurm-*.out, SLURM's lines included, is in the run directory.
# - The README's First run train flags (--out runs/kjv --threads 1 ...; a
#   synthetic task and fewer steps) pass through, the user's --threads
#   winning over --cpus-per-task.
# - An --out that contradicts RUNDIR ends the job with one line, exit 2.
# - A sweep of two array tasks with a shared --threads.
# - GPU jobs (--gpus-per-task=1 on a GRES of stand-in devices): --device cuda
#   by default, refused in one line as no GPU is visible; --device=cpu among
#   the flags wins.
# Afterwards no output says "No such file", and the checkout holds nothing
# new but runs/. Needs root (the daemons) and Debian's slurm-wlm and munge.
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/lib/slurm_cluster.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)

require_root_and "the SLURM test starts slurmd" munged slurmctld slurmd sbatch scontrol

# ---- the cluster
host=$(hostname -s)
# Ports from the pid, away from the defaults, so parallel runs do not meet.
write_slurm_conf "$host(127.0.0.1)" $((20000 + ($$ % 20000))) \
  "NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN"
# Two GPUs for SLURM to hand out (GRES), files standing for the devices: a
# job can ask for --gpus-per-task=1 here, and its ranks then find no GPU.
sed -i '1i GresTypes=gpu' "$SLURM_CONF"
touch "$work/gpu0" "$work/gpu1"
echo "Name=gpu File=$work/gpu[0-1]" >"$work/gres.conf"

stop_cluster() {
  scancel --quiet --user=root 2>/dev/null || true
  stop_daemons
}
trap stop_cluster EXIT

start_munge
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

# ---- a fresh checkout: HEAD plus this tree's uncommitted changes, with the
# build under test as build/, where the scripts look for the binary
clone=$work/checkout
fresh_checkout "$src" "$bin"
cd "$clone" || exit 1
clone_real=$(pwd -P)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# ---- the requeue: RUNDIR given twice (as RUNDIR and as --out, spelled
# otherwise), --threads=1, and --resume none for a fresh run
run=runs/requeue
log=$run/train.log
steps=3000
job=$(sbatch --parsable --ntasks=2 --cpus-per-task=1 \
  slurm/train.sbatch $run --model lm --synthetic copy --layers 2 --d-model 32 --heads 2 \
  --d-ff 64 --max-len 32 --max-tokens 256 --steps $steps --log-every 10 --eval-every 1000 \
  --checkpoint-every 1000 --out=./$run/ --threads=1 --resume none)
echo "submitted job $job"
out=$run/slurm-mpiformer-$job.out

# started: training reached step 100; a job that ended before is a failure.
started() {
  grep -qs "^${stamp}step 100/" "$log" && return 0
  if gone "$job"; then
    echo "FAIL: job $job ended before training started (ExitCode=$(job_field "$job" ExitCode))" >&2
    show_logs
    exit 1
  fi
  return 1
}
wait_for "training to start" 60 started
# job_ranks JOB: the pids of JOB's ranks, the children of its step daemons
# that execute the binary.
job_ranks() {
  local daemons
  daemons=$(pgrep -d, -f "^slurmstepd: \[$1\.[0-9]" || true)
  [[ -z $daemons ]] || executing "$bin" $(pgrep -P "$daemons")
}
# named_mpiformer WHAT JOB: JOB has two ranks and each is named mpiformer
# (/proc/PID/comm: what ps, pgrep and SLURM's accounting see).
named_mpiformer() {
  local ranks names
  ranks=$(job_ranks "$2")
  names=$(process_names $ranks | sort -u)
  expect "$1: two ranks ($(echo $ranks))" [ "$(echo "$ranks" | wc -w)" -eq 2 ]
  expect "$1: named mpiformer (${names//$'\n'/, })" [ "$names" = mpiformer ]
}
named_mpiformer "srun, --blas-core auto" "$job"

# What SLURM does before the time limit with --signal=B:USR1@120.
scancel --signal=USR1 --batch "$job"
wait_for "the stop" 60 grep -q "^${stamp}stopped by SIGUSR1 after step" "$log"
stop_step=$(sed -n "s/^${stamp}stopped by SIGUSR1 after step \([0-9]*\);.*/\1/p" "$log")
echo "PASS: the run stopped after step $stop_step with a checkpoint"
wait_for "the requeue" 60 bash -c "squeue -h -j $job -o %T | grep -q PENDING"
# The script points the next start's output into the run directory.
wait_for "StdOut in $run" 30 bash -c "scontrol show job $job | grep -q 'StdOut=$clone_real/$out\$'"
start_requeued_now "$job"
wait_for "the resumed run" 90 grep -q "^${stamp}resumed from .*: step $stop_step," "$log"
echo "PASS: the job was requeued and resumed from step $stop_step"
wait_for "the end of the job" 120 gone "$job"

expect "Restarts=1" [ "$(job_field "$job" Restarts)" = 1 ]
expect "ExitCode=0:0" [ "$(job_field "$job" ExitCode)" = 0:0 ]
expect "a final eval" grep -q "^${stamp}final eval" "$log"
expect "a checkpoint of step $stop_step" test -e "$run/checkpoints/$(printf 'step_%08d.h5' "$stop_step")"
# Every log step once, in order, across the stop.
"$bin" inspect "$run/metrics.h5" >"$work/metrics.txt"
logged_steps "$run/metrics.h5" "$bin" >"$work/steps.txt"
seq 10 10 $steps >"$work/expected-steps.txt"
expect "metrics.h5 /train/step is 10, 20, ..., $steps: each log step once" \
  cmp -s "$work/steps.txt" "$work/expected-steps.txt"
expect "metrics.h5 records the resume at $stop_step" grep -q "^resumed at   $stop_step\$" "$work/metrics.txt"
# Both starts in one file, and SLURM's own requeue line (written after the
# move) there too, where slurmstepd writes one: it does only when the
# requeue's signal finds the first start's script still running, which
# depends on timing.
expect "$out: start 1 with --resume none" grep -q "^==> job $job start 1 .*2 rank(s) x 1 thread(s), --resume none$" "$out"
expect "$out: start 2 with --resume auto" grep -q "^==> job $job start 2 .*--resume auto$" "$out"
requeue_files=$(grep -rl --include='*.out' "slurmstepd.*JOB $job .*DUE TO JOB REQUEUE" . || true)
expect "SLURM's requeue line only in $out (${requeue_files:-none written this time})" \
  test -z "$(grep -v -x -F "./$out" <<<"$requeue_files" || true)"

# ---- the README's First run train flags (another task, fewer steps) as
# they are, after the script: RUNDIR from --out, --threads 1 on 2 CPUs
first_run=$(awk '/^## First run/ { inside = 1; next }
     /^## / { inside = 0 }
     inside && /^    / { line = substr($0, 5)
                         if (sub(/\\$/, "", line)) { pending = pending line; next }
                         print pending line; pending = "" }' README.md |
  sed -n 's/^.*build\/mpiformer train //p')
for swap in "--data shards/kjv=--synthetic copy" "--steps 200=--steps 20" \
  "--eval-every 100=--eval-every 10"; do
  [[ " $first_run " == *" ${swap%%=*} "* ]] ||
    { echo "FAIL: README.md's First run train line lacks ${swap%%=*}: $first_run" >&2; exit 1; }
  first_run=${first_run/"${swap%%=*}"/"${swap#*=}"}
done
[[ $first_run == *"--out runs/kjv "* && $first_run == *"--threads 1 "* ]] ||
  { echo "FAIL: README.md's First run train line lacks --out runs/kjv or --threads 1" >&2; exit 1; }
read -ra first_run <<<"$first_run"
first=$(sbatch --parsable --ntasks=1 --cpus-per-task=2 slurm/train.sbatch "${first_run[@]}")
echo "submitted job $first: slurm/train.sbatch ${first_run[*]}"

# ---- RUNDIR and an --out of another directory (output where sbatch was told)
clash=$(sbatch --parsable --ntasks=1 --cpus-per-task=1 --output="$work/slurm-%j.out" \
  slurm/train.sbatch runs/one --model lm --synthetic copy --out runs/two)

# ---- GPU jobs (slurm/README.md's GPU recipe): --device cuda unless the
# flags say otherwise; the ranks find no GPU here, so the job ends at once
# in one line (exit 2). With --device=cpu among the flags it trains.
tiny=(--model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16
  --max-tokens 64 --steps 20 --threads 1)
gpu_job=$(sbatch --parsable --ntasks=2 --cpus-per-task=1 --gpus-per-task=1 \
  slurm/train.sbatch runs/gpu "${tiny[@]}")
gpu_cpu=$(sbatch --parsable --ntasks=1 --cpus-per-task=1 --gpus-per-task=1 \
  slurm/train.sbatch runs/gpu-cpu "${tiny[@]}" --device=cpu)

# ---- a sweep of two tasks, --threads shared
printf '%s\n' "--lr 1e-3" "--lr 3e-4 --warmup 10" >"$work/lrs.txt"
sweep=$(sbatch --parsable --array=0-1 --ntasks=1 --cpus-per-task=1 \
  slurm/sweep.sbatch "$work/lrs.txt" runs/sweep --model lm --synthetic copy --layers 1 \
  --d-model 16 --heads 2 --d-ff 32 --max-len 16 --max-tokens 64 --steps 20 --threads 1)
echo "submitted jobs $first, $clash and array $sweep"
wait_for "the First run job, the clash, the GPU jobs and the sweep" 240 gone "$first" "$clash" \
  "$gpu_job" "$gpu_cpu" "$sweep"

expect "First run flags: ExitCode=0:0" [ "$(job_field "$first" ExitCode)" = 0:0 ]
expect "First run flags: a final eval in runs/kjv/train.log" grep -q "^${stamp}final eval" runs/kjv/train.log
expect "First run flags: --threads 1 wins over --cpus-per-task=2" \
  grep -q "1 rank(s) x 1 thread(s)" runs/kjv/train.log
expect "First run flags: runs/kjv/slurm-mpiformer-$first.out" \
  grep -q "^==> job $first start 1 .*1 rank(s) x 1 thread(s), --resume auto$" \
  "runs/kjv/slurm-mpiformer-$first.out"
expect "the clash: ExitCode=2:0" [ "$(job_field "$clash" ExitCode)" = 2:0 ]
expect "the clash: one line" [ "$(cat "$work/slurm-$clash.out")" = \
  "train.sbatch: --out runs/two and RUNDIR runs/one name different directories: give the run directory once" ]
expect "the clash: no runs/one" [ ! -e runs/one ]
expect "the clash: no runs/two" [ ! -e runs/two ]
gpu_out=runs/gpu/slurm-mpiformer-$gpu_job.out
expect "GPU job: ExitCode=2:0" [ "$(job_field "$gpu_job" ExitCode)" = 2:0 ]
expect "GPU job: its start line gives a GPU a rank and --device cuda" \
  grep -q "^==> job $gpu_job start 1 .*2 rank(s) x 1 thread(s) x 1 GPU(s), --resume auto, --device cuda$" \
  "$gpu_out"
expect "GPU job: one line says the ranks see no GPU" \
  [ "$(grep -c -e "--device: cuda" "$gpu_out")" = 1 ]
expect "GPU job: no checkpoint" [ ! -e runs/gpu/checkpoints ]
expect "GPU job, --device=cpu: ExitCode=0:0" [ "$(job_field "$gpu_cpu" ExitCode)" = 0:0 ]
expect "GPU job, --device=cpu: the user's device" \
  grep -q "^==> job $gpu_cpu start 1 .*x 1 GPU(s), --resume auto, --device cpu$" \
  "runs/gpu-cpu/slurm-mpiformer-$gpu_cpu.out"
expect "GPU job, --device=cpu: a final eval" grep -q "^${stamp}final eval" runs/gpu-cpu/train.log
for task in 0 1; do
  expect "sweep task $task: ExitCode=0:0" [ "$(job_field "${sweep}_$task" ExitCode)" = 0:0 ]
  expect "sweep task $task: a final eval" grep -q "^${stamp}final eval" "runs/sweep/$task/train.log"
  expect "sweep task $task: its output in runs/sweep/$task" \
    test -s "runs/sweep/$task/slurm-mpiformer-sweep-${sweep}_$task.out"
done

# ---- srun's ranks keep their name when they start again for OpenBLAS's
# kernels (--blas-core with another family than the one loaded here)
other=$(another_blas_core "$bin")
srun -K1 --mpi=pmix -n 2 --cpus-per-task=1 --job-name=names "$bin" train --model lm \
  --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 --max-tokens 64 \
  --steps 1000000 --log-every 10 --threads 1 --out runs/names --blas-core "$other" \
  >"$work/names.out" 2>&1 &
launcher=$!
wait_for "the srun run's first step" 60 grep -q "^step [0-9]*/" "$work/names.out"
names_job=$(squeue -h -n names -o %i)
expect "srun: started again on $other kernels" \
  grep -q "^  BLAS: OpenBLAS [0-9.]*, $other kernels (--blas-core $other)" "$work/names.out"
named_mpiformer "srun, --blas-core $other" "$names_job"
scancel "$names_job"
wait "$launcher" || true
wait_for "the end of the srun run" 60 gone "$names_job"

# ---- what every job left behind
# none_say TEXT PATH...: no file under the PATHs holds TEXT (those that do
# are shown), and grep could read them all.
none_say() {
  local rc=0
  grep -r -F -- "$1" "${@:2}" >&2 || rc=$?
  [[ $rc -eq 1 ]]
}
expect 'no output says "No such file"' none_say "No such file" runs "$work"/slurm-*.out
# The checkout holds nothing new but runs/ (ignored or not; build/ is our link).
leftover=$(git status --porcelain --ignored | grep -v -e '^!! runs/$' -e '^?? build$' || true)
expect "nothing left in the checkout but runs/${leftover:+: $leftover}" [ -z "$leftover" ]

if [[ $failures -gt 0 ]]; then
  show_logs
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "slurm: all checks passed"
