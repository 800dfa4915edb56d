"""`dflash-retrace replay`: the greedy τ of drafters on whole prompt sets, exact, without a verify forward.

Under greedy decoding every round's outcome is fixed by the committed prefix, and the committed prefix is the
target's own greedy output (generation is lossless). So once a turn's plain `generate()` output y is known, one
target forward over prompt + y gives everything every round of every drafter reads: the hidden states of the
committed positions (the drafter's context), the target's KV cache (KVShot variants) and the target's argmax at
each position (its verdict on any proposal). The replay then drives the drafter's own candidate generator
(`DFlashCandidateGenerator`, the code `generate(assistant_model=...)` runs) round by round on those states: the
same proposals, cuts (budget, EOS, `max_proposals`, `proposal_threshold`) and statistics, with the target's
verify replaced by comparing the proposals with y. A drafter then costs its own forwards only (about a quarter of a
decode step per round on SmolLM2), instead of a verify per round, and plain `generate()` runs once per turn for
all drafters and all later runs (`--references`, a cache file keyed by target, dtype, ids and budget).

What it is not: a timing (no verify runs; `bench` measures speed), T > 0 (a sampled round's outcome depends on
the target's distribution after the drafted tokens, which only a verify gives), or ReTrace (its memory is the
target's states at the rejected proposals, also only a verify gives them): those are refused with the command
that measures them.

Exactness: `tests/test_replay.py` checks, on tiny targets in fp32, that every round (acceptance length and number
of proposals) equals what `generate(assistant_model=drafter)` records, for every drafter variant, cap, threshold,
budget and EOS. On a real target a near-tie can be decided differently by the one long forward than by the plain
decode steps that produced y; the replay checks the target's argmax against y at every position and stops a turn
at the first disagreement (`summary.references.turns_cut_at_near_tie`), counting only the rounds before it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from ..config_cli import add_config_arguments, config_from_args, option
from ..prompts import load_prompts
from ..runtime import encode_messages, environment, eos_token_ids
from .bench import BenchConfig, MeasureOptions, _finite, _load
from .metrics import paired_ratio_interval, summarize_rounds

__all__ = ["ReplayConfig", "paired_tau_ratio_interval", "replay_turn", "run_replay"]

SCHEMA = "dflash-retrace/replay/v1"
MAIN = "main"

DEFINITIONS = {
    "round": "one drafter call (a target verify in real generation), as `generate(assistant_model=...)` records it "
             "in DFlashStats: rounds whose proposals were all cut (proposal_threshold) count, with length 1",
    "acceptance_length": "tokens committed by a round, bonus token included",
    "tau_pooled": "mean acceptance length over all rounds of all prompts",
    "tau_ratio": "tau_pooled of the main drafter over a compared drafter's, with a 95% paired-bootstrap interval "
                 "over prompts (both drafters keep the same resampled prompts)",
    "drafter_ms_per_round": "wall time of the candidate generator's call (drafter forward + proposal logic) per "
                            "round; no verify runs in a replay",
    "reference": "a turn's plain target.generate() output (greedy), shared by every drafter; later turns are "
                 "rendered with the earlier reference answers, as in bench",
    "turns_cut_at_near_tie": "turns whose reference token differs somewhere from the argmax of the replay's one "
                             "target forward (a near-tie decided differently): replayed up to there",
}


@dataclass
class ReplayConfig(MeasureOptions):
    """What `run_replay` measures; the `replay` CLI is generated from these fields (T=0: no temperature)."""

    output: str | None = option(None, "JSON report path", cli_default="replay.json")
    references: str | None = option(None, "cache file of plain generate() outputs (JSONL, appended as they are "
                                          "computed; reused by any later replay of the same target and dtype)")


# ---------------------------------------------------------------------------------- one turn
class _CommittedCache:
    """The target's cache as generate() holds it before a round: every layer cut to the committed positions
    before the anchor (views of the one forward's cache, no copy)."""

    offloading = False

    def __init__(self, full_cache, length: int):
        self.layers = []
        for layer in full_cache.layers:
            view = copy.copy(layer)
            view.keys, view.values = layer.keys[:, :, :length], layer.values[:, :, :length]
            self.layers.append(view)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.layers[layer_idx].get_seq_length())


