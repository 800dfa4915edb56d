"""The table of `bench_fp32.sh`'s reports: per method τ, speedup over plain generate(), ms a round, and τ of the main
drafter (run 29 + lookup) over each other one with the 95% paired bootstrap over prompts.

    python results/context_lookup/bench_summary.py results/context_lookup/bench_fp32_T0_*.json
"""
import json
import sys

from dflash_retrace.evaluation.replay import paired_tau_ratio_interval

MAIN = "speculative"


def rows(path: str) -> list:
    report = json.load(open(path))
    methods = report["summary"]["methods"]
    out = []
    for name, m in methods.items():
        if name == "plain":
            continue
        cell = "1"
        if name != MAIN:
            num, den = ([p["methods"][n]["acceptance_lengths"] for p in report["prompts"]] for n in (MAIN, name))
            lo, hi = paired_tau_ratio_interval(num, den)
            cell = f"{m and methods[MAIN]['tau_pooled'] / m['tau_pooled']:.3f} [{lo:.3f}, {hi:.3f}]"
        out.append(f"| {report['config']['dataset']} ({report['config']['num_prompts']}) | {name} | "
                   f"{m['tau_pooled']:.3f} | {m['speedup']:.3f}x | {m['ms_per_round']:.1f} | {cell} | "
                   f"{m['agreement']['exact_rate']:.0%} |")
    return out


if __name__ == "__main__":
    print("| set (prompts) | method | τ | speedup | ms a round | τ(main)/τ [95% CI] | = plain |")
    print("|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        print("\n".join(rows(path)))
