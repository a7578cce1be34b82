#!/bin/sh
# `strata quantize` end to end. Models come from `strata mkmodel` (synthetic
# qwen3moe): one with every row a multiple of 256 (8 layers, 2 experts, so the
# *_M mixes show their per-layer choices) and the tiny preset (rows of 64, 8
# experts: K-quant fallbacks and llama.cpp's 8-expert rules).
#
# A Python checker (only struct + numpy; written below) reads input and
# output GGUFs itself and checks, per file type: every tensor's type against
# its own transcription of llama.cpp's llama_tensor_get_type rules, the
# tensor order (llama.cpp's), shapes, all metadata copied with
# general.file_type / general.quantization_version set, copied tensors
# byte-identical, F16/BF16 conversions exact, and every quantized tensor
# (dequantized by tests/ref/dequant_ref.py) close to the input.
# Also: same bytes with 1 and 2 threads, requantizing, and the error paths
# (bad TYPE / bad flag / missing argument -> exit 2, missing or bad input ->
# exit 1, nothing left behind).
# Env: STRATA, PYTHON. Prints "quantize_cli: N passed, N failed".
STRATA=${STRATA:-build/strata}
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

# expect_rc NAME RC CMD...: CMD exits with RC; stdout+stderr in $tmp/NAME.out
expect_rc() {
    n=$1; want=$2; shift 2
    "$@" >"$tmp/$n.out" 2>&1
    rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$n: exit $rc, expected $want: $(head -c 400 "$tmp/$n.out")"; fi
}
# contains NAME TEXT: $tmp/NAME.out contains the fixed string TEXT
contains() {
    if grep -qF -- "$2" "$tmp/$1.out"; then ok; else bad "$1: output lacks '$2': $(head -c 400 "$tmp/$1.out")"; fi
}

cat >"$tmp/check.py" <<'EOF'
"""check.py IN OUT TYPE [pure]: verify a strata-quantized GGUF against its input."""
import struct, sys, os
import numpy as np
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "ref"))
from dequant_ref import dequantize  # independent decoder (another module's oracle)

BLK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
       10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}
NAME = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_K",
        11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 30: "bf16"}
ID = {v: k for k, v in NAME.items()}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}

def read_gguf(path):
    b = open(path, "rb").read()
    pos = 0
    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, b, pos); pos += struct.calcsize(fmt); return v[0]
    def string():
        nonlocal pos
        n = take("<Q"); s = b[pos:pos + n]; pos += n; return s.decode("utf-8", "replace")
    def value(t):
        if t == 8: return string()
        if t == 9:
            et = take("<i"); n = take("<Q"); return (et, [value(et) for _ in range(n)])
        return take(SCALAR[t])
    assert b[:4] == b"GGUF"; pos = 4
    take("<I"); nt = take("<q"); nkv = take("<q")
    kv = []
    for _ in range(nkv):
        k = string(); t = take("<i"); kv.append((k, t, value(t)))
    ts = []
    for _ in range(nt):
        name = string(); nd = take("<I"); ne = [take("<q") for _ in range(nd)]
        t = take("<i"); off = take("<Q"); ts.append([name, ne, t, off])
    align = dict((k, v) for k, _, v in kv).get("general.alignment", 32)
    data = (pos + align - 1) // align * align
    for t in ts:
        nel = int(np.prod(t[1])); bl, sz = BLK[t[2]]
        t.append(b[data + t[3]: data + t[3] + nel // bl * sz])
    return kv, ts

def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

BASE = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_K",
        "Q3_K_S": "q3_K", "Q3_K_M": "q3_K", "Q3_K_L": "q3_K", "Q4_K_S": "q4_K", "Q4_K_M": "q4_K",
        "Q5_K_S": "q5_K", "Q5_K_M": "q5_K", "Q6_K": "q6_K", "F16": "f16", "BF16": "bf16", "F32": "f32"}
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
         "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}
FALLBACK = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}

def layer(name):
    if name.startswith("blk."):
        try: return int(name.split(".")[1])
        except ValueError: pass
    return -1