def _check_replayable(drafter, label: str) -> None:
    if drafter.retrace is not None:
        raise ValueError(
            f"{label} is a ReTrace drafter: its memory is the target's states at the rejected proposals, which only "
            "a verify forward gives, so it cannot be replayed. Measure it with `dflash-retrace bench` (or replay its "
            "DFlash backbone: DFlashDrafter.from_pretrained(path, retrace=False)).")


def replay_turn(target, drafter, input_ids: torch.Tensor, new_ids: list, max_new_tokens: int, forward=None) -> dict:
    """Replays greedy `generate(input_ids, assistant_model=drafter, max_new_tokens=...)` on the target's own output
    `new_ids` (plain greedy generate() of the same call). Returns {"acceptance_lengths", "num_proposals", "drafts",
    "drafter_s", "replayed_tokens", "cut_at", "outside_vocab"}, the first three as `drafter.last_stats` would hold
    them. `outside_vocab` (None without a draft vocabulary): {"tokens": tokens committed by rounds that the drafter
    could not propose in their round (a vocabulary grown by `draft_vocab_context` counts as it stood then), "rounds":
    rounds that ended at such a token}.

    `forward`: the target forward over `input_ids + new_ids` (`output_hidden_states=True`, with its cache for a
    KV drafter); computed here when None. `cut_at`: the first new token the forward's argmax disagrees with
    (a near-tie), or None; the replay stops before the round that would reach it.
    """
    _check_replayable(drafter, "the drafter")
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    full = torch.cat([input_ids, torch.tensor([new_ids], dtype=input_ids.dtype, device=device)], dim=-1)
    needs_kv = getattr(drafter.config, "context", "hidden") != "hidden"
    if forward is None:
        forward = target_forward(target, full, needs_kv)
    # The target's own verdicts: argmax at position i predicts token i + 1.
    verdict = forward.logits[0].argmax(-1).tolist()
    end = full.shape[1]
    cut_at = next((j for j in range(len(new_ids)) if verdict[prompt_len - 1 + j] != new_ids[j]), None)
    if cut_at is not None:
        end = prompt_len + cut_at  # tokens before it are consistent with this forward

    generation_config = copy.deepcopy(target.generation_config)
    generation_config.max_length = prompt_len + max_new_tokens
    generation_config.do_sample = False
    generation_config.output_hidden_states = False
    eos = eos_token_ids(target)
    generation_config._eos_token_tensor = torch.tensor(eos, device=device) if eos else None
    generator = drafter.make_candidate_generator(target, generation_config, None, {})
    stats = generator.stats
    tokens = full[0].tolist()
    # token -> whether the round's draft vocabulary (grown by the context, if so configured) holds it; None: full
    proposable = None if drafter.draft_to_target is None else generator.proposable
    ended_outside = outside_tokens = 0

    seq_len, matches, drafter_s = prompt_len + 1, 0, 0.0  # the prefill committed new_ids[0]
    while seq_len < end:
        start = generator.context_length
        outputs = SimpleNamespace(hidden_states=tuple(h[:, start:seq_len] for h in forward.hidden_states))
        model_kwargs = {"past_key_values": _CommittedCache(forward.past_key_values, seq_len - 1)} if needs_kv else {}
        t0 = time.perf_counter()
        candidates, _ = generator.get_candidates(full[:, :seq_len], model_kwargs=model_kwargs, model_outputs=outputs,
                                                 n_last_matches=matches)
        drafter_s += time.perf_counter() - t0
        drafts = candidates[0, seq_len:].tolist()
        matches = 0
        while matches < len(drafts) and seq_len + matches < end and drafts[matches] == tokens[seq_len + matches]:
            matches += 1
        if drafts and matches == len(drafts) and drafts[-1] in eos:
            matches -= 1  # transformers leaves a stopping candidate's last token to the target (it commits the same)
        if seq_len + matches >= end and end < full.shape[1]:  # the round would cross the near-tie: not counted
            if generator.round_open:
                for log in (stats.num_proposals, stats.conditioned_slots, stats.drafts, stats.lookup_proposals):
                    log.pop()
            break
        rounds = len(stats.acceptance_lengths)
        generator.update_candidate_strategy(full[:, :seq_len], None, matches)
        if proposable is not None and len(stats.acceptance_lengths) > rounds:  # a round (not a budget's plain step)
            committed = tokens[seq_len:seq_len + matches + 1]
            outside_tokens += sum(not proposable(t) for t in committed)
            ended_outside += matches < len(drafts) and not proposable(committed[-1])
        seq_len += matches + 1
    outside = None if proposable is None else {"tokens": outside_tokens, "rounds": int(ended_outside)}
    return {"acceptance_lengths": list(stats.acceptance_lengths), "num_proposals": list(stats.num_proposals),
            "lookup_proposals": list(stats.lookup_proposals), "drafts": list(stats.drafts), "drafter_s": drafter_s,
            "replayed_tokens": seq_len - prompt_len,
            "cut_at": cut_at, "outside_vocab": outside}


