#!/usr/bin/env bash
# `cmake --install` puts a working mpiformer in PREFIX/bin and the job
# scripts, analysis tools and documents in PREFIX/share/mpiformer; the
# installed binary runs from anywhere (its libraries found) and trains.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
build=$(dirname "$bin")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

cmake --install "$build" --prefix "$work/prefix" >install.log
installed=$work/prefix/bin/mpiformer
for f in bin/mpiformer share/mpiformer/slurm/train.sbatch share/mpiformer/slurm/run-step.sh \
  share/mpiformer/analysis/plot_run.py share/mpiformer/analysis/mpiformer_metrics.py \
  share/mpiformer/data/extract-kjv.sh share/mpiformer/doc/FORMAT.md \
  share/mpiformer/doc/CHECKPOINT.md share/mpiformer/doc/DESIGN.md \
  share/mpiformer/doc/INSTALL.md; do
  [[ -e prefix/$f ]] || fail "cmake --install left no prefix/$f"
done
[[ -x prefix/share/mpiformer/slurm/train.sbatch ]] || fail "train.sbatch is not executable"

# From another directory, with nothing of the build on any path.
rc=0
(cd / && env -u LD_LIBRARY_PATH "$installed" --version) >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 && $(cat "$out") == mpiformer* ]] || fail "the installed binary: --version exit $rc"
rc=0
"$installed" train --synthetic copy --steps 5 --log-every 5 --d-model 16 --heads 2 --d-ff 32 \
  --layers 1 --max-len 8 --max-tokens 64 --threads 1 --out run >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 && -f run/checkpoints/step_00000005.h5 ]] || fail "the installed binary trains: exit $rc"
python3 prefix/share/mpiformer/analysis/plot_run.py run -o run/curves.png >"$out" 2>"$err" &&
  [[ -s run/curves.png ]] || fail "the installed plot_run.py"

[[ $failures -eq 0 ]] || exit 1
echo "PASS: cmake --install gives a binary that runs and the tools beside it"
