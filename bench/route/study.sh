#!/usr/bin/env bash
# bench/route/study.sh: issue 7's residency-biased routing study (results in
# bench/RESULTS.md, "Issue 7: residency-biased routing study").
#
#   bench/route/study.sh [--quick | --full] [options]
#
# For each arm (bench/route/analyze.py arms: exact; bias with bonus
# 0.25/0.5/0.85/2 x body 1/2/3 x exact-last 0/32, placed in the first prompt
# chunk, the later prompt chunks or decode; --quick: 6 of them) it measures
# against exact routing, with the routed experts streamed through an arena
# of --arena-frac of the experts (in slots, bench/route/arena.py):
#   speed   S (a generated model with skewed routing) and Q (the trained
#           model): `strata run` on the tool-call prompt + --gen tokens,
#           exact and every arm interleaved in each round (the order rotates
#           and reverses from round to round); per round the arm's prefill
#           and decode speed and prompt/decode bytes against that round's
#           exact run; route counters and per-arm store bytes from the report;
#   KL      Q only: `strata tfdump` of eval/tf_chat.txt and eval/tf_toolcall.txt
#           + `strata kld --json` against exact (decode arms: tfdump --decode,
#           against an exact --decode reference);
#   task    Q only: `strata taskeval` on every --every'th held-out case of
#           eval/taskeval_ops.jsonl, and `taskeval --compare` with exact.
# Then analyze.py prints the table (OUT/table.md, OUT/summary.json).
# The quick default takes about 10-15 minutes on the project's 2-core
# machine; --full (60 arms, every case, 5 rounds) takes many hours.
#
# Options:
#   --quick | --full     arm set and effort [quick: 6 arms, 3 rounds, every 6th case]
#   --model PATH         quality subject Q [models/strata-ops-moe.gguf]
#   --speed-model PATH   speed subject S [generated: $ROUTE_DIR/skew-L6-E64.gguf]
#   --arena-frac F       arena = F x the experts' slot bytes [0.5]
#   --batch N            rows per forward chunk (-b) [16]
#   --rounds N           interleaved speed rounds [3; --full 5]
#   --every N            taskeval on every Nth case [6; --full 1]
#   --n-predict N        taskeval -n [128]
#   --gen N              tokens generated per speed run [32]
#   --threads N          [2]
#   --no-task            skip taskeval (speed and KL only)
#   --task-only          only the taskeval part, into an existing --out DIR (an
#                        earlier --no-task run): arms whose task/ID.json exists
#                        are skipped, so an interrupted run resumes where it
#                        stopped (the task grid takes ~10 min an arm at every
#                        case: many hours, spread over several sittings)
#   --out DIR            results [$ROUTE_DIR/study-<date>]
# Env: STRATA [build/strata], PYTHON [/usr/bin/python3], ROUTE_DIR [/work/big/route,
# else $TMPDIR/route]: generated models and results, never inside the repository.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/route"
STRATA=${STRATA:-$ROOT/build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
if [ -z "${ROUTE_DIR:-}" ]; then
    if [ -d /work/big ] && [ -w /work/big ]; then ROUTE_DIR=/work/big/route; else ROUTE_DIR=${TMPDIR:-/tmp}/route; fi
fi
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "bench/route/study: error: $*" >&2; exit 1; }
log() { printf '[route study %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

KIND=quick
MODEL="$ROOT/models/strata-ops-moe.gguf"
SMODEL=""
FRAC=0.5
BATCH=16
ROUNDS=""
EVERY=""
NPRED=128
GEN=32
THREADS=2
TASK=1
TASK_ONLY=0
OUT=""
while [ $# -gt 0 ]; do
    case $1 in
    --quick) KIND=quick; shift ;;
    --full) KIND=full; shift ;;
    --model) MODEL=$2; shift 2 ;;
    --speed-model) SMODEL=$2; shift 2 ;;
    --arena-frac) FRAC=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --n-predict) NPRED=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --no-task) TASK=0; shift ;;
    --task-only) TASK_ONLY=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "bench/route/study: unknown option '$1'" >&2; usage ;;
    esac
done
if [ "$KIND" = full ]; then : "${ROUNDS:=5}" "${EVERY:=1}"; else : "${ROUNDS:=3}" "${EVERY:=6}"; fi
[ -x "$STRATA" ] || die "$STRATA not built (make)"
[ -f "$MODEL" ] || die "no model $MODEL"
mkdir -p "$ROUTE_DIR"
if [ "$TASK_ONLY" = 1 ]; then
    [ -n "$OUT" ] && [ -s "$OUT/meta.json" ] && [ -s "$OUT/arms.tsv" ] ||
        die "--task-only needs --out DIR of an earlier run (with meta.json and arms.tsv)"
    TASK=1
