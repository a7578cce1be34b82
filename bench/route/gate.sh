#!/usr/bin/env bash
# bench/route/gate.sh: the quality gate a routing policy must pass before it
# may become strata's default (issue 7, item 6; docs/ROUTING.md "The gate").
#
#   bench/route/gate.sh MODEL 'SPEC' [options]
#
# Measures the candidate policy SPEC against exact routing on MODEL, with
# the experts streamed through an arena smaller than the experts, and checks
# three criteria (bench/route/gate.py decides and prints them):
#   (a) task: `strata taskeval` on the held-out cases, exact and candidate;
#       `taskeval --compare`; FAIL when the exact one-sided sign test on the
#       discordant cases says the candidate is worse at alpha (0.05), or the
#       candidate completes more than the margin (1% of the cases) fewer
#       cases than exact;
#   (b) KL: `strata tfdump` + `strata kld` on each corpus, in both feeding
#       modes (the prompt calls, and --decode: one token per call, which is
#       where a decode arm acts); FAIL when a mean KL(exact||candidate) is
#       not below the bound (0.03 nats);
#   (c) speed: `strata bench-ab` (exact A, candidate B, alternating pairs)
#       of `strata run` on a tool-call prompt; FAIL when the median paired
#       request-time ratio exact/candidate is below 1.05.
# Exit 0 only when all three PASS; 1 on FAIL; 2 on a usage error or when a
# tool failed (its log is named).
#
# Options:
#   --quick            the small mode for tests: 2 pairs, no warm-up, every 6th case,
#                      taskeval -n 64, 16 generated tokens per speed run
#   --cases FILE       held-out task cases [eval/taskeval_ops.jsonl]
#   --every N          use every Nth case (1 = all) [1; --quick 6]
#   --corpus FILE      a teacher-forced corpus (repeatable) [eval/tf_chat_long.txt, eval/tf_chat.txt,
#                      eval/tf_toolcall.txt]
#   --prompt FILE      speed-run prompt [the prompt section of eval/tf_toolcall.txt]
#   --arena SIZE       arena (K/M/G) [--arena-frac of the model's routed experts, in slots]
#   --arena-frac F     [0.5] (bench/route/arena.py: slot bytes x layers x experts x F)
#   --batch N          rows per forward chunk (-b) [16]
#   --pairs N          bench-ab pairs [5]    --warmup N  [1]
#   --gen N            tokens generated per speed run [64]
#   --n-predict N      taskeval -n [128]
#   --threads N        [2]
#   --kl-max X         (b)'s bound in nats [0.03]
#   --speed-min R      (c)'s minimum ratio [1.05]
#   --alpha A          (a)'s significance level [0.05]
#   --margin-frac F    (a)'s allowed loss as a fraction of the cases [0.01]
#   --out DIR          keep everything here [a new directory under $TMPDIR]
# Env: STRATA [build/strata], PYTHON [/usr/bin/python3].
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/bench/route"
STRATA=${STRATA:-$ROOT/build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "route gate: error: $*" >&2; exit 2; }
[ $# -ge 2 ] || usage
MODEL=$1
SPEC=$2
shift 2

CASES="$ROOT/eval/taskeval_ops.jsonl"
EVERY=""
CORPORA=()
PROMPT=""
ARENA=""
FRAC=0.5
BATCH=16
PAIRS=""
WARMUP=""
GEN=""
NPRED=""
THREADS=2
KL_MAX=0.03
SPEED_MIN=1.05
ALPHA=0.05
MARGIN=0.01
OUT=""
QUICK=0
while [ $# -gt 0 ]; do
    case $1 in
    --quick) QUICK=1; shift ;;
    --cases) CASES=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --corpus) CORPORA+=("$2"); shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --arena) ARENA=$2; shift 2 ;;
    --arena-frac) FRAC=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --n-predict) NPRED=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --kl-max) KL_MAX=$2; shift 2 ;;
    --speed-min) SPEED_MIN=$2; shift 2 ;;
    --alpha) ALPHA=$2; shift 2 ;;
    --margin-frac) MARGIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done
if [ "$QUICK" = 1 ]; then
    : "${PAIRS:=2}" "${WARMUP:=0}" "${EVERY:=6}" "${NPRED:=64}" "${GEN:=16}"
else
    : "${PAIRS:=5}" "${WARMUP:=1}" "${EVERY:=1}" "${NPRED:=128}" "${GEN:=64}"
