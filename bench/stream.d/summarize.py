#!/usr/bin/env python3
"""Summary of one bench/stream run directory: one table, then PASS/FAIL per target.

Usage: summarize.py OUT_DIR   (written by bench/stream; prints Markdown)
"""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]


def load(p):
    with open(p) as f:
        return json.load(f)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rng(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else (None, None)


def f(x, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x)


def mr(xs, fmt="{:.3f}"):
    """median (min..max)"""
    m = med(xs)
    lo, hi = rng(xs)
    if m is None:
        return "n/a"
    if len([x for x in xs if x is not None]) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} ({fmt.format(lo)}..{fmt.format(hi)})"


cfg = {}
for line in open(os.path.join(out, "config.txt")):
    if "=" in line:
        k, v = line.rstrip("\n").split("=", 1)
        cfg[k] = v


def ceiling(tag):
    p = os.path.join(out, f"ceiling-{tag}.txt")
    if not os.path.exists(p):
        return None
    m = re.search(r"median_gbs=([0-9.]+) min_gbs=([0-9.]+) max_gbs=([0-9.]+)", open(p).read())
    return tuple(float(x) for x in m.groups()) if m else None


ceil_tags = sorted(
    os.path.basename(p)[len("ceiling-"):-len(".txt")] for p in glob.glob(os.path.join(out, "ceiling-*.txt"))
)
ceils = {t: ceiling(t) for t in ceil_tags}
ceil_all = [c[0] for c in ceils.values() if c]
ceil_med = med(ceil_all)
ceil_lo = min(c[1] for c in ceils.values() if c) if ceil_all else None
ceil_hi = max(c[2] for c in ceils.values() if c) if ceil_all else None


def phase(rep, ph):
    s = rep.get("stream")
    return None if not s else s["phases"].get(ph)


def per_token_bytes(p):
    return p["bytes"] / p["rows"] if p and p.get("rows") else None


def wait_frac(p):
    return p["wait_ms"] / p["host_ms"] if p and p.get("host_ms") else None


# ---- miss-dominated arms (--arena 0; tiny arena + read-ahead), each next to its own ceiling ----
def miss_arm(prefix):
  res = []
  for p in sorted(glob.glob(os.path.join(out, prefix + "-*.report.json"))):
    i = os.path.basename(p)[len(prefix) + 1:-len(".report.json")]
    rep = load(p)
    d = phase(rep, "decode")
    c = ceils.get(i)
    eff = d["effective_gbps"] if d else None
    io_gbs = d["bytes"] / d["wait_ms"] / 1e6 if d and d.get("wait_ms") else None
    res.append(dict(eff=eff, ceil=c[0] if c else None, frac=(eff / c[0]) if (eff and c) else None,
                     io_gbs=io_gbs, miss=d["miss_fraction"] if d else None, wait=wait_frac(d),
                     tok_s=rep["timings"]["gen_tok_s"], bpt=per_token_bytes(d)))
  return res


miss = miss_arm("miss")
tiny = miss_arm("tiny")


# ---- bench-ab pairs ----
def ab(name):
    p = os.path.join(out, name, "results.json")
    if not os.path.exists(p):
        return None
    r = load(p)
    runs = {}
    for run in r["runs"]:
        if run.get("phase") == "warmup":
            continue
        rep = load(run["report"]) if run.get("report") and os.path.exists(run["report"]) else None
        runs.setdefault(run["index"], {})[run["arm"]] = dict(m=run["metrics"], rep=rep)
    pairs = []
    for pr in r["pair_results"]:
        a = runs[pr["pair"]]["A"]
        b = runs[pr["pair"]]["B"]
        pairs.append(dict(
            a_dec=a["m"].get("gen_tok_s"), b_dec=b["m"].get("gen_tok_s"),
            a_pre=a["m"].get("prompt_tok_s"), b_pre=b["m"].get("prompt_tok_s"),
            dec_ratio=pr.get("decode_tok_s_ratio"), a_load=a["m"].get("load_ms"), b_load=b["m"].get("load_ms"),
            pre_ratio=(b["m"]["prompt_tok_s"] / a["m"]["prompt_tok_s"])
            if a["m"].get("prompt_tok_s") and b["m"].get("prompt_tok_s") else None,
            equal=pr.get("output_equal"), b_rep=b["rep"], prompt_tokens=b["m"].get("prompt_tokens")))
    return pairs


dec = ab("ab-decode") or []
pre = ab("ab-prefill") or []


