"""Markdown table of the shipped drafters' benchmarks, from `dflash-retrace bench` JSON reports.

Each report is one run of `dflash-retrace bench --drafter <ReTrace> --compare dflash=<DFlash> [--no-memory-ablation]`:
the ReTrace drafter (`speculative`), the DFlash drafter (`speculative:dflash`) and, where asked, the ReTrace drafter
with its memory off (`speculative:no_memory`), all timed against the same plain `generate()` run.

    python examples/bench_table.py results/shipped/*.json            # prints the table
    python examples/bench_table.py results/shipped/*.json --json t.json

τ is pooled over all rounds (bonus token included); speedup = plain time / method time over the same prompts;
the ratio is τ(ReTrace)/τ(DFlash) from the same run. "mean" rows average the benchmarks with equal weight.
"""

import argparse
import json
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
        rows.append(row)
    return sorted(rows, key=lambda r: (r["T"], ["humaneval", "mt-bench", "gsm8k"].index(r["dataset"])
                                       if r["dataset"] in ("humaneval", "mt-bench", "gsm8k") else 9))


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def table(rows) -> str:
    out = ["| T | benchmark (prompts) | DFlash τ | DFlash speedup | ReTrace τ | ReTrace speedup | "
           "τ(ReTrace)/τ(DFlash) | ReTrace, memory off: τ | memory off: speedup |",
           "|---|---|---|---|---|---|---|---|---|"]
    for T in sorted({r["T"] for r in rows}):
        group = [r for r in rows if r["T"] == T]
        for r in group:
            g = lambda k, f: r[k] and r[k][f]  # noqa: E731
            out.append(f"| {T:g} | {r['dataset']} ({r['n']}) | {_f(g('dflash', 'tau'))} | {_f(g('dflash', 'speedup'))} | "
                       f"{_f(g('retrace', 'tau'))} | {_f(g('retrace', 'speedup'))} | {_f(r['ratio'], '.3f')} | "
                       f"{_f(g('no_memory', 'tau'))} | {_f(g('no_memory', 'speedup'))} |")
        if len(group) > 1:
            def mean(k, f):
                vals = [r[k][f] for r in group if r[k] and r[k][f] is not None]
                return sum(vals) / len(vals) if len(vals) == len(group) else None
            d, t = mean("dflash", "tau"), mean("retrace", "tau")
            out.append(f"| {T:g} | **mean** | {_f(d)} | {_f(mean('dflash', 'speedup'))} | {_f(t)} | "
                       f"{_f(mean('retrace', 'speedup'))} | {_f(t / d if t and d else None, '.3f')} | "
                       f"{_f(mean('no_memory', 'tau'))} | {_f(mean('no_memory', 'speedup'))} |")
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
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
