"""τ ratios of the selection benches (`select.sh`), pooled over the held-out splits, with a paired bootstrap.

    python results/retrace_sampled/pool.py results/retrace_sampled/bench/T1_*.json

Methods: `speculative` (the mixed stage), `speculative:greedy` (the greedy stage), `speculative:dflash` (the
backbone). τ is pooled over all rounds of all prompts; the intervals resample prompts (2,000 draws, seed 0), every
method keeping the same resampled prompts.
"""

import json
import random
import sys

NAMES = {"mixed": "speculative", "greedy": "speculative:greedy", "dflash": "speculative:dflash"}


def main(paths):
    prompts = []
    for path in paths:
        report = json.load(open(path))
        prompts += [p for p in report["prompts"] if all(m in p["methods"] for m in NAMES.values())]
    sums = [{k: (sum(p["methods"][m]["acceptance_lengths"]), len(p["methods"][m]["acceptance_lengths"]))
             for k, m in NAMES.items()} for p in prompts]

    def tau(rows, k):
        return sum(r[k][0] for r in rows) / sum(r[k][1] for r in rows)

    rng = random.Random(0)
    draws = [[rng.choice(sums) for _ in sums] for _ in range(2000)]
    out = {"prompts": len(prompts), "tau": {k: round(tau(sums, k), 4) for k in NAMES}}
    for a, b in (("mixed", "dflash"), ("greedy", "dflash"), ("mixed", "greedy")):
        ratios = sorted(tau(d, a) / tau(d, b) for d in draws)
        out[f"{a}/{b}"] = [round(tau(sums, a) / tau(sums, b), 4), round(ratios[50], 4), round(ratios[1949], 4)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
