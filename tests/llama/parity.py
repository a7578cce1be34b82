#!/usr/bin/env python3
"""parity: strata against the real llama.cpp (driver of tests/cli/test_llama_parity.sh).

The shell script installs the pinned npm package, builds the C helpers into
$BUILD/llama and runs this with LLAMA_LIB pointing at the package's shared
libraries. Every check below is one counted test; the last line is
"llama_parity: N passed, N failed". Figures go to stdout, failures to stderr.

  1. ggml_quant   strata's Q8_0/Q8_1/Q8_K quantizers vs ggml's own (bit-exact)
  2. tokenize     every case of tests/golden/cases.txt on the qwen2 / llama-bpe
                  / SPM vocabularies of make_vocab.py, parse_special on and off:
                  llama_tokenize ids == `strata tokenize --ids --no-escape` ids;
                  the ids' pieces (special tokens shown and hidden) == strata's;
                  and every vocabulary id's piece and EOG flag
  3. logits       mkmodel models, every position's logits, in two settings:
                  "default"  llama.cpp as it runs by default (F16 KV cache,
                             flash attention auto = on for CPU, weight
                             repacking) vs strata's default (F16 KV)
                  "matched"  F32 KV on both sides, llama.cpp without flash
                             attention and without repacking: the setting
                             where the two engines run the same arithmetic
                             up to the differences listed in README.md
  4. greedy       `strata run --temp 0` vs llama.cpp greedy decoding of the
                  same prompt: identical tokens, or a first divergence on a
                  near-tie of llama.cpp's logits (asserted)

Usage: parity.py [--only SECTION[,SECTION]] [-v]   (env: BUILD, STRATA, LLAMA_LIB)
"""
import concurrent.futures
import os
import struct
import subprocess
import zlib
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("BUILD", "build")
STRATA = os.environ.get("STRATA", os.path.join(BUILD, "strata"))
LIB = os.environ.get("LLAMA_LIB", "")
WORK = os.path.join(BUILD, "llama", "work")
TOOLS = os.path.join(BUILD, "llama")
ORACLE = [os.path.join(TOOLS, "llama_oracle"), "--lib", LIB]
PYTHON = os.environ.get("PYTHON", sys.executable)
THREADS = "2"          # strata
LLAMA_THREADS = "1"    # llama.cpp: same bits with 1 or 2 threads (checked), and
                       # its spinning barriers cost seconds per run on a busy machine
