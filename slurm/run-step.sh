# shellcheck shell=bash
# Shared by train.sbatch and sweep.sbatch (sourced, not run): one training
# step of a job that survives its time limit.
#
# mpiformer_run RUNDIR [train flags...] runs
#   $MPIFORMER_LAUNCH $MPIFORMER_BIN train --out RUNDIR --resume auto FLAGS
# in the background (launcher default: srun --mpi=pmix; binary default:
# $SLURM_SUBMIT_DIR/build/mpiformer); rank 0 appends its output to
# RUNDIR/train.log itself. SLURM's warning signal reaches only this batch shell
# (--signal=B:USR1@120), so it is passed on to the launcher as USR1, and so
# are TERM (scancel, preemption) and INT: srun and mpirun forward USR1 to
# every rank at once, while mpirun answers TERM and INT by killing the job
# after odls_base_sigkill_timeout (exported below if unset). The ranks agree
# at the next step boundary, write a checkpoint and exit 75. On 75 the job
# requeues itself and the next start resumes from that checkpoint. mpirun
# itself exits 1 when it was signalled; the ranks' stop line in the log
# then stands for their 75. Any other code is the job's exit code.

mpiformer_run() {
  local rundir=$1
  shift
  local root=${SLURM_SUBMIT_DIR:-$(pwd)}
  local bin=${MPIFORMER_BIN:-$root/build/mpiformer}
  # Word splitting is intended: the launcher and its arguments.
  # shellcheck disable=SC2206
  local launch=(${MPIFORMER_LAUNCH:-srun --mpi=pmix})
  local threads=${SLURM_CPUS_PER_TASK:-1}
  export OMP_NUM_THREADS=$threads
  mkdir -p "$rundir"
  echo "==> job ${SLURM_JOB_ID:-?} start $((${SLURM_RESTART_COUNT:-0} + 1)) on" \
    "${SLURM_JOB_NODELIST:-$(hostname)}: ${SLURM_NTASKS:-1} rank(s) x $threads thread(s)"

  # mpirun, signalled itself (SLURM signals every process of the job),
  # gives the ranks this long after its SIGTERM before SIGKILL: time for a
  # checkpoint, within SLURM's KillWait (30 s by default).
  export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-15}
  # The first start has no log yet: count its lines only when it exists.
  local log_start=1
  if [[ -f $rundir/train.log ]]; then
    log_start=$(($(wc -l <"$rundir/train.log") + 1))
  fi

  # Rank 0 appends its own output to RUNDIR/train.log.
  "${launch[@]}" "$bin" train --out "$rundir" --resume auto --threads "$threads" "$@" &
  local pid=$!
  local signalled=0
  trap 'signalled=1; kill -s USR1 "$pid" 2>/dev/null || true' USR1 TERM INT
  # A trapped signal interrupts `wait`; wait again until the launcher is gone.
  local rc=0
  wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do
    rc=0
    wait "$pid" || rc=$?
  done
  trap - USR1 TERM INT
  # mpirun exits 1 after a signal of its own even when every rank stopped
  # with a checkpoint (exit 75); their line in the log says so.
  if [[ $rc -ne 75 && $signalled -eq 1 ]] && sleep 1 &&
    tail -n +"$log_start" "$rundir/train.log" | grep -q '^stopped by SIG.*(exit code 75)$'; then
    echo "==> the launcher exited $rc after a signal; the ranks stopped with a checkpoint (75)"
    rc=75
  fi

  if [[ $rc -eq 75 ]]; then
    if [[ -n ${SLURM_JOB_ID:-} ]]; then
      echo "==> stopped with a checkpoint (exit 75): requeueing job $SLURM_JOB_ID"
      scontrol requeue "$SLURM_JOB_ID"
      return 0
    fi
    echo "==> stopped with a checkpoint (exit 75); run again to resume"
  fi
  return "$rc"
}