def target_forward(target, full_ids: torch.Tensor, with_cache: bool):
    """One target forward over a whole turn (prompt + reference): logits, every hidden state, and the cache."""
    with torch.no_grad():
        return target(full_ids, attention_mask=torch.ones_like(full_ids), use_cache=with_cache,
                      output_hidden_states=True)


# ----------------------------------------------------------------------------- references
class References:
    """Plain greedy generate() outputs, cached in a JSONL file (one {"key", "new_ids"} per line, appended)."""

    def __init__(self, path, target_name: str, dtype: torch.dtype):
        self.path = None if path is None else Path(path)
        self.prefix = f"{target_name}|{dtype}"
        self.table, self.computed, self.reused = {}, 0, 0
        if self.path is not None and self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.table[row["key"]] = row["new_ids"]
                except (ValueError, KeyError) as err:
                    raise ValueError(f"{self.path}:{n} is not a reference row ({err}): delete the file or that line "
                                     "(it is a cache; the references are recomputed).") from err

    def key(self, input_ids: torch.Tensor, max_new_tokens: int) -> str:
        text = json.dumps([self.prefix, max_new_tokens, input_ids[0].tolist()])
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, target, input_ids: torch.Tensor, max_new_tokens: int) -> list:
        key = self.key(input_ids, max_new_tokens)
        if key in self.table:
            self.reused += 1
            return self.table[key]
        eos = eos_token_ids(target)
        pad = target.generation_config.pad_token_id
        with torch.no_grad():
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=pad if pad is not None else (eos[0] if eos else None))
        new_ids = out[0, input_ids.shape[1]:].tolist()
        self.table[key] = new_ids
        self.computed += 1
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(json.dumps({"key": key, "new_ids": new_ids}) + "\n")
        return new_ids


# ------------------------------------------------------------------------------------ stats
def paired_tau_ratio_interval(num: list, den: list, reps: int = 2000, seed: int = 0) -> list | None:
    """95% paired-bootstrap interval over prompts of τ_num / τ_den, each τ pooled over the resampled prompts.

    `num`, `den`: per prompt, the list of acceptance lengths of each drafter (same prompts, same order). Every prompt
    counts, as in the point estimate (a prompt where one drafter had no rounds still adds the other's)."""
    return paired_ratio_interval([(sum(a), len(a), sum(b), len(b)) for a, b in zip(num, den)], reps, seed)


def _outside_vocab(prompt_rows: list, name: str, rounds: int) -> dict | None:
    """How much of the target's output `name`'s draft vocabulary cannot propose (None without one): the share of the
    replayed reference tokens outside it, and of the rounds that ended at such a token."""
    counts = [p["drafters"][name]["outside_vocab"] for p in prompt_rows]
    if all(c is None for c in counts):
        return None
    tokens = sum(sum(p["drafters"][name]["acceptance_lengths"]) for p in prompt_rows)  # each round commits its length
    outside = sum(c["tokens"] for c in counts if c)
    return {"tokens": outside, "token_share": outside / tokens if tokens else None,
            "rounds": sum(c["rounds"] for c in counts if c),
            "round_share": sum(c["rounds"] for c in counts if c) / rounds if rounds else None}


