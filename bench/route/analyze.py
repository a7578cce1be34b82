#!/usr/bin/python3
"""analyze.py: the arms and the analysis of bench/route/study.sh (issue 7's
residency-biased routing study).

  analyze.py arms quick|full     the arms, one per line: ID<TAB>PLACEMENT<TAB>SPEC
  analyze.py table OUT           read OUT (what study.sh wrote), print the
                                 markdown table, write OUT/table.md and
                                 OUT/summary.json

Placements: chunk0 = the arm routes the first forward chunk of every prompt
evaluation (later chunks and decode exact); prompt = the later chunks
(chunk 0 and decode exact); decode = one-token evaluations (prompts exact).
exact-last does not exist in decode (a parse error there).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routelib as rl  # noqa: E402

BONUS = (0.25, 0.5, 0.85, 2)
BODY = (1, 2, 3)
EXACT_LAST = (0, 32)

# the --quick subset: one mild and one aggressive arm per placement, plus
# the seed system's prompt arm
QUICK = [
    ("chunk0", 2, 0.85, 0),
    ("prompt", 3, 0.85, 32),
    ("prompt", 1, 2, 0),
    ("decode", 3, 0.5, 0),
    ("decode", 2, 0.85, 0),
    ("decode", 1, 2, 0),
]


def arm_spec(place, body, bonus, el):
    b = f"bias(body={body},bonus={bonus:g}" + (f",exact-last={el}" if el else "") + ")"
    if place == "chunk0":
        return f"prompt.chunk0={b}; prompt=exact; decode=exact"
    if place == "prompt":
        return f"prompt.chunk0=exact; prompt={b}; decode=exact"
    return f"prompt.chunk0=exact; prompt=exact; decode={b}"


def arm_id(place, body, bonus, el):
    return f"{place}-b{body}-x{bonus:g}" + (f"-el{el}" if el else "")


def arms(kind):
    if kind == "quick":
        lst = QUICK
    else:
        lst = [(p, b, x, e) for p in ("chunk0", "prompt", "decode") for e in EXACT_LAST for b in BODY for x in BONUS
               if not (p == "decode" and e)]
    return [(arm_id(*a), a[0], arm_spec(*a)) for a in lst]


def read(path):
    with open(path) as f:
        return f.read()


def speed(out, model_tag, ids, rounds):
    """Per arm: paired ratios against the exact run of the same round."""
    res = {}
    d = os.path.join(out, "speed", model_tag)
    if not os.path.isdir(d):
        return res
    ex = {}
    for r in range(1, rounds + 1):
        p = os.path.join(d, f"exact.r{r}.json")
        if os.path.exists(p):
            ex[r] = rl.parse_run_report(p)
    for i in ids:
        pf, dc, pb, db, ch, res_share, res_share_ex, rq = [], [], [], [], [], [], [], []
        arm_bytes = {}
        for r, e in ex.items():
            p = os.path.join(d, f"{i}.r{r}.json")
            if not os.path.exists(p):
                continue
            a = rl.parse_run_report(p)
            pf.append(e["prompt_ms"] / a["prompt_ms"])                      # > 1: faster prefill
            rq.append((e["prompt_ms"] + e["gen_ms"]) / (a["prompt_ms"] + a["gen_ms"]))   # request time
            if a["gen_ms"] > 0 and e["gen_ms"] > 0:
                dc.append((a["gen_tokens"] / a["gen_ms"]) / (e["gen_tokens"] / e["gen_ms"]))
            if e["prompt_bytes"]:
                pb.append(a["prompt_bytes"] / e["prompt_bytes"])
            if e["decode_bytes"]:
                db.append(a["decode_bytes"] / e["decode_bytes"])
            slots = sum(x["slots_changed"] for x in a["arms"].values())
            k_slots = sum(x["rows"] for x in a["arms"].values())
            ch.append(slots)
            ml = sum(x["masked_lookups"] for x in a["arms"].values())
            if ml:
                res_share.append(sum(x["masked_resident"] for x in a["arms"].values()) / ml)
                res_share_ex.append(sum(x["masked_resident_exact"] for x in a["arms"].values()) /
                                    max(1, sum(x["masked_lookups_exact"] for x in a["arms"].values())))
            for name, x in a["arms"].items():
                if x.get("stream") and e["arms"][name].get("stream") and e["arms"][name]["stream"]["bytes"]:
                    arm_bytes.setdefault(name, []).append(x["stream"]["bytes"] / e["arms"][name]["stream"]["bytes"])
        res[i] = {
            "rounds": len(pf), "prefill_speed": rl.span(pf), "decode_speed": rl.span(dc), "request_speed": rl.span(rq),
            "prompt_bytes_ratio": rl.span(pb), "decode_bytes_ratio": rl.span(db),
            "slots_changed": rl.span(ch), "resident_share": rl.span(res_share),
            "resident_share_exact": rl.span(res_share_ex),
            "arm_bytes_ratio": {k: rl.span(v) for k, v in arm_bytes.items()},
        }
    return res


# The gate's criteria (bench/route/gate.py, docs/ROUTING.md "The gate"),
# applied to the study's own measurements: the study's case subset, rounds
# and one feeding mode per arm, not a full gate run.
KL_MAX, SPEED_MIN, ALPHA, MARGIN = 0.03, 1.05, 0.05, 0.01


def gate_verdict(row):
    fails, unknown = [], []
    t = row["task"]
    if t is None:
        unknown.append("a")
    elif t["p_worse"] < ALPHA or t["done_a"] - t["done_b"] > math.floor(MARGIN * t["paired"] + 1e-9):
        fails.append("a")
    ks = [k for k in row["kl"].values()]
    if any(k is None for k in ks):
        unknown.append("b")
    elif not all(k["mean"] < KL_MAX for k in ks):
        fails.append("b")
    q = row["speed"].get("Q")
    if not q or math.isnan(q["request_speed"][0]):
        unknown.append("c")
    elif q["request_speed"][0] < SPEED_MIN or q["slots_changed"][2] == 0:
        fails.append("c")
    v = ("FAIL " + ",".join(fails)) if fails else ("PASS" if not unknown else "no fail")
    return v + (f" ({','.join(unknown)} not measured)" if unknown else "")


def table(out):
    meta = json.load(open(os.path.join(out, "meta.json")))
    lst = [tuple(l.split("\t")) for l in read(os.path.join(out, "arms.tsv")).splitlines() if l.strip()]
    ids = [a[0] for a in lst]
    rounds = int(meta["rounds"])
    sp = {tag: speed(out, tag, ids, rounds) for tag in ("S", "Q")}
    rows = []
    for i, place, spec in lst:
        row = {"id": i, "placement": place, "spec": spec, "speed": {t: sp[t].get(i) for t in sp}}
        mode = "decode" if place == "decode" else "prompt"
        row["kl"] = {}
        for c in ("chat", "toolcall"):
            p = os.path.join(out, "kl", f"{i}.{c}.json")
            row["kl"][c] = rl.parse_kld_json(p) if os.path.exists(p) else None
        row["kl_mode"] = mode
        p = os.path.join(out, "task", f"{i}.compare.txt")
        row["task"] = rl.parse_compare(read(p), p) if os.path.exists(p) else None
        if row["task"]:
            t = row["task"]
            row["task"]["p_worse"] = rl.sign_test_worse(t["better"], t["worse"])
        row["gate"] = gate_verdict(row)
        rows.append(row)

    def f_kl(k):
        if not k:
            return "n/a"
        return f"{k['mean']:.4f} / {k['top1_agree']}/{k['top1_n']}"

    def f_task(t):
        if not t:
            return "n/a"
        return (f"{t['done_b']}/{t['paired']} vs {t['done_a']}; +{t['better']} -{t['worse']}, "
                f"p2 {t['p_two']:.3g}")

    def f_sp(s, key):
        if not s:
            return "n/a"
        return rl.fmt_span(s[key], 2)

    lines = []
    lines.append(f"Subjects: S = {meta['speed_model']} (arena {meta['arena_S']}), "
                 f"Q = {meta['model']} (arena {meta['arena_Q']}); -b {meta['batch']}, -t {meta['threads']}, "
                 f"{rounds} interleaved rounds; " +
                 (f"taskeval: {meta['n_cases']} held-out cases (every {meta['every']}), -n {meta['n_predict']}; "
                  f"exact on Q completed {meta.get('exact_completed', '?')}." if meta.get("task", 1) else
                  "taskeval not run (--no-task)."))
    lines.append("")
    lines.append("| arm | spec (the biased arm) | S prefill speed | S decode speed | S prompt bytes | "
                 "Q prefill speed | Q decode speed | Q prompt bytes | Q decode bytes | Q slots changed | "
                 "Q request speed | KL chat / top-1 | KL tool-call / top-1 | "
                 "task completed (vs exact); discordant; sign test | gate criteria |")
    lines.append("|" + "---|" * 15)
    for r in rows:
        s, q = r["speed"]["S"], r["speed"]["Q"]
        short = [x for x in r["spec"].split("; ") if "bias" in x][0]
        lines.append(f"| {r['id']} | `{short}` | {f_sp(s, 'prefill_speed')} | {f_sp(s, 'decode_speed')} | "
                     f"{f_sp(s, 'prompt_bytes_ratio')} | {f_sp(q, 'prefill_speed')} | {f_sp(q, 'decode_speed')} | "
                     f"{f_sp(q, 'prompt_bytes_ratio')} | {f_sp(q, 'decode_bytes_ratio')} | "
                     f"{rl.fmt_span(q['slots_changed'], 0) if q else 'n/a'} | {f_sp(q, 'request_speed')} | "
                     f"{f_kl(r['kl']['chat'])} | {f_kl(r['kl']['toolcall'])} | {f_task(r['task'])} | "
                     f"{r['gate']} |")
    lines.append("")
    lines.append("Speeds are exact time / arm time per round (> 1: the arm is faster), bytes are arm / exact; "
                 "each cell is the median and the observed min..max over the rounds (a range, not a confidence "
                 "interval). KL is mean KL(exact||arm) in nats over the corpus targets, with top-1 agreement; "
                 "decode arms are measured with `tfdump --decode` (one token per call) against an exact "
                 "`--decode` reference. KL is distribution drift, not task harm. The sign test p2 is taskeval's "
                 "exact two-sided test on the discordant cases. Gate criteria: the gate's bounds "
                 "(docs/ROUTING.md) applied to these measurements (a: one-sided sign test p >= 0.05 and a "
                 "loss of at most 1% of the cases; b: both mean KL < 0.03; c: Q request-speed median >= 1.05 "
                 "with some slots changed) - a screen on the study's subset, not a full gate run.")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)

    def clean(o):
        if isinstance(o, float) and math.isnan(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(clean({"meta": meta, "rows": rows}), f, indent=1)
    sys.stdout.write(text)
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "arms" and sys.argv[2] in ("quick", "full"):
        for a in arms(sys.argv[2]):
            print("\t".join(a))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        try:
            return table(sys.argv[2])
        except (rl.ParseError, OSError, KeyError) as e:
            print(f"analyze.py: error: {e}", file=sys.stderr)
            return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
