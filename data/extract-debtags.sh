#!/usr/bin/env bash
# Writes a multi-label text corpus from Debian's package index: one line per
# package that carries debtags (the Tag: field of apt's Packages index), for
# a classifier of package descriptions.
#   OUTDIR/debtags.txt     the description on one line: the short description,
#                          then the long one (from apt's English Translation
#                          index) with its lines joined;
#   OUTDIR/debtags.labels  its tags, space-separated ("devel::lang:python
#                          implemented-in::c"), line-aligned with debtags.txt;
#   OUTDIR/debtags.names   the package's name, line-aligned too.
# Tags that are bookkeeping rather than topic are dropped (role::*, the
# package's kind: shared library, program, -dev, data...; special::*; the
# *TODO* placeholders), then every tag carried by fewer than MIN packages;
# packages left with no tag are dropped. One line per package name (apt's
# candidate version), sorted by name. The data/extract_debtags.py beside
# this script does the work (Python standard library only).
#
# The Translation-en index is what Docker images skip (Acquire::Languages
# "none"), and a plain `apt-get update` removes it again: scripts/setup
# fetches it with `apt-get update -o Acquire::Languages=en`.
#
# usage: data/extract-debtags.sh [--min-count MIN] [--shuffle SEED] OUTDIR
#   --min-count MIN (or DEBTAGS_MIN_COUNT)  keep tags of >= MIN packages (50)
#   --shuffle SEED                          shuffle the lines with a fixed
#                                           seed instead of sorting by name
set -euo pipefail

usage() {
  echo "usage: $0 [--min-count MIN] [--shuffle SEED] OUTDIR" >&2
  exit 2
}
min_count=${DEBTAGS_MIN_COUNT:-50}
extra=()
outdir=
while [[ $# -gt 0 ]]; do
  case $1 in
    --min-count) [[ $# -ge 2 ]] || usage; min_count=$2; shift 2 ;;
    --shuffle) [[ $# -ge 2 ]] || usage; extra+=(--shuffle "$2"); shift 2 ;;
    -h | --help | -*) usage ;;
    *) [[ -z $outdir ]] || usage; outdir=$1; shift ;;
  esac
done
[[ -n $outdir ]] || usage
if ! [[ $min_count =~ ^[0-9]+$ ]]; then
  echo "$0: --min-count must be a whole number, not '$min_count'" >&2
  exit 2
fi

apt_helper=/usr/lib/apt/apt-helper
for tool in apt-cache apt-get "$apt_helper" python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "$0: $tool is missing (this needs Debian's apt)" >&2
    exit 1
  fi
done

# apt's English Translation files, whatever their compression (apt-helper
# cat-file reads lz4, gz, xz, zstd and plain alike).
# shellcheck disable=SC2016 # $(FILENAME) is apt's, not the shell's
mapfile -t translations < <(apt-get indextargets -o Acquire::Languages=en \
  --format '$(FILENAME)' 'Identifier: Translations')
if [[ ${#translations[@]} -eq 0 ]]; then
  echo "$0: apt has no English Translation index (the long descriptions):" >&2
  echo "  run scripts/setup, or: apt-get update -o Acquire::Languages=en" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LC_ALL=C
apt-cache dumpavail >"$work/avail"
if ! grep -q '^Tag:' "$work/avail"; then
  echo "$0: no package in apt-cache dumpavail has a Tag: field" >&2
  echo "  (no package lists? run scripts/setup, or: apt-get update -o Acquire::Languages=en)" >&2
  exit 1
fi
for file in "${translations[@]}"; do
  "$apt_helper" cat-file "$file"
  echo
done >"$work/translations"

python3 "$(dirname "${BASH_SOURCE[0]}")/extract_debtags.py" --min-count "$min_count" \
  "${extra[@]}" "$work/avail" "$work/translations" "$outdir"
