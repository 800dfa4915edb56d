"""Exact held-out τ of a drafter lineage against the supervised slot-tokens it has seen, from `replay` reports.

    python examples/plot_tau_vs_tokens.py results/tau_vs_tokens.json --output results/tau_vs_tokens.png

The spec is a JSON list of points, each naming the `dflash-retrace replay` report its τ comes from (so no figure is
typed by hand but the token count, which comes from the run's training log or summary):

    [{"label": "run 8", "slot_tokens": 26.5e6, "replay": "results/wip_run8/replay_heldout64_run78.json",
      "drafter": "main", "lineage": "2 layers, random init"}, ...]

`drafter` is the report's method key (`main` or a `--compare` name). Points sharing a `lineage` are joined by a line.
Every report must replay the same prompts (the same ids in the same order, token budget and temperature), or the
points would not compare: the script refuses a spec that mixes them. Prints one line per point and writes the plot
and, with `--json`, the points it read.
"""

import argparse
import json
from pathlib import Path


def _cell(report: dict) -> dict:
    """What must agree between reports: the prompts (by id, in order), the token budget and the temperature."""
    return {"prompts": [p["id"] for p in report["prompts"]], "max_new_tokens": report["config"]["max_new_tokens"],
            "temperature": report["config"]["temperature"]}


def read_points(spec_path: Path) -> list:
    """The spec's points with `tau` and `slot1` (per-slot acceptance of slot 1) read from their replay reports."""
    spec = json.loads(Path(spec_path).read_text())
    if not isinstance(spec, list) or not spec:
        raise ValueError(f"{spec_path}: expected a non-empty JSON list of points (see this script's docstring).")
    points, cell = [], None
    for i, point in enumerate(spec):
        missing = [k for k in ("label", "slot_tokens", "replay", "drafter") if k not in point]
        if missing:
            raise ValueError(f"{spec_path}: point {i} lacks {missing}; each point needs label, slot_tokens, replay "
                             "and drafter.")
        report = json.loads(Path(point["replay"]).read_text())
        methods = report["summary"]["methods"]
        if point["drafter"] not in methods:
            raise ValueError(f"{point['replay']} has no drafter {point['drafter']!r} (it has {sorted(methods)}): "
                             "use the report's method key, `main` or a --compare name.")
        this = _cell(report)
        if cell is None:
            cell, first = this, point["replay"]
        elif this != cell:
            what = [k for k in this if this[k] != cell[k]]
            raise ValueError(f"{point['replay']} and {first} differ in {what}: points on different prompts or "
                             "budgets do not compare; replay every drafter on the same prompts and budget.")
        m = methods[point["drafter"]]
        points.append({**point, "tau": m["tau_pooled"], "slot1": m["per_slot"]["rate"][0],
                       "num_rounds": m["num_rounds"], "num_prompts": len(this["prompts"]),
                       "max_new_tokens": this["max_new_tokens"]})
    return points


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="JSON list of points (see the docstring)")
    p.add_argument("--output", default="results/tau_vs_tokens.png")
    p.add_argument("--json", default=None, help="also write the points read, with their τ, here")
    args = p.parse_args(argv)
    points = read_points(Path(args.spec))
    for pt in points:
        print(f"{pt['label']:>24}  {pt['slot_tokens'] / 1e6:7.2f}M slot-tokens  τ {pt['tau']:.3f}  "
              f"slot-1 {pt['slot1']:.3f}  ({pt.get('lineage', '')})")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    lineages = list(dict.fromkeys(pt.get("lineage", "") for pt in points))
    for lineage in lineages:
        mine = sorted((pt for pt in points if pt.get("lineage", "") == lineage), key=lambda pt: pt["slot_tokens"])
        for ax, key in zip(axes, ("tau", "slot1")):
            ax.plot([pt["slot_tokens"] / 1e6 for pt in mine], [pt[key] for pt in mine], "o-", label=lineage or None)
            for pt in mine:
                ax.annotate(pt["label"], (pt["slot_tokens"] / 1e6, pt[key]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
    for ax, title in zip(axes, ("exact replayed greedy τ", "slot-1 acceptance")):
        ax.set_title(f"{title}\n{points[0]['num_prompts']} held-out prompts x {points[0]['max_new_tokens']} tokens")
        ax.set_xlabel("supervised slot-tokens seen (millions)")
        ax.grid(alpha=0.3)
        if any(lineages):
            ax.legend(fontsize=8)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(args.output)
    if args.json:
        Path(args.json).write_text(json.dumps(points, indent=1) + "\n")


if __name__ == "__main__":
    main()