fi
[ ${#CORPORA[@]} -gt 0 ] || CORPORA=("$ROOT/eval/tf_chat_long.txt" "$ROOT/eval/tf_chat.txt" "$ROOT/eval/tf_toolcall.txt")
[ -x "$STRATA" ] || die "$STRATA not built (make)"
[ -f "$MODEL" ] || die "no model file '$MODEL'"
[ -f "$CASES" ] || die "no case file '$CASES'"
for c in "${CORPORA[@]}"; do [ -f "$c" ] || die "no corpus '$c'"; done
# the spec must parse (the same check --route does; the model bound comes at open)
"$STRATA" run -m "$MODEL" --route "$SPEC" --help >/dev/null 2>"${TMPDIR:-/tmp}/route-gate-spec.$$" || {
    sed 's/^/  /' "${TMPDIR:-/tmp}/route-gate-spec.$$" >&2; rm -f "${TMPDIR:-/tmp}/route-gate-spec.$$"
    die "bad candidate spec"; }
rm -f "${TMPDIR:-/tmp}/route-gate-spec.$$"
if [ -z "$OUT" ]; then OUT=$(mktemp -d "${TMPDIR:-/tmp}/route-gate.XXXXXX"); fi
mkdir -p "$OUT"
log() { [ "${GATE_QUIET:-0}" = 1 ] || printf '[route gate %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
# run a tool; on failure name its log and stop with exit 2
step() {
    local name=$1; shift
    if ! "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
        echo "route gate: error: $name failed (exit $?): $*" >&2
        tail -n 5 "$OUT/$name.err" | sed 's/^/  /' >&2
        echo "route gate: logs in $OUT/$name.out, $OUT/$name.err" >&2
        exit 2
    fi
}

# ---- arena: a fraction of the model's routed experts, as the store lays them out ----
if [ -z "$ARENA" ]; then
    ARENA=$("$PYTHON" "$HERE/arena.py" "$STRATA" "$MODEL" "$FRAC") || die "cannot size the arena for $MODEL"
fi
STREAM=(--arena "$ARENA" -b "$BATCH" -t "$THREADS")
if [ -z "$PROMPT" ]; then
    PROMPT="$OUT/prompt.txt"
    awk '/^### prompt$/ { on = 1; next } /^### eval$/ { on = 0 } on' "$ROOT/eval/tf_toolcall.txt" > "$PROMPT"
fi
log "model $MODEL, candidate '$SPEC', arena $ARENA, -b $BATCH; results in $OUT"

# ---- (b) KL: tfdump + kld per corpus, prompt-call and decode feeding ----
i=0
for c in "${CORPORA[@]}"; do
    i=$((i + 1))
    for mode in prompt decode; do
        extra=()
        [ "$mode" = decode ] && extra=(--decode)
        log "KL: $(basename "$c") ($mode feeding)"
        STRATA_ROUTE=exact step "tf$i-$mode-exact" "$STRATA" tfdump -m "$MODEL" -f "$c" -o "$OUT/tf$i-$mode-exact.dump" \
            "${STREAM[@]}" "${extra[@]}"
        STRATA_ROUTE= step "tf$i-$mode-cand" "$STRATA" tfdump -m "$MODEL" -f "$c" -o "$OUT/tf$i-$mode-cand.dump" \
            "${STREAM[@]}" "${extra[@]}" --route "$SPEC"
        step "kld$i-$mode" "$STRATA" kld "$OUT/tf$i-$mode-exact.dump" "$OUT/tf$i-$mode-cand.dump" \
            --json "$OUT/kld$i-$mode.json"
        rm -f "$OUT/tf$i-$mode-exact.dump" "$OUT/tf$i-$mode-cand.dump"
    done
    printf '%s\n' "$c" > "$OUT/corpus$i.name"
done

# ---- (a) task: taskeval exact and candidate, paired ----
awk -v n="$EVERY" 'NF && (k++ % n) == 0' "$CASES" > "$OUT/cases.jsonl"
log "task: $(wc -l <"$OUT/cases.jsonl") cases of $CASES (every $EVERY), -n $NPRED"
STRATA_ROUTE=exact step task-exact "$STRATA" taskeval -m "$MODEL" --cases "$OUT/cases.jsonl" -n "$NPRED" \
    "${STREAM[@]}" --arm exact --json "$OUT/task-exact.json"
STRATA_ROUTE="$SPEC" step task-cand "$STRATA" taskeval -m "$MODEL" --cases "$OUT/cases.jsonl" -n "$NPRED" \
    "${STREAM[@]}" --arm candidate --json "$OUT/task-cand.json"
step compare "$STRATA" taskeval --compare "$OUT/task-exact.json" "$OUT/task-cand.json"

# ---- (c) speed: bench-ab, exact (A) vs candidate (B) ----
log "speed: bench-ab, $PAIRS pairs (warm-up $WARMUP), $GEN tokens after the prompt"
rm -rf "$OUT/ab"
step abbench "$STRATA" bench-ab -o "$OUT/ab" --name-a exact --name-b candidate \
    --env-a STRATA_ROUTE=exact --env-b "STRATA_ROUTE=$SPEC" --warmup "$WARMUP" --pairs "$PAIRS" -- \
    run -m "$MODEL" -f "$PROMPT" -n "$GEN" --ignore-eos --temp 0 "${STREAM[@]}"

# ---- decide ----
set +e
"$PYTHON" "$HERE/gate.py" --out "$OUT" --model "$MODEL" --spec "$SPEC" --arena "$ARENA" --batch "$BATCH" \
    --kl-max "$KL_MAX" --speed-min "$SPEED_MIN" --alpha "$ALPHA" --margin-frac "$MARGIN"
rc=$?
set -e
exit $rc
