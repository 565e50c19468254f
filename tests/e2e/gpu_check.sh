#!/usr/bin/env bash
# scripts/gpu-check where there is no GPU: its arguments are checked before
# any device time is spent, a missing bundle is one clear line, and, on a
# stand-in bundle whose op test fails, a failed stage runs again once with
# MPIFORMER_CUDA_CHECK=1, the failing tests go to compute-sanitizer, and a
# device command ($OUT set) gets the summary and every log back. And the
# decode stage on a stand-in bundle that runs this build on the CPU: its
# training, decoding and comparisons go through (the "GPU" is the CPU, so
# every line agrees); the devices stage there, which finds no GPU; and the
# limit stage on a stand-in that shrinks its GPT-2 shapes, every bench line
# read back into the summary.
source "$(dirname "$0")/common.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0 out=$work/out err=$work/err

# A copy of the script in a tree of its own, where device-bundle/ is ours.
tree=$work/tree
mkdir -p "$tree/scripts" && cp "$root/scripts/gpu-check" "$tree/scripts/"
gpu_check() {
  rc=0
  "$tree/scripts/gpu-check" "$@" >"$out" 2>"$err" || rc=$?
}

gpu_check
check "no stage: exit 2 ($rc) with the usage" test "$rc" -eq 2
check "  the usage names the stages" grep -q "determinism" "$err"
gpu_check --help
check "--help: exit 0 ($rc)" test "$rc" -eq 0
check "  it names the limit stage" grep -q "^    limit " "$out"
gpu_check ops bogus
refused "an unknown stage" 2 "unknown stage 'bogus'"
gpu_check kjv
refused "kjv without its shards" 2 "kjv needs the directory of its shards"
gpu_check digits "$work/none"
refused "digits without its shards" 2 "digits needs the directory of its image shards"
gpu_check ragged "$work/none"
refused "ragged's shards that are not a directory" 2 "unknown stage '$work/none'"
gpu_check ops
refused "no bundle" 2 "device-bundle/run is missing: run scripts/device-bundle first"
gpu_check ragged
refused "ragged without shards, no bundle" 2 "device-bundle/run is missing"

# The stand-in bundle: its op test fails one test, and says whether the
# check switch was on; compute-sanitizer stands in on PATH.
mkdir -p "$tree/device-bundle" "$work/bin"
cat >"$tree/device-bundle/run" <<'SH'
#!/usr/bin/env bash
echo "run $* MPIFORMER_CUDA_CHECK=${MPIFORMER_CUDA_CHECK:-}" >>"$CALLS"
echo "[==========] 2 tests ran."
echo "[  PASSED  ] 1 test."
echo "[  FAILED  ] Precisions/CudaOpsTest.RaggedAttention/bf16, where GetParam() = 1"
[[ -n ${MPIFORMER_CUDA_CHECK:-} ]] && echo "after attention_backward (bf16; B 5): an illegal memory access"
exit 1
SH
cat >"$work/bin/compute-sanitizer" <<'SH'
#!/usr/bin/env bash
echo "sanitizer $*" >>"$CALLS"
echo "========= ERROR SUMMARY: 1 error"
SH
chmod +x "$tree/device-bundle/run" "$work/bin/compute-sanitizer"
# A bundle built from other sources than the tree's: refused before any stage.
mkdir -p "$tree/src" && echo "int built;" >"$tree/src/x.cpp"
(cd "$tree" && sha256sum src/x.cpp >device-bundle/sources.sha256)
echo "int edited;" >"$tree/src/x.cpp"
gpu_check ops
refused "a bundle older than its sources" 2 \
  "device-bundle/ was built from other sources: 1 file(s) changed since, e.g. src/x.cpp; run scripts/device-bundle again"
check "  before any stage" test ! -e "$tree/gpu-check-out/summary.txt"
rm "$tree/device-bundle/sources.sha256"
export CALLS=$work/calls
mkdir -p "$work/device-out"
PATH=$work/bin:$PATH OUT=$work/device-out gpu_check ops
summary=$work/device-out/summary.txt
check "a failed stage: the script still ends 0 ($rc)" test "$rc" -eq 0
check "the summary comes back" test -s "$summary"
check "  with the failure" grep -q "^ops: exit 1; \[  PASSED  \] 1 test. \[  FAILED  \]" "$summary"
check "  the failing test under compute-sanitizer" \
  grep -q "^ops: compute-sanitizer on Precisions/CudaOpsTest.RaggedAttention/bf16: exit 0; =* ERROR SUMMARY: 1 error" "$summary"