def _lookup_share(prompt_rows: list, name: str) -> dict | None:
    """Proposals from the context lookup (`lookup_threshold`) and how many the target accepted (a round's lookup
    proposals are its last ones); None where the drafter made none."""
    rounds = [(a, k, n) for p in prompt_rows for a, k, n in zip(p["drafters"][name]["acceptance_lengths"],
                                                                 p["drafters"][name]["num_proposals"],
                                                                 p["drafters"][name].get("lookup_proposals") or [])]
    proposals = sum(n for _, _, n in rounds)
    if not proposals:
        return None
    accepted = sum(max(0, a - 1 - (k - n)) for a, k, n in rounds)
    return {"proposals": proposals, "accepted": accepted,
            "rounds_with_lookup": sum(n > 0 for _, _, n in rounds) / len(rounds)}


def _summary(prompt_rows: list, names: list, block_sizes: dict) -> dict:
    methods = {}
    for name in names:
        lengths = [p["drafters"][name]["acceptance_lengths"] for p in prompt_rows]
        proposals = [p["drafters"][name]["num_proposals"] for p in prompt_rows]
        summary = summarize_rounds(lengths, proposals, block_sizes[name])
        drafter_s = sum(p["drafters"][name]["drafter_s"] for p in prompt_rows)
        rounds = summary["num_rounds"]
        summary["drafter_ms_per_round"] = 1000 * drafter_s / rounds if rounds else None
        summary["rounds_without_proposals"] = sum(k == 0 for ks in proposals for k in ks) / rounds if rounds else None
        summary["proposals_per_round"] = sum(map(sum, proposals)) / rounds if rounds else None
        summary["outside_draft_vocab"] = _outside_vocab(prompt_rows, name, rounds)
        summary["context_lookup"] = _lookup_share(prompt_rows, name)
        methods[name] = summary
    ratios = {}
    for name in names[1:]:
        num = [p["drafters"][MAIN]["acceptance_lengths"] for p in prompt_rows]
        den = [p["drafters"][name]["acceptance_lengths"] for p in prompt_rows]
        ours, theirs = methods[MAIN]["tau_pooled"], methods[name]["tau_pooled"]
        ratios[f"{MAIN}/{name}"] = {"ratio": ours / theirs if ours and theirs else None,
                                    "ci95": paired_tau_ratio_interval(num, den)}
    return {"num_prompts": len(prompt_rows), "methods": methods, "tau_ratios": ratios}


def _replay_item(target, tokenizer, drafters: dict, item: dict, references: References, cfg: ReplayConfig, device,
                 needs_kv: bool) -> dict:
    """Every turn of one prompt: its reference, one target forward, and each drafter's replay on it."""
    row = {"id": item["id"], "turns": len(item["turns"]), "prompt_tokens": [], "new_tokens": [], "cut_at": [],
           "drafters": {label: {"acceptance_lengths": [], "num_proposals": [], "lookup_proposals": [], "drafter_s": 0.0,
                                "outside_vocab": None} for label in drafters}}
    messages = []
    for turn in item["turns"]:
        messages.append({"role": "user", "content": turn})
        input_ids = torch.tensor([encode_messages(tokenizer, messages, cfg.enable_thinking)], device=device)
        new_ids = references.get(target, input_ids, cfg.max_new_tokens)
        full = torch.cat([input_ids, torch.tensor([new_ids], dtype=input_ids.dtype, device=device)], dim=-1)
        forward = target_forward(target, full, needs_kv)
        for label, model in drafters.items():
            result = replay_turn(target, model, input_ids, new_ids, cfg.max_new_tokens, forward)
            entry = row["drafters"][label]
            entry["acceptance_lengths"] += result["acceptance_lengths"]
            entry["num_proposals"] += result["num_proposals"]
            entry["lookup_proposals"] += result["lookup_proposals"]
            entry["drafter_s"] += result["drafter_s"]
            if result["outside_vocab"] is not None:
                old = entry["outside_vocab"] or {"tokens": 0, "rounds": 0}
                entry["outside_vocab"] = {k: old[k] + result["outside_vocab"][k] for k in old}
        row["prompt_tokens"].append(input_ids.shape[1])
        row["new_tokens"].append(len(new_ids))
        row["cut_at"].append(result["cut_at"])  # the same for every drafter: it is the forward's
        del forward
        # Later turns see the reference answer, as bench renders them with plain generate's.
        messages.append({"role": "assistant", "content": tokenizer.decode(new_ids, skip_special_tokens=True)})
    return row


