#!/usr/bin/env python3
"""Builds the debtags multi-label corpus; data/extract-debtags.sh runs it.

Reads `apt-cache dumpavail` (one record per package: its candidate version)
and apt's English Translation index (decompressed), and writes into OUTDIR,
line-aligned:
  debtags.txt     the package's description on one line: the short
                  description, ". " (unless it ends in punctuation), then the
                  long description with its lines joined, the " ." paragraph
                  separators dropped and whitespace collapsed;
  debtags.labels  the package's kept tags, space-separated, sorted;
  debtags.names   the package's name.
Tags matching a --drop pattern (bookkeeping, not topic) are removed, then
only tags carried by at least --min-count packages are kept; packages left
with no tag are dropped. Lines are sorted by package name (byte-wise), or
shuffled with a fixed seed (--shuffle SEED). Standard library only.
"""

import argparse
import collections
import fnmatch
import os
import random
import re
import sys

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SPACE = re.compile(r"\s+")


def records(path):
    """Yields each deb822 record of a file as {field: [first, continuation...]}."""
    with open(path, encoding="utf-8", errors="replace") as f:
        record, field = {}, None
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if record:
                    yield record
                record, field = {}, None
            elif line[0] in " \t":
                if field is not None:
                    record[field].append(line)
            elif ":" in line:
                field, value = line.split(":", 1)
                record[field] = [value.strip()]
        if record:
            yield record


def join_long(lines):
    """The long description's lines as one line (drops the " ." separators)."""
    words = []
    for line in lines:
        line = line.strip()
        if line == ".":
            continue
        words.append(line)
    return SPACE.sub(" ", CONTROL.sub(" ", " ".join(words))).strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dumpavail", help="the output of `apt-cache dumpavail`")
    parser.add_argument("translations", help="Translation-en records, decompressed")
    parser.add_argument("outdir")
    parser.add_argument("--min-count", type=int, default=50,
                        help="keep tags carried by at least this many packages (50)")
    parser.add_argument("--drop", default="role::* special::* *TODO*",
                        help="space-separated shell patterns of tags to drop "
                             "(default: %(default)s)")
    parser.add_argument("--shuffle", type=int, metavar="SEED",
                        help="shuffle the lines with this seed instead of sorting by name")
    args = parser.parse_args()
    drop = args.drop.split()

    # Long descriptions, by Description-md5 (the md5 of the whole English
    # description, so it identifies the text whatever the package).
    long_by_md5 = {}
    for rec in records(args.translations):
        md5 = rec.get("Description-md5", [""])[0]
        desc = rec.get("Description-en")
        if md5 and desc and md5 not in long_by_md5:
            long_by_md5[md5] = desc[1:]

    n_records = n_tagged = n_long = n_short_only = 0
    all_tags = set()
    packages = {}  # name -> (text, tags after --drop)
    seen = set()  # one entry per name: the first record
    for rec in records(args.dumpavail):
        n_records += 1
        name = rec.get("Package", [""])[0]
        if not name or name in seen:
            continue
        seen.add(name)
        if "Tag" not in rec:
            continue
        n_tagged += 1
        tags = {t.strip() for t in " ".join(rec["Tag"]).split(",") if t.strip()}
        all_tags |= tags
        tags = {t for t in tags if not any(fnmatch.fnmatchcase(t, p) for p in drop)}
        desc = rec.get("Description", [""])
        short = SPACE.sub(" ", CONTROL.sub(" ", desc[0])).strip()
        md5 = rec.get("Description-md5", [""])[0]
        long_lines = long_by_md5.get(md5) if md5 else None
        if long_lines is None:
            long_lines = desc[1:]  # a Packages file that carries the whole text
        long_text = join_long(long_lines)
        if long_text:
            n_long += 1
            sep = " " if short[-1:] in (".", "!", "?", ":", ";") else ". "
            text = short + sep + long_text if short else long_text
        else:
            n_short_only += 1
            text = short
        if text:
            packages[name] = (text, tags)

    if n_tagged == 0:
        sys.exit("extract_debtags: no package in apt-cache dumpavail has a Tag: field")

    after_drop = collections.Counter(t for _, tags in packages.values() for t in tags)
    kept = {t for t, c in after_drop.items() if c >= args.min_count}
    lines = []
    for name in sorted(packages):
        text, tags = packages[name]
        tags = sorted(tags & kept)
        if tags:
            lines.append((name, text, tags))
    if args.shuffle is not None:
        random.Random(args.shuffle).shuffle(lines)
    if not lines:
        sys.exit(f"extract_debtags: no package keeps a tag (--min-count {args.min_count})")

    os.makedirs(args.outdir, exist_ok=True)
    outputs = {"txt": lambda l: l[1], "labels": lambda l: " ".join(l[2]),
               "names": lambda l: l[0]}
    for ext, column in outputs.items():
        path = os.path.join(args.outdir, f"debtags.{ext}")
        with open(path + ".tmp", "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(column(line) + "\n")
    for ext in outputs:
        path = os.path.join(args.outdir, f"debtags.{ext}")
        os.replace(path + ".tmp", path)

    freq = collections.Counter(t for l in lines for t in l[2])
    n_labels = sum(len(l[2]) for l in lines)
    dropped_tags = sorted(t for t in all_tags
                          if any(fnmatch.fnmatchcase(t, p) for p in drop))
    no_tag_after_drop = sum(1 for _, tags in packages.values() if not tags)
    say = lambda s: print(s, file=sys.stderr)
    say(f"debtags: {n_tagged} of {n_records} packages have a Tag: field "
        f"({len(all_tags)} distinct tags)")
    say(f"  long descriptions: {n_long} packages; short description only: {n_short_only}")
    say(f"  dropped {len(dropped_tags)} tags matching '{args.drop}'; "
        f"{no_tag_after_drop} packages had no other tag")
    say(f"  kept {len(kept)} of {len(after_drop)} tags carried by >= {args.min_count} packages")
    say(f"  wrote {len(lines)} lines to {args.outdir}/debtags.{{txt,labels,names}}: "
        f"{n_labels / len(lines):.2f} tags per line on average "
        f"(min {min(len(l[2]) for l in lines)}, max {max(len(l[2]) for l in lines)}), "
        f"{sum(len(l[1].split()) for l in lines)} words")
    say("  top 10 tags: " + ", ".join(f"{t} {c}" for t, c in freq.most_common(10)))


if __name__ == "__main__":
    main()