VERBOSE = "-v" in sys.argv

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        if VERBOSE:
            print("ok   " + name)
    else:
        failed += 1
        if failed <= 40:
            sys.stderr.write("FAIL %s%s\n" % (name, (": " + detail) if detail else ""))


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def run2(cmd1, cmd2):
    """Run two commands at once (the llama.cpp side and strata's)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        f1, f2 = pool.submit(run, cmd1), pool.submit(run, cmd2)
        return f1.result(), f2.result()


def newer(a, b):
    """True if a is missing or older than b."""
    return not os.path.exists(a) or os.path.getmtime(a) < os.path.getmtime(b)


# ==== 1. ggml's quantizers ====

def section_ggml_quant():
    r = run([os.path.join(TOOLS, "ggml_quant_check"), LIB, "haswell"])
    out = r.stdout.decode()
    for line in out.splitlines():
        if line.startswith("ggml_quant:") or line.startswith("  "):
            continue
        check("ggml_quant " + line.split(" vs ")[0] + " vs ggml", " 0 of " in line, line)
    if r.returncode not in (0, 1) or "ggml_quant:" not in out:
        check("ggml_quant ran", False, r.stderr.decode()[-300:])
    print("ggml_quant: act_quant Q8_0/Q8_1/Q8_K (scalar, AVX2) == ggml-cpu-haswell quantize_row_*; "
          "quant == ggml-base quantize_row_*_ref (%s)" % ("all bit-exact" if r.returncode == 0 else "DIFFERENCES"))


# ==== 2. tokenization ====

VOCABS = [("qwen2", "qwen2 BPE"), ("llama3", "llama-bpe"), ("spm", "SPM")]


def section_tokenize():
    vocab_dir = os.path.join(TOOLS, "vocab")
    stamp = os.path.join(vocab_dir, "spm.gguf")
    if newer(stamp, os.path.join(ROOT, "tests/golden/make_vocab.py")):
        r = run([PYTHON, os.path.join(ROOT, "tests/golden/make_vocab.py"), "--out", vocab_dir])
        if r.returncode != 0:
            check("tokenize: make_vocab.py", False, r.stderr.decode()[-300:])
            return
    sys.path.insert(0, os.path.join(ROOT, "tests/golden"))
    from bpe_ref import load_cases
    cases = load_cases()
    cdir = os.path.join(WORK, "tok")
    os.makedirs(cdir, exist_ok=True)
    for i, (name, text) in enumerate(cases):
        with open(os.path.join(cdir, "%03d.txt" % i), "wb") as fh:
            fh.write(text)

    def strata_ids(job):
        v, ps, i = job
        cmd = [STRATA, "tokenize", "-m", os.path.join(vocab_dir, v + ".gguf"), "-f",
               os.path.join(cdir, "%03d.txt" % i), "--ids", "--no-escape"] + ([] if ps else ["--no-parse-special"])
        r = run(cmd)
        return job, r.stdout.decode("utf-8", "replace").strip(), r.returncode

    jobs = [(v, ps, i) for v, _ in VOCABS for ps in (1, 0) for i in range(len(cases))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        got = {job: (out, rc) for job, out, rc in pool.map(strata_ids, jobs)}

    n_ids = n_ids_ok = n_det = n_det_ok = 0
    for v, label in VOCABS:
        gguf = os.path.join(vocab_dir, v + ".gguf")
        # whole-vocabulary piece tables (and EOG flags)
        lp, sp = os.path.join(WORK, "lp_%s.tsv" % v), os.path.join(WORK, "sp_%s.tsv" % v)
        r1 = run(ORACLE + ["pieces", gguf, lp])
        r2 = run([os.path.join(TOOLS, "strata_pieces"), gguf, sp])
        if r1.returncode or r2.returncode:
            check("tokenize %s: piece tables" % v, False, (r1.stderr + r2.stderr).decode()[-300:])
            continue
        ltab = [ln.split("\t") for ln in open(lp).read().splitlines()]
        stab = [ln.split("\t") for ln in open(sp).read().splitlines()]
        bad = [a[0] for a, b in zip(ltab, stab) if a != b]
        check("tokenize %s: every id's piece (special shown/hidden) and EOG flag" % v,
              len(ltab) == len(stab) and not bad, "%d ids differ, first %s" % (len(bad), bad[:5]))
        pieces = {int(row[0]): (bytes.fromhex(row[1]), bytes.fromhex(row[2])) for row in stab}
        for ps in (1, 0):
            lines = "".join("%s\t%d\t%s\n" % (os.path.join(cdir, "%03d.txt" % i), ps,
                                             os.path.join(cdir, "%s_%d_%03d" % (v, ps, i)))
                            for i in range(len(cases)))
            r = run(ORACLE + ["tokenize", gguf], input=lines.encode())
            if r.returncode:
                check("tokenize %s ps=%d: llama_oracle" % (v, ps), False, r.stderr.decode()[-300:])
                continue
            for i, (name, _) in enumerate(cases):
                base = os.path.join(cdir, "%s_%d_%03d" % (v, ps, i))
                want = open(base + ".ids").read().strip()
                out, rc = got[(v, ps, i)]
                tag = "tokenize %s %s%s" % (v, name, "" if ps else " (no parse_special)")
                n_ids += 1
                ok = rc == 0 and out == want
                n_ids_ok += ok
                check(tag + ": ids", ok, "llama.cpp %s, strata %s" % (want[:120], out[:120]))
                # detokenization of the id list: piece by piece, as llama-tokenize
                # lists them (special shown) and as llama-completion prints them (hidden)
                ids = [int(t) for t in want.strip("[]").split(",") if t.strip()]
                s1 = b"".join(pieces[t][0] for t in ids if t in pieces)
                s0 = b"".join(pieces[t][1] for t in ids if t in pieces)
                l1 = open(base + ".p1", "rb").read()
                l0 = open(base + ".p0", "rb").read()
                n_det += 1
                ok = s1 == l1 and s0 == l0
                n_det_ok += ok
                check(tag + ": detokenized pieces", ok, "llama.cpp %r, strata %r" % (l1[:80], s1[:80]))
    print("tokenize: ids %d/%d identical, detokenized id lists %d/%d identical (%d cases x %d vocabularies x "
          "parse_special on/off)" % (n_ids_ok, n_ids, n_det_ok, n_det, len(cases), len(VOCABS)))


# ==== 3. logits ====

def load_logits(path):
    with open(path, "rb") as fh:
        n, v = struct.unpack("<ii", fh.read(8))
        return np.frombuffer(fh.read(), dtype="<f4").reshape(n, v).astype(np.float64)


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def compare(ll, ls):
    """Figures of strata's logits ls against llama.cpp's ll (positions x vocab)."""
    d = np.abs(ll - ls)
    pl, ps_ = log_softmax(ll), log_softmax(ls)
    kl = (np.exp(pl) * (pl - ps_)).sum(axis=1)
    al, as_ = ll.argmax(axis=1), ls.argmax(axis=1)
    rows = np.arange(len(al))
    gap = ll[rows, al] - ll[rows, as_]          # llama.cpp's own margin for strata's choice
    return {
        "max": float(d.max()), "relrms": float(np.sqrt((d ** 2).mean() / (ll ** 2).mean())),
        "top1": float((al == as_).mean()), "kl": float(kl.mean()), "klmax": float(kl.max()),
        "exact": float((d.max(axis=1) == 0).mean()), "worst_gap": float(gap.max()),
        "n": len(al),
    }


# name, mkmodel args, number of positions.
# tiny: 2 layers, 8 experts top-2, n_embd 64 (K-quants fall back to q5_0/q8_0 at
# 64-wide rows as llama-quantize does); kq: the small shape (n_embd 512,
# expert ff 256) cut to 2 layers / 8 experts so K-quants apply; small: the
# preset itself (8 layers, 128 experts top-8, q4_K/q8_0/q6_K mix, 0.24 GB),
# the model `make demo` generates.
MODELS = [
    ("tiny-f32", ["--preset", "tiny", "--seed", "3"], 32),
    ("tiny-f16", ["--preset", "tiny", "--seed", "3", "--type", "f16"], 32),
    ("tiny-bf16", ["--preset", "tiny", "--seed", "3", "--type", "bf16"], 32),
    ("tiny-q8_0", ["--preset", "tiny", "--seed", "3", "--type", "q8_0"], 32),
    ("tiny-q4_0", ["--preset", "tiny", "--seed", "3", "--type", "q4_0"], 32),
    ("tiny-q4_1", ["--preset", "tiny", "--seed", "3", "--type", "q4_1"], 32),
    ("tiny-q5_1-tied", ["--preset", "tiny", "--seed", "3", "--type", "q5_1", "--tied"], 32),
    ("kq-q4_K/q6_K/q5_K", ["--preset", "small", "--seed", "5", "--layers", "2", "--experts", "8",
                           "--type-experts", "q4_K", "--type-attn", "q6_K", "--type-embd", "q5_K",
                           "--type-output", "q6_K"], 48),
    ("kq-q2_K/q3_K", ["--preset", "small", "--seed", "6", "--layers", "2", "--experts", "8",
                      "--type-experts", "q2_K", "--type-attn", "q3_K", "--type-embd", "q8_0"], 48),
    ("small", ["--preset", "small", "--seed", "1"], 64),
]

# Tolerances (README.md explains each figure):
#   default  F16 KV: llama.cpp rounds Q (and, with flash attention, the V
#            accumulator) to fp16 where strata keeps float; measured relRMS
#            <= 0.044 and KL <= 1e-3 on these models. A top-1 disagreement is
#            allowed only where llama.cpp's own top-1 / strata-choice margin
#            is a near-tie (< NEAR_TIE).
#   matched  F32 KV, no flash attention, no repacking: float models agree to
#            summation order (<= 1e-4), quantized ones exactly except after a
#            one-step activation rounding flip (ggml's SIMD expf in softmax and
#            SiLU rounds differently from libm in ~25 % of values; Q8
#            quantization absorbs nearly all of it): relRMS <= 0.01.
TOL = {
    "default": {"relrms": 0.06, "kl": 2e-3, "klmax": 0.05},
    "matched": {"relrms": 0.01, "kl": 1e-4, "klmax": 2e-3},
}
NEAR_TIE = 0.35
FLOAT_MODELS = ("tiny-f32", "tiny-f16", "tiny-bf16")


def make_model(name, args):
    os.makedirs(os.path.join(WORK, "models"), exist_ok=True)
    path = os.path.join(WORK, "models", name.replace("/", "_") + ".gguf")
    if newer(path, STRATA):
        r = run([STRATA, "mkmodel", "-o", path, "-q", "-t", THREADS] + args)
        if r.returncode:
            return None, r.stderr.decode()
    return path, ""


def n_vocab_of(path):
    r = run([STRATA, "inspect", path])
    for line in r.stdout.decode().splitlines():
        if line.strip().startswith("tokenizer.ggml.tokens"):
            return int(line.split("[")[1].split("]")[0].split()[0]) if "[" in line else None
    return None


def test_ids(n, n_vocab, seed):
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, n_vocab - 16, size=n)]


def section_logits():
    print("logits: %-20s %-8s %10s %10s %8s %10s %10s %7s" % ("model", "setting", "max|d|", "relRMS", "top-1",
                                                                "KL mean", "KL max", "exact"))
    for name, args, n in MODELS:
        path, msg = make_model(name, args)
        if not path:
            check("logits %s: mkmodel" % name, False, msg[-300:])
            continue
        nv = n_vocab_of(path)
        ids = test_ids(n, nv or 512, zlib.crc32(name.encode()))
        ids_s = ",".join(map(str, ids))
        for setting in ("default", "matched"):
            lbin = os.path.join(WORK, "l.bin")
            sbin = os.path.join(WORK, "s.bin")
            kv = "f16" if setting == "default" else "f32"
            lcmd = ORACLE + (["--no-repack"] if setting == "matched" else []) + \
                ["logits", path, lbin, ids_s, "-t", LLAMA_THREADS, "-ctk", kv, "-ctv", kv,
                 "--fa", "auto" if setting == "default" else "off"]
            r1, r2 = run2(lcmd, [os.path.join(BUILD, "tests", "dump_logits"), path, sbin, ids_s, "-t", THREADS,
                                 "-ctk", kv, "-ctv", kv])
            tag = "logits %s %s" % (name, setting)
            if r1.returncode or r2.returncode:
                check(tag, False, (r1.stderr + r2.stderr).decode()[-300:])
                continue
            ll, ls = load_logits(lbin), load_logits(sbin)
            if ll.shape != ls.shape:
                check(tag + ": shape", False, "%s vs %s" % (ll.shape, ls.shape))
                continue
            f = compare(ll, ls)
            print("logits: %-20s %-8s %10.3g %10.3g %8.4f %10.3g %10.3g %6.0f%%" % (
                name, setting, f["max"], f["relrms"], f["top1"], f["kl"], f["klmax"], 100 * f["exact"]))
            t = TOL[setting]
            if setting == "matched" and name == "tiny-f16":
                # llama.cpp's batch path (llamafile sgemm) keeps F16 matmul
                # inputs in float; strata rounds them to fp16 as ggml's
                # single-token path does: differences of fp16 rounding size
                check(tag + ": relRMS <= 1e-3 (fp16 input rounding)", f["relrms"] <= 1e-3, "%.3g" % f["relrms"])
            elif setting == "matched" and name in FLOAT_MODELS:
                check(tag + ": max|d| <= 1e-4 (summation order only)", f["max"] <= 1e-4, "%.3g" % f["max"])
            else:
                check(tag + ": relRMS <= %g" % t["relrms"], f["relrms"] <= t["relrms"], "%.3g" % f["relrms"])
            check(tag + ": KL mean <= %g, max <= %g" % (t["kl"], t["klmax"]),
                  f["kl"] <= t["kl"] and f["klmax"] <= t["klmax"], "mean %.3g max %.3g" % (f["kl"], f["klmax"]))
            check(tag + ": top-1 agrees except on near-ties (llama.cpp margin < %g)" % NEAR_TIE,
                  f["worst_gap"] < NEAR_TIE, "top-1 %.4f, worst margin %.3g" % (f["top1"], f["worst_gap"]))


# ==== 4. greedy generation ====

GREEDY = [
    ("tiny-f32", "The quick brown fox"),
    ("tiny-q8_0", "Once upon a time"),
    ("kq-q4_K/q6_K/q5_K", "It is a truth universally acknowledged"),
    ("small", "The quick brown fox"),
]
N_GEN = 32


def section_greedy():
    spec = {name: args for name, args, _ in MODELS}
    for name, prompt in GREEDY:
        path, msg = make_model(name, spec[name])
        tag = "greedy %s" % name
        if not path:
            check(tag, False, msg[-300:])
            continue
        pfile = os.path.join(WORK, "prompt.txt")
        with open(pfile, "w") as fh:
            fh.write(prompt)
        r, rs = run2(ORACLE + ["greedy", path, pfile, str(N_GEN), "-t", LLAMA_THREADS],
                     [STRATA, "run", "-m", path, "-p", prompt, "-n", str(N_GEN), "--temp", "0", "-t", THREADS])
        if r.returncode:
            check(tag + ": llama_oracle greedy", False, r.stderr.decode()[-300:])
            continue
        out = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines() if " " in line)
        lp = [int(t) for t in out["prompt"].strip("[]").split(",") if t.strip()]
        lg = [int(t) for t in out["gen"].strip("[]").split(",") if t.strip()]
        margins = [float(m) for m in out.get("margin", "").split()]
        ltext = bytes.fromhex(out["text"].strip()) if out.get("text", "").strip() else b""
        # same prompt tokens (strata tokenize = what strata run feeds)
        rt = run([STRATA, "tokenize", "-m", path, "-p", prompt, "--ids", "--no-escape"])
        sp = [int(t) for t in rt.stdout.decode().strip().strip("[]").split(",") if t.strip()]
        check(tag + ": prompt tokens", sp == lp, "llama.cpp %s, strata %s" % (lp, sp))
        if rs.returncode:
            check(tag + ": strata run", False, rs.stderr.decode()[-300:])
            continue
        stext = rs.stdout
        if stext == ltext:
            check(tag + ": %d tokens identical" % len(lg), True)
            print("greedy: %-20s %d/%d tokens identical (min llama.cpp top-1 margin %.3g)" % (
                name, len(lg), len(lg), min(margins) if margins else 0))
            continue
        # Diverged: find the step with teacher forcing on llama.cpp's tokens
        sbin = os.path.join(WORK, "g.bin")
        ids = lp + lg
        rd = run([os.path.join(BUILD, "tests", "dump_logits"), path, sbin, ",".join(map(str, ids)), "-t", THREADS])
        if rd.returncode:
            check(tag + ": dump_logits", False, rd.stderr.decode()[-300:])
            continue
        ls = load_logits(sbin)
        k = next((j for j in range(len(lg)) if int(ls[len(lp) - 1 + j].argmax()) != lg[j]), None)
        if k is None:
            check(tag + ": strata run == its own teacher-forced argmax", False,
                  "text differs but every teacher-forced argmax agrees (run vs batch path?)")
            continue
        ok = margins[k] < NEAR_TIE
        check(tag + ": first divergence at step %d is a near-tie (llama.cpp margin %.3g < %g)" % (k, margins[k], NEAR_TIE),
              ok, "llama.cpp token %d, strata %d" % (lg[k], int(ls[len(lp) - 1 + k].argmax())))
        print("greedy: %-20s %d/%d tokens identical, then a near-tie (llama.cpp top-1 margin %.3g)" % (
            name, k, len(lg), margins[k]))


SECTIONS = {"ggml_quant": section_ggml_quant, "tokenize": section_tokenize,
            "logits": section_logits, "greedy": section_greedy}


def main():
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    os.makedirs(WORK, exist_ok=True)
    for name, fn in SECTIONS.items():
        if only and name not in only:
            continue
        try:
            fn()
        except Exception as ex:   # a crash of one section is one failure, not a lost summary
            check("%s section" % name, False, "%s: %s" % (type(ex).__name__, ex))
    print("llama_parity: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