check "  and the rerun with the check switch" grep -q "^ops: failed; again with MPIFORMER_CUDA_CHECK=1" "$summary"
check "  and what the stage took, its rerun included" grep -q "^ops: [0-9]* s in all$" "$summary"
check "  whose line is marked" grep -q "^  (checked) ops: exit 1" "$summary"
check "the op test ran twice, the second time checked" \
  test "$(grep -c '^run tests/cuda_ops_test' "$CALLS")" -eq 2 -a \
  "$(grep -c '^run tests/cuda_ops_test.*MPIFORMER_CUDA_CHECK=1$' "$CALLS")" -eq 1
check "compute-sanitizer ran only the failing test" \
  grep -q "^sanitizer --tool memcheck --target-processes all .*/run tests/cuda_ops_test --gtest_filter=Precisions/CudaOpsTest.RaggedAttention/bf16$" "$CALLS"
tar tzf "$work/device-out/logs.tar.gz" >"$work/logs.txt"
for log in ops.log ops.check.log ops.sanitizer.log summary.txt; do
  check "logs.tar.gz holds $log" grep -q "^./$log$" "$work/logs.txt"
done
check "the checked log names the op" \
  bash -c "tar xzOf '$work/device-out/logs.tar.gz' ./ops.check.log | grep -q 'after attention_backward (bf16'"
check "nothing else in \$OUT" test "$(ls "$work/device-out" | tr '\n' ' ')" == "logs.tar.gz summary.txt "

cpu_tree=$work/cpu-tree
mkdir -p "$cpu_tree/scripts" "$cpu_tree/device-bundle" && cp "$root/scripts/gpu-check" "$cpu_tree/scripts/"
cat >"$cpu_tree/device-bundle/run" <<SH
#!/usr/bin/env bash
# The build's mpiformer, --device cuda read as cpu.
shift
args=()
for a in "\$@"; do [[ \$a == cuda ]] && a=cpu; args+=("\$a"); done
exec "$1" "\${args[@]}"
SH
chmod +x "$cpu_tree/device-bundle/run"
rc=0
# Forty training steps: the "GPU" is the CPU, so the lines agree however
# little the models learnt.
GPU_CHECK_DECODE_STEPS=40 GPU_CHECK_SECONDS=400 "$cpu_tree/scripts/gpu-check" decode >"$out" 2>"$err" || rc=$?
summary=$cpu_tree/gpu-check-out/summary.txt
check "decode on a CPU stand-in: exit 0 ($rc)" test "$rc" -eq 0
check "  four decodings, each line the same on both and cached or recomputed" \
  test "$(grep -c '^decode .*: exit 0; GPU lines equal to the CPU.s 400/400, GPU cached equal to recomputed 400/400;' "$summary")" -eq 4
# devices on the stand-in: with no --device, train finds no GPU here, so the
# stage says it fails and why, and runs again under the check switch; the
# precisions and the decoding rates are reported (a small model, and
# transformers from the test venv where scripts/setup --tests made one).
rc=0
venv_python=$root/.deps/torch-venv/bin/python
[[ -x $venv_python ]] || venv_python=python3
PYTHON=$venv_python GPU_CHECK_SPEED_SHAPE=tiny GPU_CHECK_DECODE_STEPS=40 GPU_CHECK_SECONDS=300 \
  "$cpu_tree/scripts/gpu-check" devices >"$out" 2>"$err" || rc=$?
check "devices on a CPU stand-in: exit 0 ($rc)" test "$rc" -eq 0
check "  no --device on a machine without a GPU fails the stage, saying why" \
  grep -q "^devices: train with no --device fails (exit 0): mpiformer train: lm on copy (cpu; auto: no GPU visible)" "$summary"
for precision in bf16 fp16; do
  check "  generate $precision against fp32, both tasks" \
    test "$(grep -c "^devices: generate \(rev\|copy\) $precision against fp32 on the GPU: [0-9]*/400 lines equal ([0-9.]*%; bf16 passes at 95%): [a-z]* (exit 0)" "$summary")" -eq 2
