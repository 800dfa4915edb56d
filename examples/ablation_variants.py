"""Ablation of the drafter variants against plain DFlash: same data, same supervised tokens, same seed.

Every variant is trained from the same DFlash drafter (`--init`; the variants' new weights start at zero, so each
starts as an exact copy of it) on the same feature store for the same number of updates with the same seed; the
`dflash` entry gets the same updates with no option, so every difference is the option's. Then one
`dflash-retrace bench` per (set, temperature) times plain `generate()` once and every drafter against it on the same
prompts, and the table reports τ, τ(variant)/τ(DFlash) with a paired-bootstrap 95% interval over prompts, slot-1
acceptance, per-slot acceptance and the cost of a round.

    python examples/ablation_variants.py --target smollm2-135m-instruct --features STORE \\
        --init checkpoints/smollm2-135m-instruct-dflash-b8-wip --out results/ablation --steps 200 \\
        --datasets humaneval:164,mt-bench:80,gsm8k:128 --temperatures 0,1 --max-new-tokens 64

`--replay`: the T=0 cells come from `dflash-retrace replay` instead of `bench` (the exact rounds greedy generation
records, from one target forward per turn and each drafter's own forwards; no verify, so ~10x cheaper per variant on
a CPU, which is what makes the full sets fit; no speedup column, the drafter's cost per round instead), in
`--replay-dtype` (fp32 by default). Plain generate() outputs are cached in OUT/references-SET.jsonl (a copy of any
cache with the same target, dtype and budget can seed it). `--sample-datasets` gives the T > 0 cells, which need
`bench`, their own (smaller) prompt counts. `--jobs 2` trains two variants (and measures two cells) at a time.

Resumable: a variant whose folder has `summary.json` is not retrained, a bench JSON that exists is not rerun.
Writes OUT/ablation.json (every figure) and OUT/ablation.png (τ ratios with intervals; per-slot acceptance), and
prints a Markdown table.
"""

import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dflash_retrace.evaluation.replay import paired_tau_ratio_interval

VARIANTS = {  # name -> extra `train` flags (each adds zero-initialised weights to the --init drafter, or the loss)
    "dflash": [],
    "layerwise": ["--fusion", "layerwise"],
    "steps": ["--step-embeddings"],
    "kv-hybrid": ["--context", "hybrid"],
    "kv": ["--context", "kv"],
    "vat": ["--loss", "vat"],
    "all": ["--fusion", "layerwise", "--step-embeddings", "--context", "hybrid", "--loss", "vat"],
}


def run(cmd, log):
    print("$", shlex.join(cmd), flush=True)
    with open(log, "a") as handle:
        handle.write("$ " + shlex.join(cmd) + "\n")
        handle.flush()
        proc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}; see {log}")


def variant_flags(args, name):
    """The variant's `train` flags, with the layer sets the store holds (--fusion-layer-ids, --kv-layer-ids)."""
    flags = list(VARIANTS[name])
    if "--fusion" in flags and args.fusion_layer_ids:
        flags += ["--fusion-layer-ids", args.fusion_layer_ids]
    if "--context" in flags and args.kv_layer_ids:
        flags += ["--kv-layer-ids", args.kv_layer_ids]
    return flags


def train(args, name, flags, out):
    folder = out / name
    if (folder / "summary.json").exists():
        return folder
    cmd = [args.cli, "train", "--target", args.target, "--features", args.features, "--init", args.init,
           "--out", str(folder), "--max-steps", str(args.steps), "--seed", str(args.seed), *flags,
           *shlex.split(args.train_args)]
    start = time.perf_counter()
    run(cmd, out / f"train-{name}.log")
    summary = json.loads((folder / "summary.json").read_text())
    summary["ablation_wall_s"] = time.perf_counter() - start
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    return folder


def file_name(dataset):
    """A set name or a path as one file-name part (`humaneval`; `/data/my set.jsonl` -> `data_my_set.jsonl`)."""
    return re.sub(r"[^\w.-]+", "_", dataset).strip("_")


