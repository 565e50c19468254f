#!/usr/bin/env bash
# Two nodes, for real: node1 and node2 are network and UTS namespaces with
# their own hostnames, joined by a veth link (10.77.0.1 and 10.77.0.2, the
# only addresses either has), each with its own /tmp and /dev/shm; the
# rest of the file system is shared, as a cluster's home is. On them a
# two-node SLURM cluster (munged, slurmctld on node1, a slurmd on each),
# and Open MPI between the nodes over TCP only (vader within one), on the
# link slurm/README.md tells users to name. Submitted from a fresh
# checkout with the project's own scripts:
# - prepare over 2 nodes writes the same shards as on one, and removes a
#   temporary of node2's whose pid runs on node1;
# - slurm/train.sbatch on 2 nodes x 2 tasks: the start line says so, and
#   the parameters after 3 steps equal bitwise those of 1 rank with
#   --accum-steps 4;
# - a two-node job gets the time-limit warning, checkpoints, exits 75, is
#   requeued, resumes and finishes; metrics.h5 holds every log step once;
#   meanwhile a job on node2 in the same run directory is refused by the
#   lock, which names node1;
# - kill -9 of node2's ranks ends node1's within seconds, and the job's
#   output names the lost ranks;
# - mpirun with a hostfile of the two nodes inside an allocation (no ssh),
#   as slurm/README.md says;
# - bench with one rank per node over a link limited to a known rate (tc):
#   the measured exchange beside analysis/scaling_model.py's prediction
#   (reported, not asserted; MULTINODE_RATES="1gbit 10gbit" for more).
# At the end, no namespace, link, daemon or process of the test is left
# (checked). Needs root; skipped where namespaces cannot be made.
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/lib/slurm_cluster.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "$bin")
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd -P)

require_root_and "the multinode test makes network namespaces and starts slurmd" \
  munged slurmctld slurmd sbatch scontrol ip tc nsenter unshare

# ---- the nodes
ns=mf$$ # namespaces ns-node1, ns-node2; the link's ends ns-a, ns-b until moved
net=10.77.0
nodes=(node1 node2)
if ! ip netns add "$ns-probe" 2>"$work/netns.err"; then
  echo "SKIP: no network namespace can be made here: $(head -n 1 "$work/netns.err")"
  exit 77
fi
ip netns del "$ns-probe"