fi
: "${OUT:=$ROUTE_DIR/study-$(date -u +%Y%m%d-%H%M%S)}"
case "$OUT" in "$ROOT"/*) die "--out is inside the repository: $OUT" ;; esac
mkdir -p "$OUT/speed/S" "$OUT/speed/Q" "$OUT/kl" "$OUT/task" "$OUT/logs"
START=$(date +%s)

# ---- subjects and arenas ----
if [ -z "$SMODEL" ]; then
    SMODEL="$ROUTE_DIR/skew-L6-E64.gguf"
    if [ ! -s "$SMODEL" ]; then
        log "generating $SMODEL (6 layers x 64 experts, top-8, Zipf 1.0 routing skew)"
        "$STRATA" mkmodel --preset small --layers 6 --experts 64 --route-skew 1.0 --seed 7 -t "$THREADS" -q \
            -o "$SMODEL" || die "mkmodel failed"
    fi
fi
[ -f "$SMODEL" ] || die "no speed model $SMODEL"
ARENA_S=$("$PYTHON" "$HERE/arena.py" "$STRATA" "$SMODEL" "$FRAC") || die "cannot size the arena of $SMODEL"
ARENA_Q=$("$PYTHON" "$HERE/arena.py" "$STRATA" "$MODEL" "$FRAC") || die "cannot size the arena of $MODEL"
PROMPT="$OUT/prompt.txt"
awk '/^### prompt$/ { on = 1; next } /^### eval$/ { on = 0 } on' "$ROOT/eval/tf_toolcall.txt" > "$PROMPT"
[ "$TASK_ONLY" = 1 ] || "$PYTHON" "$HERE/analyze.py" arms "$KIND" > "$OUT/arms.tsv"
N_ARMS=$(wc -l < "$OUT/arms.tsv")
awk -v n="$EVERY" 'NF && (k++ % n) == 0' "$ROOT/eval/taskeval_ops.jsonl" > "$OUT/cases.jsonl"
N_CASES=$(wc -l < "$OUT/cases.jsonl")
log "$KIND: $N_ARMS arms; S $SMODEL (arena $ARENA_S), Q $MODEL (arena $ARENA_Q); -b $BATCH; out $OUT"

# run a tool, its output to logs/NAME.{out,err}; stop on failure naming the log
step() {
    local name=$1; shift
    if ! "$@" >"$OUT/logs/$name.out" 2>"$OUT/logs/$name.err"; then
        tail -n 5 "$OUT/logs/$name.err" >&2
        die "$name failed; logs in $OUT/logs/$name.{out,err}"
    fi
}
spec_of() { [ "$1" = exact ] && echo exact || awk -F'\t' -v i="$1" '$1 == i { print $3 }' "$OUT/arms.tsv"; }
place_of() { awk -F'\t' -v i="$1" '$1 == i { print $2 }' "$OUT/arms.tsv"; }

# ---- speed: interleaved rounds ----
IDS=(exact $(cut -f1 "$OUT/arms.tsv"))
n=${#IDS[@]}
[ "$TASK_ONLY" = 1 ] && ROUNDS=0
for r in $(seq 1 "$ROUNDS"); do
    order=()
    for j in $(seq 0 $((n - 1))); do order+=("${IDS[$(( (j + r - 1) % n ))]}"); done
    if [ $((r % 2)) -eq 0 ]; then
        rev=(); for ((j = n - 1; j >= 0; j--)); do rev+=("${order[$j]}"); done; order=("${rev[@]}")
    fi
    log "speed round $r/$ROUNDS: ${order[*]}"
    for id in "${order[@]}"; do
        spec=$(spec_of "$id")
        for tag in S Q; do
            if [ $tag = S ]; then m=$SMODEL; a=$ARENA_S; else m=$MODEL; a=$ARENA_Q; fi
            STRATA_ROUTE="$spec" step "run-$tag-$id.r$r" "$STRATA" run -m "$m" -f "$PROMPT" -n "$GEN" --ignore-eos \
                --temp 0 -t "$THREADS" -b "$BATCH" --arena "$a" --report-json "$OUT/speed/$tag/$id.r$r.json"
        done
    done
done

# ---- KL on Q: exact references in both feeding modes, then each arm ----
TF=(-m "$MODEL" -t "$THREADS" -b "$BATCH" --arena "$ARENA_Q")
[ "$TASK_ONLY" = 1 ] || for c in chat toolcall; do
    STRATA_ROUTE=exact step "tf-exact-$c" "$STRATA" tfdump "${TF[@]}" -f "$ROOT/eval/tf_$c.txt" -o "$OUT/kl/exact.$c.dump"
    STRATA_ROUTE=exact step "tf-exact-$c-decode" "$STRATA" tfdump "${TF[@]}" -f "$ROOT/eval/tf_$c.txt" --decode \
        -o "$OUT/kl/exact.$c.decode.dump"
done
while IFS=$'\t' read -r id place spec; do
    log "KL: $id"
    for c in chat toolcall; do
        if [ "$place" = decode ]; then mode=(--decode); ref="$OUT/kl/exact.$c.decode.dump"
        else mode=(); ref="$OUT/kl/exact.$c.dump"; fi
        STRATA_ROUTE="$spec" step "tf-$id-$c" "$STRATA" tfdump "${TF[@]}" -f "$ROOT/eval/tf_$c.txt" "${mode[@]}" \
            -o "$OUT/kl/$id.$c.dump"
        step "kld-$id-$c" "$STRATA" kld "$ref" "$OUT/kl/$id.$c.dump" --json "$OUT/kl/$id.$c.json"
        rm -f "$OUT/kl/$id.$c.dump"
    done
done < <([ "$TASK_ONLY" = 1 ] || cat "$OUT/arms.tsv")

# ---- task on Q ----
EXACT_DONE="n/a"
if [ "$TASK" = 1 ]; then
    TE=(-m "$MODEL" --cases "$OUT/cases.jsonl" -n "$NPRED" -t "$THREADS" -b "$BATCH" --arena "$ARENA_Q")
    log "taskeval exact ($N_CASES cases)"
    [ -s "$OUT/task/exact.json" ] ||
        STRATA_ROUTE=exact step task-exact "$STRATA" taskeval "${TE[@]}" --arm exact --json "$OUT/task/exact.json"
    EXACT_DONE=$(sed -n 's/^total (arm exact): .*completed \([0-9]*\/[0-9]*\).*/\1/p' "$OUT/logs/task-exact.out")
    while IFS=$'\t' read -r id place spec; do
        [ -s "$OUT/task/$id.json" ] && [ -s "$OUT/task/$id.compare.txt" ] && continue
        log "taskeval $id"
        STRATA_ROUTE="$spec" step "task-$id" "$STRATA" taskeval "${TE[@]}" --arm "$id" --json "$OUT/task/$id.json"
        "$STRATA" taskeval --compare "$OUT/task/exact.json" "$OUT/task/$id.json" > "$OUT/task/$id.compare.txt" ||
            die "taskeval --compare failed for $id"
    done < "$OUT/arms.tsv"