# ------------------------------------------------------------------------------------ driver
def run_replay(target, drafter, config: ReplayConfig | None = None, tokenizer=None, **overrides) -> dict:
    """Replays greedy speculative generation of `drafter` (and `compare` drafters) on a prompt set; returns the
    report (the JSON's content). Arguments as `run_benchmark`'s; see the module docstring for what a replay is."""
    if config is not None and not isinstance(config, ReplayConfig):
        raise TypeError(f"run_replay(target, drafter, config) takes a ReplayConfig, got {type(config).__name__}: "
                        "pass the other settings by keyword (dataset=..., max_samples=...).")
    cfg = ReplayConfig(**{**(vars(config) if config else {}), **overrides})
    bench_cfg = BenchConfig(device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, max_proposals=cfg.max_proposals,
                            proposal_threshold=cfg.proposal_threshold, lookup_threshold=cfg.lookup_threshold,
                            compare=cfg.compare)
    notes = []
    target, tokenizer, drafter, compared, names = _load(target, drafter, bench_cfg, tokenizer, notes)
    drafters = {MAIN: drafter, **compared}
    for label, model in drafters.items():
        _check_replayable(model, f"drafter {label!r}")
    param = next(target.parameters())
    device, dtype = param.device, param.dtype
    items = load_prompts(cfg.dataset, max_samples=cfg.max_samples, seed=None if cfg.source_order else cfg.seed,
                         source=cfg.data)
    if not items:
        raise ValueError(f"prompt set {cfg.dataset!r} gave no prompts")
    references = References(cfg.references, names["target"], dtype)
    needs_kv = any(getattr(m.config, "context", "hidden") != "hidden" for m in drafters.values())
    labels = list(drafters)

    prompt_rows = []
    start = time.perf_counter()
    bar = tqdm(items, desc="replay", unit="prompt", disable=not cfg.progress, file=sys.stderr)
    for item in bar:
        prompt_rows.append(_replay_item(target, tokenizer, drafters, item, references, cfg, device, needs_kv))
        lengths = [n for r in prompt_rows for n in r["drafters"][MAIN]["acceptance_lengths"]]
        if lengths:
            bar.set_postfix(tau=f"{sum(lengths) / len(lengths):.2f}")
    bar.close()
    turns_total = sum(r["turns"] for r in prompt_rows)
    cut_turns = sum(c is not None for r in prompt_rows for c in r["cut_at"])

    block_sizes = {label: model.config.block_size for label, model in drafters.items()}
    summary = _summary(prompt_rows, labels, block_sizes)
    summary["references"] = {"file": cfg.references, "computed": references.computed, "reused": references.reused,
                             "turns": turns_total, "turns_cut_at_near_tie": cut_turns}
    report = _finite({
        "schema": SCHEMA,
        "config": {
            "target": names["target"], "drafters": {MAIN: names["drafter"], **names["compare"]},
            "dataset": os.fspath(cfg.dataset), "data": None if cfg.data is None else os.fspath(cfg.data),
            "max_samples": cfg.max_samples,
            "prompt_order": "source" if cfg.source_order else f"shuffled (seed {cfg.seed})",
            "num_prompts": len(items), "max_new_tokens": cfg.max_new_tokens, "temperature": 0.0,
            "block_sizes": block_sizes,
            "max_proposals": getattr(drafter.config, "max_proposals", None),
            "proposal_threshold": getattr(drafter.config, "proposal_threshold", 0.0),
            "lookup_threshold": getattr(drafter.config, "lookup_threshold", 0.0),
        },
        "environment": environment(device, dtype, cfg.seed),
        "definitions": DEFINITIONS,
        "notes": notes,
        "summary": summary,
        "timing": {"wall_s": time.perf_counter() - start},
        "prompts": prompt_rows,
    })
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output).write_text(json.dumps(report, indent=1) + "\n")
    return report