def measure(args, command, folders, dataset, count, path, extra):
    """One `bench` or `replay` run of every variant's drafter (DFlash as --drafter, the rest --compare) on a set."""
    if path.exists():
        check_cached(path, folders, count, args.max_new_tokens, args.seed)
        return path
    compare = [x for name, folder in folders.items() if name != "dflash" for x in ("--compare", f"{name}={folder}")]
    cmd = [args.cli, command, "--target", args.target, "--drafter", str(folders["dflash"]), *compare,
           "--dataset", dataset, "--max-samples", str(count), "--source-order", "--max-new-tokens",
           str(args.max_new_tokens), "--seed", str(args.seed), "--no-progress", "--output", str(path), *extra]
    run(cmd, path.parent / f"{command}-{file_name(dataset)}.log")
    return path


def check_cached(path, folders, count, max_new_tokens, seed):
    """A report kept from an earlier run must be of this run's cell: same prompts, budget, seed and drafters."""
    report = json.loads(path.read_text())
    config = report["config"]
    drafters = config.get("drafters") or {"main": config.get("drafter"), **config.get("compare", {})}
    seed_used = config.get("seed", report.get("environment", {}).get("seed"))  # replay keeps it in environment
    cached = {"prompts": config.get("max_samples"), "max_new_tokens": config.get("max_new_tokens"), "seed": seed_used,
              "drafters": sorted(map(str, drafters.values()))}
    wanted = {"prompts": count, "max_new_tokens": max_new_tokens, "seed": seed,
              "drafters": sorted(map(str, folders.values()))}
    if cached != wanted:
        diff = {k: (cached[k], wanted[k]) for k in wanted if cached[k] != wanted[k]}
        raise SystemExit(f"{path} is from another run (kept, this run: {diff}); move it away or use another --out")


def bench(args, folders, dataset, count, temperature, out):
    path = out / f"bench-{file_name(dataset)}-T{temperature:g}.json"
    return measure(args, "bench", folders, dataset, count, path,
                   ["--temperature", str(temperature), "--dtype", args.dtype])


def replay(args, folders, dataset, count, out):
    name = file_name(dataset)
    return measure(args, "replay", folders, dataset, count, out / f"replay-{name}-T0.json",
                   ["--references", str(out / f"references-{name}.jsonl"), "--dtype", args.replay_dtype])


def replay_rows(dataset, report, names):
    """Table rows of one replay report (T=0): τ, the ratio to DFlash with its paired interval, per-slot acceptance and
    the drafter's cost per round (no verify ran: no speedup)."""
    methods, rows = report["summary"]["methods"], []
    base = [p["drafters"]["main"]["acceptance_lengths"] for p in report["prompts"]]
    for name in names:
        label = "main" if name == "dflash" else name
        m = methods[label]
        ours = [p["drafters"][label]["acceptance_lengths"] for p in report["prompts"]]
        rows.append({
            "dataset": dataset, "T": 0.0, "variant": name, "prompts": report["summary"]["num_prompts"],
            "tau": m["tau_pooled"], "speedup": None, "ms_per_round": m["drafter_ms_per_round"],
            "cost": "drafter ms per round (replay)", "per_slot": m["per_slot"]["rate"], "exact_rate": None,
            "tau_ratio": m["tau_pooled"] / methods["main"]["tau_pooled"],
            "tau_ratio_ci": paired_tau_ratio_interval(ours, base),
        })
    return rows


def method_name(name):
    return "speculative" if name == "dflash" else f"speculative:{name}"


def per_prompt(report, method):
    return [(sum(p["methods"][method]["acceptance_lengths"]), len(p["methods"][method]["acceptance_lengths"]))
            if p["methods"][method]["error"] is None else None for p in report["prompts"]]