done
check "  the decoding rates side by side" \
  grep -q "^devices: decoding 8 prompts x 16 tokens, lm 2 64 4 512 (layers d-model heads vocab): mpiformer fp32 [1-9][0-9]* tok/s (model calls [0-9.]* s, choice of tokens [0-9.]* s, [0-9.]* rows a step); mpiformer bf16 [1-9][0-9]* tok/s (.*); mpiformer bf16-pageable [1-9][0-9]* tok/s (.*); transformers bf16 [1-9][0-9]* tok/s; bf16 against transformers bf16: [0-9]*\.[0-9][0-9]x (target 2x: \(met\|not met\))" "$summary"
check "  where a bf16 decoding step's time goes" \
  grep -q "^devices: decoding bf16 --profile, ms per step: gemm [0-9.]*, attention [0-9.]*, .*, other [0-9.-]* of [0-9.]*$" "$summary"
check "  eval on the GPU left out without shards" \
  grep -q "^devices: eval on the GPU left out (no shards given)" "$summary"
# devices with shard directories: each by its kind (an lm, the digits
# classifier) trained on the "GPU" and evaluated there against the CPU; a
# directory without shards is left out, saying so.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >"$work/text.txt"
"$bin" prepare --kind lm --input "$work/text.txt" --out "$work/lm-shards" --shards 1 \
  --vocab-size 300 --valid-lines 50 >/dev/null
"$root/data/extract-digits.py" "$work/digits.npz" >/dev/null
"$bin" prepare --kind image --input "$work/digits.npz" --out "$work/digit-shards" --shards 1 \
  --valid-lines 180 --test-lines 180 >/dev/null
mkdir -p "$work/no-shards"
rc=0
PYTHON=$venv_python GPU_CHECK_SPEED_SHAPE=tiny GPU_CHECK_DECODE_STEPS=40 GPU_CHECK_EVAL_STEPS=20 \
  GPU_CHECK_SECONDS=300 "$cpu_tree/scripts/gpu-check" devices "$work/lm-shards" \
  "$work/digit-shards" "$work/no-shards" >"$out" 2>"$err" || rc=$?
check "devices with three directories: exit 0 ($rc)" test "$rc" -eq 0
for kind in lm image; do
  check "  eval fp32 and bf16 of the $kind shards on the GPU against the CPU" \
    test "$(grep -c "^devices: eval \(fp32\|bf16\) of $kind shards $work/[a-z-]*shards passes, relative difference [0-9.e+-]* (at most [0-9.e-]*, and 1e-4 of the printed loss): cpu loss [0-9.]* in [0-9]*\.[0-9][0-9] s, cuda loss [0-9.]* in [0-9]*\.[0-9][0-9] s" "$summary")" -eq 2
done
check "  the directory without shards left out" \
  grep -q "^devices: eval on $work/no-shards left out: shards of kind '?' (lm and image are taken)" "$summary"

# limit on a stand-in bundle that runs this build on the CPU with the GPT-2
# shapes shrunk and two timed steps (and a PyTorch that drops --compile and
# --sdpa, which an old torch lacks): every setting's bench line is read
# back, each switch set beside the defaults, the targets and PyTorch's
# baseline reported, the micro-timings taken from the ops stage before it.
# One bench fails (adamw=ranged's, unless under the check switch): the
# stage's rerun runs it alone again.
limit_tree=$work/limit-tree
mkdir -p "$limit_tree/scripts" "$limit_tree/device-bundle"
cp "$root/scripts/gpu-check" "$limit_tree/scripts/"
ln -s "$root/analysis" "$limit_tree/analysis"
shrink='prev=""; args=()
for a in "$@"; do
  case $prev in
    --layers) a=1 ;; --d-model) a=32 ;; --heads) a=2 ;; --d-ff) a=64 ;; --vocab) a=256 ;;
    --max-len|--seq) a=32 ;; --batch) a=$((a / 8 > 0 ? a / 8 : 1)) ;; --attention) a=auto ;;
    --device) a=cpu ;; --precision) a=${STANDIN_PRECISION:-$a} ;;
    --steps) a=2 ;; --warmup-steps) a=1 ;;
  esac
  prev=$a
  [[ $a == --compile || $a == --sdpa ]] || args+=("$a")
