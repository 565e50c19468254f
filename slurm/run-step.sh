# shellcheck shell=bash
# Shared by train.sbatch and sweep.sbatch (sourced, not run): one training
# step of a job that survives its time limit.
#
# mpiformer_run RUNDIR [train flags...] runs
#   $MPIFORMER_LAUNCH $MPIFORMER_BIN train --out RUNDIR --resume R --threads T FLAGS
# in the background (launcher default: srun --mpi=pmix --kill-on-bad-exit=1;
# binary default:
# $SLURM_SUBMIT_DIR/build/mpiformer); rank 0 appends its output to
# RUNDIR/train.log itself. The three flags this script sets are taken out of
# FLAGS first (`--flag value` or `--flag=value`), and the user's value wins:
#   --out      RUNDIR, or, with RUNDIR empty, the run directory itself; when
#              both are given they must name the same directory.
#   --threads  default $SLURM_CPUS_PER_TASK (1 outside SLURM); OMP_NUM_THREADS
#              follows it.
#   --resume   default auto. A requeued start (SLURM_RESTART_COUNT > 0)
#              continues the job's own run: auto once RUNDIR holds a
#              checkpoint, whatever the first start was given; before that,
#              none becomes auto and a PATH is given again.
# --device, also taken out, defaults to cuda in a job given GPUs (sbatch
# --gpus-per-task=1, or --gres=gpu:N): a node whose GPUs the ranks cannot
# see then ends the job in one line (exit 2) instead of training on its
# CPUs. Elsewhere the trainer's own default holds.
# The job's output file (sbatch's default slurm-*.out in the submit
# directory) moves into RUNDIR at the start, and a requeue points SLURM at
# it there (mpiformer_adopt_output).
#
# SLURM's warning signal reaches only this batch shell
# (--signal=B:USR1@120), so it is passed on to the launcher as USR1, and so
# are TERM (scancel, preemption) and INT: srun and mpirun forward USR1 to
# every rank at once, while mpirun answers TERM and INT by killing the job
# after odls_base_sigkill_timeout (exported below if unset). The ranks agree
# at the next step boundary, write a checkpoint and exit 75. On 75 the job
# requeues itself and the next start resumes from that checkpoint. mpirun
# itself exits 1 when it was signalled; the ranks' stop line in the log
# then stands for their 75. Any other code is the job's exit code; a
# refusal of this script (one line) is 2, as the trainer's own refusals.

# The name refusals go by; the sbatch scripts set it ($0 of a batch job is
# SLURM's copy of the script).
mpiformer_who=${mpiformer_who:-run-step.sh}

mpiformer_refuse() {
  echo "$mpiformer_who: $*" >&2
  return 2
}