def expected_types(ts, kvd, ft, pure):
    arch = kvd["general.architecture"]
    n_layer = kvd[arch + ".block_count"]; n_expert = kvd.get(arch + ".expert_count", 0)
    n_gqa = kvd[arch + ".attention.head_count"] // kvd[arch + ".attention.head_count_kv"]
    names = [t[0] for t in ts]
    tied = "output.weight" not in names
    n_wv = sum("attn_v.weight" in n for n in names)
    i_wv = 0
    out = {}
    for name, ne, typ, _, _ in sorted(ts, key=lambda t: (layer(t[0]), t[0])):
        base = BASE[ft]
        if len(ne) < 2 or not name.endswith("weight") or "_norm.weight" in name or "ffn_gate_inp.weight" in name:
            out[name] = NAME[typ]; continue
        if base in ("f16", "bf16", "f32"):
            out[name] = base; continue
        t = base
        if not pure:
            if name == "output.weight" or (tied and name == "token_embd.weight"):
                t = "q8_0" if ne[0] % BLK[ID[base]][0] or base == "q8_0" else "q6_K"
            elif "attn_v.weight" in name:
                if ft == "Q2_K": t = "q4_K" if n_gqa >= 4 else "q3_K"
                elif ft == "Q3_K_M": t = "q5_K" if i_wv < 2 else "q4_K"
                elif ft == "Q3_K_L": t = "q5_K"
                elif ft in ("Q4_K_M", "Q5_K_M") and more_bits(i_wv, n_wv): t = "q6_K"
                elif ft == "Q4_K_S" and i_wv < 4: t = "q5_K"
                if n_expert == 8: t = "q8_0"
                i_wv += 1
            elif "attn_k.weight" in name:
                if n_expert == 8: t = "q8_0"
            elif "attn_output.weight" in name:
                if n_expert == 8:
                    if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M"): t = "q5_K"
                elif ft == "Q2_K": t = "q3_K"
                elif ft == "Q3_K_M": t = "q4_K"
                elif ft == "Q3_K_L": t = "q5_K"
            elif "ffn_down" in name:
                il = layer(name)
                if ft == "Q2_K": t = "q3_K"
                elif ft == "Q3_K_M": t = "q5_K" if il < n_layer // 16 else "q4_K"
                elif ft == "Q3_K_L": t = "q5_K"
                elif ft in ("Q4_K_M", "Q5_K_M"):
                    if more_bits(il, n_layer): t = "q6_K"
                elif ft == "Q4_K_S" and il < n_layer // 8: t = "q5_K"
        if ne[0] % BLK[ID[t]][0]:
            t = FALLBACK[t]
            if ne[0] % BLK[ID[t]][0]: t = "f16"
        out[name] = t
    return out

BOUND = {"q8_0": 0.01, "q6_K": 0.03, "q5_K": 0.05, "q5_0": 0.06, "q5_1": 0.06, "q4_K": 0.1,
         "q4_0": 0.14, "q4_1": 0.12, "q3_K": 0.25, "q2_K": 0.5}

def main():
    inp, outp, ft = sys.argv[1], sys.argv[2], sys.argv[3]
    pure = len(sys.argv) > 4
    kv_in, ts_in = read_gguf(inp)
    kv_out, ts_out = read_gguf(outp)
    passed = failed = 0
    def check(cond, msg):
        nonlocal passed, failed
        if cond: passed += 1
        else:
            failed += 1; print("FAIL", ft, msg)
    kvi = dict((k, v) for k, _, v in kv_in); kvo = dict((k, v) for k, _, v in kv_out)
    for k, t, v in kv_in:
        if k != "general.file_type":
            check(kvo.get(k) == v, "metadata %s not copied" % k)
    check(kvo.get("general.file_type") == FTYPE[ft], "general.file_type %r" % kvo.get("general.file_type"))
    check(kvo.get("general.quantization_version") == 2, "general.quantization_version")
    # llama.cpp's gguf_set_val moves a key it sets to the end
    moved = ("general.quantization_version", "general.file_type")
    check([k for k, _, _ in kv_out if k not in moved] == [k for k, _, _ in kv_in if k not in moved],
          "metadata order changed")
    check([k for k, _, _ in kv_out][-2:] == list(moved), "file_type / quantization_version not last")
    order = [t[0] for t in sorted(ts_in, key=lambda t: (layer(t[0]), t[0]))]
    check([t[0] for t in ts_out] == order, "tensor order is not llama.cpp's")
    exp = expected_types(ts_in, kvi, ft, pure)
    src = dict((t[0], t) for t in ts_in)
    for name, ne, typ, _, data in ts_out:
        s = src[name]
        check(ne == s[1], "%s shape %s != %s" % (name, ne, s[1]))
        check(NAME.get(typ) == exp[name], "%s type %s, expected %s" % (name, NAME.get(typ), exp[name]))
        n = int(np.prod(ne))
        if typ == s[2]:
            check(data == s[4], "%s copied bytes differ" % name); continue
        x = np.frombuffer(s[4], np.float32).astype(np.float64) if s[2] == 0 else dequantize(s[2], np.frombuffer(s[4], np.uint8), n)
        y = dequantize(typ, np.frombuffer(data, np.uint8), n)
        if NAME[typ] == "f16":
            check(np.array_equal(np.frombuffer(data, np.uint16), x.astype(np.float32).astype(np.float16).view(np.uint16)), "%s f16 rounding" % name)
        elif NAME[typ] == "bf16":
            u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
            want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            check(np.array_equal(np.frombuffer(data, np.uint16), want), "%s bf16 rounding" % name)
        elif NAME[typ] == "f32":
            check(np.array_equal(y, x.astype(np.float32).astype(np.float64)), "%s f32 values" % name)
        else:
            rel = np.sqrt(np.mean((y - x) ** 2) / max(np.mean(x ** 2), 1e-30))
            check(rel <= BOUND[NAME[typ]], "%s %s relative RMS error %.4f > %.4f" % (name, NAME[typ], rel, BOUND[NAME[typ]]))
    print("RESULT %d %d" % (passed, failed))

