"""`dflash-retrace bench`: acceptance length τ and speedup of a DFlash drafter, measured honestly.

For every prompt, in the same run and on the same token ids:
- `plain`: `target.generate()` alone (the speedup's denominator);
- `speculative`: `target.generate(assistant_model=drafter)` (this library's candidate generator);
- with `--baselines`: `zlab_reference`, z-lab's own loop `dflash.model.dflash_generate` run on a
  `dflash.model.DFlashDraftModel` loaded with the same weights, and `transformers_builtin`,
  `generate(assistant_model=drafter, speculation_type="dflash")` (transformers' own DFlash path).

Definitions (also written into the JSON under "definitions"):
- a round is a drafter call and the target forward after it, as `generate(assistant_model=...)` records it
  (`DFlashStats`): a round whose proposals were all cut (`proposal_threshold`, or a stopping criterion on its
  first) counts, with 0 proposals and length 1; a step with no room for a proposal (the budget's last token) is not
  a round, and proposals past the budget or after the first EOS are not counted (the baselines' logs are cut the
  same way). τ is tokens committed per round, bonus included (1..B). `tau_pooled` averages over all rounds of all
  prompts, `tau_prompt_mean` averages each prompt's mean;
- prefill (time to first token) is timed by a separate `target.generate(max_new_tokens=1)` on the same
  ids (generate()'s setup included) and shared by all methods; decode time = end-to-end time - prefill;
- every comparison (speedup and agreement against `plain`, τ ratios between drafters, overheads against the
  baselines) is over the prompts both methods completed, with the number compared (and, for agreement and τ
  ratios, the number left out for an error) in the JSON;
- speedup = end-to-end time of `plain` / time of the method, summed over prompts both completed
  (equal to the tokens/s ratio when the outputs are identical, as under greedy decoding); its spread is the
  per-prompt ratios' min / median / max, and a decode-rate ratio above its bound τ is flagged as a measurement
  fault;
- methods run in turn on each prompt, in reverse order on every other prompt; warm-up calls are excluded; at T > 0
  every method samples from the same seed on the same turn, and each turn of each prompt from its own;
  on CUDA the device is synchronised before every clock read.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..assets import asset_note
from ..config_cli import add_config_arguments, config_from_args, option
from ..prompts import load_prompts
from ..runtime import INFERENCE_DTYPE_HELP, cudnn_sdpa, encode_messages, environment, load_drafter, load_target
from .methods import BUILTIN, PLAIN, REFERENCE, SPECULATIVE, Methods, clock
from .metrics import (agreement, merge_suffix_matches, paired_ratio_interval, rejected_suffix_matches,
                      speedup_bound_fault, spread, summarize_rounds, tau_pooled)
from .report import format_report, plot_results

__all__ = ["BenchConfig", "MeasureOptions", "register_cli", "run_benchmark"]

SCHEMA = "dflash-retrace/bench/v1"
WARMUP_TOKENS = 16  # per method, on the first prompt, before any clock runs
TURN_SEED_STRIDE = 1_000_000  # sampling seeds of later turns: distinct from every first turn's below 10**6 prompts

DEFINITIONS = {
    "round": "one drafter call and the target forward after it, as generate(assistant_model=...) records it in "
             "DFlashStats: a round whose proposals were all cut (proposal_threshold, or a stopping criterion on the "
             "first) counts, with 0 proposals and length 1; a step with no room for a proposal (the budget's last "
             "token) is not a round; proposals past the budget or after the first EOS are not counted (z-lab's and "
             "transformers' logs are cut the same way)",
    "acceptance_length": "tokens committed by a round, bonus token included (1..block_size; 1 with 0 proposals)",
    "tau_pooled": "mean acceptance length over all rounds of all prompts",
    "tau_prompt_mean": "mean over prompts of each prompt's mean acceptance length",
    "histogram": "counts/fractions of acceptance lengths 1..block_size over all rounds",
    "per_slot.rate": "rounds that accepted proposal slot k / rounds that proposed slot k",
    "prefill_s": "time of a separate target.generate(max_new_tokens=1) on the same ids (time to first token, "
                 "generate() setup included), shared by all methods, summed over turns",
    "total_s": "end-to-end time of the method's generate call(s), warm-up excluded, device synchronised",
    "decode_s": "total_s - prefill_s",
    "tokens_per_s": "new tokens / total_s; decode_tokens_per_s: (new tokens - turns) / decode_s",
    "speedup": "sum of plain total_s / sum of the method's total_s over prompts both completed",
    "speedup_spread": "min / median / max over prompts of plain total_s / the method's total_s",
    "decode_rate_ratio": "the method's decode tokens/s over plain's, over prompts both completed (prefill excluded; "
                         "valid when outputs differ in length)",
    "measurement_fault": "set when decode_rate_ratio exceeds its bound tau_pooled (1 without rounds): a round "
                         "commits at most tau tokens for at least one plain decode step's cost: a timing fault",
    "agreement": "over the prompts the method and plain both completed (num_prompts; num_errors: left out for an "
                 "error in either): exact_rate: prompts whose tokens equal plain's; prefix_rate: tokens before the "
                 "first divergence / tokens of the longer output, pooled",
    "tau_ratios": "tau_pooled of the main drafter over a compared drafter's, both pooled over the prompts both "
                  "completed (tau_ratio_prompts: num_prompts compared, num_errors left out for an error in either)",
    "overhead": "our generator against z-lab's loop / transformers' built-in path on the prompts both completed: "
                "time_ratio (end to end), decode_time_ratio, round_time_ratio (decode seconds per round), each "
                "*_ci95 a 95% paired-bootstrap interval over prompts; same_acceptance_lengths is None over 0 prompts",
    "multi_turn": "later turns are rendered with plain generate's earlier answers, so every method sees the same ids",
    "sampling_seed": f"T > 0: torch.manual_seed(seed + prompt index + {TURN_SEED_STRIDE} * turn index) before every "
                     "method's call: the same stream for every method on a turn, a stream of its own for each turn",
}

UNTRAINED_NOTE = (
    "--drafter untrained: a randomly initialised 1-layer DFlash drafter (DFlashDrafter.from_target). Its proposals "
    "are noise, so tau ~ 1 (the floor: only the bonus token per round) and speculative decoding is SLOWER than plain "
    "generate. This run measures the integration's overhead, not acceptance."
)




def _label_and_path(value: str) -> tuple:
    import argparse

    label, sep, path = value.partition("=")
    if not sep or not label or not path or not label.replace("_", "").replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected LABEL=DRAFTER (e.g. dflash=hub_configs/x-dflash), got {value!r}")
    return label, path


@dataclass
class MeasureOptions:
    """The prompts, budget, drafter settings and environment shared by `bench` and `replay` (and their CLIs)."""

    dataset: str = option("humaneval", "gsm8k, math500, humaneval, mbpp, mt-bench, or a local .jsonl of prompts")
    data: str | None = option(None, "local JSONL with the benchmark's own fields (instead of Hub/registry)")
    max_samples: int | None = option(32, "prompts after the seeded shuffle")
    source_order: bool = option(False, "keep the set's own order instead of the seeded shuffle: --max-samples N "
                                       "takes the first N")
    max_new_tokens: int = option(256, "new tokens per turn")
    seed: int = option(0, "prompt shuffle, untrained drafter and sampling seed")
    dtype: str = option("auto", INFERENCE_DTYPE_HELP)
    device: str = option("auto", "auto (cuda if available), cpu, cuda, cuda:1, ...")
    compare: dict | None = option(None, "also measure this drafter on the same prompts and plain outputs (bench: "
                                        "method speculative:LABEL; repeatable)", type=_label_and_path,
                                  action="append", metavar="LABEL=DRAFTER")
    max_proposals: int | None = option(None, "at most this many proposals per round for --drafter (its config's "
                                             "max_proposals; --compare drafters keep their own)")
    proposal_threshold: float | None = option(None, "adaptive rounds for --drafter: stop before the first slot "
                                                    "whose drafter probability is below this (slot 1: a plain step)")
    lookup_threshold: float | None = option(None, "context lookup for --drafter: from the first slot whose drafter "
                                                  "top probability is below this, propose the context's own "
                                                  "continuation (0: off; --compare drafters keep their own)")
    enable_thinking: bool = option(False, "thinking on in chat templates that support it")
    progress: bool = option(True, "progress bar")

    def __post_init__(self):
        if isinstance(self.compare, list):  # the CLI's repeated LABEL=DRAFTER pairs
            self.compare = dict(self.compare)


@dataclass
class BenchConfig(MeasureOptions):
    """What `run_benchmark` measures and how; the `bench` CLI is generated from these fields."""

    temperature: float = option(0.0, "0 = greedy; > 0 samples")
    output: str | None = option(None, "JSON report path", cli_default="bench.json")
    plot: str | None = option(None, "also write a PNG (histogram + per-slot acceptance) here")
    baselines: bool = option(False, "also run z-lab's dflash_generate (if installed) and transformers' "
                                    "speculation_type='dflash'")
    no_memory: bool = option(False, "also run the --drafter with its ReTrace memory switched off (method "
                                    "speculative:no_memory)", flag="--no-memory-ablation")
    save_outputs: bool = option(False, "store every method's token ids in the JSON")
    warmup_tokens: int = option(WARMUP_TOKENS, "new tokens of each untimed warm-up call, per method, on the first prompt")
    cudnn_sdpa: bool = option(True, "PyTorch's cuDNN attention backend (CUDA; it re-plans for every new KV length)")


@dataclass
class _Row:
    """One method on one prompt, all turns together."""

    new_ids: list = field(default_factory=list)
    total_s: float = 0.0
    acceptance_lengths: list | None = None
    num_proposals: list | None = None
    error: str | None = None
    suffix: list = field(default_factory=list)  # `rejected_suffix_matches` per turn (our generator)
    conditioned_slots: list = field(default_factory=list)


def _encode(tokenizer, messages, enable_thinking, device):
    return torch.tensor([encode_messages(tokenizer, messages, enable_thinking)], device=device)


def _error_text(err: BaseException) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


def _finite(value):
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _sampling_seed(seed: int, index: int, turn_index: int) -> int:
    """The torch seed of one turn of one prompt, the same for every method (T > 0: the same sampling stream): seed +
    prompt index on the first turn, and a stream of its own for each later turn (not the first turn's again)."""
    return seed + index + TURN_SEED_STRIDE * turn_index


def _run_prompt(methods: Methods, names: list, item: dict, index: int, tokenizer, enable_thinking: bool,
                device: torch.device, seed: int) -> tuple:
    """All methods on one prompt (every turn): ({name: _Row}, prompt token counts, prefill seconds)."""
    rows = {name: _Row(acceptance_lengths=None if name == PLAIN else [],
                       num_proposals=None if name == PLAIN else []) for name in names}
    prompt_tokens, prefill_s, messages = [], 0.0, []
    for turn_index, turn in enumerate(item["turns"]):
        where = f"turn {turn_index + 1}: " if len(item["turns"]) > 1 else ""
        messages.append({"role": "user", "content": turn})
        try:
            input_ids = _encode(tokenizer, messages, enable_thinking, device)
            with torch.no_grad():
                t0 = clock(device)
                methods.prefill(input_ids)
                prefill_s += clock(device) - t0
        except Exception as err:
            for row in rows.values():
                row.error = row.error or f"{where}prompt/prefill failed: {_error_text(err)}"
            break
        prompt_tokens.append(input_ids.shape[1])
        plain_before = len(rows[PLAIN].new_ids)
        for name in (names if index % 2 == 0 else names[::-1]):  # alternate the order: no method always first
            row = rows[name]
            if row.error:
                continue
            torch.manual_seed(_sampling_seed(seed, index, turn_index))  # the same stream for every method (T > 0)
            try:
                with torch.no_grad():
                    t0 = clock(device)
                    result = methods.available[name](input_ids, methods.max_new_tokens)
                    row.total_s += clock(device) - t0
            except Exception as err:
                row.error = f"{where}{_error_text(err)}"
                continue
            row.new_ids += result.new_ids
            if result.acceptance_lengths is not None:
                row.acceptance_lengths += result.acceptance_lengths
                row.num_proposals += result.num_proposals
            if result.drafts is not None:
                row.suffix.append(rejected_suffix_matches(result.new_ids, result.acceptance_lengths, result.drafts))
                row.conditioned_slots += result.conditioned_slots
        if rows[PLAIN].error:
            for row in rows.values():
                row.error = row.error or "skipped: plain generate failed on an earlier turn"
            break
        # Later turns see plain generate's answer, so every method gets the same ids.
        answer = tokenizer.decode(rows[PLAIN].new_ids[plain_before:], skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
    return rows, prompt_tokens, prefill_s


def _prompt_row(item: dict, prompt_tokens: list, prefill_s: float, rows: dict, save_outputs: bool) -> dict:
    plain = rows[PLAIN]
    methods = {}
    for name, row in rows.items():
        entry = {"error": row.error}
        if not row.error:
            n = len(row.new_ids)
            entry.update(new_tokens=n, total_s=row.total_s, decode_s=row.total_s - prefill_s,
                         tokens_per_s=n / row.total_s if row.total_s > 0 else None)
            if row.acceptance_lengths is not None:
                lengths = row.acceptance_lengths
                entry.update(rounds=len(lengths), tau=sum(lengths) / len(lengths) if lengths else None,
                             acceptance_lengths=lengths, num_proposals=row.num_proposals)
            if row.suffix:
                entry.update(rejected_suffix=merge_suffix_matches(row.suffix), conditioned_slots=row.conditioned_slots)
            if name != PLAIN and not plain.error:
                first = agreement([plain.new_ids], [row.new_ids])["first_divergence"][0]
                entry.update(agrees_with_plain=first is None, first_divergence=first)
            if save_outputs:
                entry["output_ids"] = row.new_ids
        methods[name] = entry
    return {"id": item["id"], "turns": len(item["turns"]), "prompt_tokens": prompt_tokens, "prefill_s": prefill_s,
            "methods": methods}


def _sum(rows: list, name: str, key: str) -> float:
    return sum(r["methods"][name][key] for r in rows)


def _ratio(a: float, b: float):
    return a / b if b > 0 else None


def _memory_summary(entries: list) -> dict:
    """Where ReTrace's memory comes from and goes (our generator's rounds only): the rejected suffixes against the
    target's continuation (`rejected_suffix_matches`), and the slots that received memory per round."""
    entries = [e for e in entries if "rejected_suffix" in e]
    if not entries:
        return {}
    slots = [n for e in entries for n in e["conditioned_slots"]]
    return {"rejected_suffix": merge_suffix_matches([e["rejected_suffix"] for e in entries]),
            "memory_slots_mean": sum(slots) / len(slots) if slots else None,
            "memory_rounds_share": sum(n > 0 for n in slots) / len(slots) if slots else None}


def _summary(prompt_rows: list, all_rows: list, names: list, block_sizes: dict) -> dict:
    """Aggregates per method over the prompts it completed; comparisons over the prompts both completed."""
    done = lambda p, name: not p["methods"][name]["error"]  # noqa: E731
    methods = {}
    for name in names:
        ok = [p for p in prompt_rows if done(p, name)]
        new_tokens, total_s, decode_s = _sum(ok, name, "new_tokens"), _sum(ok, name, "total_s"), _sum(ok, name, "decode_s")
        summary = {
            "num_ok": len(ok), "num_errors": len(prompt_rows) - len(ok),
            "new_tokens": new_tokens, "total_s": total_s, "decode_s": decode_s,
            "tokens_per_s": _ratio(new_tokens, total_s),
            "decode_tokens_per_s": _ratio(new_tokens - sum(p["turns"] for p in ok), decode_s),
        }
        if name != PLAIN:
            both = [i for i, p in enumerate(prompt_rows) if done(p, name) and done(p, PLAIN)]
            pair = [prompt_rows[i] for i in both]
            summary["speedup"] = _ratio(_sum(pair, PLAIN, "total_s"), _sum(pair, name, "total_s"))
            summary["decode_speedup"] = _ratio(_sum(pair, PLAIN, "decode_s"), _sum(pair, name, "decode_s"))
            summary["speedup_spread"] = spread([_ratio(p["methods"][PLAIN]["total_s"], p["methods"][name]["total_s"])
                                                for p in pair])
            check = agreement([all_rows[i][PLAIN].new_ids for i in both], [all_rows[i][name].new_ids for i in both])
            summary["agreement"] = {**{k: check[k] for k in ("num_prompts", "exact_rate", "prefix_rate")},
                                    "num_errors": len(prompt_rows) - len(both)}
            summary.update(summarize_rounds([p["methods"][name]["acceptance_lengths"] for p in ok],
                                            [p["methods"][name]["num_proposals"] for p in ok], block_sizes[name]))
            summary["ms_per_round"] = _ratio(1000 * decode_s, summary["num_rounds"])
            summary.update(_memory_summary([p["methods"][name] for p in ok]))
            turns = sum(p["turns"] for p in pair)  # decode tokens: each turn's first token is the prefill's
            rates = [_ratio(_sum(pair, n, "new_tokens") - turns, _sum(pair, n, "decode_s")) for n in (name, PLAIN)]
            summary["decode_rate_ratio"] = _ratio(rates[0] or 0.0, rates[1] or 0.0)
            summary["measurement_fault"] = speedup_bound_fault(summary["decode_rate_ratio"], summary.get("tau_pooled"))
        methods[name] = summary

    overhead = {}
    for name in (REFERENCE, BUILTIN):
        if name not in names:
            continue
        both = [p for p in prompt_rows if done(p, name) and done(p, SPECULATIVE)]
        ours_rounds, their_rounds = _sum(both, SPECULATIVE, "rounds"), _sum(both, name, "rounds")
        ours_round_s = _ratio(_sum(both, SPECULATIVE, "decode_s"), ours_rounds)
        their_round_s = _ratio(_sum(both, name, "decode_s"), their_rounds)
        overhead[f"{SPECULATIVE}_vs_{name}"] = {
            "num_prompts": len(both),
            "time_ratio": _ratio(_sum(both, SPECULATIVE, "total_s"), _sum(both, name, "total_s")),
            "decode_time_ratio": _ratio(_sum(both, SPECULATIVE, "decode_s"), _sum(both, name, "decode_s")),
            "round_time_ratio": _ratio(ours_round_s or 0.0, their_round_s or 0.0),
            "time_ratio_ci95": paired_ratio_interval([(m[SPECULATIVE]["total_s"], 1, m[name]["total_s"], 1)
                                                      for m in (p["methods"] for p in both)]),
            "round_time_ratio_ci95": paired_ratio_interval([(m[SPECULATIVE]["decode_s"], m[SPECULATIVE]["rounds"],
                                                             m[name]["decode_s"], m[name]["rounds"])
                                                            for m in (p["methods"] for p in both)]),
            "same_acceptance_lengths": all(p["methods"][SPECULATIVE]["acceptance_lengths"] ==
                                           p["methods"][name]["acceptance_lengths"] for p in both) if both else None,
        }
    tau_ratios, tau_ratio_prompts = {}, {}
    for name in names:  # the main drafter's τ over each compared drafter's, over the prompts both completed
        if name.startswith(f"{SPECULATIVE}:"):
            both = [p for p in prompt_rows if done(p, SPECULATIVE) and done(p, name)]
            ours, theirs = (tau_pooled([p["methods"][n]["acceptance_lengths"] for p in both])
                            for n in (SPECULATIVE, name))
            tau_ratios[f"{SPECULATIVE}/{name}"] = _ratio(ours or 0.0, theirs or 0.0)
            tau_ratio_prompts[f"{SPECULATIVE}/{name}"] = {"num_prompts": len(both),
                                                          "num_errors": len(prompt_rows) - len(both)}
    turns = sum(p["turns"] for p in prompt_rows)
    prefill_s = sum(p["prefill_s"] for p in prompt_rows)
    return {
        "tau_ratios": tau_ratios,
        "tau_ratio_prompts": tau_ratio_prompts,
        "num_prompts": len(prompt_rows),
        "num_prompts_with_errors": sum(1 for p in prompt_rows if any(m["error"] for m in p["methods"].values())),
        "prefill_s": prefill_s,
        "prefill_ms_mean": 1000 * prefill_s / turns if turns else None,
        "methods": methods,
        "overhead": overhead,
    }




def run_benchmark(target, drafter, config: BenchConfig | None = None, tokenizer=None, **overrides) -> dict:
    """Runs plain and speculative generation (and, with `baselines`, the reference loop and transformers'
    built-in DFlash path) on the same prompts in one process; returns the report (the JSON's content).

    `target`: registry name (see `dflash-retrace fetch`), local folder or Hub id, or a loaded model (then pass
    `tokenizer`). `drafter`: folder or Hub id, `"untrained"`, or a loaded drafter. `config`: a `BenchConfig`,
    or its fields as keyword arguments (`dataset="gsm8k", max_samples=128, source_order=True, ...`). Prompts:
    `load_prompts(dataset, max_samples=, seed=)`. An error on a prompt is recorded in its row and printed; the
    run goes on. `compare`: {label: drafter (folder, Hub id or loaded)}: more speculative methods
    `speculative:<label>`, each timed against the same plain run, with τ(main)/τ(label) in
    `summary.tau_ratios`. `no_memory`: also the main drafter with its ReTrace conditioner bypassed
    (`speculative:no_memory`; needs a ReTrace drafter): the ablation that separates what the memory does at
    inference from what the ReTrace training did.
    """
    if config is not None and not isinstance(config, BenchConfig):
        raise TypeError(f"run_benchmark(target, drafter, config) takes a BenchConfig, got {type(config).__name__}: "
                        "pass the other settings by keyword (dataset=..., max_samples=...).")
    cfg = BenchConfig(**{**(vars(config) if config else {}), **overrides})
    with cudnn_sdpa(cfg.cudnn_sdpa):
        return _run_benchmark(target, drafter, cfg, tokenizer)


def _name(model) -> str:
    return getattr(model.config, "_name_or_path", "") or type(model).__name__


def _load(target, drafter, cfg: BenchConfig, tokenizer, notes: list) -> tuple:
    """(target, tokenizer, drafter, {label: compared drafter}, names): loads what was given by name."""
    names = {"target": os.fspath(target) if isinstance(target, (str, os.PathLike)) else None}
    if names["target"] is not None:
        target, tokenizer = load_target(names["target"], cfg.device, cfg.dtype, inference=True)
        if note := asset_note(target.name_or_path):
            notes.append(f"target: {note}")
    elif tokenizer is None:
        raise ValueError("run_benchmark(target=<loaded model>) needs tokenizer=<its tokenizer>")
    names["target"] = names["target"] or _name(target)
    names["untrained"] = isinstance(drafter, (str, os.PathLike)) and os.fspath(drafter) == "untrained"
    names["drafter"] = os.fspath(drafter) if isinstance(drafter, (str, os.PathLike)) else _name(drafter)
    if isinstance(drafter, (str, os.PathLike)):
        drafter = load_drafter(drafter, target, cfg.seed)
    for name in ("max_proposals", "proposal_threshold", "lookup_threshold"):  # the main drafter only: --compare keeps its own
        if getattr(cfg, name) is not None:
            setattr(drafter.config, name, getattr(cfg, name))
    if names["untrained"]:
        notes.append(UNTRAINED_NOTE)
        print(f"\n{'!' * 100}\nNOTE {UNTRAINED_NOTE}\n{'!' * 100}\n", file=sys.stderr, flush=True)
    compared, names["compare"] = {}, {}
    for label, other in (cfg.compare or {}).items():
        names["compare"][label] = os.fspath(other) if isinstance(other, (str, os.PathLike)) else _name(other)
        compared[label] = load_drafter(other, target, cfg.seed) if isinstance(other, (str, os.PathLike)) else other
    if cfg.no_memory:
        if drafter.retrace is None:
            raise ValueError("no_memory (--no-memory-ablation) bypasses the ReTrace conditioner: the main drafter "
                             f"{names['drafter']!r} has none (pass a ReTrace drafter as --drafter).")
        ablated = copy.deepcopy(drafter)
        ablated.retrace = None  # the conditioner bypassed: the same backbone, no memory
        compared["no_memory"], names["compare"]["no_memory"] = ablated, f"{names['drafter']} (ReTrace memory off)"
    return target, tokenizer, drafter, compared, names


def _run_benchmark(target, drafter, cfg: BenchConfig, tokenizer) -> dict:
    notes = []
    target, tokenizer, drafter, compared, names = _load(target, drafter, cfg, tokenizer, notes)
    param = next(target.parameters())
    device, dtype = param.device, param.dtype
    if cfg.baselines and cfg.temperature > 0:
        notes.append("T > 0: zlab_reference samples its proposals from the drafter (z-lab's policy); speculative "
                     f"uses proposal_policy={drafter.config.proposal_policy!r}, transformers_builtin samples them")
    if drafter.retrace is not None and cfg.baselines:
        notes.append("the drafter has ReTrace weights: zlab_reference and transformers_builtin run it as plain DFlash")
    items = load_prompts(cfg.dataset, max_samples=cfg.max_samples, seed=None if cfg.source_order else cfg.seed,
                         source=cfg.data)
    if not items:
        raise ValueError(f"prompt set {cfg.dataset!r} gave no prompts")
    if any(len(item["turns"]) > 1 for item in items):
        notes.append(DEFINITIONS["multi_turn"])
    methods = Methods(target, drafter, cfg.max_new_tokens, cfg.temperature, cfg.baselines, compared)
    method_names = list(methods.available)
    _warm_up(methods, method_names, _encode(tokenizer, [{"role": "user", "content": items[0]["turns"][0]}],
                                             cfg.enable_thinking, device), cfg)

    prompt_rows, all_rows = [], []
    start = time.perf_counter()
    bar = tqdm(items, desc="bench", unit="prompt", disable=not cfg.progress, file=sys.stderr)
    for index, item in enumerate(bar):
        rows, prompt_tokens, prefill_s = _run_prompt(methods, method_names, item, index, tokenizer,
                                                     cfg.enable_thinking, device, cfg.seed)
        all_rows.append(rows)
        prompt_rows.append(_prompt_row(item, prompt_tokens, prefill_s, rows, cfg.save_outputs))
        for name, row in rows.items():
            if row.error:
                bar.write(f"[bench] ERROR {item['id']} {name}: {row.error}", file=sys.stderr)
        lengths = [n for r in all_rows for n in (r[SPECULATIVE].acceptance_lengths or [])]
        if lengths:
            bar.set_postfix(tau=f"{sum(lengths) / len(lengths):.2f}")
    bar.close()

    report = _finite({
        "schema": SCHEMA,
        "config": {
            "target": names["target"], "drafter": names["drafter"], "drafter_untrained": names["untrained"],
            "dataset": os.fspath(cfg.dataset), "data": None if cfg.data is None else os.fspath(cfg.data),
            "max_samples": cfg.max_samples,
            "prompt_order": "source" if cfg.source_order else f"shuffled (seed {cfg.seed})",
            "num_prompts": len(items), "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature, "block_size": drafter.config.block_size, "seed": cfg.seed,
            "enable_thinking": cfg.enable_thinking, "baselines": cfg.baselines, "methods": method_names,
            "skipped_methods": methods.skipped, "warmup_tokens": cfg.warmup_tokens, "compare": names["compare"],
            "block_sizes": methods.block_sizes,
            "max_proposals": getattr(drafter.config, "max_proposals", None),  # the main drafter's, as it ran
            "proposal_threshold": getattr(drafter.config, "proposal_threshold", 0.0),
            "lookup_threshold": getattr(drafter.config, "lookup_threshold", 0.0),
            "cudnn_sdpa": torch.backends.cuda.cudnn_sdp_enabled() if device.type == "cuda" else None,
        },
        "environment": environment(device, dtype, cfg.seed),
        "definitions": DEFINITIONS,
        "notes": notes,
        "summary": _summary(prompt_rows, all_rows, method_names, methods.block_sizes),
        "timing": {
            "wall_s": time.perf_counter() - start,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        },
        "prompts": prompt_rows,
    })
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output).write_text(json.dumps(report, indent=1) + "\n")
    if cfg.plot:
        plot_results(report, cfg.plot)
    return report


def _warm_up(methods: Methods, names: list, first, cfg: BenchConfig) -> None:
    """The prefill call and each method once on the first prompt, excluded from every number."""
    with torch.no_grad():
        methods.prefill(first)
        for name in names:
            try:
                methods.available[name](first, min(cfg.warmup_tokens, cfg.max_new_tokens))
            except Exception as err:  # the timed run reports it again, per prompt
                print(f"[bench] warm-up of {name} failed: {_error_text(err)}", file=sys.stderr)
    if first.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(first.device)


# ------------------------------------------------------------------------------------ CLI
def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="measure τ and speedup of a drafter against plain generate() (and the reference loop)",
        description="Runs plain target.generate() and target.generate(assistant_model=drafter) on the same prompts "
                    "in one run and reports τ (pooled and per-prompt mean), the acceptance histogram, per-slot "
                    "acceptance, tokens/s, speedup and the environment. Exit code 1 if any prompt had an error "
                    "(the JSON is written anyway).",
    )
    p.add_argument("--target", required=True, help="target model: registry name (dflash-retrace fetch), folder or Hub id")
    p.add_argument("--drafter", required=True,
                   help="DFlash drafter folder or Hub id, or 'untrained' (random 1-layer drafter: τ≈1, the floor)")
    add_config_arguments(p, BenchConfig)
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    report = run_benchmark(args.target, args.drafter, config_from_args(BenchConfig, args))
    print(format_report(report))
    if args.output:
        print(f"JSON: {args.output}" + (f" | plot: {args.plot}" if args.plot else ""))
    return 1 if report["summary"]["num_prompts_with_errors"] else 0