def format_replay(report: dict) -> str:
    """A Markdown table of a replay report: τ, ratio to the main drafter with its interval, per-slot acceptance."""
    summary, config = report["summary"], report["config"]
    refs = summary["references"]
    lines = [f"replay: {config['dataset']} ({summary['num_prompts']} prompts, {refs['turns']} turns), "
             f"{config['max_new_tokens']} new tokens per turn, T=0, target {config['target']}",
             f"references: {refs['computed']} computed, {refs['reused']} reused; "
             f"{refs['turns_cut_at_near_tie']} turns cut at a near-tie",
             "", "| drafter | τ | τ(main) / τ [95% CI] | slot-1 | slot-2 | slot-3 | proposals/round | "
             "drafter ms/round |", "|---|---|---|---|---|---|---|---|"]
    for label, m in summary["methods"].items():
        ratio = summary["tau_ratios"].get(f"{MAIN}/{label}")
        ci = ratio and ratio["ci95"]
        if ratio is None:  # the main drafter itself
            cell = "1"
        elif ratio["ratio"] is None:  # a drafter without rounds (e.g. a budget of 1 or 2 tokens): no τ ratio
            cell = "-"
        else:
            cell = f"{ratio['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        rate = m["per_slot"]["rate"] + [math.nan] * 3
        slots = " | ".join("-" if r is None or r != r else f"{r:.3f}" for r in rate[:3])
        tau = "-" if m["tau_pooled"] is None else f"{m['tau_pooled']:.3f}"
        ms = "-" if m["drafter_ms_per_round"] is None else f"{m['drafter_ms_per_round']:.1f}"
        per = "-" if m["proposals_per_round"] is None else f"{m['proposals_per_round']:.2f}"
        lines.append(f"| {label} ({config['drafters'][label]}) | {tau} | {cell} | {slots} | {per} | {ms} |")
    outside = [(label, m["outside_draft_vocab"]) for label, m in summary["methods"].items()
               if m.get("outside_draft_vocab") and m["outside_draft_vocab"]["token_share"] is not None]
    lookups = [(label, m["context_lookup"]) for label, m in summary["methods"].items() if m.get("context_lookup")]
    if lookups:
        lines += ["", "context lookup: " + "; ".join(
            f"{label} {o['proposals']} proposals in {o['rounds_with_lookup']:.1%} of the rounds, {o['accepted']} accepted"
            for label, o in lookups)]
    if outside:
        lines += ["", "draft vocabulary, the target's tokens it cannot propose: " + "; ".join(
            f"{label} {o['token_share']:.1%} of the tokens, {o['round_share']:.1%} of the rounds end at one"
            for label, o in outside)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CLI
def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="exact greedy τ of drafters on a prompt set from one target forward per turn (no verify)",
        description="Computes each turn's plain greedy generate() output once (cached with --references), runs one "
                    "target forward over it, and replays every drafter's rounds on it through the drafter's own "
                    "candidate generator: the τ, per-slot acceptance and rounds generate(assistant_model=drafter) "
                    "would record at T=0, at the cost of the drafter's forwards. No timing (see bench), T=0 only, "
                    "no ReTrace drafters.",
    )
    p.add_argument("--target", required=True, help="target model: registry name (dflash-retrace fetch), folder or Hub id")
    p.add_argument("--drafter", required=True, help="DFlash drafter folder or Hub id (not a ReTrace drafter)")
    add_config_arguments(p, ReplayConfig)
    p.set_defaults(func=_cli)


def _cli(args) -> int:
    report = run_replay(args.target, args.drafter, config_from_args(ReplayConfig, args))
    print(format_replay(report))
    if args.output:
        print(f"JSON: {args.output}")
    return 0