main()
EOF

# add_py NAME: fold the checker's RESULT line into the counts
add_py() {
    r=$(grep '^RESULT' "$tmp/$1.out")
    if [ -z "$r" ]; then bad "$1: checker crashed: $(tail -c 600 "$tmp/$1.out")"; return; fi
    grep '^FAIL' "$tmp/$1.out" | head -n 10 >&2
    set -- $r
    pass=$((pass + $2)); fail=$((fail + $3))
}

m256=$tmp/m256.gguf
tiny=$tmp/tiny.gguf
expect_rc mk256 0 "$STRATA" mkmodel -o "$m256" --layers 8 --experts 2 --experts-used 2 --embd 256 --ff-exp 256 \
    --heads 4 --heads-kv 2 --head-dim 64 --vocab 512 --type f32
expect_rc mktiny 0 "$STRATA" mkmodel -o "$tiny" --preset tiny --type f32

for t in Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K F16 BF16 F32; do
    expect_rc "q_$t" 0 "$STRATA" quantize "$m256" "$tmp/m-$t.gguf" "$t" --threads 2
    contains "q_$t" "strata quantize: wrote $tmp/m-$t.gguf ($t)"
    "$PYTHON" "$tmp/check.py" "$m256" "$tmp/m-$t.gguf" "$t" >"$tmp/chk_$t.out" 2>&1
    add_py "chk_$t"
done

# BF16 and F16 inputs (converted to f32 row by row, or copied when the type stays)
expect_rc mkbf16 0 "$STRATA" mkmodel -o "$tmp/mbf.gguf" --layers 8 --experts 2 --experts-used 2 --embd 256 --ff-exp 256 \
    --heads 4 --heads-kv 2 --head-dim 64 --vocab 512 --type bf16
for t in Q4_K_M F16; do
    expect_rc "bf_$t" 0 "$STRATA" quantize "$tmp/mbf.gguf" "$tmp/bf-$t.gguf" "$t"
    "$PYTHON" "$tmp/check.py" "$tmp/mbf.gguf" "$tmp/bf-$t.gguf" "$t" >"$tmp/bfchk_$t.out" 2>&1
    add_py "bfchk_$t"
done
expect_rc f16_q6 0 "$STRATA" quantize "$tmp/m-F16.gguf" "$tmp/f16-q6.gguf" Q6_K
"$PYTHON" "$tmp/check.py" "$tmp/m-F16.gguf" "$tmp/f16-q6.gguf" Q6_K >"$tmp/f16chk.out" 2>&1
add_py f16chk

# --pure, case-insensitive type names and the Q4_K alias
expect_rc pure 0 "$STRATA" quantize --pure "$m256" "$tmp/m-pure.gguf" q4_k_m
"$PYTHON" "$tmp/check.py" "$m256" "$tmp/m-pure.gguf" Q4_K_M pure >"$tmp/chk_pure.out" 2>&1
add_py chk_pure
expect_rc alias 0 "$STRATA" quantize "$m256" "$tmp/m-alias.gguf" q4_k -t 1
if cmp -s "$tmp/m-alias.gguf" "$tmp/m-Q4_K_M.gguf"; then ok; else bad "Q4_K alias (1 thread) differs from Q4_K_M (2 threads)"; fi

# fallbacks and the 8-expert rules on the tiny model (rows of 64)
for t in Q4_K_M Q2_K Q6_K Q8_0 BF16; do
    expect_rc "tiny_$t" 0 "$STRATA" quantize "$tiny" "$tmp/t-$t.gguf" "$t" --verbose
    "$PYTHON" "$tmp/check.py" "$tiny" "$tmp/t-$t.gguf" "$t" >"$tmp/tchk_$t.out" 2>&1
    add_py "tchk_$t"
done
contains tiny_Q4_K_M "blk.1.ffn_down_exps.weight"
contains tiny_Q4_K_M "f32 -> q8_0"

