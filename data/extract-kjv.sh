#!/usr/bin/env bash
# Writes the King James Bible as one verse per line, Genesis 1:1 to
# Revelation 22:21 (31,102 lines), for `mpiformer prepare --kind lm`.
# Source: Debian's bible-kjv (the `bible` program) and bible-kjv-text (the
# text, public domain); scripts/setup installs both.
#
# usage: data/extract-kjv.sh OUT.txt
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 OUT.txt" >&2
  exit 2
fi
out=$1

if ! command -v bible >/dev/null; then
  echo "$0: the 'bible' program is missing: install bible-kjv (scripts/setup does)" >&2
  exit 1
fi

# `bible` prints a header per chapter ("Genesis 1", "2 Samuel 1") at column
# 0, then one verse per line, indented and numbered ("  20 And God said...").
# Verses are the indented numbered lines; the number and indent go, and so do
# the headers and blank lines. -l sets a page width no verse reaches, so
# verses are never wrapped.
mkdir -p "$(dirname "$out")"
tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT
bible -l100000 "gen1:1-rev22:21" |
  sed -n -E 's/^ +[0-9]+ +//p' |
  sed -E 's/[[:space:]]+$//' |
  grep -v '^$' >"$tmp"

verses=$(wc -l <"$tmp")
if [[ $verses -ne 31102 ]]; then
  echo "$0: expected 31102 verses, got $verses (has bible-kjv's output format changed?)" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "$out: $verses verses"