def ratio_interval(num, den, reps=2000, seed=0):
    """Paired bootstrap over prompts of τ_num/τ_den (each τ pooled over the resampled prompts)."""
    pairs = [(a, b) for a, b in zip(num, den) if a is not None and b is not None]
    if not pairs:
        return None

    def ratio(sample):
        ca, ra = sum(a[0] for a, _ in sample), sum(a[1] for a, _ in sample)
        cb, rb = sum(b[0] for _, b in sample), sum(b[1] for _, b in sample)
        return (ca / ra) / (cb / rb) if ra and rb and cb else float("nan")

    rng = random.Random(seed)
    draws = sorted(ratio([pairs[rng.randrange(len(pairs))] for _ in pairs]) for _ in range(reps))
    return [draws[int(0.025 * reps)], draws[int(0.975 * reps) - 1]]


def table(reports, names):
    rows = []
    for (dataset, temperature), report in reports.items():
        methods = report["summary"]["methods"]
        base = per_prompt(report, method_name("dflash"))
        for name in names:
            m = methods[method_name(name)]
            rows.append({
                "dataset": dataset, "T": temperature, "variant": name, "prompts": report["summary"]["num_prompts"],
                "tau": m["tau_pooled"], "speedup": m["speedup"], "ms_per_round": m["ms_per_round"],
                "cost": "ms per round (bench: verify + drafter)", "per_slot": m["per_slot"]["rate"], "exact_rate": m["agreement"]["exact_rate"],
                "tau_ratio": m["tau_pooled"] / methods[method_name("dflash")]["tau_pooled"],
                "tau_ratio_ci": ratio_interval(per_prompt(report, method_name(name)), base),
            })
    return rows


