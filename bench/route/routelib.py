"""routelib: parsers and statistics shared by bench/route/analyze.py (the
issue-7 study) and bench/route/gate.py (the gate). Standard library only
(run with /usr/bin/python3).

Every parser raises ParseError naming the file and what was missing, so a
changed tool output fails loudly instead of giving a wrong number.
"""
import json
import math
import re


class ParseError(Exception):
    pass


def _load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ParseError(f"{path}: cannot read JSON ({e})")


# ==== strata kld --json ====

def parse_kld_json(path):
    """{'mean', 'max', 'top1_agree', 'top1_n', 'ppl_ref', 'ppl_cand',
    'ref_routing', 'cand_routing'} from `strata kld --json`."""
    j = _load_json(path)
    if j.get("strata_kld") != 1 or "kl" not in j:
        raise ParseError(f"{path}: not a strata kld --json result")
    try:
        return {
            "mean": float(j["kl"]["mean"]), "max": float(j["kl"]["max"]),
            "top1_agree": int(j["top1_agree"]), "top1_n": int(j["top1_n"]),
            "ppl_ref": float(j["ppl_ref"]), "ppl_cand": float(j["ppl_cand"]),
            "ref_routing": j["ref"]["routing"], "cand_routing": j["cand"]["routing"],
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ParseError(f"{path}: kld result lacks {e}")


# ==== strata taskeval --compare (text on stdout) ====

_RE_TOTALS = re.compile(r"^(\d+) paired cases.*; completed A (\d+)/(\d+), B (\d+)/(\d+)$", re.M)
_RE_COMPLETED = re.compile(
    r"^completed: (\d+) better in B, (\d+) worse, (\d+) unchanged; exact two-sided sign test p = ([0-9.eE+-]+|nan) "
    r"\(n = (\d+) discordant\)$", re.M)
_RE_SCORE = re.compile(
    r"^case score: (\d+) higher in B, (\d+) lower, (\d+) equal; exact two-sided sign test p = ([0-9.eE+-]+|nan) "
    r"\(n = (\d+)\)$", re.M)


def parse_compare(text, where="taskeval --compare output"):
    """The paired comparison of `strata taskeval --compare A B` (A the
    baseline, B the candidate): paired, done_a, done_b, better, worse,
    unchanged, p_two (the tool's two-sided p), score_up, score_down."""
    m = _RE_TOTALS.search(text)
    c = _RE_COMPLETED.search(text)
    s = _RE_SCORE.search(text)
    if not m or not c or not s:
        missing = [n for n, x in (("the totals line", m), ("the 'completed:' line", c), ("the 'case score:' line", s))
                   if not x]
        raise ParseError(f"{where}: no {', '.join(missing)}")
    r = {
        "paired": int(m.group(1)), "done_a": int(m.group(2)), "done_b": int(m.group(4)),
        "better": int(c.group(1)), "worse": int(c.group(2)), "unchanged": int(c.group(3)),
        "p_two": float(c.group(4)), "discordant": int(c.group(5)),
        "score_up": int(s.group(1)), "score_down": int(s.group(2)), "score_p_two": float(s.group(4)),
    }
    if r["better"] + r["worse"] != r["discordant"] or r["better"] + r["worse"] + r["unchanged"] != r["paired"]:
        raise ParseError(f"{where}: inconsistent counts {r}")
    if r["done_b"] - r["done_a"] != r["better"] - r["worse"]:
        raise ParseError(f"{where}: completed totals disagree with the discordant counts {r}")
    return r


def binom_cdf_half(k, n):
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integers)."""
    if n <= 0:
        return 1.0
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(0, min(k, n) + 1)) / 2 ** n


def sign_test_two_sided(k, n):
    """The tool's test: p = min(1, 2 P(X <= min(k, n-k)))."""
    if n <= 0:
        return 1.0
    return min(1.0, 2 * binom_cdf_half(min(k, n - k), n))


def sign_test_worse(better, worse):
    """One-sided exact sign test of 'the candidate is worse': p = P(X <=
    better) for X ~ Binomial(better + worse, 1/2). Small p: more cases lost
    than chance explains."""
    return binom_cdf_half(better, better + worse)


# ==== strata run --report-json ====

