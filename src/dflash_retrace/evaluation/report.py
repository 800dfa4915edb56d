"""The benchmark report for people: the terminal table (`format_report`) and the PNG (`plot_results`)."""

from __future__ import annotations

import os

from .methods import SPECULATIVE

__all__ = ["format_report", "plot_results"]


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _interval(bounds) -> str:
    return "" if bounds is None else f" [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def _left_out(agreement: dict) -> str:
    n = agreement.get("num_errors")  # absent in reports written before it was recorded
    return f" ({n} prompt{'s' if n > 1 else ''} with an error not compared)" if n else ""


def format_report(report: dict) -> str:
    """The compact terminal table (and the lines under it) for a report from `run_benchmark`."""
    config, summary = report["config"], report["summary"]
    env = report["environment"]
    lines = [
        f"target {config['target']} | drafter {config['drafter']} | {config['dataset']} x{config['num_prompts']} | "
        f"max_new_tokens {config['max_new_tokens']} | T={config['temperature']} | B={config['block_size']} | "
        f"{env['device']} {env['dtype']} | torch {env['torch']} | transformers {env['transformers']} | "
        f"git {str(env['git_sha'])[:10]}{'+dirty' if env['git_dirty'] else ''} | seed {config['seed']}"
        + (f" | prompts in {config['prompt_order']} order" if "prompt_order" in config else ""),
    ]
    header = (f"{'method':<24}{'ok':>4}{'new tok':>9}{'total s':>9}{'decode s':>10}{'tok/s':>8}{'dec tok/s':>10}"
              f"{'speedup':>9}{'τ pooled':>10}{'τ prompt':>10}{'ms/round':>10}{'= plain':>9}")
    lines += [header, "-" * len(header)]
    for name, m in summary["methods"].items():
        agree = m.get("agreement")
        lines.append(
            f"{name:<24}{m['num_ok']:>4}{m['new_tokens']:>9}{m['total_s']:>9.2f}{m['decode_s']:>10.2f}"
            f"{_fmt(m['tokens_per_s']):>8}{_fmt(m['decode_tokens_per_s']):>10}{_fmt(m.get('speedup'), '.3f'):>9}"
            f"{_fmt(m.get('tau_pooled'), '.3f'):>10}{_fmt(m.get('tau_prompt_mean'), '.3f'):>10}"
            f"{_fmt(m.get('ms_per_round'), '.1f'):>10}{_fmt(agree and agree['exact_rate'], '.0%'):>9}"
        )
    for name, reason in config["skipped_methods"].items():
        lines.append(f"{name:<24}skipped: {reason}")
    lines.append(f"prefill (separate generate(max_new_tokens=1), shared by all methods): "
                 f"{_fmt(summary['prefill_ms_mean'], '.1f')} ms per turn; decode = total - prefill")
    lines.append("τ pooled = mean over all rounds; τ prompt = mean of per-prompt means; '= plain' = prompts whose "
                 "tokens equal plain generate's")
    for name, m in summary["methods"].items():
        if m.get("speedup_spread"):
            sp = m["speedup_spread"]
            lines.append(f"speedup per prompt ({name}): {sp['min']:.3f}..{sp['max']:.3f}, median {sp['median']:.3f}")
        if m.get("measurement_fault"):
            lines.append(f"{name}: {m['measurement_fault']}")
    if config["temperature"] == 0:
        rates = ", ".join(f"{name} {_fmt(m['agreement']['exact_rate'], '.0%')}" + _left_out(m["agreement"])
                          for name, m in summary["methods"].items() if m.get("agreement"))
        exact = "must be 100% (exact)" if env["dtype"] == "float32" else "exact only up to near-ties in this dtype"
        lines.append(f"greedy output identical to plain generate() ({env['dtype']}: {exact}): {rates} of prompts")
    for name, spec in summary["methods"].items():
        if not name.startswith(SPECULATIVE) or not spec.get("histogram"):
            continue
        hist = spec["histogram"]
        lines.append(f"τ histogram ({name}, % of rounds): " + " ".join(
            f"{n}:{_fmt(f and 100 * f, '.1f')}" for n, f in zip(hist["lengths"], hist["fractions"]) if f))
        rates = spec["per_slot"]["rate"]
        lines.append(f"per-slot acceptance ({name}, slot 1..K): " + " ".join(_fmt(r, ".2f") for r in rates))
        suffix = spec.get("rejected_suffix")
        if suffix and suffix["rounds"]:
            rate = suffix["match_rate"]
            lines.append(f"rejected suffixes ({name}, {suffix['rounds']} rounds): equal to the target's token at the "
                         f"same position {_fmt(rate['0'], '.1%')}, one earlier {_fmt(rate['-1'], '.1%')}, one later "
                         f"{_fmt(rate['1'], '.1%')}; ReTrace memory in {_fmt(spec['memory_rounds_share'], '.0%')} of "
                         f"rounds, {_fmt(spec['memory_slots_mean'], '.2f')} slots per round")
    for key, ratio in summary.get("tau_ratios", {}).items():
        covered = summary.get("tau_ratio_prompts", {}).get(key)
        over = "" if covered is None else (
            f", over the {covered['num_prompts']} prompts both completed"
            + (f" ({covered['num_errors']} left out: an error in either)" if covered["num_errors"] else ""))
        lines.append(f"τ ratio {key}: {_fmt(ratio, '.3f')} (pooled τ of the main drafter over the compared one{over})")
    for label, name in config.get("compare", {}).items():
        lines.append(f"{SPECULATIVE}:{label} = {name}")
    for key, o in summary["overhead"].items():
        lines.append(f"overhead {key}: end-to-end time ratio {_fmt(o['time_ratio'], '.3f')}"
                     f"{_interval(o.get('time_ratio_ci95'))}, decode {_fmt(o['decode_time_ratio'], '.3f')}, per round "
                     f"{_fmt(o['round_time_ratio'], '.3f')}{_interval(o.get('round_time_ratio_ci95'))} over "
                     f"{o['num_prompts']} prompts (95% paired bootstrap); same acceptance lengths: "
                     f"{_fmt(o['same_acceptance_lengths'], '')}")
    errors = [(p["id"], name, m["error"]) for p in report["prompts"] for name, m in p["methods"].items() if m["error"]]
    if errors:
        lines.append(f"ERRORS ({len(errors)}):")
        lines += [f"  {pid} {name}: {err}" for pid, name, err in errors]
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def plot_results(report: dict, path: str | os.PathLike) -> None:
    """PNG: acceptance-length histogram and per-slot acceptance rate of every speculative method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = report["config"]
    spec = {name: m for name, m in report["summary"]["methods"].items() if m.get("histogram")}
    fig, (ax_hist, ax_slot) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(spec))
    for i, (name, m) in enumerate(spec.items()):
        hist = m["histogram"]
        xs = [n + (i - (len(spec) - 1) / 2) * width for n in hist["lengths"]]
        ax_hist.bar(xs, [f or 0.0 for f in hist["fractions"]], width=width,
                    label=f"{name} (τ pooled {_fmt(m['tau_pooled'], '.2f')}, prompt mean {_fmt(m['tau_prompt_mean'], '.2f')})")
        slot = m["per_slot"]
        ax_slot.plot(slot["slots"], [r if r is not None else float("nan") for r in slot["rate"]], marker="o", label=name)
    ax_hist.set(xlabel="acceptance length (tokens per round, bonus included)", ylabel="fraction of rounds",
                title="acceptance lengths", xticks=list(range(1, config["block_size"] + 1)))
    ax_slot.set(xlabel="proposal slot k", ylabel="accepted / proposed", title="per-slot acceptance", ylim=(0, 1.02),
                xticks=list(range(1, config["block_size"])))
    for ax in (ax_hist, ax_slot):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{config['target']} + {config['drafter']} | {config['dataset']} x{config['num_prompts']} | "
                 f"T={config['temperature']} | {report['environment']['device']} {report['environment']['dtype']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