# remove_nodes: every process left in the namespaces, the namespaces (and
# with them the link), and the link's root end should it not have moved.
remove_nodes() {
  local node pids
  for node in "${nodes[@]}"; do
    pids=$(ip netns pids "$ns-$node" 2>/dev/null || true)
    [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns-$node" 2>/dev/null || true
  done
  ip link del "$ns-a" 2>/dev/null || true
}
stop_cluster() {
  scancel --quiet --user=root 2>/dev/null || true
  stop_daemons
  remove_nodes
}
trap stop_cluster EXIT

mkdir -p "$work/nodes"
for i in 1 2; do
  ip netns add "$ns-node$i"
  mkdir -p "$work/nodes/node$i/tmp"
done
ip link add "$ns-a" type veth peer name "$ns-b"
ip link set "$ns-a" netns "$ns-node1" name mfnet0
ip link set "$ns-b" netns "$ns-node2" name mfnet0
for i in 1 2; do
  ip -n "$ns-node$i" addr add "$net.$i/24" dev mfnet0
  ip -n "$ns-node$i" link set mfnet0 up
  ip -n "$ns-node$i" link set lo up
done

# A node's /tmp is its own, but the checkout, the binary and this test's
# files may lie under the machine's /tmp (a CI clone): those directories
# are carried into each node's /tmp.
carry=()
for path in "$src" "$(dirname "$bin")" "$work"; do
  path=$(realpath "$path")
  [[ $path == /tmp/* ]] || continue
  path=${path#/tmp/}
  carry+=("${path%%/*}")
done

# on NODE CMD...: CMD on NODE: in its network namespace, with its hostname,
# its /tmp and a /dev/shm of its own (a mount namespace per command, so
# nothing is mounted outside it).
on() {
  local node=$1
  shift
  nsenter --net="/run/netns/$ns-$node" unshare --uts --mount sh -c '
    node=$1 tmp=$2 carry=$3
    shift 3
    hostname "$node" || exit 1
    for dir in $carry; do
      mkdir -p "$tmp/$dir" && mount --bind "/tmp/$dir" "$tmp/$dir" || exit 1
    done
    mount --rbind "$tmp" /tmp && mount -t tmpfs tmpfs /dev/shm || exit 1
    exec "$@"' sh "$node" "$work/nodes/$node/tmp" "${carry[*]}" "$@"
}
# ranks_on NODE: the pids in NODE's namespace that execute the binary.
ranks_on() { executing "$bin" $(ip netns pids "$ns-$1" 2>/dev/null); }
# The user's commands run on node1, the login node.
for command in sbatch squeue scontrol scancel sinfo srun salloc; do
  eval "$command() { on node1 $command \"\$@\"; }"
done

# ---- the cluster: slurmctld on node1, a slurmd on each node
write_slurm_conf "node1($net.1)" 6817 \
  "NodeName=node1 NodeAddr=$net.1 CPUs=$(nproc) State=UNKNOWN" \
  "NodeName=node2 NodeAddr=$net.2 CPUs=$(nproc) State=UNKNOWN"
start_munge
on node1 slurmctld -f "$SLURM_CONF"
on node1 slurmd -f "$SLURM_CONF"
on node2 slurmd -f "$SLURM_CONF"
both_idle() { [[ $(sinfo -h -o '%n %t' 2>/dev/null | sort | tr '\n' ' ') == "node1 idle node2 idle " ]]; }
wait_for "both nodes to come up" 60 both_idle
echo "PASS: a two-node cluster is up: node1 ($net.1) and node2 ($net.2), $(nproc) CPUs each"

# ---- Open MPI as slurm/README.md sets it for TCP between nodes; the two
# nodes share this machine's cores, so waiting ranks yield them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=tcp,self,vader
export OMPI_MCA_btl_tcp_if_include=$net.0/24 OMPI_MCA_oob_tcp_if_include=$net.0/24
export OMPI_MCA_mpi_yield_when_idle=1
grep -q "^    export OMPI_MCA_btl_tcp_if_include=10.0.0.0/16 OMPI_MCA_oob_tcp_if_include=10.0.0.0/16$" \
  "$src/slurm/README.md" ||
  { echo "FAIL: slurm/README.md no longer says how to name the network between nodes" >&2; exit 1; }

fresh_checkout "$src" "$bin"
cd "$work/checkout" || exit 1
compare=$(dirname "$bin")/tests/compare_params
decoder=$(dirname "$bin")/tests/decode_shards

# ---- prepare over 2 nodes and on one
"$src/data/extract-kjv.sh" "$work/kjv-all.txt"
head -n 2000 "$work/kjv-all.txt" >"$work/kjv.txt"
prepare=(--kind lm --input "$work/kjv.txt" --shards 2 --vocab-size 500 --valid-lines 100)
# A shard's temporary left by a prepare killed on node2, under the pid of a
# process that runs on node1 (its slurmctld): pids are per host, so node1's
# prepare must not take it for one of its own that still runs.
mkdir -p shards-two
busy_pid=$(cat "$work/slurmctld.pid")
echo partial >"shards-two/train-00001.h5.tmp-node2-$busy_pid"
srun -K1 -N 2 --ntasks-per-node 1 --cpus-per-task 1 "$bin" prepare "${prepare[@]}" \
  --out shards-two >"$work/prepare-two.log" 2>&1 || { cat "$work/prepare-two.log"; exit 1; }
expect "prepare on node1 removes node2's abandoned temporary (pid $busy_pid runs on node1)" \
  bash -c "grep -q 'removed 1 temporary file(s) left in shards-two' '$work/prepare-two.log' &&
    ! compgen -G 'shards-two/*.tmp-*' >/dev/null"
srun -K1 -N 1 -n 2 --cpus-per-task 1 -w node1 "$bin" prepare "${prepare[@]}" \
  --out shards-one >"$work/prepare-one.log" 2>&1 || { cat "$work/prepare-one.log"; exit 1; }
expect "prepare over 2 nodes: the tokenizer of one node" \
  cmp -s shards-two/tokenizer.model shards-one/tokenizer.model
on node1 "$decoder" shards-two >"$work/two.decoded"
on node1 "$decoder" shards-one >"$work/one.decoded"
expect "prepare over 2 nodes: the shards of one node ($(wc -l <"$work/one.decoded") sequences)" \
  cmp -s "$work/two.decoded" "$work/one.decoded"

# ---- 2 nodes x 2 ranks against 1 rank x 4 micro-batches
model=(--model lm --data shards-two --layers 2 --d-model 32 --heads 2 --d-ff 64 --max-len 64
  --max-tokens 256 --steps 3 --lr 1e-2 --warmup 0 --schedule constant --dropout 0
  --bucket-mb 0.01 --log-every 1 --eval-batches 1 --seed 5)
four=$(sbatch --parsable -N 2 --ntasks-per-node 2 --cpus-per-task 1 slurm/train.sbatch runs/four \
  "${model[@]}" --accum-steps 1)
one=$(sbatch --parsable -N 1 -n 1 --cpus-per-task 1 -w node2 slurm/train.sbatch runs/one \
  "${model[@]}" --accum-steps 4)
wait_for "the two runs" 180 gone "$four" "$one"
expect "2 nodes x 2: ExitCode=0:0" [ "$(job_field "$four" ExitCode)" = 0:0 ]
expect "1 x 4: ExitCode=0:0" [ "$(job_field "$one" ExitCode)" = 0:0 ]
expect "the start line: 4 ranks on 2 nodes x 2 local ranks" \
  grep -q "4 rank(s) x 1 thread(s) on 2 nodes x 2 local ranks," runs/four/train.log
expect "the job's output: node[1-2], 4 ranks" \
  grep -q "^==> job $four start 1 on node\[1-2\]: 4 rank(s) x 1 thread(s)" \
  "runs/four/slurm-mpiformer-$four.out"
if on node1 "$compare" runs/four/checkpoints/step_00000003.h5 runs/one/checkpoints/step_00000003.h5 \
  --bitwise >"$work/compare.log" 2>&1; then
  echo "PASS: 2 nodes x 2 ranks = 1 rank x 4 micro-batches after 3 steps: $(tail -n 1 "$work/compare.log")"
else
  cat "$work/compare.log" >&2
  expect "2 nodes x 2 ranks = 1 rank x 4 micro-batches, bitwise" false
fi

# ---- the time limit on two nodes; a job from node2 meets the lock
run=runs/requeue
log=$run/train.log
steps=3000
job=$(sbatch --parsable -N 2 --ntasks-per-node 1 --cpus-per-task 1 slurm/train.sbatch $run \
  --model lm --synthetic copy --layers 2 --d-model 32 --heads 2 --d-ff 64 --max-len 32 \
  --max-tokens 256 --steps $steps --log-every 10 --eval-every 1000 --checkpoint-every 1000 \
  --resume none)
started() {
  grep -qs "^${stamp}step 100/" "$log" && return 0
  ! gone "$job" || { echo "FAIL: job $job ended before training started" >&2; show_logs; exit 1; }
  return 1
}
wait_for "training on two nodes to start" 90 started
# Held still (SIGSTOP, its lock held) while a job on node2 tries the same
# run directory; the time-limit warning comes once it goes on.
scontrol suspend "$job"
# all_stopped: slurmd has stopped every rank (it does so after scontrol
# returns); step_lines: the step lines in the log so far.
all_stopped() {
  local ranks pid
  ranks=$(ranks_on node1; ranks_on node2)
  [[ -n $ranks ]] || return 1
  for pid in $ranks; do
    [[ $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) == T ]] || return 1
  done
}
step_lines() { grep -c "^${stamp}step " "$log"; }
wait_for "the suspended job's ranks to stop" 30 all_stopped
steps_before=$(step_lines)
intruder=$(sbatch --parsable -N 1 -n 1 --cpus-per-task 1 -w node2 \
  --output="$work/slurm-intruder-%j.out" slurm/train.sbatch $run --model lm --synthetic copy)
wait_for "the job from node2" 60 gone "$intruder"
expect "a job from node2 in the same run directory: ExitCode=2:0" \
  [ "$(job_field "$intruder" ExitCode)" = 2:0 ]
expect "... refused by the lock of node1's rank 0" \
  grep -q "$run is in use by another process (host node1, pid " "$work/slurm-intruder-$intruder.out"
scontrol resume "$job"
# slurmd resumes the steps after scontrol returns, and a step not yet
# resumed refuses signals: the warning could be lost. Once a new step line
# is logged, the ranks run.
going_on() { [[ $(step_lines) -gt $steps_before ]]; }
wait_for "training to go on after the resume" 30 going_on
scancel --signal=USR1 --batch "$job"
wait_for "the stop" 60 grep -q "^${stamp}stopped by SIGUSR1 after step" "$log"
stop_step=$(sed -n "s/^${stamp}stopped by SIGUSR1 after step \([0-9]*\);.*/\1/p" "$log")
pending() { squeue -h -j "$job" -o %T | grep -q PENDING; }
wait_for "the requeue" 60 pending
start_requeued_now "$job"
wait_for "the resumed run" 90 grep -q "^${stamp}resumed from .*: step $stop_step," "$log"
wait_for "the end of the two-node job" 120 gone "$job"
echo "PASS: the two-node job stopped after step $stop_step, was requeued and resumed"
expect "requeue: Restarts=1, ExitCode=0:0" \
  [ "$(job_field "$job" Restarts) $(job_field "$job" ExitCode)" = "1 0:0" ]
# The binary on node1 too: Open MPI's settings above name its network.
node1_bin() { on node1 "$bin" "$@"; }
logged_steps "$run/metrics.h5" node1_bin >"$work/steps.txt"
seq 10 10 $steps >"$work/expected-steps.txt"
expect "requeue: metrics.h5 holds each log step once" cmp -s "$work/steps.txt" "$work/expected-steps.txt"

# ---- a node lost: kill -9 of node2's ranks
lost=$(sbatch --parsable -N 2 --ntasks-per-node 1 --cpus-per-task 1 slurm/train.sbatch runs/lost \
  --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --max-tokens 64 --steps 1000000 --log-every 100)
wait_for "the job to lose a node" 90 grep -qs "^${stamp}step 200/" runs/lost/train.log
victims=$(ranks_on node2)
survivors=$(ranks_on node1)
expect "a rank on each node (node1: $survivors, node2: $victims)" [ -n "$victims" -a -n "$survivors" ]
names=$(process_names $survivors $victims | sort -u)
expect "the ranks on both nodes are named mpiformer (${names//$'\n'/, })" [ "$names" = mpiformer ]
killed_at=$SECONDS
kill -9 $victims
none_left() { [[ -z $(ranks_on node1) ]]; }
wait_for "node1's ranks to end after node2's were killed" 60 none_left
echo "PASS: node1's ranks ended $((SECONDS - killed_at)) s after node2's were killed"
wait_for "the end of the job that lost a node" 60 gone "$lost"
expect "the job's output names the lost rank (srun: error: node2: task 1: Killed)" \
  grep -q "^srun: error: node2: task 1: Killed" "runs/lost/slurm-mpiformer-$lost.out"
expect "the job that lost a node is not requeued" [ "$(job_field "$lost" Restarts)" = 0 ]

# ---- mpirun with a hostfile inside an allocation, as slurm/README.md says
hostfile_line="printf '%s slots=1\\n' \$(scontrol show hostnames \"\$SLURM_JOB_NODELIST\") >hosts"
mpirun_line="mpirun --hostfile hosts -np 2 build/mpiformer train --out runs/mpirun"
for line in "$hostfile_line" "$mpirun_line"; do
  grep -qF "    $line" "$src/slurm/README.md" ||
    { echo "FAIL: slurm/README.md lacks the line: $line" >&2; exit 1; }
done
salloc -N 2 --ntasks-per-node 1 --cpus-per-task 1 bash -c "$hostfile_line && $mpirun_line \
  --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --max-tokens 64 --steps 20 --threads 1" >"$work/mpirun.log" 2>&1 || true
expect "mpirun --hostfile in an allocation: 2 nodes x 1 local rank" \
  grep -q "2 rank(s) x 1 thread(s) on 2 nodes x 1 local rank," runs/mpirun/train.log
expect "mpirun --hostfile in an allocation: a final eval" grep -q "^${stamp}final eval" runs/mpirun/train.log

# ---- the link at a known rate: bench, one rank per node, against the model
# rate_limit RATE: both ends of the link send at most RATE (tc tbf; netem
# where the kernel has it, to add no delay of its own).
rate_limit() {
  local node
  for node in "${nodes[@]}"; do
    on "$node" tc qdisc replace dev mfnet0 root tbf rate "$1" burst 256kb latency 50ms
  done
}
bench=(--model lm --layers 2 --d-model 128 --heads 4 --d-ff 512 --vocab 4096 --batch 4 --seq 64
  --steps "${MULTINODE_BENCH_STEPS:-10}" --warmup-steps 3 --threads 1 --bucket-mb 0.5)
for rate in ${MULTINODE_RATES:-1gbit}; do
  rate_limit "$rate"
  salloc -N 2 --ntasks-per-node 1 --cpus-per-task 1 \
    mpirun -np 2 --map-by node "$bin" bench "${bench[@]}" >"$work/bench-$rate.json" \
    2>"$work/bench-$rate.err" || { cat "$work/bench-$rate.err" >&2; exit 1; }
  expect "bench at $rate: one rank per node" grep -q "on 2 nodes x 1 local rank" "$work/bench-$rate.err"
  python3 "$src/analysis/scaling_model.py" --measured "$work/bench-$rate.json" \
    --link-rate "$rate" >"$work/bench-$rate.txt" ||
    { cat "$work/bench-$rate.txt" >&2; exit 1; }
  cat "$work/bench-$rate.txt"
done
for node in "${nodes[@]}"; do on "$node" tc qdisc del dev mfnet0 root 2>/dev/null || true; done

# ---- what is left: nothing
scancel --quiet --user=root 2>/dev/null || true
stop_daemons
remove_nodes
cd "$work"
leftover_ns=$(ip netns list | grep "^$ns-" || true)
leftover_links=$(ip -o link show | grep -e "$ns-" || true)
expect "no namespace left${leftover_ns:+: $leftover_ns}" [ -z "$leftover_ns" ]
expect "no link left${leftover_links:+: $leftover_links}" [ -z "$leftover_links" ]
expect "no daemon left" [ -z "$(daemons_alive)" ]
expect "no address of the link in this namespace" bash -c "! ip -o addr | grep -q ' $net\\.'"

if [[ $failures -gt 0 ]]; then
  show_logs
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "multinode: all checks passed"
