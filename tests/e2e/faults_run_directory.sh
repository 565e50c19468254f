#!/usr/bin/env bash
# The run directory is the run's own: no write follows a symbolic link that
# someone planted there, and a FIFO where a file belongs never blocks.
#   links planted at .lock and train.log: refused with one line naming the
#     file, the file they point at untouched;
#   links at the temporaries' names of older versions (a checkpoint's
#     PATH.tmp, latest.tmp, metrics.jsonl.tmp, metrics.h5.tmp; the names are
#     PATH.tmp-HOST-PID now): removed at start, their targets untouched,
#     every file a regular one;
#   generate --output through a link: the link is replaced, not its target;
#   a FIFO as metrics.h5 at resume, and as --config: no wait;
#   --config /dev/zero and a 20 MB --config: refused with one line.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
try_seconds=60

model=(--model lm --synthetic copy --layers 2 --heads 2 --d-ff 64 --max-len 32 --d-model 32
  --max-tokens 256 --threads 1 --eval-batches 2)
echo "not yours to write" >victim.txt
victim_intact() { check "$1: the linked file is untouched" test "$(cat victim.txt)" == "not yours to write"; }

# ---- the lock and the log: refused, one line naming the file
mkdir -p locked && ln -s "$work/victim.txt" locked/.lock
try "$bin" train "${model[@]}" --steps 2 --out locked
refused "a link at .lock" nonzero "locked/.lock: is a symbolic link"
victim_intact "a link at .lock"

mkdir -p logged && ln -s "$work/victim.txt" logged/train.log
try "$bin" train "${model[@]}" --steps 2 --out logged
refused "a link at train.log" nonzero "logged/train.log: is a symbolic link"
victim_intact "a link at train.log"

# ---- temporaries and metrics.h5: replaced by the run's own files
mkdir -p planted/checkpoints
for name in checkpoints/step_00000002.h5.tmp checkpoints/latest.tmp metrics.jsonl.tmp; do
  ln -s "$work/victim.txt" "planted/$name"
done
try "$bin" train "${model[@]}" --steps 4 --checkpoint-every 2 --out planted
check "links at the temporaries: the run trains (exit $rc)" test "$rc" -eq 0
victim_intact "links at the temporaries"
for file in planted/checkpoints/step_00000002.h5 planted/checkpoints/step_00000004.h5 \
  planted/checkpoints/latest planted/metrics.h5; do
  check "$file is a regular file" test -f "$file" -a ! -L "$file"
done
check "no temporary is left" test -z "$(find planted -name '*.tmp*')"
# At resume both metrics files are rewritten through temporaries.
for name in checkpoints/step_00000006.h5.tmp metrics.h5.tmp metrics.jsonl.tmp; do
  ln -s "$work/victim.txt" "planted/$name"
done
try "$bin" train "${model[@]}" --steps 6 --checkpoint-every 2 --out planted --resume auto
check "links at the temporaries at resume: the run goes on (exit $rc)" test "$rc" -eq 0
victim_intact "links at the temporaries at resume"
check "no temporary is left after the resume" test -z "$(find planted -name '*.tmp*')"

# ---- outputs of generate: a link is replaced
ln -s "$work/victim.txt" generated.txt
try "$bin" generate --checkpoint planted/checkpoints/step_00000006.h5 --prompt "3 4 5" --output generated.txt
check "generate --output through a link: it writes (exit $rc)" test "$rc" -eq 0
check "generate --output through a link: the link is replaced" test -f generated.txt -a ! -L generated.txt
victim_intact "generate --output through a link"

# ---- FIFOs and devices where a file belongs: no wait
rm planted/metrics.h5 && mkfifo planted/metrics.h5
try "$bin" train "${model[@]}" --steps 8 --checkpoint-every 2 --out planted --resume auto
refused "a FIFO as metrics.h5 at resume" nonzero "planted/metrics.h5: not a regular file"
mkfifo config.fifo
try "$bin" train --config config.fifo --out fifo-run
refused "--config a FIFO" 2 "config.fifo is not a regular file"
try "$bin" train --config /dev/zero --out zero-run
refused "--config /dev/zero" 2 "/dev/zero is not a regular file"
head -c 20000000 /dev/zero | tr '\0' '#' >huge.ini
try "$bin" train --config huge.ini --out huge-run
refused "a 20 MB --config" 2 "huge.ini holds 20000000 bytes"

exit_on_failures