def stream_stats(pairs, ph):
    ps = [phase(x["b_rep"], ph) for x in pairs if x["b_rep"]]
    ps = [p for p in ps if p]
    return dict(
        bpt=[per_token_bytes(p) for p in ps], hit=[p["hit_fraction"] for p in ps],
        ahead=[p["ahead_fraction"] for p in ps], miss=[p["miss_fraction"] for p in ps],
        eff=[p["effective_gbps"] for p in ps], wait=[wait_frac(p) for p in ps],
        prec=[p.get("prefetch_precision") for p in ps])


sd = stream_stats(dec, "decode")
sp = stream_stats(pre, "prompt")

# ---- warm arm ----
warm = []
for p in sorted(glob.glob(os.path.join(out, "warm-*.report.json"))):
    rep = load(p)
    d = phase(rep, "decode")
    w = rep["stream"].get("warm", {})
    warm.append(dict(tok_s=rep["timings"]["gen_tok_s"], hit=d["hit_fraction"] if d else None,
                     miss=d["miss_fraction"] if d else None, wait=wait_frac(d),
                     fill=w.get("experts"), fill_ms=w.get("ms"), fill_bytes=w.get("bytes")))

# ---- table ----
MB = 1e6
L = []
L.append(f"model {os.path.basename(cfg.get('model', '?'))}: {int(cfg['model_bytes']) / 1e9:.2f} GB; "
         f"memory limit {int(cfg['mem_limit']) / 2**30:.2f} GiB (cgroup {cfg.get('cgroup')}; "
         f"model/limit {int(cfg['model_bytes']) / int(cfg['mem_limit']):.2f}x); expert blob {cfg['blob']} bytes; "
         f"queue depth {cfg['qd']}; {cfg['threads']} threads; {cfg.get('date_utc')} git {cfg.get('git')}")
L.append(f"streamed arm: --arena {cfg['arena']} --read-ahead {cfg['read_ahead']} --io-depth {cfg['qd']}; "
         f"mmap arm: no --arena; decode -n {cfg['n_decode']}, {cfg['pairs']} alternating pairs each")
L.append("")
L.append("| figure | mmap | streamed | streamed/mmap |")
L.append("|---|---|---|---|")
L.append(f"| decode tok/s, median (min..max) | {mr([x['a_dec'] for x in dec], '{:.2f}')} | "
         f"{mr([x['b_dec'] for x in dec], '{:.2f}')} | {mr([x['dec_ratio'] for x in dec], '{:.1f}x')} |")
ptok = pre[0]["prompt_tokens"] if pre else None
L.append(f"| prefill tok/s ({ptok} tokens) | {mr([x['a_pre'] for x in pre], '{:.2f}')} | "
         f"{mr([x['b_pre'] for x in pre], '{:.2f}')} | {mr([x['pre_ratio'] for x in pre], '{:.2f}x')} |")
L.append(f"| load ms (decode pairs) | {mr([x['a_load'] for x in dec], '{:.0f}')} | {mr([x['b_load'] for x in dec], '{:.0f}')} | |")
L.append(f"| output byte-identical (pairs) | | | decode {sum(1 for x in dec if x['equal'])}/{len(dec)}, "
         f"prefill {sum(1 for x in pre if x['equal'])}/{len(pre)} |")
L.append("")
L.append("| streamed figure | decode | prefill |")
L.append("|---|---|---|")
L.append(f"| bytes read per token (MB) | {mr([b / MB for b in sd['bpt'] if b], '{:.1f}')} | "
         f"{mr([b / MB for b in sp['bpt'] if b], '{:.1f}')} |")
L.append(f"| in arena / streamed ahead / missed | {f(med(sd['hit']))} / {f(med(sd['ahead']))} / {f(med(sd['miss']))} | "
         f"{f(med(sp['hit']))} / {f(med(sp['ahead']))} / {f(med(sp['miss']))} |")
L.append(f"| read-ahead precision | {f(med(sd['prec']))} | {f(med(sp['prec']))} |")
L.append(f"| effective read GB/s (bytes / host time) | {mr(sd['eff'])} | {mr(sp['eff'])} |")
L.append(f"| ... as a fraction of the ceiling median {f(ceil_med)} | "
         f"{f(med(sd['eff']) / ceil_med if ceil_med and med(sd['eff']) else None, '{:.2f}')} | "
         f"{f(med(sp['eff']) / ceil_med if ceil_med and med(sp['eff']) else None, '{:.2f}')} |")
L.append(f"| waiting / host time | {mr(sd['wait'], '{:.2f}')} | {mr(sp['wait'], '{:.2f}')} |")
L.append("")
L.append("| disk ceiling and the other arms | figure |")
L.append("|---|---|")
L.append(f"| disk ceiling: random O_DIRECT reads of {cfg['blob']} B at QD {cfg['qd']} (io_uring), "
         f"medians of 10 x 0.5 s windows of continuous reading | " + ", ".join(f"{t}: {f(c[0])}" for t, c in ceils.items() if c)
         + f" GB/s; all windows {f(ceil_lo)}..{f(ceil_hi)} |")
