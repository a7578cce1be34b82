#!/bin/sh
# test_kld: `strata tfdump` and `strata kld` (docs/EVAL.md). A dump is
# checked against the format and, bit for bit, against dump_logits on the
# same tokens (tests/eval/llama_ref.py tfcheck); a corpus written as text
# and the same corpus written as token ids give the same dump; kld of a
# dump against itself is 0 with N/N agreement; kld of a q4_K-experts model
# against its f32 twin matches the float64 figures recomputed in numpy
# (llama_ref.py tfkld): target PPLs, KL mean/median/p90/p99/max, top-1,
# the top-4/top-8 shares and every position's KL and argmaxes (text and
# JSON). Then the refusals: mismatched vocabularies, tokens and positions,
# truncated or foreign dumps, malformed corpora, usage.
# Prints "kld: N passed, N failed". Env: STRATA, BUILD, PYTHON.
STRATA=${STRATA:-build/strata}
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DUMP=$BUILD/tests/dump_logits
REF="$PYTHON tests/eval/llama_ref.py"
CORPUS=tests/eval/tf_corpus.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok()  { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
exits() {
    want=$1; d=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "$d (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/err" >&2; fi
}
has() { grep -q -- "$2" "$1"; }
one_line() { [ "$(wc -l <"$1")" -eq 1 ]; }

if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
    echo "SKIP kld: numpy missing" >&2
    echo "kld: 0 passed, 0 failed"
    exit 0
fi

# ==== models ====
M=$tmp/tiny.gguf; MV=$tmp/vocab600.gguf; MF=$tmp/wide.gguf; MQ=$tmp/wide_q4k.gguf
$STRATA mkmodel --preset tiny -q -o "$M" >/dev/null 2>&1 || { echo "kld: 0 passed, 1 failed"; exit 1; }
$STRATA mkmodel --preset tiny --vocab 600 -q -o "$MV" >/dev/null 2>&1
$STRATA mkmodel --preset tiny --experts 16 --embd 256 -q -o "$MF" >/dev/null 2>&1
$STRATA mkmodel --preset tiny --experts 16 --embd 256 --type-experts q4_K -q -o "$MQ" >/dev/null 2>&1

TF="$STRATA tfdump -t 2"
KLD="$STRATA kld"

# ==== tfdump: the format, and the logits bit for bit ====
exits 0 "tfdump" $TF -m "$M" -f $CORPUS -o "$tmp/a.dump"
check "tfdump summary line" grep -q "^tfdump: wrote .*a.dump: [0-9]* prompt tokens + [0-9]* targets, n_vocab 512, .* routing exact; target PPL [0-9.]*$" "$tmp/out"
exits 0 "tfcheck" $REF tfcheck --dump "$DUMP" --model "$M" "$tmp/a.dump"
check "dump logits identical to dump_logits rows n_prompt-1 .. n_tokens-2" has "$tmp/out" "logits identical"
check "routing configuration 'exact'" has "$tmp/out" "routing exact"
fp=$($STRATA inspect "$M" | sed -n 's/^fingerprint *//p')
check "fingerprint is the model's (strata inspect)" has "$tmp/out" "fingerprint $fp"
exits 0 "tfdump -t 1 -b 5" $STRATA tfdump -m "$M" -f $CORPUS -o "$tmp/a5.dump" -t 1 -b 5
check "chunking and threads: identical dump" cmp -s "$tmp/a.dump" "$tmp/a5.dump"

# text and ids corpora: the newline before a marker and the final newline are not text
printf 'Once upon a time, there was a kettle.\n' >"$tmp/p.txt"            # the prompt ends with a newline
printf ' It clicked off at seven' >"$tmp/e.txt"
{ printf 'a description line\n### prompt\n'; cat "$tmp/p.txt"; printf '\n### eval\n'; cat "$tmp/e.txt"; printf '\n'; } >"$tmp/c.txt"
pids=$($STRATA tokenize -m "$M" -f "$tmp/p.txt" --ids --no-escape)
eids=$($STRATA tokenize -m "$M" -f "$tmp/e.txt" --ids --no-escape --no-bos)
printf '### prompt ids\n%s\n### eval ids\n%s\n' "$pids" "$eids" | tr -d '[]' >"$tmp/ids.txt"
exits 0 "tfdump, text corpus" $TF -m "$M" -f "$tmp/c.txt" -o "$tmp/t.dump"
exits 0 "tfdump, ids corpus" $TF -m "$M" -f "$tmp/ids.txt" -o "$tmp/i.dump"
check "text and ids corpora give the same dump" cmp -s "$tmp/t.dump" "$tmp/i.dump"
np=$(echo "$pids" | tr ',' '\n' | wc -l); ne=$(echo "$eids" | tr ',' '\n' | wc -l)
check "prompt and eval token counts" has "$tmp/out" ": $np prompt tokens + $ne targets"
exits 0 "tfdump --eval 3" $TF -m "$M" -f "$tmp/c.txt" -o "$tmp/t3.dump" --eval 3
check "--eval 3" has "$tmp/out" ": $np prompt tokens + 3 targets"

# ==== kld of a dump with itself ====
exits 0 "kld self" $KLD "$tmp/a.dump" "$tmp/a.dump" --json "$tmp/self.json"
n_eval=$(sed -n 's/.* + \([0-9]*\) evaluation positions.*/\1/p' "$tmp/out")
check "self: mean KL 0" grep -q "^  mean 0.000000  median 0.000000  p90 0.000000  p99 0.000000  max 0.000000" "$tmp/out"
check "self: top-1 N/N" has "$tmp/out" "^top-1 agreement: $n_eval/$n_eval (0 flips)"
check "self: share n/a" has "$tmp/out" "share of total KL: n/a (total KL is 0)"
check "self: same model noted" has "$tmp/out" "(same model file and routing configuration)"
check "output says KL is not correctness" has "$tmp/out" "^note: KL(ref||cand) measures .* not correctness"
check "self: table has every position" test "$(grep -cE "^ +[0-9]+ +[0-9]+  '" "$tmp/out")" -eq "$n_eval"
check "self JSON: zeros and N/N" "$PYTHON" -c "
import json,sys
d=json.load(open('$tmp/self.json'))
sys.exit(not (d['kl']['max']==0 and d['top1_agree']==d['top1_n']==$n_eval and d['top4_share'] is None
              and len(d['positions'])==$n_eval and not any(p['flip'] for p in d['positions'])))"

# ==== q4_K experts against the f32 twin: the figures, recomputed ====
exits 0 "tfdump f32" $TF -m "$MF" -f $CORPUS -o "$tmp/f.dump"
exits 0 "tfdump q4_K" $TF -m "$MQ" -f $CORPUS -o "$tmp/q.dump"
exits 0 "kld f32 vs q4_K" $KLD "$tmp/f.dump" "$tmp/q.dump" --json "$tmp/q.json"
cp "$tmp/out" "$tmp/s_kld"
$REF tfkld "$tmp/f.dump" "$tmp/q.dump" >"$tmp/p_kld"
ppl_r=$(sed -n 's/^ppl_ref //p' "$tmp/p_kld"); ppl_c=$(sed -n 's/^ppl_cand //p' "$tmp/p_kld")
check "target PPLs equal numpy's" has "$tmp/s_kld" "^PPL on the corpus targets: ref $ppl_r, cand $ppl_c$"
stats=$(sed -n 's/^mean \([^ ]*\) median \([^ ]*\) p90 \([^ ]*\) p99 \([^ ]*\) max \([^ ]*\)$/  mean \1  median \2  p90 \3  p99 \4  max \5/p' "$tmp/p_kld")
check "KL mean/median/p90/p99/max equal numpy's" has "$tmp/s_kld" "^$stats (position"
top1=$(sed -n 's/^top1 //p' "$tmp/p_kld")
check "top-1 agreement equals numpy's" has "$tmp/s_kld" "^top-1 agreement: $top1 ("
shares=$(sed -n 's/^share4 \(.*\) share8 \(.*\)$/top 4 positions \1, top 8 positions \2/p' "$tmp/p_kld")
check "top-4/top-8 shares equal numpy's" has "$tmp/s_kld" "share of total KL: $shares"
check "different models reported" sh -c "! grep -q 'same model file' '$tmp/s_kld'"
check "JSON positions equal numpy's (ids exact, KL to 1e-9)" "$PYTHON" -c "
import json,sys
d=json.load(open('$tmp/q.json'))
ref=[l.split() for l in open('$tmp/p_kld') if l.startswith('pos ')]
ok=len(ref)==len(d['positions'])==d['n_eval']
for p,r in zip(d['positions'],ref):
    ok&=[p['pos'],p['target_id'],p['ref_argmax_id'],p['cand_argmax_id']]==[int(x) for x in r[1:5]]
    ok&=abs(p['kl']-float(r[5]))<=1e-6 and p['flip']==(p['ref_argmax_id']!=p['cand_argmax_id'])
ok&=d['top1_agree']==sum(not p['flip'] for p in d['positions'])
ok&=abs(d['kl']['mean']-sum(p['kl'] for p in d['positions'])/d['n_eval'])<1e-12
sys.exit(not ok)"
check "text table KL equals JSON" "$PYTHON" -c "
import json,sys
d=json.load(open('$tmp/q.json'))
rows=[l for l in open('$tmp/s_kld') if l[:5].strip().isdigit()]
ok=len(rows)==d['n_eval']
for l,p in zip(rows,d['positions']):
    f=l.split()
    ok&=int(f[0])==p['i'] and int(f[1])==p['pos'] and ('%.6f'%p['kl']) in l and (('FLIP' in l)==p['flip'])
sys.exit(not ok)"
exits 0 "kld --top 4" $KLD "$tmp/f.dump" "$tmp/q.dump" --top 4
check "--top 4: four rows, largest KL first" "$PYTHON" -c "
import sys
rows=[l for l in open('$tmp/out') if l[:5].strip().isdigit()]
kl=[float(l[60:].split()[0]) for l in rows]
sys.exit(not (len(rows)==4 and kl==sorted(kl,reverse=True)))"

exits 0 "kld --html" $KLD "$tmp/f.dump" "$tmp/q.dump" --html "$tmp/k.html"
check "--html: a self-contained page with the chart and the caveat" sh -c "grep -q '<svg' '$tmp/k.html' && \
    grep -q 'top-1 flip' '$tmp/k.html' && grep -q 'not correctness' '$tmp/k.html' && ! grep -q '<script' '$tmp/k.html'"

# ==== refusals ====
exits 1 "different evaluation length" $KLD "$tmp/t.dump" "$tmp/t3.dump"
check "names the token mismatch" has "$tmp/err" "token ids differ"
check "mismatch: one line" one_line "$tmp/err"
exits 1 "different corpus" $KLD "$tmp/a.dump" "$tmp/t.dump"
check "different corpus: token ids differ" has "$tmp/err" "token ids differ"
exits 0 "tfdump, vocabulary of 600" $TF -m "$MV" -f $CORPUS -o "$tmp/v.dump"
exits 1 "different vocabulary" $KLD "$tmp/a.dump" "$tmp/v.dump"
check "names the vocabulary mismatch" has "$tmp/err" "vocabularies differ: .* has 512 tokens, .* 600"
"$PYTHON" - "$tmp/a.dump" "$tmp/pos.dump" "$tmp/voc.dump" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
rn, dn, vb = struct.unpack("<III", b[40:52])
n_tok = struct.unpack("<i", b[28:32])[0]
off = 52 + rn + dn + 4 * n_tok          # positions[0]
p = bytearray(b); p[off:off + 4] = struct.pack("<i", struct.unpack("<i", b[off:off + 4])[0] - 1)
open(sys.argv[2], "wb").write(p)
v = bytearray(b); vo = off + 4 * struct.unpack("<i", b[36:40])[0]   # the vocabulary
for _ in range(300):                                                    # to id 300's piece
    vo += 4 + struct.unpack("<I", b[vo:vo + 4])[0]
assert struct.unpack("<I", b[vo:vo + 4])[0] > 0
v[vo + 4:vo + 5] = b"~" if v[vo + 4:vo + 5] != b"~" else b"^"
open(sys.argv[3], "wb").write(v)
EOF
exits 1 "different positions" $KLD "$tmp/a.dump" "$tmp/pos.dump"
check "names the position mismatch" has "$tmp/err" "positions differ at evaluation 0"
exits 1 "different vocabulary piece" $KLD "$tmp/a.dump" "$tmp/voc.dump"
check "names the vocabulary piece" has "$tmp/err" "vocabularies differ at id"
head -c 5000 "$tmp/a.dump" >"$tmp/trunc.dump"
exits 1 "truncated dump" $KLD "$tmp/a.dump" "$tmp/trunc.dump"
check "truncated: message" has "$tmp/err" "is truncated: 5000 bytes, its header describes"
head -c 30 "$tmp/a.dump" >"$tmp/hdr.dump"
exits 1 "dump cut inside its header" $KLD "$tmp/hdr.dump" "$tmp/a.dump"
check "cut header: message" has "$tmp/err" "shorter than the 52-byte header"
cat "$tmp/a.dump" $CORPUS >"$tmp/long.dump"
exits 1 "bytes after the logits" $KLD "$tmp/a.dump" "$tmp/long.dump"
check "padded: message" has "$tmp/err" "bytes after its logits"
exits 1 "not a dump" $KLD $CORPUS "$tmp/a.dump"
check "no magic: message" has "$tmp/err" "is not a strata tfdump file"
exits 1 "missing dump" $KLD "$tmp/none.dump" "$tmp/a.dump"

printf '### prompt\nHello there\n' >"$tmp/noeval.txt"
exits 1 "corpus without an eval section" $TF -m "$M" -f "$tmp/noeval.txt" -o "$tmp/x.dump"
check "no eval: message" has "$tmp/err" "no '### eval' section"
check "no eval: one line, before loading the model" one_line "$tmp/err"
printf '### eval\n world\n### prompt\nHello\n' >"$tmp/order.txt"
exits 1 "eval before prompt" $TF -m "$M" -f "$tmp/order.txt" -o "$tmp/x.dump"
check "order: message" has "$tmp/err" "must come before the eval section"
printf '### prompt\n\n### eval\n world\n' >"$tmp/empty.txt"
exits 1 "empty prompt, model without BOS" $TF -m "$M" -f "$tmp/empty.txt" -o "$tmp/x.dump"
check "empty prompt: message" has "$tmp/err" "the prompt has no tokens"
exits 1 "--eval beyond the corpus" $TF -m "$M" -f "$tmp/c.txt" -o "$tmp/x.dump" --eval 1000
check "--eval: message" has "$tmp/err" "has only $ne evaluation tokens"
printf '### prompt ids\n1, 2, x3\n### eval ids\n4\n' >"$tmp/badid.txt"
exits 1 "malformed id" $TF -m "$M" -f "$tmp/badid.txt" -o "$tmp/x.dump"
check "malformed id: message" has "$tmp/err" "'x3' is not a token id"
printf '### prompt ids\n1 2\n### eval ids\n512\n' >"$tmp/range.txt"
exits 1 "id outside the vocabulary" $TF -m "$M" -f "$tmp/range.txt" -o "$tmp/x.dump"
check "id range: message" has "$tmp/err" "token id 512 is outside the vocabulary (512 tokens)"
check "no dump left behind" test ! -e "$tmp/x.dump"
exits 2 "kld with one dump" $KLD "$tmp/a.dump"
exits 2 "kld unknown flag" $KLD "$tmp/a.dump" "$tmp/a.dump" --bogus
check "usage: one line" one_line "$tmp/err"
exits 2 "kld --top 0" $KLD "$tmp/a.dump" "$tmp/a.dump" --top 0
exits 2 "tfdump without -o" $TF -m "$M" -f $CORPUS
exits 2 "tfdump --eval 0" $TF -m "$M" -f $CORPUS -o "$tmp/x.dump" --eval 0
exits 0 "kld --help" $KLD --help
exits 0 "tfdump --help" $TF --help

echo "kld: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