# mpiformer_split_flags FLAGS...: takes --out, --resume, --threads and
# --device (both spellings) out of FLAGS into mf_out, mf_resume, mf_threads
# and mf_device; mf_given lists the ones given (" out threads "), mf_rest
# holds the other flags in their order. Refuses a flag given twice, as the
# trainer would.
mpiformer_split_flags() {
  mf_out='' mf_resume='' mf_threads='' mf_device='' mf_given=' ' mf_rest=()
  local name value
  while (($# > 0)); do
    case $1 in
      --out | --resume | --threads | --device)
        name=${1#--}
        (($# >= 2)) || { mpiformer_refuse "$1: needs a value"; return; }
        value=$2
        shift 2
        ;;
      --out=* | --resume=* | --threads=* | --device=*)
        name=${1%%=*} name=${name#--} value=${1#*=}
        shift
        ;;
      *)
        mf_rest+=("$1")
        shift
        continue
        ;;
    esac
    [[ -n $value ]] || { mpiformer_refuse "--$name: needs a value"; return; }
    [[ $mf_given != *" $name "* ]] || { mpiformer_refuse "--$name: given more than once"; return; }
    mf_given+="$name "
    printf -v "mf_$name" '%s' "$value"
  done
}

# mpiformer_adopt_output RUNDIR: a job's output file is opened by SLURM
# before the script runs, from a pattern that cannot name RUNDIR. When it is
# sbatch's default, a slurm-*.out in the submit directory, it moves into
# RUNDIR: a rename on the same file system, so SLURM's own later lines (time
# limit, cancel, out of memory), written to the open file, follow it.
# mf_output_updates then holds the scontrol settings (StdOut=, StdErr=) that
# send a requeued start's output there directly; SLURM takes them only
# while the job is pending, after the requeue. An output file the user
# chose (sbatch --output) stays where it is.
mpiformer_adopt_output() {
  local rundir=$1 fd file first='' target field
  mf_output_updates=()
  [[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_SUBMIT_DIR:-} ]] || return 0
  for fd in 1 2; do
    file=$(readlink -f "/proc/$$/fd/$fd" 2>/dev/null) || continue
    [[ $fd == 1 ]] && first=$file
    [[ $fd == 2 && $file == "$first" ]] && continue
    # /dev/null, a terminal, a pipe; or not the default place and name.
    [[ -f $file && $(dirname "$file") -ef $SLURM_SUBMIT_DIR && $(basename "$file") == slurm-*.out ]] ||
      continue
    [[ $fd == 1 ]] && field=StdOut || field=StdErr
    target=$(realpath -m -- "$rundir/$(basename "$file")")
    mf_output_updates+=("$field=$target")
    if [[ -e $target ]]; then
      # A start after a requeue that did not come from this script.
      echo "==> this start's output is $file; the earlier starts' is $target"
    elif [[ $(stat -c %d "$file") != "$(stat -c %d "$rundir")" ]]; then
      echo "==> this start's output stays in $file ($rundir is on another file system; a requeued start writes to $target)"
    else
      mv -T -- "$file" "$target" || echo "==> this start's output stays in $file"
    fi
  done
}

# mpiformer_gpus: the job's GPUs as the start line gives them
# (mf_gpu_text: " x 1 GPU(s)" a rank, or " (2 GPU(s) on the node)") and the
# --device flag to pass (mf_device_flag: the user's, or cuda in a GPU job).
mpiformer_gpus() {
  local per_task=${SLURM_GPUS_PER_TASK:-} on_node=${SLURM_GPUS_ON_NODE:-0}
  mf_gpu_text='' mf_device_flag=()
  if [[ -n $per_task ]]; then
    mf_gpu_text=" x $per_task GPU(s)"
  elif [[ $on_node =~ ^[1-9] ]]; then
    mf_gpu_text=" ($on_node GPU(s) on the node)"
  fi
  local device=$mf_device
  [[ -n $device || -z $mf_gpu_text ]] || device=cuda
  [[ -z $device ]] || mf_device_flag=(--device "$device")
  if [[ $per_task =~ ^[0-9]+$ && $per_task -gt 1 ]]; then
    echo "==> note: --gpus-per-task=$per_task: a rank computes on one GPU (the others stay idle); ask for --gpus-per-task=1 and a rank per GPU"
  fi
}

mpiformer_run() {
  local rundir=$1
  shift
  mpiformer_split_flags "$@" || return
  if [[ -z $rundir ]]; then
    rundir=$mf_out
    [[ -n $rundir ]] || {
      mpiformer_refuse "no run directory: give RUNDIR before the train flags, or --out RUNDIR among them"
      return
    }
  elif [[ -n $mf_out && $(realpath -m -- "$mf_out") != "$(realpath -m -- "$rundir")" ]]; then
    mpiformer_refuse "--out $mf_out and RUNDIR $rundir name different directories: give the run directory once"
    return
  fi
  local root=${SLURM_SUBMIT_DIR:-$(pwd)}
  local bin=${MPIFORMER_BIN:-$root/build/mpiformer}
  # Word splitting is intended: the launcher and its arguments. A rank that
  # dies (its node lost, killed) leaves the others waiting on it in a
  # collective for ever: --kill-on-bad-exit ends them, as mpirun does, and
  # srun's line names the lost tasks (ranks).
  # shellcheck disable=SC2206
  local launch=(${MPIFORMER_LAUNCH:-srun --mpi=pmix --kill-on-bad-exit=1})
  local threads=${mf_threads:-${SLURM_CPUS_PER_TASK:-1}}
  # --threads 0 leaves the count to the trainer (the node's cores shared by
  # its ranks); anything else not a count it refuses itself.
  if [[ $threads =~ ^[1-9][0-9]*$ ]]; then
    export OMP_NUM_THREADS=$threads
  else
    unset OMP_NUM_THREADS
  fi
  local resume=${mf_resume:-auto} resume_extra=()
  if [[ ${SLURM_RESTART_COUNT:-0} -gt 0 && $resume != auto ]]; then
    if compgen -G "$rundir/checkpoints/step_*.h5" >/dev/null || [[ $resume == none ]]; then
      resume=auto
    elif [[ -e $rundir/config.ini && " ${mf_rest[*]} " != *" --resume-other-run"* ]]; then
      # The first start made RUNDIR a run of its own before it wrote a
      # checkpoint: PATH is now another run's checkpoint.
      resume_extra=(--resume-other-run)
    fi
  fi
  mkdir -p "$rundir"
  mpiformer_adopt_output "$rundir"
  mpiformer_gpus
  # An array task goes by its array name (sweep.sbatch): JOBID_TASK.
  local job=${SLURM_JOB_ID:-?}
  [[ -z ${SLURM_ARRAY_JOB_ID:-} ]] || job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID:-?}
  echo "==> job $job start $((${SLURM_RESTART_COUNT:-0} + 1)) on" \
    "${SLURM_JOB_NODELIST:-$(hostname)}: ${SLURM_NTASKS:-1} rank(s) x $threads thread(s)$mf_gpu_text," \
    "--resume $resume${mf_device_flag[*]:+, ${mf_device_flag[*]}}"
  if [[ -n $mf_threads && -n ${SLURM_CPUS_PER_TASK:-} && $threads =~ ^[0-9]+$ &&
    $threads -gt $SLURM_CPUS_PER_TASK ]]; then
    echo "==> note: --threads $threads is more than the $SLURM_CPUS_PER_TASK CPU(s) per task SLURM gave (--cpus-per-task)"
  fi

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
  "${launch[@]}" "$bin" train --out "$rundir" --resume "$resume" "${resume_extra[@]}" \
    --threads "$threads" "${mf_device_flag[@]}" "${mf_rest[@]}" &
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
    tail -n +"$log_start" "$rundir/train.log" | grep -q '^[0-9-]* [0-9:]* stopped by SIG.*(exit code 75)$'; then
    echo "==> the launcher exited $rc after a signal; the ranks stopped with a checkpoint (75)"
    rc=75
  fi

  if [[ $rc -eq 75 ]]; then
    if [[ -n ${SLURM_JOB_ID:-} ]]; then
      echo "==> stopped with a checkpoint (exit 75): requeueing job $SLURM_JOB_ID"
      # The requeue ends this start (SLURM signals the job): the output
      # settings below still have to reach SLURM.
      trap '' TERM
      scontrol requeue "$SLURM_JOB_ID"
      mpiformer_point_output
      return 0
    fi
    echo "==> stopped with a checkpoint (exit 75); run again to resume"
  fi
  return "$rc"
}

# mpiformer_point_output: after a requeue, sends the next start's output to
# the file in RUNDIR (mf_output_updates). SLURM takes a new output path
# only once the job is pending again, so a few tries.
mpiformer_point_output() {
  local setting try
  for setting in "${mf_output_updates[@]}"; do
    for try in 1 2 3 4 5; do
      scontrol update JobId="$SLURM_JOB_ID" "$setting" 2>/dev/null && break
      [[ $try -lt 5 ]] || echo "==> could not set $setting for the next start"
      sleep 1
    done
  done
}
