"""Markdown table of the shipped drafters' benchmarks, from `dflash-retrace bench` JSON reports.

Each report is one run of `dflash-retrace bench --drafter <ReTrace> --compare dflash=<DFlash> [--no-memory-ablation]`:
the ReTrace drafter (`speculative`), the DFlash drafter (`speculative:dflash`) and, where asked, the ReTrace drafter
with its memory off (`speculative:no_memory`), all timed against the same plain `generate()` run.

    python examples/bench_table.py results/shipped/*.json            # prints the table
    python examples/bench_table.py results/shipped/*.json --json t.json

τ is pooled over all rounds (bonus token included); the ratio is τ(ReTrace)/τ(DFlash) from the same run. Every
figure of a row (τ, speedups, ratios, intervals, output identity) is over one prompt set: the prompts that plain
generate() and every method of the report completed; the benchmark cell says how many that is when some prompts had
an error. Speedup (†): at T=0 plain time / method time (greedy: the same outputs up to near-ties); at T > 0 the
decode-rate ratio, the method's decode tokens/s over plain's (prefill excluded), since sampled outputs differ in
length and a time ratio would compare different work. "mean" rows average the benchmarks with equal weight.
The last two columns are the noise floor: 95% intervals of τ(ReTrace)/τ(DFlash) and of τ(memory on)/τ(memory off)
from a paired bootstrap over prompts (both methods keep the same resampled prompts), so a ratio whose interval
holds 1 is not a measured difference.
"""

import argparse
import json
import random
from pathlib import Path

from dflash_retrace.evaluation.metrics import tau_pooled

COLUMNS = {"dflash": "speculative:dflash", "retrace": "speculative", "no_memory": "speculative:no_memory"}
PLAIN = "plain"
FOOTNOTE = ("† speedup: at T=0 plain generate()'s time over the method's on the same prompts (greedy: the same "
            "outputs, up to near-ties outside fp32); at T > 0 the decode-rate ratio, the method's decode tokens/s over "
            "plain's (prefill excluded): sampled outputs differ in length, so a time ratio would compare different "
            "work.")


def _div(a, b):
    return a / b if a is not None and b else None


def _method_figures(ok, method, plain_rate):
    """τ, time speedup, decode-rate ratio and slot-1 acceptance of `method` over the prompts `ok`, as bench sums them."""
    runs = [p["methods"][method] for p in ok]
    lengths = [n for m in runs for n in m["acceptance_lengths"]]
    proposals = [k for m in runs for k in m["num_proposals"]]
    turns = sum(p["turns"] for p in ok)  # each turn's first token is the prefill's
    rate = _div(sum(m["new_tokens"] for m in runs) - turns, sum(m["decode_s"] for m in runs))
    return {"tau": tau_pooled([m["acceptance_lengths"] for m in runs]),
            "speedup": _div(sum(p["methods"][PLAIN]["total_s"] for p in ok), sum(m["total_s"] for m in runs)),
            "decode_rate_ratio": _div(rate, plain_rate),
            "slot1": _div(sum(n >= 2 for n in lengths), sum(k >= 1 for k in proposals))}


def read(paths):
    rows = []
    for path in paths:
        report = json.loads(Path(path).read_text())
        config, methods = report["config"], report["summary"]["methods"]
        if "speculative:dflash" not in methods:
            raise SystemExit(f"{path}: not a --compare dflash=... run (methods: {sorted(methods)})")
        present = {k: m for k, m in COLUMNS.items() if m in methods}
        # One prompt set for every figure of the row: the prompts plain and every method completed.
        ok = [p for p in report["prompts"] if all(p["methods"][m]["error"] is None for m in (PLAIN, *present.values()))]
        n = report["summary"]["num_prompts"]
        row = {"file": str(path), "dataset": Path(config["dataset"]).stem, "T": config["temperature"],
               "n": n, "n_ok": len(ok), "errors": n - len(ok), "max_new_tokens": config["max_new_tokens"],
               "exact": {k: _div(sum(p["methods"][m]["agrees_with_plain"] for p in ok), len(ok))
                         for k, m in present.items()}}
        plain = [p["methods"][PLAIN] for p in ok]
        plain_rate = _div(sum(m["new_tokens"] for m in plain) - sum(p["turns"] for p in ok),
                          sum(m["decode_s"] for m in plain))
        for key, method in COLUMNS.items():
            row[key] = _method_figures(ok, method, plain_rate) if method in methods else None
        row["ratio"] = _div(row["retrace"]["tau"], row["dflash"]["tau"])
        # per prompt: (tokens committed by rounds, rounds) for each method; the pooled τ is sum / sum
        row["per_prompt"] = {k: [(sum(p["methods"][m]["acceptance_lengths"]), len(p["methods"][m]["acceptance_lengths"]))
                                 for p in ok] for k, m in present.items()}
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
    if any(num not in r["per_prompt"] or den not in r["per_prompt"] or not r["per_prompt"][num] for r in group):
        return None  # a method missing, or a report without a prompt every method completed
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


