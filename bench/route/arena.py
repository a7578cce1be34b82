#!/usr/bin/python3
"""arena.py STRATA MODEL FRAC: print an arena size (in K) that holds about
FRAC of the model's routed experts as the store lays them out: FRAC x
n_layer x n_expert x slot bytes, where the slot bytes (per size class,
page-aligned for O_DIRECT, so larger than the raw tensor bytes) come from a
one-token run's --report-json and n_expert from `strata inspect`."""
import json
import os
import re
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 4:
        print("usage: arena.py STRATA MODEL FRAC", file=sys.stderr)
        return 2
    strata, model, frac = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ins = subprocess.run([strata, "inspect", model, "--no-tensors"], capture_output=True, text=True)
    m = re.search(r"\.expert_count\s+\S+\s+(\d+)", ins.stdout)
    if ins.returncode or not m:
        print(f"arena.py: cannot read the expert count of {model}", file=sys.stderr)
        return 1
    n_expert = int(m.group(1))
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "r.json")
        r = subprocess.run([strata, "run", "-m", model, "-p", "a", "-n", "1", "--temp", "0", "-t", "1",
                            "--arena", "0", "--report-json", rep], capture_output=True, text=True)
        if r.returncode:
            print(f"arena.py: the probe run failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        cls = json.load(open(rep))["stream"]["config"]["size_classes"]
    total = sum(c["slot_bytes"] * c["layers"] * n_expert for c in cls)
    print(f"{max(1, int(total * frac / 1024))}K")
    return 0


if __name__ == "__main__":
    sys.exit(main())