def parse_run_report(path):
    """Timings, stream bytes per phase and per arm, route counters of one
    `strata run --report-json` file."""
    j = _load_json(path)
    if j.get("strata_report") != 1:
        raise ParseError(f"{path}: not a strata run report")
    if not j.get("ok"):
        raise ParseError(f"{path}: the run failed (ok is false)")
    t = j["timings"]
    r = {
        "prompt_ms": float(t["prompt_ms"]), "prompt_tokens": int(t["prompt_tokens"]),
        "gen_ms": float(t["gen_ms"]), "gen_tokens": int(t["generated_tokens"]),
        "policy": j["route"]["policy"], "reads_residency": bool(j["route"]["reads_residency"]),
        "arms": {}, "prompt_bytes": None, "decode_bytes": None,
    }
    st = j.get("stream")
    if st:
        r["prompt_bytes"] = int(st["phases"]["prompt"]["bytes"])
        r["decode_bytes"] = int(st["phases"]["decode"]["bytes"])
    for name, a in j["route"]["arms"].items():
        r["arms"][name] = {
            "rows": a["rows"], "rows_biased": a["rows_biased"], "slots_changed": a["slots_changed"],
            "lookups": a["lookups"], "lookups_exact": a["lookups_exact"],
            "masked_lookups": a["masked_lookups"], "masked_resident": a["masked_resident"],
            "masked_lookups_exact": a["masked_lookups_exact"], "masked_resident_exact": a["masked_resident_exact"],
            "stream": a.get("stream"),
        }
    return r


# ==== strata bench-ab results.json ====

def parse_abbench(path):
    """Per pair (A the baseline, B the candidate): prefill time ratio B/A,
    decode tok/s ratio B/A, request time ratio A/B (prefill + decode wall
    time; > 1: B faster) and the routing slots B's run changed (its
    report's route counters; None without a report), from `strata
    bench-ab`'s results.json."""
    j = _load_json(path)
    if "runs" not in j or "pair_results" not in j:
        raise ParseError(f"{path}: not a strata bench-ab results.json")
    runs = {}
    for run in j["runs"]:
        if run.get("phase") != "pair":
            continue
        m = run.get("metrics") or {}
        try:
            gen_ms = 1e3 * m["generated_tokens"] / m["gen_tok_s"] if m.get("gen_tok_s") else 0.0
            changed = None
            if run.get("report"):
                try:
                    rep = parse_run_report(run["report"])
                    changed = sum(a["slots_changed"] for a in rep["arms"].values())
                except (ParseError, KeyError):
                    changed = None
            runs[(run["index"], run["arm"])] = {"prefill_ms": float(m["prefill_ms"]), "gen_ms": gen_ms,
                                                "prompt_bytes": m.get("prompt_bytes"), "slots_changed": changed}
        except (KeyError, TypeError) as e:
            raise ParseError(f"{path}: run {run.get('run')} lacks {e}")
    pairs = []
    for p in j["pair_results"]:
        i = p["pair"]
        a, b = runs.get((i, "A")), runs.get((i, "B"))
        if not a or not b:
            raise ParseError(f"{path}: pair {i} lacks a run")
        pairs.append({
            "pair": i, "order": p.get("order"),
            "prefill_ratio": b["prefill_ms"] / a["prefill_ms"] if a["prefill_ms"] > 0 else float("nan"),
            "decode_ratio": p.get("decode_tok_s_ratio"),
            "request_speedup": (a["prefill_ms"] + a["gen_ms"]) / (b["prefill_ms"] + b["gen_ms"]),
            "bytes_ratio": p.get("bytes_ratio"), "slots_changed_b": b["slots_changed"],
        })
    if not pairs:
        raise ParseError(f"{path}: no measured pairs")
    return pairs


# ==== small statistics ====

def median(xs):
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def span(xs):
    """(median, min, max) of the finite values; a range is the observed
    min..max, a description of the draws, not a confidence interval."""
    ys = [x for x in xs if x is not None and not math.isnan(x)]
    if not ys:
        return (float("nan"), float("nan"), float("nan"))
    return (median(ys), min(ys), max(ys))


def fmt_span(t, digits=3):
    m, lo, hi = t
    if math.isnan(m):
        return "n/a"
    if lo == hi:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({lo:.{digits}f}..{hi:.{digits}f})"