def _value(r, key, field):
    """A row's figure; "speed" is the time speedup at T=0 and the decode-rate ratio at T > 0 (see FOOTNOTE)."""
    if r[key] is None:
        return None
    if field == "speed":
        field = "speedup" if r["T"] == 0 else "decode_rate_ratio"
    return r[key][field]


def _prompts_cell(r) -> str:
    if not r["errors"]:
        return f"{r['dataset']} ({r['n']})"
    return f"{r['dataset']} ({r['n_ok']} of {r['n']}; {r['errors']} with errors)"


def table(rows) -> str:
    out = ["| T | benchmark (prompts) | DFlash τ | DFlash speedup† | ReTrace τ | ReTrace speedup† | "
           "τ(ReTrace)/τ(DFlash) | ReTrace, memory off: τ | memory off: speedup† | "
           "τ(ReTrace)/τ(DFlash), 95% CI | τ(memory on)/τ(memory off), 95% CI |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for T in sorted({r["T"] for r in rows}):
        group = [r for r in rows if r["T"] == T]
        for r in group:
            g = lambda k, f: _value(r, k, f)  # noqa: E731
            out.append(f"| {T:g} | {_prompts_cell(r)} | {_f(g('dflash', 'tau'))} | {_f(g('dflash', 'speed'))} | "
                       f"{_f(g('retrace', 'tau'))} | {_f(g('retrace', 'speed'))} | {_f(r['ratio'], '.3f')} | "
                       f"{_f(g('no_memory', 'tau'))} | {_f(g('no_memory', 'speed'))} | "
                       f"{_ci([r], 'retrace', 'dflash')} | {_ci([r], 'retrace', 'no_memory')} |")
        if len(group) > 1:
            def mean(k, f):
                vals = [v for v in (_value(r, k, f) for r in group) if v is not None]
                return sum(vals) / len(vals) if len(vals) == len(group) else None
            d, t = mean("dflash", "tau"), mean("retrace", "tau")
            out.append(f"| {T:g} | **mean** | {_f(d)} | {_f(mean('dflash', 'speed'))} | {_f(t)} | "
                       f"{_f(mean('retrace', 'speed'))} | {_f(t / d if t and d else None, '.3f')} | "
                       f"{_f(mean('no_memory', 'tau'))} | {_f(mean('no_memory', 'speed'))} | "
                       f"{_ci(group, 'retrace', 'dflash')} | {_ci(group, 'retrace', 'no_memory')} |")
    return "\n".join(out)


def _greedy_verdict(rows) -> str:
    zero = [r for r in rows if r["T"] == 0]
    if not zero:
        return "n/a (no T=0 report)"
    compared, errors = sum(r["n_ok"] for r in zero), sum(r["errors"] for r in zero)
    if not compared:
        return "n/a (no prompt completed by every method)"
    verdict = str(all(v == 1.0 for r in zero if r["n_ok"] for v in r["exact"].values()))
    if errors:
        verdict += f" over the {compared} prompts every method completed, {errors} with errors not compared"
    return verdict


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="bench JSON files")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = read(args.reports)
    print(table(rows))
    print(f"\n{FOOTNOTE}")
    for r in rows:
        if r["errors"]:
            print(f"{r['file']}: {r['errors']} of {r['n']} prompts had an error in some method; every figure of its "
                  f"row is over the other {r['n_ok']}")
    print(f"\ngreedy (T=0) outputs identical to plain generate() for every method and prompt: {_greedy_verdict(rows)}")
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
