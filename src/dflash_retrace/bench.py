"""`dflash-retrace bench`: acceptance length τ and speedup of a DFlash drafter, measured honestly.

For every prompt, in the same run and on the same token ids:
- `plain`: `target.generate()` alone (the speedup's denominator);
- `speculative`: `target.generate(assistant_model=drafter)` (this library's candidate generator);
- with `--baselines`: `zlab_reference`, z-lab's own loop `dflash.model.dflash_generate` run on a
  `dflash.model.DFlashDraftModel` loaded with the same weights, and `transformers_builtin`,
  `generate(assistant_model=drafter, speculation_type="dflash")` (transformers' own DFlash path).

Definitions (also written into the JSON under "definitions"):
- a round is a target verification forward that checked at least one proposal; τ is tokens committed
  per round, bonus included (1..B). `tau_pooled` averages over all rounds of all prompts,
  `tau_prompt_mean` averages each prompt's mean;
- prefill (time to first token) is timed by a separate `target.generate(max_new_tokens=1)` on the same
  ids (generate()'s setup included) and shared by all methods; decode time = end-to-end time - prefill;
- speedup = end-to-end time of `plain` / time of the method, summed over prompts both completed
  (equal to the tokens/s ratio when the outputs are identical, as under greedy decoding);
- warm-up calls are excluded; on CUDA the device is synchronised before every clock read.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from . import __version__
from .assets import resolve_model
from .datasets import apply_chat_template, load_prompts
from .metrics import agreement, summarize_rounds
from .modeling_dflash import DFlashDrafter

__all__ = ["run_benchmark", "format_report", "plot_results", "build_reference_drafter", "environment", "register_cli"]

SCHEMA = "dflash-retrace/bench/v1"
PLAIN, SPECULATIVE, REFERENCE, BUILTIN = "plain", "speculative", "zlab_reference", "transformers_builtin"
WARMUP_TOKENS = 16  # per method, on the first prompt, before any clock runs

DEFINITIONS = {
    "round": "one target verification forward that checked >= 1 proposal; budget-limited proposals that could "
             "never be committed are not counted (rounds left with none are plain steps)",
    "acceptance_length": "tokens committed by a round, bonus token included (1..block_size)",
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
    "agreement": "exact_rate: prompts whose tokens equal plain's; prefix_rate: tokens before the first divergence "
                 "/ tokens of the longer output, pooled",
    "multi_turn": "later turns are rendered with plain generate's earlier answers, so every method sees the same ids",
}

UNTRAINED_NOTE = (
    "--drafter untrained: a randomly initialised 1-layer DFlash drafter (DFlashDrafter.from_target). Its proposals "
    "are noise, so tau ~ 1 (the floor: only the bonus token per round) and speculative decoding is SLOWER than plain "
    "generate. This run measures the integration's overhead, not acceptance."
)


# ------------------------------------------------------------------------------------ loading
def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on CUDA, float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(names)}")
    return names[dtype]


def _asset_note(path: str) -> str | None:
    info = Path(path) / "asset.json"
    if info.is_file():
        try:
            return json.loads(info.read_text()).get("note")
        except ValueError:
            return None
    return None


def load_target(name_or_path: str, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer, resolved path): a registry name, local folder or Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tokenizer, path


def load_drafter(spec: str, target, seed: int = 0) -> tuple:
    """(drafter, untrained): `"untrained"` builds a seeded 1-layer drafter; anything else is a local folder
    or Hub id for `DFlashDrafter.from_pretrained`. The drafter takes the target's device and dtype."""
    param = next(target.parameters())
    if spec == "untrained":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            drafter = DFlashDrafter.from_target(target, num_hidden_layers=1)
        return drafter.to(device=param.device, dtype=param.dtype).eval(), True
    drafter = DFlashDrafter.from_pretrained(spec, dtype=param.dtype)
    return drafter.to(param.device).eval(), False