# requantizing: refused without the flag, then Q8_0 -> Q4_K_M with it
expect_rc requant_no 1 "$STRATA" quantize "$tmp/m-Q8_0.gguf" "$tmp/rq.gguf" Q4_K_M
contains requant_no "--allow-requantize"
if [ ! -e "$tmp/rq.gguf" ] && [ ! -e "$tmp/rq.gguf.tmp" ]; then ok; else bad "requant_no left a file behind"; fi
expect_rc requant 0 "$STRATA" quantize --allow-requantize "$tmp/m-Q8_0.gguf" "$tmp/rq.gguf" Q4_K_M
"$PYTHON" "$tmp/check.py" "$tmp/m-Q8_0.gguf" "$tmp/rq.gguf" Q4_K_M >"$tmp/chk_rq.out" 2>&1
add_py chk_rq

# errors
expect_rc badtype 2 "$STRATA" quantize "$m256" "$tmp/x.gguf" Q4_K_X
contains badtype "strata quantize: unknown type 'Q4_K_X'; valid types: Q4_0, Q4_1, Q5_0"
if [ "$(wc -l <"$tmp/badtype.out")" -eq 1 ]; then ok; else bad "badtype: error is not one line"; fi
expect_rc missing 1 "$STRATA" quantize "$tmp/nope.gguf" "$tmp/x.gguf" Q4_0
contains missing "strata quantize: "
contains missing "nope.gguf"
if [ "$(wc -l <"$tmp/missing.out")" -eq 1 ]; then ok; else bad "missing: error is not one line"; fi
printf 'not a gguf file at all' >"$tmp/junk.gguf"
expect_rc junk 1 "$STRATA" quantize "$tmp/junk.gguf" "$tmp/x.gguf" Q4_0
expect_rc noargs 2 "$STRATA" quantize "$m256" "$tmp/x.gguf"
expect_rc badflag 2 "$STRATA" quantize "$m256" "$tmp/x.gguf" Q4_0 --frobnicate
expect_rc badthreads 2 "$STRATA" quantize "$m256" "$tmp/x.gguf" Q4_0 --threads 0
expect_rc samepath 2 "$STRATA" quantize "$m256" "$m256" Q4_0
expect_rc badout 1 "$STRATA" quantize "$m256" "$tmp/no/such/dir/x.gguf" Q4_0
if [ ! -e "$tmp/x.gguf" ]; then ok; else bad "a failed run left $tmp/x.gguf"; fi
expect_rc help 0 "$STRATA" quantize --help
contains help "Q3_K_M"

# Optional: byte-for-byte against llama.cpp's own llama_model_quantize, when
# LLAMA_LIBDIR names a directory with a libllama*.so of a 2025 llama.cpp
# (e.g. the one inside the npm package @node-llama-cpp/linux-x64). The params
# struct is taken from llama_model_quantize_default_params(); this file sets
# nthread (offset 0), ftype (offset 4) and pure (offset 19) as llama.h lays
# them out.
if [ -n "$LLAMA_LIBDIR" ]; then
    lib=$(ls "$LLAMA_LIBDIR"/libllama.so "$LLAMA_LIBDIR"/libllama.*so* 2>/dev/null | head -n 1)
    cat >"$tmp/lq.c" <<'EOF2'
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned char b[56]; } params;
int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    params (*dp)(void) = (params (*)(void))dlsym(h, "llama_model_quantize_default_params");
    unsigned (*q)(const char *, const char *, const params *) =
        (unsigned (*)(const char *, const char *, const params *))dlsym(h, "llama_model_quantize");
    void (*init)(void) = (void (*)(void))dlsym(h, "llama_backend_init");
    if (init) init();
    params p = dp();
    int ft = atoi(argv[4]), nt = 2;
    memcpy(p.b, &nt, 4);
    memcpy(p.b + 4, &ft, 4);
    if (argc > 5) p.b[19] = 1;
    return (int)q(argv[2], argv[3], &p);
}
EOF2
    if [ -n "$lib" ] && ${CC:-cc} -o "$tmp/lq" "$tmp/lq.c" -ldl 2>"$tmp/lq.err"; then
        for m in "$m256" "$tiny"; do
            for t in Q4_0:2 Q4_1:3 Q5_0:8 Q5_1:9 Q8_0:7 Q2_K:10 Q3_K_S:11 Q3_K_M:12 Q3_K_L:13 Q4_K_S:14 Q4_K_M:15 \
                     Q5_K_S:16 Q5_K_M:17 Q6_K:18 F16:1 BF16:32 F32:0; do
                n=${t%%:*}; f=${t##*:}
                "$tmp/lq" "$lib" "$m" "$tmp/ll.gguf" "$f" >/dev/null 2>&1 &&
                    "$STRATA" quantize "$m" "$tmp/st.gguf" "$n" >/dev/null 2>&1 &&
                    cmp -s "$tmp/ll.gguf" "$tmp/st.gguf" && ok || bad "llama.cpp $n on $(basename "$m"): files differ"
            done
        done
    else
        bad "LLAMA_LIBDIR=$LLAMA_LIBDIR: no usable libllama: $(cat "$tmp/lq.err")"
    fi
fi

echo "quantize_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
