"""Held-out τ estimate, slot-1 accuracy and loss against supervised slot-tokens seen, from `train_log.jsonl` files.

    python examples/plot_training.py RUN_DIR [RUN_DIR ...] --output results/training_curve.png
    python examples/plot_training.py RUN_A RUN_B --chain   # RUN_B continued RUN_A (--init): one axis of tokens
    python examples/plot_training.py RUN --start start.json   # the starting drafter's level (eval_held_out.py --rows 32)

A run logs held-out estimates when trained with `--eval-every N` (teacher-forced τ on blocks of the target's own
greedy chain, bonus included; slot accuracy on random anchors of up to 32 held-out rows).
"""

import argparse
import json
from pathlib import Path


def read_log(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines() if line.strip()]


def load_runs(runs: list, chain: bool = False) -> list:
    """[(name, log)]; with `chain`, each run's slot_tokens continue from the previous run's last count."""
    out, offset = [], 0
    for run in map(Path, runs):
        log = read_log(run)
        if chain:
            log = [{**r, "slot_tokens": r["slot_tokens"] + offset} for r in log if "slot_tokens" in r]
            offset = log[-1]["slot_tokens"] if log else offset
        out.append((run.name, log))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="training output folders (with train_log.jsonl)")
    p.add_argument("--output", default="results/training_curve.png")
    p.add_argument("--chain", action="store_true",
                   help="each run continued the one before (--init): count its tokens after that run's last")
    p.add_argument("--start", action="append", default=[], metavar="JSON",
                   help="an examples/eval_held_out.py report on the same held-out rows (e.g. the drafter the runs "
                        "started from, with --rows 32): each of its drafters drawn as a dashed level")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, log in load_runs(args.runs, args.chain):
        evals = [r for r in log if r.get("held_out_tau_estimate") is not None]
        axes[0].plot([r["slot_tokens"] for r in evals], [r["held_out_tau_estimate"] for r in evals], "o-",
                     label=name)
        axes[1].plot([r["slot_tokens"] for r in evals], [r["held_out_slot_accuracy"][0] for r in evals], "o-",
                     label=name)
        axes[2].plot([r.get("slot_tokens", r["step"]) for r in log], [r["loss"] for r in log], label=name)
    for report in args.start:
        for name, m in json.loads(Path(report).read_text())["drafters"].items():
            for ax, value in zip(axes, (m["held_out_tau_estimate"], m["held_out_slot_accuracy"][0])):
                ax.axhline(value, linestyle="--", color="grey", label=f"{name} (eval_held_out)")
    for ax, title in zip(axes, ["held-out τ (teacher-forced estimate)", "held-out slot-1 accuracy", "training loss"]):
        ax.set_title(title)
        ax.set_xlabel("supervised slot-tokens seen" + (" (runs chained)" if args.chain else ""))
        ax.grid(alpha=0.3)
        ax.legend()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(args.output)


if __name__ == "__main__":
    main()
