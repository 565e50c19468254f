#!/usr/bin/env bash
# The commit a build records (src/core/version.cmake, run before every
# build): a tree's commit, "-dirty" after it while a tracked file differs,
# the next commit once committed, "unknown" outside git; and a header left
# untouched while its text stays the same, so a build recompiles nothing
# for it. Then this build's own binary names a commit of this tree.
source "$(dirname "$0")/common.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$2
rm -rf "$work" && mkdir -p "$work/repo"
failures=0 out=$work/out err=$work/err
: >"$out" >"$err"
header=$work/version.h
stamp() {
  cmake -DSOURCE="$1" -DIN="$root/src/core/version.h.in" -DOUT="$header" -DVERSION=9.8.7 \
    -P "$root/src/core/version.cmake" >"$out" 2>"$err"
}
commit_of() { sed -n 's/^#define MPIFORMER_GIT_COMMIT "\(.*\)"$/\1/p' "$header"; }

repo=$work/repo
git -C "$repo" init -q
echo one >"$repo/file"
git -C "$repo" add file
git -C "$repo" -c user.name=t -c user.email=t@t commit -qm one
first=$(git -C "$repo" rev-parse --short=12 HEAD)
stamp "$repo"
check "a clean tree: its commit ($(commit_of))" test "$(commit_of)" == "$first"
check "  and the version" grep -q '^#define MPIFORMER_VERSION "9.8.7"$' "$header"
touch -d '2000-01-01' "$header"
stamp "$repo"
check "the same text again: the header untouched" test "$(stat -c %Y "$header")" -eq 946684800
echo two >"$repo/file"
stamp "$repo"
check "a tracked file edited: -dirty ($(commit_of))" test "$(commit_of)" == "$first-dirty"
echo new >"$repo/untracked"
git -C "$repo" -c user.name=t -c user.email=t@t commit -qam two
second=$(git -C "$repo" rev-parse --short=12 HEAD)
stamp "$repo"
check "committed (an untracked file beside it): the new commit ($(commit_of))" \
  test "$(commit_of)" == "$second"
mkdir -p "$work/plain"
GIT_CEILING_DIRECTORIES=$work stamp "$work/plain"  # not the clone around $work
check "outside git: unknown ($(commit_of))" test "$(commit_of)" == unknown

# This build: a commit of this tree, or unknown where the tree is no clone.
own=$("$1" --version | sed -n 's/^mpiformer [0-9.]* (\(.*\))$/\1/p')
if git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
  check "this build names a commit of this tree ($own)" \
    git -C "$root" cat-file -e "${own%-dirty}^{commit}"
else
  check "this build, outside git: unknown ($own)" test "$own" == unknown
fi
exit_on_failures