L.append(f"| miss-dominated (--arena 0) decode: missed | {mr([m['miss'] for m in miss])} |")
L.append(f"| ... effective GB/s (bytes / host time) | {mr([m['eff'] for m in miss])} |")
L.append(f"| ... as a fraction of the neighbouring ceiling | {mr([m['frac'] for m in miss], '{:.2f}')} |")
L.append(f"| ... GB/s while waiting (bytes / wait time) | {mr([m['io_gbs'] for m in miss])} |")
L.append(f"| ... decode tok/s, MB per token, waiting / host | {mr([m['tok_s'] for m in miss], '{:.2f}')}, "
         f"{mr([m['bpt'] / MB for m in miss if m['bpt']], '{:.1f}')}, {mr([m['wait'] for m in miss], '{:.2f}')} |")
L.append(f"| tiny arena (--arena {cfg.get('tiny_arena')} --read-ahead {cfg['read_ahead']}) decode: in arena+ahead / missed | "
         f"{mr([1 - m['miss'] for m in tiny if m['miss'] is not None])} / {mr([m['miss'] for m in tiny])} |")
L.append(f"| ... effective GB/s, fraction of the neighbouring ceiling | {mr([m['eff'] for m in tiny])}, "
         f"{mr([m['frac'] for m in tiny], '{:.2f}')} |")
L.append(f"| ... decode tok/s, MB per token, waiting / host | {mr([m['tok_s'] for m in tiny], '{:.2f}')}, "
         f"{mr([m['bpt'] / MB for m in tiny if m['bpt']], '{:.1f}')}, {mr([m['wait'] for m in tiny], '{:.2f}')} |")
L.append(f"| warm arena (--arena {cfg['warm_arena']} --profile of the request, -n {cfg['warm_n']}): "
         f"decode in arena / missed | {mr([w['hit'] for w in warm])} / {mr([w['miss'] for w in warm])} |")
L.append(f"| ... waiting / host time, decode tok/s | {mr([w['wait'] for w in warm], '{:.3f}')}, "
         f"{mr([w['tok_s'] for w in warm], '{:.2f}')} |")
L.append(f"| ... warm fill (init) | " + ", ".join(
    f"{w['fill']} experts {w['fill_bytes'] / 1e9 if w['fill_bytes'] else 0:.2f} GB in {w['fill_ms'] or 0:.0f} ms"
    for w in warm) + " |")
if "cgroup_max_usage" in cfg:
    try:
        L.append(f"| cgroup peak usage / failcnt | {int(cfg['cgroup_max_usage']) / 2**30:.2f} GiB / {cfg.get('cgroup_failcnt', 'n/a')} |")
    except ValueError:
        pass
L.append(f"| benchmark wall time | {cfg.get('wall_s', '?')} s |")
L.append("")

# ---- targets ----
t1 = med([m["frac"] for m in miss])
t2 = med([w["wait"] for w in warm])
t3 = med([x["dec_ratio"] for x in dec])
ident = bool(dec) and all(x["equal"] for x in dec)


def verdict(ok):
    return "PASS" if ok else "FAIL"


L.append("| target | measured | verdict |")
L.append("|---|---|---|")
L.append(f"| misses dominate (--arena 0): effective read bandwidth >= 85% of the ceiling at QD {cfg['qd']} | "
         f"{f(t1, '{:.0%}')} (per run {', '.join(f(m['frac'], '{:.0%}') for m in miss)}) | "
         f"{verdict(t1 is not None and t1 >= 0.85)} |")
t1b = med([m["frac"] for m in tiny])
L.append(f"| same, tiny arena + read-ahead (misses {f(med([m['miss'] for m in tiny]))}) | "
         f"{f(t1b, '{:.0%}')} (per run {', '.join(f(m['frac'], '{:.0%}') for m in tiny)}) | "
         f"{verdict(t1b is not None and t1b >= 0.85)} |")
L.append(f"| arena holds the working set: waiting < 10% of host time (decode) | "
         f"{f(t2, '{:.1%}')} (in arena {f(med([w['hit'] for w in warm]))}) | {verdict(t2 is not None and t2 < 0.10)} |")
L.append(f"| decode >= 10x mmap at the same memory limit, byte-identical output | {f(t3, '{:.1f}x')} "
         f"(min {f(rng([x['dec_ratio'] for x in dec])[0], '{:.1f}x')}), identical "
         f"{sum(1 for x in dec if x['equal'])}/{len(dec)} | {verdict(t3 is not None and t3 >= 10 and ident)} |")
print("\n".join(L))
