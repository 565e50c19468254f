#!/usr/bin/env bash
# The README's "First run" commands, run verbatim, in order, on a fresh
# checkout (a clone of this repository's HEAD whose build/ is the build
# under test): each must succeed, and afterwards `git status` must show
# nothing: everything they write lands where git ignores it.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"

# The commands: the indented lines of the section, continuation lines joined.
commands=$work/commands.sh
awk '/^## First run/ { inside = 1; next }
     /^## / { inside = 0 }
     inside && /^    / { line = substr($0, 5)
                         if (sub(/\\$/, "", line)) { pending = pending line; next }
                         print pending line; pending = "" }' "$src/README.md" >"$commands"
count=$(grep -cv '^[[:space:]]*\(#.*\)\{0,1\}$' "$commands" || true)
[[ $count -ge 5 ]] || { echo "FAIL: only $count commands under '## First run' in README.md" >&2; exit 1; }

# A fresh checkout: HEAD plus this tree's uncommitted changes (so the test
# checks the README being edited), with the build under test as build/.
clone=$work/checkout
git clone --quiet --no-hardlinks "$src" "$clone"
(cd "$src" && git diff HEAD --binary) | (cd "$clone" && git apply --allow-empty)
(cd "$src" && git ls-files --others --exclude-standard -z) |
  (cd "$src" && xargs -0 -r cp --parents -t "$clone")
ln -s "$(dirname "$bin")" "$clone/build"
(cd "$clone" && git add -A >/dev/null && git -c user.name=t -c user.email=t@t commit -qm tree \
  --allow-empty)

cd "$clone"
n=0
while IFS= read -r command; do
  [[ $command =~ ^[[:space:]]*(#.*)?$ ]] && continue
  n=$((n + 1))
  echo "==> [$n/$count] $command"
  start=$SECONDS
  if ! bash -euo pipefail -c "$command" </dev/null >"$work/step-$n.log" 2>&1; then
    echo "FAIL: README command $n failed: $command" >&2
    tail -n 30 "$work/step-$n.log" >&2
    exit 1
  fi
  tail -n 3 "$work/step-$n.log" | sed 's/^/    /'
  echo "    ($((SECONDS - start)) s)"
done <"$commands"

# Nothing the commands wrote is left for git to see (build/ is our link).
status=$(git status --porcelain --ignored=no | grep -v '^?? build$' || true)
if [[ -n $status ]]; then
  echo "FAIL: the README commands left files git does not ignore:" >&2
  echo "$status" >&2
  exit 1
fi
echo "PASS: the README's $n First run commands ran verbatim on a fresh checkout"
