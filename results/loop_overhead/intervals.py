"""95% paired-bootstrap intervals of the overhead ratios in `bench --baselines` reports (the figures `bench` now prints
itself; these reports were written before it did). Usage: python results/loop_overhead/intervals.py REPORT.json ..."""

import json
import sys

from dflash_retrace.evaluation.metrics import paired_ratio_interval

for path in sys.argv[1:]:
    report = json.load(open(path))
    rows = [p["methods"] for p in report["prompts"]]
    for other in ("zlab_reference", "transformers_builtin"):
        both = [m for m in rows if m.get(other, {}).get("error") is None and m["speculative"]["error"] is None]
        ours, theirs = [m["speculative"] for m in both], [m[other] for m in both]
        total = [sum(m["total_s"] for m in side) for side in (ours, theirs)]
        per_round = [sum(m["decode_s"] for m in side) / sum(m["rounds"] for m in side) for side in (ours, theirs)]
        e2e = paired_ratio_interval([(a["total_s"], 1, b["total_s"], 1) for a, b in zip(ours, theirs)])
        rnd = paired_ratio_interval([(a["decode_s"], a["rounds"], b["decode_s"], b["rounds"]) for a, b in zip(ours, theirs)])
        print(f"{path}: speculative / {other} over {len(both)} prompts: end to end {total[0] / total[1]:.3f} "
              f"[{e2e[0]:.3f}, {e2e[1]:.3f}], per round {per_round[0] / per_round[1]:.3f} [{rnd[0]:.3f}, {rnd[1]:.3f}] "
              f"({1000 * per_round[0]:.1f} against {1000 * per_round[1]:.1f} ms)")