def build_reference_drafter(drafter: DFlashDrafter):
    """z-lab's `dflash.model.DFlashDraftModel` holding `drafter`'s weights (the checkpoint keys are the same).

    Config in z-lab's layout: a Qwen3Config plus `dflash_config={mask_token_id, target_layer_ids}`,
    `block_size` and `num_target_layers`. ReTrace weights, if any, are left out: the reference is plain DFlash.
    """
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    c = drafter.config
    dflash_config = {"mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)}
    for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        if getattr(c, name) != default:
            dflash_config[name] = getattr(c, name)
    config = Qwen3Config(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        max_position_embeddings=c.max_position_embeddings, attention_bias=c.attention_bias, hidden_act=c.hidden_act,
        vocab_size=c.vocab_size, tie_word_embeddings=False,
    )
    config.architectures = ["DFlashDraftModel"]
    config.block_size = c.block_size
    config.num_target_layers = c.num_target_layers
    config.dflash_config = dflash_config
    param = drafter.fc.weight
    with torch.device(param.device):
        model = DFlashDraftModel(config)
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("retrace.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto z-lab's DFlashDraftModel: missing {missing}, unexpected {unexpected}")
    return model.to(dtype=param.dtype).eval()


def _git(*args: str) -> str | None:
    """git output in this package's source checkout (None for an installed copy or without git)."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "src" / "dflash_retrace").is_dir():
        return None
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(device: torch.device, dtype: torch.dtype, seed: int | None) -> dict:
    """What produced the numbers (no hostname)."""
    try:
        import dflash

        dflash_version = getattr(dflash, "__version__", None) or _dist_version("dflash")
    except ImportError:
        dflash_version = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine()),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "dflash_retrace": __version__,
        "dflash_reference": dflash_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "seed": seed,
    }


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------ methods
@dataclass
class Generation:
    """One method on one turn: new token ids and, for speculative methods, its rounds."""

    new_ids: list
    acceptance_lengths: list | None = None
    num_proposals: list | None = None


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _budget_rounds(produced: list, max_new_tokens: int, block_size: int) -> tuple:
    """(acceptance lengths, proposals) in this module's definition, from z-lab's per-round `produced` counts.

    z-lab's loop verifies a full block even when fewer tokens fit the budget (and then clips what it
    commits); proposals that could never be committed are not counted, and a round left with none is a
    plain step, as in this library's generator.
    """
    lengths, counts, offset = [], [], 1  # the first new token comes from prefill
    for d in produced:
        remaining = max_new_tokens - offset  # tokens still allowed, the bonus included
        k = min(block_size - 1, remaining - 1)
        if k >= 1:
            lengths.append(int(d))
            counts.append(k)
        offset += int(d)
    return lengths, counts


class _Methods:
    """The generate calls being compared; each returns a Generation for one turn's input ids."""

    def __init__(self, target, drafter, max_new_tokens: int, temperature: float, baselines: bool,
                 compare: dict | None = None):
        self.target, self.drafter = target, drafter
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.block_size = drafter.config.block_size
        gen = target.generation_config
        eos = gen.eos_token_id
        self.stop_ids = None if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        pad = gen.pad_token_id if gen.pad_token_id is not None else (self.stop_ids[0] if self.stop_ids else None)
        self.kwargs = {"do_sample": temperature > 0, "pad_token_id": pad}
        if temperature > 0:  # plain temperature sampling, as the reference loop (top_p=1, top_k=0)
            self.kwargs.update(temperature=temperature, top_p=1.0, top_k=0)
        self.available = {PLAIN: self.plain, SPECULATIVE: self.speculative}
        self.block_sizes = {SPECULATIVE: self.block_size}
        for label, other in (compare or {}).items():  # more drafters, each against the same plain run
            name = f"{SPECULATIVE}:{label}"
            self.available[name] = lambda ids, n, other=other: self.speculative(ids, n, other)
            self.block_sizes[name] = other.config.block_size
        self.skipped = {}
        self.reference = None
        if baselines:
            try:
                import dflash.model  # noqa: F401
            except ImportError as err:
                self.skipped[REFERENCE] = f"z-lab's `dflash` is not importable ({err}); pip install dflash==0.1.0"
            else:
                self.reference = build_reference_drafter(drafter)
                self.available[REFERENCE] = self.zlab_reference
            self.available[BUILTIN] = self.transformers_builtin
            self.block_sizes[REFERENCE] = self.block_sizes[BUILTIN] = self.block_size

    def _generate(self, input_ids, max_new_tokens, **extra):
        out = self.target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                   max_new_tokens=max_new_tokens, **self.kwargs, **extra)
        return out[0, input_ids.shape[1]:].tolist()

    def prefill(self, input_ids):
        return self._generate(input_ids, 1)

    def plain(self, input_ids, max_new_tokens):
        return Generation(self._generate(input_ids, max_new_tokens))

    def speculative(self, input_ids, max_new_tokens, drafter=None):
        drafter = self.drafter if drafter is None else drafter
        drafter.last_stats = None
        new_ids = self._generate(input_ids, max_new_tokens, assistant_model=drafter)
        stats = drafter.last_stats
        if stats is None:  # never report a plain run as speculative
            raise RuntimeError("generate(assistant_model=drafter) did not run the DFlash candidate generator "
                               "(drafter.last_stats was not set): is the dispatch disabled (no_dispatch)?")
        return Generation(new_ids, list(stats.acceptance_lengths), list(stats.num_proposals))

    def zlab_reference(self, input_ids, max_new_tokens):
        from dflash.model import dflash_generate

        with _reference_clock(input_ids.device), warnings.catch_warnings():
            # z-lab 0.1.0 still passes `past_key_values=` to the target (renamed `cache=` in transformers 5.24)
            warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
            result = dflash_generate(self.reference, self.target, input_ids, max_new_tokens, self.stop_ids,
                                     temperature=self.temperature, return_stats=True)
        lengths, counts = _budget_rounds(result.acceptance_lengths, max_new_tokens, self.block_size)
        return Generation(result.output_ids[0, input_ids.shape[1]:].tolist(), lengths, counts)

    def transformers_builtin(self, input_ids, max_new_tokens):
        log = []
        with _record_builtin_rounds(log):
            new_ids = self._generate(input_ids, max_new_tokens, assistant_model=self.drafter, speculation_type="dflash")
        lengths, counts = [], []
        for committed, proposals, remaining in log:
            k = min(proposals, remaining - 1)
            if k >= 1:
                lengths.append(committed)
                counts.append(k)
        return Generation(new_ids, lengths, counts)