done'
cat >"$limit_tree/device-bundle/run" <<SH
#!/usr/bin/env bash
# The build's mpiformer, GPT-2 shrunk, on the CPU; the op test a stand-in.
if [[ \$1 == tests/cuda_ops_test ]]; then
  echo "kernel timing: adamw ranged 1.000 ms, vector 0.500 ms"
  echo "switches: MPIFORMER_KERNELS=\${MPIFORMER_KERNELS:-(unset)}"
  echo "[==========] 2 tests from 1 test suite ran. (10 ms total)"
  echo "[  PASSED  ] 2 tests."
  exit 0
fi
shift
[[ \${MPIFORMER_KERNELS:-} == adamw=ranged && -z \${MPIFORMER_CUDA_CHECK:-} ]] && exit 1
$shrink
# bench's line as a GPU's names an epilogue cuBLASLt refused; its rate and
# GEMM time are set, so that dbias=columns alone wins.
rate=1000 gemm=1
[[ ,\${MPIFORMER_KERNELS:-}, == *,dbias=columns,* ]] && rate=2000 gemm=0.5
set -o pipefail
"$1" "\${args[@]}" | sed "s/}\$/, \"gemm_unfused\": \"1 shape: BGRADB m 32 n 1 k 64\"}/;
  s/\"tokens_per_s\": [0-9.e+-]*/\"tokens_per_s\": \$rate/; s/\"gemm\": [0-9.e+-]*/\"gemm\": \$gemm/"
SH
cat >"$work/limit-python" <<SH
#!/usr/bin/env bash
STANDIN_PRECISION=fp32
$shrink
exec "$venv_python" "\${args[@]}"
SH
chmod +x "$limit_tree/device-bundle/run" "$work/limit-python"
rc=0
PYTHON=$work/limit-python GPU_CHECK_SECONDS=300 "$limit_tree/scripts/gpu-check" ops limit \
  winners ops >"$out" 2>"$err" || rc=$?
summary=$limit_tree/gpu-check-out/summary.txt
check "limit on a CPU stand-in: exit 0 ($rc)" test "$rc" -eq 0
check "  the failed bench ran again under the check switch" \
  grep -q "^limit: failed; again with MPIFORMER_CUDA_CHECK=1" "$summary"
limit_logs=$limit_tree/gpu-check-out
benches=$(grep "^== [a-z]" "$limit_logs/limit.log" | grep -vc "^== pytorch")
check "  ... it alone: the other $((benches - 1)) benches' lines kept" \
  test "$(grep -c "^== .*: the first run's line, kept: {" "$limit_logs/limit.check.log")" -eq \
  "$((benches - 1))"
check "  ... and it passed there" \
  grep -q "^  (checked) limit: gpt2 B32 adamw=ranged: [0-9][0-9.]* tok/s" "$summary"
check "  the micro-timings reported" \
  grep -q "^limit: kernel timing: adamw ranged 1.000 ms, vector 0.500 ms" "$summary"
check "  ... those the ops stage ran before it, not run again" \
  grep -q "^limit: kernel micro-timings: those the ops stage ran (ops.log)" "$summary"
number='[0-9][0-9.]*'
for setting in present layernorm=block adamw=ranged layernorm_backward=warp loss=pipelined \
  gemm=timed attention=dense dweight=split dweight_stream=side attention_plan=timed dbias=columns \
  dbias_out=norm dbias_in=dgelu candidates deterministic=false; do
  check "  B32 under $setting, with its target and profile" \
    grep -q "^\\(  (checked) \\)\\?limit: gpt2 B32 $setting: $number tok/s, mfu $number, step $number ms, .*; GEMM epilogues run unfused: 1 shape: BGRADB m 32 n 1 k 64 (target tokens_per_s >= 600000: \(met\|not met\)); ms per step: gemm $number, attention $number, layernorm $number, .*optimizer $number, other -*$number$" "$summary"
done
check "  GPT-2's head without a bias, against one with a bias" \
  grep -q "^\\(  (checked) \\)\\?limit: GPT-2's head (no bias) against one with a bias (up to 2026-11-29), gpt2 B32: gemm $number -> $number ms per step (new/old $number); tok/s $number -> $number (new/old $number)$" "$summary"
check "  ... the defaults without the bias, the other run with it" \
  test "$(grep -c "^== present (MPIFORMER_KERNELS unset): mpiformer bench .* --output-bias \(false\|true\) --batch 32 " "$limit_logs/limit.log")" -eq 2
