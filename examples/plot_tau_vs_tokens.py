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

`--fit LINEAGE` fits τ = a + b ln(tokens) to that lineage's points (its last `--fit-last` ones), draws the fit,
prints the gain per doubling of each segment and of the fit, and the tokens at which the fit reaches each
`--targets` τ (with `--rate`, in hours of training at that many slot-tokens per second). A curve that bends below
its log fit reaches a target later than the fit says, so these are lower bounds on the tokens it needs:

    python examples/plot_tau_vs_tokens.py results/tau_vs_tokens.json --output results/tau_vs_tokens.png \
        --fit "2 layers, random init (committed WIP lineage)" --fit-last 3 --targets 2.0,3.0 --rate 1200
"""

import math

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


def log_fit(points: list, last: int | None = None) -> dict:
    """Least-squares τ = a + b ln(slot_tokens) over `points` (sorted by tokens; the last `last` of them)."""
    points = sorted(points, key=lambda pt: pt["slot_tokens"])
    if last is not None:
        if last < 2:
            raise ValueError(f"--fit-last {last}: a fit needs at least 2 points.")
        points = points[-last:]
    if len({pt["slot_tokens"] for pt in points}) < 2:
        raise ValueError(f"a log fit needs points at 2 or more token counts; got {len(points)} point(s).")
    xs = [math.log(pt["slot_tokens"]) for pt in points]
    ys = [pt["tau"] for pt in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    residual = max(abs(a + b * x - y) for x, y in zip(xs, ys))
    segments = [{"from": p["label"], "to": q["label"],
                 "gain_per_doubling": (q["tau"] - p["tau"]) / math.log2(q["slot_tokens"] / p["slot_tokens"])}
                for p, q in zip(points, points[1:]) if q["slot_tokens"] > p["slot_tokens"]]
    return {"a": a, "b": b, "gain_per_doubling": b * math.log(2), "max_residual": residual,
            "points": [pt["label"] for pt in points], "segments": segments}


def tokens_to_reach(fit: dict, tau: float) -> float | None:
    """Slot-tokens at which the fit reaches τ; None if it never does (a flat or falling fit)."""
    if fit["b"] <= 0:
        return None
    try:
        return math.exp((tau - fit["a"]) / fit["b"])
    except OverflowError:  # a nearly flat fit: beyond any count of tokens
        return math.inf


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="JSON list of points (see the docstring)")
    p.add_argument("--output", default="results/tau_vs_tokens.png")
    p.add_argument("--json", default=None, help="also write the points read, with their τ, here")
    p.add_argument("--fit", default=None, metavar="LINEAGE", help="fit τ = a + b ln(tokens) to this lineage")
    p.add_argument("--fit-last", type=int, default=None, help="fit only the lineage's last K points")
    p.add_argument("--targets", default="2.0,3.0", help="comma-separated τ values to project (with --fit)")
    p.add_argument("--rate", type=float, default=None, help="training slot-tokens per second, to print hours")
    args = p.parse_args(argv)
    points = read_points(Path(args.spec))
    for pt in points:
        print(f"{pt['label']:>24}  {pt['slot_tokens'] / 1e6:7.2f}M slot-tokens  τ {pt['tau']:.3f}  "
              f"slot-1 {pt['slot1']:.3f}  ({pt.get('lineage', '')})")
    fit = None
    if args.fit is not None:
        mine = [pt for pt in points if pt.get("lineage", "") == args.fit]
        if not mine:
            known = sorted({pt.get("lineage", "") for pt in points})
            raise SystemExit(f"--fit {args.fit!r}: no point has that lineage; the spec has {known}.")
        fit = log_fit(mine, args.fit_last)
        print(f"fit over {', '.join(fit['points'])}: τ = {fit['a']:.3f} + {fit['b']:.4f} ln(tokens), "
              f"{fit['gain_per_doubling']:+.3f} per doubling (largest residual {fit['max_residual']:.3f})")
        for seg in fit["segments"]:
            print(f"  {seg['from']} -> {seg['to']}: {seg['gain_per_doubling']:+.3f} per doubling")
        seen = max(pt["slot_tokens"] for pt in mine)
        fit["projections"] = []
        for tau in (float(t) for t in args.targets.split(",") if t.strip()):
            tokens = tokens_to_reach(fit, tau)
            more = None if tokens is None else max(tokens - seen, 0.0)
            hours = None if more is None or args.rate is None else more / args.rate / 3600
            fit["projections"].append({"tau": tau, "slot_tokens": tokens, "more_slot_tokens": more,
                                       "hours_more": hours, "rate": args.rate})
            if tokens is None:
                print(f"  τ {tau}: never (the fit does not rise)")
            else:
                extra = "" if hours is None else f", {hours:,.0f} h of training at {args.rate:,.0f} slot-tokens/s"
                print(f"  τ {tau}: at {tokens / 1e6:,.0f}M slot-tokens or more ({more / 1e6:,.0f}M beyond the "
                      f"lineage's {seen / 1e6:.1f}M{extra})")
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
    if fit is not None:
        lo = min(pt["slot_tokens"] for pt in points if pt.get("lineage", "") == args.fit and pt["label"] in fit["points"])
        hi = max(pt["slot_tokens"] for pt in points) * 1.3
        xs = [lo + (hi - lo) * i / 50 for i in range(51)]
        axes[0].plot([x / 1e6 for x in xs], [fit["a"] + fit["b"] * math.log(x) for x in xs], "--", color="gray",
                     label=f"log fit, {fit['gain_per_doubling']:+.3f} per doubling")
    for ax, title in zip(axes, ("exact replayed greedy τ", "slot-1 acceptance")):
        ax.set_title(f"{title}\n{points[0]['num_prompts']} held-out prompts x {points[0]['max_new_tokens']} tokens")
        ax.set_xlabel("supervised slot-tokens seen (millions)")
        ax.grid(alpha=0.3)
        if any(lineages) or fit is not None:
            ax.legend(fontsize=8)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(args.output)
    if args.json:
        out = points if fit is None else {"points": points, "fit": fit}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
