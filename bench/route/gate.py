#!/usr/bin/python3
"""gate.py: the decision of bench/route/gate.sh (docs/ROUTING.md, "The gate").

Reads what gate.sh left in --out and prints one line per criterion with the
measured values and PASS/FAIL, then the verdict. Exit 0 only when all pass,
1 when one fails, 2 when an output cannot be parsed.

  (a) task  : taskeval --compare exact (A) vs candidate (B) on the held-out
              cases. FAIL if the exact one-sided sign test of "the candidate
              is worse" (p = P(X <= better), X ~ Bin(better + worse, 1/2))
              gives p < alpha, or if the candidate completes more than
              floor(margin_frac x cases) fewer cases than exact.
  (b) KL    : every corpus, both feeding modes: mean KL(exact||candidate)
              must be < kl_max (nats).
  (c) speed : bench-ab pairs: the median of exact/candidate request time
              (prefill + decode wall time) must be >= speed_min, and the
              candidate's runs must have changed routing at all (route
              counters: slots changed > 0); a policy that changed nothing
              cannot be faster, whatever the noise says.
"""
import argparse
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routelib as rl  # noqa: E402


def read(path):
    with open(path) as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="?")
    ap.add_argument("--spec", default="?")
    ap.add_argument("--arena", default="?")
    ap.add_argument("--batch", default="?")
    ap.add_argument("--kl-max", type=float, default=0.03)
    ap.add_argument("--speed-min", type=float, default=1.05)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--margin-frac", type=float, default=0.01)
    a = ap.parse_args()
    out = a.out
    try:
        # the candidate's canonical policy, as tfdump printed it
        policy = "?"
        for p in sorted(glob.glob(os.path.join(out, "tf*-cand.out"))):
            m = re.search(r"routing (.*?); target PPL", read(p))
            if m:
                policy = m.group(1)
                break
        # (b)
        kls = []
        def order(p):
            m = re.match(r"kld(\d+)-(prompt|decode)\.json$", os.path.basename(p))
            return (int(m.group(1)), m.group(2) != "prompt") if m else (1 << 30, True)
        for p in sorted(glob.glob(os.path.join(out, "kld*-*.json")), key=order):
            m = re.match(r"kld(\d+)-(prompt|decode)\.json$", os.path.basename(p))
            if not m:
                continue
            name = os.path.basename(read(os.path.join(out, f"corpus{m.group(1)}.name")).strip())
            kls.append((name, m.group(2), rl.parse_kld_json(p)))
        if not kls:
            raise rl.ParseError(f"{out}: no kld results")
        # (a)
        cmp_ = rl.parse_compare(read(os.path.join(out, "compare.out")), os.path.join(out, "compare.out"))
        # (c)
        pairs = rl.parse_abbench(os.path.join(out, "ab", "results.json"))
    except (rl.ParseError, OSError) as e:
        print(f"route gate: error: {e}", file=sys.stderr)
        return 2

    print(f"route gate: candidate {policy}")
    print(f"  vs exact on {a.model}, arena {a.arena}, -b {a.batch}")
    if policy == "exact":
        print("  note: the candidate is exact routing: nothing can change, and no speed can be gained")
    fails = []

    # (a) task
    n = cmp_["paired"]
    margin = int(math.floor(a.margin_frac * n + 1e-9))
    p_worse = rl.sign_test_worse(cmp_["better"], cmp_["worse"])
    loss = cmp_["done_a"] - cmp_["done_b"]
    ok_a = p_worse >= a.alpha and loss <= margin
    why = []
    if p_worse < a.alpha:
        why.append(f"significantly worse (p {p_worse:.4g} < {a.alpha:g})")
    if loss > margin:
        why.append(f"{loss} fewer cases completed, more than the margin {margin}")
    print(f"(a) task : completed exact {cmp_['done_a']}/{n}, candidate {cmp_['done_b']}/{n}; "
          f"{cmp_['discordant']} discordant ({cmp_['better']} better, {cmp_['worse']} worse); "
          f"one-sided exact sign test (candidate worse) p = {p_worse:.4g}, alpha {a.alpha:g}; "
          f"loss {loss} vs margin {margin} -> " + ("PASS" if ok_a else "FAIL: " + "; ".join(why)))
    if not ok_a:
        fails.append("a")

    # (b) KL
    parts, ok_b, worst = [], True, None
    for name, mode, k in kls:
        bad = not (k["mean"] < a.kl_max)
        ok_b &= not bad
        parts.append(f"{name} {mode} {k['mean']:.6f} (top-1 {k['top1_agree']}/{k['top1_n']})" + (" OVER" if bad else ""))
        if worst is None or k["mean"] > worst[2]:
            worst = (name, mode, k["mean"])
    print(f"(b) KL   : mean KL(exact||candidate), nats: " + "; ".join(parts) + f"; bound < {a.kl_max:g} -> " +
          ("PASS" if ok_b else f"FAIL: {worst[0]} ({worst[1]} feeding) drifts {worst[2]:.6f} >= {a.kl_max:g}"))
    if not ok_b:
        fails.append("b")
    if "(reads residency)" in policy:
        for name in dict.fromkeys(n for n, _, _ in kls):
            if all(k["mean"] == 0 for n, _, k in kls if n == name):
                print(f"  warning: KL is exactly 0 on {name} in both modes: the corpus may not exercise the "
                      "candidate (e.g. exact-last covering every row that feeds a target); (b) is weak evidence there")

    # (c) speed
    sp = rl.span([p["request_speedup"] for p in pairs])
    pf = rl.span([1.0 / p["prefill_ratio"] if p["prefill_ratio"] else float("nan") for p in pairs])
    dc = rl.span([p["decode_ratio"] for p in pairs])
    faster = sum(1 for p in pairs if p["request_speedup"] > 1)
    ch = [p["slots_changed_b"] for p in pairs]
    changed = None if any(c is None for c in ch) else sum(ch)
    ok_c = sp[0] >= a.speed_min and changed != 0
    if changed == 0:
        msg = "FAIL: no gain: the candidate changed no routing, so any measured difference is noise"
    elif ok_c:
        msg = "PASS"
    else:
        msg = f"FAIL: median {sp[0]:.3f} < {a.speed_min:g}" + (
            " (no gain)" if sp[0] < 1.0 + 0.5 * (a.speed_min - 1.0) else " (gain too small)")
    print(f"(c) speed: request time exact/candidate median {rl.fmt_span(sp)} over {len(pairs)} pairs "
          f"({faster} faster); prefill speed {rl.fmt_span(pf)}, decode speed {rl.fmt_span(dc)}; "
          f"need median >= {a.speed_min:g}; slots changed by the candidate "
          f"{'n/a' if changed is None else changed} -> {msg}")
    if not ok_c:
        fails.append("c")

    print("  (ranges are the observed min..max over the pairs, not confidence intervals; KL is distribution "
          "drift, not task harm)")
    if fails:
        print("route gate: FAIL (" + ", ".join(fails) + ")")
        return 1
    print("route gate: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