fi

if [ "$TASK_ONLY" = 1 ]; then
    # keep the speed/KL run's meta; add what the task part used
    "$PYTHON" - "$OUT/meta.json" "$N_CASES" "$EVERY" "$NPRED" "$EXACT_DONE" "$(( $(date +%s) - START ))" <<'PY'
import json, sys
p, n, every, npred, done, secs = sys.argv[1:]
m = json.load(open(p))
m.update({"task": 1, "n_cases": int(n), "every": int(every), "n_predict": int(npred),
          "exact_completed": done, "task_seconds": m.get("task_seconds", 0) + int(secs)})
json.dump(m, open(p, "w"))
PY
    log "task part done in $(( $(date +%s) - START )) s"
    "$PYTHON" "$HERE/analyze.py" table "$OUT"
    exit 0
fi
cat > "$OUT/meta.json" <<EOF
{"kind": "$KIND", "model": "$MODEL", "speed_model": "$SMODEL", "arena_S": "$ARENA_S", "arena_Q": "$ARENA_Q",
 "arena_frac": $FRAC, "batch": $BATCH, "threads": $THREADS, "rounds": $ROUNDS, "every": $EVERY,
 "task": $TASK, "n_cases": $N_CASES, "n_predict": $NPRED, "gen": $GEN, "exact_completed": "$EXACT_DONE",
 "strata": "$STRATA", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(uname -n)",
 "seconds": $(( $(date +%s) - START ))}
EOF
log "done in $(( $(date +%s) - START )) s"
"$PYTHON" "$HERE/analyze.py" table "$OUT"