def markdown(rows):
    lines = ["| T | set | variant | τ | τ / τ(DFlash) [95% CI] | slot-1 acc. | ms per round (replay: drafter only) | "
             "speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = r["tau_ratio_ci"]
        ci = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        slot1 = (r["per_slot"] or [None])[0]
        lines.append(f"| {r['T']:g} | {r['dataset']} ({r['prompts']}) | {r['variant']} | {r['tau']:.3f} | "
                     f"{r['tau_ratio']:.3f}{ci} | {slot1 if slot1 is None else f'{slot1:.3f}'} | "
                     f"{r['ms_per_round']:.1f} | {'-' if r['speedup'] is None else format(r['speedup'], '.3f')} |")
    return "\n".join(lines)


def plot(rows, names, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["dataset"], r["T"]) for r in rows}, key=lambda c: (c[1], c[0]))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(19, 4.5))
    width = 0.8 / max(1, len(names) - 1)
    others = [n for n in names if n != "dflash"]
    color = {name: f"C{i}" for i, name in enumerate(names)}  # one colour per variant in both panels
    for j, name in enumerate(others):
        xs, ys, lo, hi = [], [], [], []
        for i, cell in enumerate(cells):
            r = next(r for r in rows if (r["dataset"], r["T"]) == cell and r["variant"] == name)
            ci = r["tau_ratio_ci"] or [r["tau_ratio"]] * 2
            xs.append(i + (j - (len(others) - 1) / 2) * width)
            ys.append(r["tau_ratio"])
            lo.append(r["tau_ratio"] - ci[0])
            hi.append(ci[1] - r["tau_ratio"])
        ax1.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=name, color=color[name])
    ax1.axhline(1.0, color="grey", lw=1)
    ax1.set_xticks(range(len(cells)), [f"{d}\nT={t:g}" for d, t in cells])
    ax1.set_ylabel("τ(variant) / τ(DFlash), 95% CI")
    ax1.legend(fontsize=8)
    curves = {}  # per-slot acceptance at T=0, mean over sets
    for name in names:
        rates = [r["per_slot"] for r in rows if r["variant"] == name and r["T"] == 0 and r["per_slot"]]
        if rates:
            k = min(len(x) for x in rates)
            curves[name] = [sum(x[i] for x in rates) / len(rates) for i in range(k)]
            ax2.plot(range(1, k + 1), curves[name], marker="o", label=name, color=color[name])
    ax2.set_xlabel("proposal slot")
    ax2.set_ylabel("acceptance rate (T=0, mean over sets)")
    ax2.legend(fontsize=8)
    # The differences that decide the ratios are small next to the rates: each variant's curve minus DFlash's, on a
    # scale linear within ±0.01 (so a tie reads as 0 and a large loss still fits).
    for name in others:
        if name in curves and "dflash" in curves:
            k = min(len(curves[name]), len(curves["dflash"]))
            ax3.plot(range(1, k + 1), [curves[name][i] - curves["dflash"][i] for i in range(k)], marker="o",
                     label=name, color=color[name])
    ax3.axhline(0.0, color="grey", lw=1)
    ax3.set_yscale("symlog", linthresh=0.01)
    ax3.set_xlabel("proposal slot")
    ax3.set_ylabel("acceptance rate minus DFlash's (T=0, mean over sets)")
    ax3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--features", required=True, help="feature store holding every variant's layers")
    parser.add_argument("--init", required=True, help="the DFlash drafter every variant starts from")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200, help="optimizer updates per variant (the same for all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--train-args", default="--labels target-chain --mixed-precision bf16 --grad-accum 4 "
                        "--lr 3e-4 --warmup-ratio 0.02 --max-anchors 256 --eval-size 64 --eval-prompts 0 "
                        "--save-dtype bfloat16 --no-progress", help="flags every variant's `train` shares")
    parser.add_argument("--fusion-layer-ids", default=None, help="layer-wise fusion's target layers (stored ones)")
    parser.add_argument("--kv-layer-ids", default=None, help="KV variants' target layers (l - 1 stored for each l)")
    parser.add_argument("--datasets", default="humaneval:164,mt-bench:80,gsm8k:128", help="set:prompts,...")
    parser.add_argument("--sample-datasets", default=None,
                        help="set:prompts,... for the T > 0 cells (default: --datasets); sampled cells need bench")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto", help="bench dtype (auto: bf16 on CPUs with bf16 units)")
    parser.add_argument("--replay-dtype", default="float32", help="replay dtype (fp32: the exact greedy rounds)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="variants trained (and sets measured) at a time, one core each by default")
    parser.add_argument("--replay", action="store_true",
                        help="T=0 cells from `dflash-retrace replay` (exact rounds, no verify, no speedup)")
    parser.add_argument("--cli", default=str(Path(sys.executable).with_name("dflash-retrace")))
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "dflash" not in names:
        raise SystemExit(f"--variants must include dflash and name only {sorted(VARIANTS)}; got {names}")
    if args.jobs > 1:  # one core per job unless the caller chose a thread count
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    with ThreadPoolExecutor(args.jobs) as pool:  # each job is a `train` / `replay` / `bench` subprocess
        folders = dict(zip(names, pool.map(lambda name: train(args, name, variant_flags(args, name), out), names)))
        cells = []  # (dataset, count, temperature): T=0 over --datasets, T>0 over --sample-datasets
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for spec in (args.datasets if temperature == 0 else args.sample_datasets or args.datasets).split(","):
                dataset, _, count = spec.partition(":")
                cells.append((dataset, int(count or 32), temperature))

        def cell(c):
            dataset, count, temperature = c
            if args.replay and temperature == 0:
                return c, replay(args, folders, dataset, count, out)
            return c, bench(args, folders, dataset, count, temperature, out)

        done = list(pool.map(cell, cells))
    reports, rows = {}, []
    for (dataset, _, temperature), path in done:
        if args.replay and temperature == 0:
            rows += replay_rows(dataset, json.loads(path.read_text()), names)
        else:
            reports[(dataset, temperature)] = json.loads(path.read_text())
    rows += table(reports, names)
    summaries = {name: json.loads((folders[name] / "summary.json").read_text()) for name in names}
    (out / "ablation.json").write_text(json.dumps({
        "command": shlex.join([sys.executable, *sys.argv]), "config": vars(args), "rows": rows,
        "training": {name: {k: summaries[name].get(k) for k in ("steps", "final_loss", "held_out_loss",
                                                                 "held_out_slot_accuracy", "train_seconds")}
                     for name in names},
    }, indent=2))
    plot(rows, names, out / "ablation.png")
    print(markdown(rows))


if __name__ == "__main__":
    main()
