#!/usr/bin/env bash
# Writes an English->German parallel corpus from the gettext catalogues
# installed under /usr/share/locale/de/LC_MESSAGES (one message per line,
# OUT.en and OUT.de line-aligned), for `mpiformer prepare --kind seq2seq`.
# The corpus depends on which packages are installed: scripts/setup installs
# gcc-12-locales, whose compiler messages are most of it.
#
# Each catalogue (.mo) is turned back into text with msgunfmt and converted
# to UTF-8 with msgconv; every translated message becomes one pair:
#   - the header entry (empty msgid), untranslated and fuzzy entries are skipped;
#   - plural entries give msgid and msgstr[0] (the singular);
#   - a leading or trailing newline is dropped; messages with a newline
#     inside (help screens, whose line structure differs between the
#     languages) and messages with control characters are skipped;
#   - tabs become spaces, runs of spaces one space, ends trimmed;
#   - pairs where either side holds no letter ("%s: %s") are skipped;
#   - duplicate pairs are dropped, the rest sorted byte-wise (LC_ALL=C) and
#     then shuffled with a fixed seed (Perl's own generator, srand 1), so the
#     same catalogues always give the same corpus, and the last lines, which
#     prepare holds out for validation, are a fair sample rather than the end
#     of the alphabet.
#
# usage: data/extract-gettext-de.sh OUT.en OUT.de
set -euo pipefail

if [[ $# -ne 2 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 OUT.en OUT.de" >&2
  exit 2
fi
out_en=$1
out_de=$2
catalogue_dir=${MPIFORMER_LOCALE_DIR:-/usr/share/locale/de/LC_MESSAGES}

for tool in msgunfmt msgconv perl; do
  if ! command -v "$tool" >/dev/null; then
    echo "$0: $tool is missing: install gettext (scripts/setup does)" >&2
    exit 1
  fi
done

export LC_ALL=C
shopt -s nullglob
catalogues=("$catalogue_dir"/*.mo)
if [[ ${#catalogues[@]} -eq 0 ]]; then
  echo "$0: no German catalogues in $catalogue_dir: install gcc-12-locales (scripts/setup does)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Reads one catalogue as PO text and prints "english<TAB>german" per pair.
read -r -d '' parse_po <<'AWK' || true
function quoted(line) {  # the text between the first and the last quote
  line = substr(line, index(line, "\"") + 1)
  return substr(line, 1, length(line) - 1)
}
function unescape(s,    out, i, c) {  # PO escapes; unknown ones mark the pair bad
  out = ""
  while ((i = index(s, "\\")) > 0) {
    out = out substr(s, 1, i - 1)
    c = substr(s, i + 1, 1)
    if (c == "n") out = out "\n"
    else if (c == "t") out = out "\t"
    else if (c == "\"" || c == "\\") out = out c
    else bad = 1
    s = substr(s, i + 2)
  }
  return out s
}
function clean(s) {
  gsub(/[\t\r]/, " ", s)
  gsub(/^[ \n]+/, "", s)
  gsub(/[ \n]+$/, "", s)
  gsub(/  +/, " ", s)
  if (index(s, "\n") > 0) bad = 1
  return s
}
function flush(    en, de) {
  if (have && id != "" && str != "" && !fuzzy) {
    bad = 0
    en = clean(unescape(id))
    de = clean(unescape(str))
    if (!bad && en ~ /[A-Za-z]/ && de ~ /[[:alpha:]]/) print en "\t" de
  }
  have = 0; fuzzy = next_fuzzy; next_fuzzy = 0; id = ""; str = ""; field = ""
}
/^#,.*fuzzy/ { next_fuzzy = 1; next }
/^#/ { next }
/^msgctxt / { flush(); field = "ctxt"; next }
/^msgid / { if (field != "ctxt") flush(); field = "id"; id = quoted($0); have = 1; next }
/^msgid_plural / { field = "plural"; next }
/^msgstr / { field = "str"; str = quoted($0); next }
/^msgstr\[0\] / { field = "str"; str = quoted($0); next }
/^msgstr\[/ { field = "other"; next }
/^"/ {
  if (field == "id") id = id quoted($0)
  else if (field == "str") str = str quoted($0)
  next
}
/^[ \t]*$/ { flush(); next }
END { flush() }
AWK

for mo in "${catalogues[@]}"; do
  # msgunfmt warns about odd escapes on stderr; the parser skips those pairs.
  if ! msgunfmt --no-wrap "$mo" 2>/dev/null >"$work/po" ||
    ! msgconv --no-wrap -t UTF-8 "$work/po" 2>/dev/null >"$work/utf8.po"; then
    echo "$0: skipping $mo (msgunfmt or msgconv cannot read it)" >&2
    continue
  fi
  awk "$parse_po" "$work/utf8.po"
done | sort -u >"$work/sorted"
# Fisher-Yates with a fixed seed: Perl's drand48 is its own (5.20 and later),
# so the order is the same on every machine.
perl -e 'srand(1); my @l = <STDIN>;
         for (my $i = $#l; $i > 0; --$i) { my $j = int(rand($i + 1)); @l[$i, $j] = @l[$j, $i]; }
         print @l;' <"$work/sorted" >"$work/pairs"

pairs=$(wc -l <"$work/pairs")
if [[ $pairs -eq 0 ]]; then
  echo "$0: no translated messages found in $catalogue_dir" >&2
  exit 1
fi
cut -f1 "$work/pairs" >"$work/en"
cut -f2 "$work/pairs" >"$work/de"
mkdir -p "$(dirname "$out_en")" "$(dirname "$out_de")"
mv "$work/en" "$out_en"
mv "$work/de" "$out_de"
echo "$out_en, $out_de: $pairs pairs from ${#catalogues[@]} catalogues"