check "  ... PyTorch's baseline without it too" \
  test "$(grep -c "^== pytorch --sdpa B[0-9]*: analysis/bench_pytorch.py .* --output-bias false --batch " "$limit_logs/limit.log")" -eq 2
for older in layernorm=block:layernorm adamw=ranged:optimizer; do
  check "  the defaults against ${older%%:*}, the path they replaced" \
    grep -q "^\\(  (checked) \\)\\?limit: present against ${older%%:*} (the path it replaced), gpt2 B32: ${older#*:} $number -> $number ms per step (new/old $number); tok/s $number -> $number (new/old $number)$" "$summary"
done
for candidate in layernorm_backward=warp:layernorm loss=pipelined:loss gemm=timed:gemm \
  attention=dense:attention dweight=split:gemm dweight_stream=side:gemm \
  attention_plan=timed:attention dbias=columns:gemm dbias_out=norm:gemm dbias_in=dgelu:gemm; do
  check "  the candidate ${candidate%%:*} against the defaults" \
    grep -q "^\\(  (checked) \\)\\?limit: ${candidate%%:*} against present, gpt2 B32: ${candidate#*:} $number -> $number ms per step (new/old $number); tok/s $number -> $number (new/old $number)$" "$summary"
done
for name in "candidates against present, gpt2 B32" \
  "--deterministic false against present, gpt2 B32" "candidates against present, gpt2 B8"; do
  check "  $name" grep -q "^limit: $name: .*tok/s $number -> $number (new/old $number)$" "$summary"
done
check "  the loss family beside its target" \
  grep -q "^limit: loss family at gpt2 B32 (target <= 1.5 ms per step); present $number ms (\(met\|not met\)); loss=pipelined $number ms (\(met\|not met\)); candidates $number ms (\(met\|not met\)); winners $number ms (\(met\|not met\))$" "$summary"
for name in "gpt2 B8 present" "gpt2 B8 candidates" "gpt2 B64 candidates" \
  "gpt2-medium B16 candidates" "gpt2 B8 --grad-sum exact exact=buffered" \
  "gpt2 B8 --grad-sum exact present" "gpt2 B64 candidates --recompute activation"; do
  check "  $name" grep -q "^limit: $name: $number tok/s" "$summary"
done
check "  B64 with the MLPs' activations made again, against none" \
  grep -q "^limit: --recompute activation against none, gpt2 B64 candidates: tok/s $number -> $number (new/old $number)$" "$summary"
check "  B64's device memory beside its target" \
  grep -q "^limit: gpt2 B64 device memory (target below 25.9 GB); candidates $number B (met); activation $number B (met)$" "$summary"
check "  the exact sum's two paths side by side" \
  grep -q "^limit: present against exact=buffered (the path it replaced), gpt2 B8 --grad-sum exact: optimizer $number -> $number ms" "$summary"
check "  the winners: the candidate faster alone, and no other" \
  grep -q "^limit: winners: dbias=columns (each candidate" "$summary"
check "  ... written for the winners stage" test "$(cat "$limit_logs/winners.txt")" == dbias=columns
for name in "gpt2 B32 winners" "gpt2 B8 winners" "gpt2-medium B16 winners"; do
  check "  $name, under their switches" \
    grep -q "^limit: $name: 2000 tok/s, .*; ms per step: gemm 0.5," "$summary"
done
for name in "winners against present, gpt2 B32" "winners against candidates, gpt2 B32" \
  "winners against present, gpt2 B8"; do
  check "  $name" grep -q "^limit: $name: tok/s [0-9]* -> 2000 (new/old [0-9.]*)$" "$summary"
done
check "  the winners stage: the stages after it on the winners" \
  grep -q "^winners: dbias=columns; the stages after it run on MPIFORMER_KERNELS=dbias=columns$" \
  "$summary"
check "  ... the op test run after it under them" \
  grep -q "^switches: MPIFORMER_KERNELS=dbias=columns$" "$limit_logs/ops.log"
check "  PyTorch's baseline at B8 and B32 beside ours" \
  test "$(grep -c "^limit: pytorch bf16 compiled --sdpa gpt2 B\(8\|32\): $number tok/s .*; mpiformer present/pytorch $number$" "$summary")" -eq 2

exit_on_failures