@contextlib.contextmanager
def _reference_clock(device: torch.device):
    """z-lab's loop reads its clocks through `torch.cuda.synchronize()`; off CUDA use the plain clock."""
    import dflash.model as zlab

    if device.type == "cuda":
        yield
        return
    original = zlab._cuda_time
    zlab._cuda_time = time.perf_counter
    try:
        yield
    finally:
        zlab._cuda_time = original


@contextlib.contextmanager
def _record_builtin_rounds(log: list):
    """Logs (committed, proposals, remaining budget) per round of transformers' built-in DFlash generator."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator as Builtin

    had_own = "update_candidate_strategy" in Builtin.__dict__
    original = Builtin.update_candidate_strategy

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        proposals = scores.shape[1] - 1  # scores cover the proposals and the bonus position
        if proposals > 0:
            committed = int(num_matches) + 1
            log.append((committed, proposals, self.main_model_max_length - (input_ids.shape[1] - committed)))
        return original(self, input_ids, scores, num_matches)

    Builtin.update_candidate_strategy = update_candidate_strategy
    try:
        yield
    finally:
        if had_own:
            Builtin.update_candidate_strategy = original
        else:
            del Builtin.update_candidate_strategy


# ------------------------------------------------------------------------------------ the run
@dataclass
class _Row:
    """One method on one prompt, all turns together."""

    new_ids: list = field(default_factory=list)
    total_s: float = 0.0
    acceptance_lengths: list | None = None
    num_proposals: list | None = None
    error: str | None = None


def _encode(tokenizer, messages, enable_thinking, device):
    text = apply_chat_template(tokenizer, messages, enable_thinking=enable_thinking)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)


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


def _run_prompt(methods: "_Methods", names: list, item: dict, index: int, tokenizer, enable_thinking: bool,
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
                t0 = _clock(device)
                methods.prefill(input_ids)
                prefill_s += _clock(device) - t0
        except Exception as err:
            for row in rows.values():
                row.error = row.error or f"{where}prompt/prefill failed: {_error_text(err)}"
            break
        prompt_tokens.append(input_ids.shape[1])
        plain_before = len(rows[PLAIN].new_ids)
        for name in names:
            row = rows[name]
            if row.error:
                continue
            torch.manual_seed(seed + index)  # the same sampling stream for every method (T > 0)
            try:
                with torch.no_grad():
                    t0 = _clock(device)
                    result = methods.available[name](input_ids, methods.max_new_tokens)
                    row.total_s += _clock(device) - t0
            except Exception as err:
                row.error = f"{where}{_error_text(err)}"
                continue
            row.new_ids += result.new_ids
            if result.acceptance_lengths is not None:
                row.acceptance_lengths += result.acceptance_lengths
                row.num_proposals += result.num_proposals
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
            check = agreement([all_rows[i][PLAIN].new_ids for i in both], [all_rows[i][name].new_ids for i in both])
            summary["agreement"] = {k: check[k] for k in ("num_prompts", "exact_rate", "prefix_rate")}
            summary.update(summarize_rounds([p["methods"][name]["acceptance_lengths"] for p in ok],
                                            [p["methods"][name]["num_proposals"] for p in ok], block_sizes[name]))
            summary["ms_per_round"] = _ratio(1000 * decode_s, summary["num_rounds"])
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
            "same_acceptance_lengths": all(p["methods"][SPECULATIVE]["acceptance_lengths"] ==
                                           p["methods"][name]["acceptance_lengths"] for p in both),
        }
    tau_ratios = {}
    for name in names:  # the main drafter's τ over each compared drafter's, pooled over all their rounds
        if name.startswith(f"{SPECULATIVE}:"):
            ours, theirs = methods[SPECULATIVE].get("tau_pooled"), methods[name].get("tau_pooled")
            tau_ratios[f"{SPECULATIVE}/{name}"] = _ratio(ours or 0.0, theirs or 0.0)
    turns = sum(p["turns"] for p in prompt_rows)
    prefill_s = sum(p["prefill_s"] for p in prompt_rows)
    return {
        "tau_ratios": tau_ratios,
        "num_prompts": len(prompt_rows),
        "num_prompts_with_errors": sum(1 for p in prompt_rows if any(m["error"] for m in p["methods"].values())),
        "prefill_s": prefill_s,
        "prefill_ms_mean": 1000 * prefill_s / turns if turns else None,
        "methods": methods,
        "overhead": overhead,
    }


def run_benchmark(
    target,
    drafter,
    dataset: str = "humaneval",
    max_samples: int | None = 32,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    dtype: str | torch.dtype | None = "auto",
    device: str | None = "auto",
    baselines: bool = False,
    output: str | os.PathLike | None = None,
    plot: str | os.PathLike | None = None,
    data: str | os.PathLike | None = None,
    tokenizer=None,
    enable_thinking: bool = False,
    save_outputs: bool = False,
    progress: bool = True,
    warmup_tokens: int = WARMUP_TOKENS,
    cudnn_sdpa: bool = True,
    compare: dict | None = None,
    no_memory: bool = False,
    source_order: bool = False,
) -> dict:
    """Runs plain and speculative generation (and, with `baselines`, the reference loop and transformers'
    built-in DFlash path) on the same prompts in one process; returns the report (the JSON's content).

    `target`: registry name (see `dflash-retrace fetch`), local folder or Hub id, or a loaded model (then pass
    `tokenizer`). `drafter`: folder or Hub id for `DFlashDrafter.from_pretrained`, `"untrained"`, or a loaded
    drafter. `dataset`: gsm8k, math500, humaneval, mbpp, mt-bench or a local JSONL (`data`: a local JSONL with
    the benchmark's own fields). Prompts: `load_prompts(dataset, max_samples=, seed=)`; `source_order=True`
    keeps the set's own order instead of the seeded shuffle, so `max_samples=128` is "the first 128". `output` / `plot`:
    where to write the JSON / PNG. An error on a prompt is recorded in its row and printed; the run goes on.
    `cudnn_sdpa=False` turns PyTorch's cuDNN attention backend off for the run (on an H200 with torch 2.11 it
    re-plans for every new KV length: ~1 ms of CPU per attention call, twice the decode-step time).
    `compare`: {label: drafter (folder, Hub id or loaded)}: more speculative methods `speculative:<label>`, each
    timed against the same plain run, with τ(main)/τ(label) in `summary.tau_ratios`. `no_memory`: also the main
    drafter with its ReTrace conditioner bypassed (`speculative:no_memory`; needs a ReTrace drafter): the
    ablation that separates what the memory does at inference from what the ReTrace training did.
    """
    previous = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(cudnn_sdpa and previous)
    try:
        return _run_benchmark(target, drafter, dataset, max_samples, max_new_tokens, temperature, seed, dtype, device,
                              baselines, output, plot, data, tokenizer, enable_thinking, save_outputs, progress,
                              warmup_tokens, compare or {}, no_memory, source_order)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(previous)


def _run_benchmark(target, drafter, dataset, max_samples, max_new_tokens, temperature, seed, dtype, device, baselines,
                   output, plot, data, tokenizer, enable_thinking, save_outputs, progress, warmup_tokens, compare,
                   no_memory, source_order) -> dict:
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    notes = []
    if isinstance(target, (str, os.PathLike)):
        target_name = os.fspath(target)
        target, tokenizer, target_path = load_target(target_name, device, dtype)
        if note := _asset_note(target_path):
            notes.append(f"target: {note}")
    else:
        if tokenizer is None:
            raise ValueError("run_benchmark(target=<loaded model>) needs tokenizer=<its tokenizer>")
        target_name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        param = next(target.parameters())
        device, dtype = param.device, param.dtype
    if isinstance(drafter, (str, os.PathLike)):
        drafter_name = os.fspath(drafter)
        drafter, untrained = load_drafter(drafter_name, target, seed)
    else:
        drafter_name, untrained = getattr(drafter.config, "_name_or_path", "") or type(drafter).__name__, False
    if untrained:
        notes.append(UNTRAINED_NOTE)
        print(f"\n{'!' * 100}\nNOTE {UNTRAINED_NOTE}\n{'!' * 100}\n", file=sys.stderr, flush=True)
    compared, compare_names = {}, {}
    for label, other in compare.items():
        if isinstance(other, (str, os.PathLike)):
            compare_names[label] = os.fspath(other)
            other, _ = load_drafter(os.fspath(other), target, seed)
        else:
            compare_names[label] = getattr(other.config, "_name_or_path", "") or type(other).__name__
        compared[label] = other
    if no_memory:
        if drafter.retrace is None:
            raise ValueError("no_memory (--no-memory-ablation) bypasses the ReTrace conditioner: the main drafter "
                             f"{drafter_name!r} has none (pass a ReTrace drafter as --drafter).")
        ablated = copy.deepcopy(drafter)
        ablated.retrace = None  # the conditioner bypassed: the same backbone, no memory
        compared["no_memory"], compare_names["no_memory"] = ablated, f"{drafter_name} (ReTrace memory off)"
    if baselines and temperature > 0:
        notes.append("T > 0: zlab_reference samples its proposals from the drafter (z-lab's policy); speculative "
                     f"uses proposal_policy={drafter.config.proposal_policy!r}, transformers_builtin samples them")
    if drafter.retrace is not None and baselines:
        notes.append("the drafter has ReTrace weights: zlab_reference and transformers_builtin run it as plain DFlash")

    items = load_prompts(dataset, max_samples=max_samples, seed=None if source_order else seed, source=data)
    if not items:
        raise ValueError(f"prompt set {dataset!r} gave no prompts")
    if any(len(item["turns"]) > 1 for item in items):
        notes.append(DEFINITIONS["multi_turn"])
    methods = _Methods(target, drafter, max_new_tokens, temperature, baselines, compared)
    names = list(methods.available)

    # Warm-up, excluded from every number: the prefill call and each method once on the first prompt.
    first = _encode(tokenizer, [{"role": "user", "content": items[0]["turns"][0]}], enable_thinking, device)
    with torch.no_grad():
        methods.prefill(first)
        for name in names:
            try:
                methods.available[name](first, min(warmup_tokens, max_new_tokens))
            except Exception as err:  # the timed run reports it again, per prompt
                print(f"[bench] warm-up of {name} failed: {_error_text(err)}", file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    prompt_rows, all_rows = [], []
    start = time.perf_counter()
    bar = tqdm(items, desc="bench", unit="prompt", disable=not progress, file=sys.stderr)
    for index, item in enumerate(bar):
        rows, prompt_tokens, prefill_s = _run_prompt(methods, names, item, index, tokenizer, enable_thinking,
                                                     device, seed)
        all_rows.append(rows)
        prompt_rows.append(_prompt_row(item, prompt_tokens, prefill_s, rows, save_outputs))
        for name, row in rows.items():
            if row.error:
                bar.write(f"[bench] ERROR {item['id']} {name}: {row.error}", file=sys.stderr)
        lengths = [n for r in all_rows for n in (r[SPECULATIVE].acceptance_lengths or [])]
        if lengths:
            bar.set_postfix(tau=f"{sum(lengths) / len(lengths):.2f}")
    bar.close()

    report = {
        "schema": SCHEMA,
        "config": {
            "target": target_name, "drafter": drafter_name, "drafter_untrained": untrained,
            "dataset": os.fspath(dataset), "data": None if data is None else os.fspath(data),
            "max_samples": max_samples, "prompt_order": "source" if source_order else f"shuffled (seed {seed})",
            "num_prompts": len(items), "max_new_tokens": max_new_tokens,
            "temperature": temperature, "block_size": drafter.config.block_size, "seed": seed,
            "enable_thinking": enable_thinking, "baselines": baselines, "methods": names,
            "skipped_methods": methods.skipped, "warmup_tokens": warmup_tokens, "compare": compare_names,
            "block_sizes": methods.block_sizes,
            "cudnn_sdpa": torch.backends.cuda.cudnn_sdp_enabled() if device.type == "cuda" else None,
        },
        "environment": environment(device, dtype, seed),
        "definitions": DEFINITIONS,
        "notes": notes,
        "summary": _summary(prompt_rows, all_rows, names, methods.block_sizes),
        "timing": {
            "wall_s": time.perf_counter() - start,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        },
        "prompts": prompt_rows,
    }
    report = _finite(report)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(report, indent=1) + "\n")
    if plot:
        plot_results(report, plot)
    return report


# ------------------------------------------------------------------------------------ output
def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


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
    for name, spec in summary["methods"].items():
        if not name.startswith(SPECULATIVE) or not spec.get("histogram"):
            continue
        hist = spec["histogram"]
        lines.append(f"τ histogram ({name}, % of rounds): " + " ".join(
            f"{n}:{_fmt(f and 100 * f, '.1f')}" for n, f in zip(hist["lengths"], hist["fractions"]) if f))
        rates = spec["per_slot"]["rate"]
        lines.append(f"per-slot acceptance ({name}, slot 1..K): " + " ".join(_fmt(r, ".2f") for r in rates))
    for key, ratio in summary.get("tau_ratios", {}).items():
        lines.append(f"τ ratio {key}: {_fmt(ratio, '.3f')} (pooled τ of the main drafter over the compared one)")
    for label, name in config.get("compare", {}).items():
        lines.append(f"{SPECULATIVE}:{label} = {name}")
    for key, o in summary["overhead"].items():
        lines.append(f"overhead {key}: end-to-end time ratio {_fmt(o['time_ratio'], '.3f')}, decode "
                     f"{_fmt(o['decode_time_ratio'], '.3f')}, per round {_fmt(o['round_time_ratio'], '.3f')} "
                     f"over {o['num_prompts']} prompts; same acceptance lengths: {o['same_acceptance_lengths']}")
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


# ------------------------------------------------------------------------------------ CLI
def _cli(args) -> int:
    report = run_benchmark(
        args.target, args.drafter, dataset=args.dataset, max_samples=args.max_samples,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, dtype=args.dtype,
        device=args.device, baselines=args.baselines, output=args.output, plot=args.plot, data=args.data,
        enable_thinking=args.enable_thinking, save_outputs=args.save_outputs, progress=not args.no_progress,
        warmup_tokens=args.warmup_tokens, cudnn_sdpa=not args.no_cudnn_sdpa,
        compare=dict(args.compare or []), no_memory=args.no_memory_ablation, source_order=args.source_order,
    )
    print(format_report(report))
    if args.output:
        print(f"JSON: {args.output}" + (f" | plot: {args.plot}" if args.plot else ""))
    return 1 if report["summary"]["num_prompts_with_errors"] else 0


def _label_and_path(value: str) -> tuple:
    import argparse

    label, sep, path = value.partition("=")
    if not sep or not label or not path or not label.replace("_", "").replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected LABEL=DRAFTER (e.g. dflash=hub_configs/x-dflash), got {value!r}")
    return label, path


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
    p.add_argument("--dataset", default="humaneval",
                   help="gsm8k, math500, humaneval, mbpp, mt-bench, or a local .jsonl of prompts (default: humaneval)")
    p.add_argument("--data", default=None, help="local JSONL with the benchmark's own fields (instead of Hub/registry)")
    p.add_argument("--max-samples", type=int, default=32, help="prompts after the seeded shuffle (default: 32)")
    p.add_argument("--source-order", action="store_true",
                   help="keep the set's own order instead of the seeded shuffle: --max-samples N takes the first N")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per turn (default: 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=0, help="prompt shuffle, untrained drafter and sampling seed (default: 0)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--output", default="bench.json", help="JSON report path (default: bench.json)")
    p.add_argument("--plot", default=None, help="also write a PNG (histogram + per-slot acceptance) here")
    p.add_argument("--baselines", action="store_true",
                   help="also run z-lab's dflash_generate (if installed) and transformers' speculation_type='dflash'")
    p.add_argument("--compare", action="append", type=_label_and_path, metavar="LABEL=DRAFTER",
                   help="also time this drafter against the same plain run (method speculative:LABEL; repeatable)")
    p.add_argument("--no-memory-ablation", action="store_true",
                   help="also run the --drafter with its ReTrace memory switched off (method speculative:no_memory)")
    p.add_argument("--enable-thinking", action="store_true", help="thinking on in chat templates that support it")
    p.add_argument("--save-outputs", action="store_true", help="store every method's token ids in the JSON")
    p.add_argument("--warmup-tokens", type=int, default=WARMUP_TOKENS, help="new tokens of each untimed warm-up call")
    p.add_argument("--no-cudnn-sdpa", action="store_true",
                   help="turn PyTorch's cuDNN attention backend off (CUDA; it re-plans for every new KV length)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cli)
