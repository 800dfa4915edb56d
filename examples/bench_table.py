"""Markdown table of the shipped drafters' benchmarks, from `dflash-retrace bench` JSON reports.

Each report is one run of `dflash-retrace bench --drafter <ReTrace> --compare dflash=<DFlash> [--no-memory-ablation]`:
the ReTrace drafter (`speculative`), the DFlash drafter (`speculative:dflash`) and, where asked, the ReTrace drafter
with its memory off (`speculative:no_memory`), all timed against the same plain `generate()` run.

    python examples/bench_table.py results/shipped/*.json            # prints the table
    python examples/bench_table.py results/shipped/*.json --json t.json

τ is pooled over all rounds (bonus token included); speedup = plain time / method time over the same prompts;
the ratio is τ(ReTrace)/τ(DFlash) from the same run. "mean" rows average the benchmarks with equal weight.
The last two columns are the noise floor: 95% intervals of τ(ReTrace)/τ(DFlash) and of τ(memory on)/τ(memory off)
from a paired bootstrap over prompts (both methods keep the same resampled prompts), so a ratio whose interval
holds 1 is not a measured difference.
"""

import argparse
import json
import random
from pathlib import Path

COLUMNS = {"dflash": "speculative:dflash", "retrace": "speculative", "no_memory": "speculative:no_memory"}


def read(paths):
    rows = []
    for path in paths:
        report = json.loads(Path(path).read_text())
        config, methods = report["config"], report["summary"]["methods"]
        if "speculative:dflash" not in methods:
            raise SystemExit(f"{path}: not a --compare dflash=... run (methods: {sorted(methods)})")
        row = {"file": str(path), "dataset": Path(config["dataset"]).stem, "T": config["temperature"],
               "n": report["summary"]["num_prompts"], "max_new_tokens": config["max_new_tokens"],
               "exact": {k: methods[m]["agreement"]["exact_rate"] for k, m in COLUMNS.items() if m in methods}}
        for key, method in COLUMNS.items():
            m = methods.get(method)
            row[key] = None if m is None else {"tau": m["tau_pooled"], "speedup": m["speedup"],
                                                "slot1": (m["per_slot"]["rate"] or [None])[0]}
        row["ratio"] = report["summary"]["tau_ratios"]["speculative/speculative:dflash"]
        ok = [p["methods"] for p in report["prompts"]
              if all(p["methods"][m]["error"] is None for m in COLUMNS.values() if m in p["methods"])]
        # per prompt: (tokens committed by rounds, rounds) for each method; the pooled τ is sum / sum
        row["per_prompt"] = {k: [(sum(p[m]["acceptance_lengths"]), len(p[m]["acceptance_lengths"])) for p in ok]
                             for k, m in COLUMNS.items() if m in methods}
        rows.append(row)
    return sorted(rows, key=lambda r: (r["T"], ["humaneval", "mt-bench", "gsm8k"].index(r["dataset"])
                                       if r["dataset"] in ("humaneval", "mt-bench", "gsm8k") else 9))


def _tau(counts, index=None):
    index = range(len(counts)) if index is None else index
    committed, rounds = sum(counts[i][0] for i in index), sum(counts[i][1] for i in index)
    return committed / rounds if rounds else float("nan")


def bootstrap_ratio(group, num, den, reps=2000, seed=0):
    """95% interval of mean_r τ_num / mean_r τ_den over the reports in `group` (each τ pooled over its prompts),
    resampling each report's prompts with replacement, the same draw for both methods (a paired bootstrap)."""
    if any(num not in r["per_prompt"] or den not in r["per_prompt"] for r in group):
        return None
    rng, ratios = random.Random(seed), []
    for _ in range(reps):
        tau_num = tau_den = 0.0
        for r in group:
            n = len(r["per_prompt"][num])
            index = [rng.randrange(n) for _ in range(n)]
            tau_num += _tau(r["per_prompt"][num], index)
            tau_den += _tau(r["per_prompt"][den], index)
        ratios.append(tau_num / tau_den)
    ratios.sort()
    return ratios[int(0.025 * reps)], ratios[int(0.975 * reps) - 1]


def _ci(group, num, den):
    bounds = bootstrap_ratio(group, num, den)
    if bounds is None:
        return "-"
    point = sum(_tau(r["per_prompt"][num]) for r in group) / sum(_tau(r["per_prompt"][den]) for r in group)
    return f"{point:.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def table(rows) -> str:
    out = ["| T | benchmark (prompts) | DFlash τ | DFlash speedup | ReTrace τ | ReTrace speedup | "
           "τ(ReTrace)/τ(DFlash) | ReTrace, memory off: τ | memory off: speedup | "
           "τ(ReTrace)/τ(DFlash), 95% CI | τ(memory on)/τ(memory off), 95% CI |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for T in sorted({r["T"] for r in rows}):
        group = [r for r in rows if r["T"] == T]
        for r in group:
            g = lambda k, f: r[k] and r[k][f]  # noqa: E731
            out.append(f"| {T:g} | {r['dataset']} ({r['n']}) | {_f(g('dflash', 'tau'))} | {_f(g('dflash', 'speedup'))} | "
                       f"{_f(g('retrace', 'tau'))} | {_f(g('retrace', 'speedup'))} | {_f(r['ratio'], '.3f')} | "
                       f"{_f(g('no_memory', 'tau'))} | {_f(g('no_memory', 'speedup'))} | "
                       f"{_ci([r], 'retrace', 'dflash')} | {_ci([r], 'retrace', 'no_memory')} |")
        if len(group) > 1:
            def mean(k, f):
                vals = [r[k][f] for r in group if r[k] and r[k][f] is not None]
                return sum(vals) / len(vals) if len(vals) == len(group) else None
            d, t = mean("dflash", "tau"), mean("retrace", "tau")
            out.append(f"| {T:g} | **mean** | {_f(d)} | {_f(mean('dflash', 'speedup'))} | {_f(t)} | "
                       f"{_f(mean('retrace', 'speedup'))} | {_f(t / d if t and d else None, '.3f')} | "
                       f"{_f(mean('no_memory', 'tau'))} | {_f(mean('no_memory', 'speedup'))} | "
                       f"{_ci(group, 'retrace', 'dflash')} | {_ci(group, 'retrace', 'no_memory')} |")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="bench JSON files")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = read(args.reports)
    print(table(rows))
    lossless = all(v == 1.0 for r in rows if r["T"] == 0 for v in r["exact"].values())
    print(f"\ngreedy (T=0) outputs identical to plain generate() for every method and prompt: {lossless}")
    for T in sorted({r["T"] for r in rows}):
        group = [r for r in rows if r["T"] == T and "no_memory" in r["per_prompt"]]
        if group:  # the ablation's other half: ReTrace weights without memory against the DFlash backbone
            cells = [f"{r['dataset']} {_ci([r], 'no_memory', 'dflash')}" for r in group]
            if len(group) > 1:
                cells.append(f"mean {_ci(group, 'no_memory', 'dflash')}")
            print(f"T={T:g}: what the ReTrace-stage training did to the backbone, τ(memory off)/τ(DFlash), 95% CI: "
                  + "; ".join(cells))
    if args.json:
        for r in rows:
            group = [r]
            r["ratio_ci95"] = bootstrap_ratio(group, "retrace", "dflash")
            r["memory_ratio_ci95"] = bootstrap_ratio(group, "retrace", "no_memory")
            r.pop("per_prompt")
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
