#!/bin/sh
# Rebuild data/corpus.txt from its sources (see data/README.md), then
# src/mkmodel/corpus.c from data/corpus.txt. Needs the Debian packages
# bible-kjv (+ bible-kjv-text) and wamerican, and python3.
# Usage: sh data/make_corpus.sh        (from the repository root)
set -eu
out=data/corpus.txt
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
    cat data/src/modern.txt
    echo
    cat data/src/code.txt
    echo
    cat data/src/world.txt
    echo
    echo "The King James Bible (1611), excerpts"
    # Verse lines come out as "  12 text"; drop the two-space indent.
    bible -l0 Ge1:1-Ge25:34 Ru1:1-Ru4:22 Ec1:1-Ec12:14 Jon1:1-Jon4:11 Pr1:1-Pr31:31 | sed 's/^  //'
    echo
    echo "Word list (SCOWL, via Debian's wamerican: every 5th entry without an apostrophe)"
    grep -v "'" /usr/share/dict/american-english | awk 'NR % 5 == 1' | paste -d' ' - - - - - - - - - - - -
} >"$tmp"
mv "$tmp" "$out"
trap - EXIT
python3 data/corpus_to_c.py "$out" src/mkmodel/corpus.c
wc -c "$out" src/mkmodel/corpus.c
