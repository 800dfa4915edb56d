"""`dflash-retrace gpu-check`: what only a GPU can show, in one run of a few minutes with nothing downloaded.

A random-weight target at Qwen3-8B shapes and the `qwen3-8b` drafter template (5 layers, block 16, target
layers [1, 9, 17, 25, 33], mask id 151669) are created directly on the GPU in bf16. On a few random prompts
it runs plain `target.generate()` and `target.generate(assistant_model=drafter)` (greedy) and reports
- greedy agreement of speculative with plain generate (random bf16 weights give near-uniform logits,
  so verifying 16 tokens at once can flip near-ties: the rate is reported, exact equality is not assumed);
- the per-round time split, measured inside the real speculative run with CUDA events on forward hooks:
  target verify of B tokens, drafter forward, drafter logits (the target's LM head) and everything else
  (round wall time minus those), against one plain decode step (a 1-token target forward in plain generate);
- peak GPU memory.
The drafter is untrained, so τ ≈ 1 and the speedup is below 1: this checks cost, not acceptance.
Plain and speculative runs alternate in order prompt by prompt; the per-prompt speedups' spread is reported,
and a speedup above its bound τ is reported as a measurement fault (see `metrics.speedup_bound_fault`).
`--small` (required without CUDA) runs the same code at tiny shapes on the CPU, in fp32.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ..modeling_dflash import DFlashDrafter
from ..runtime import cudnn_sdpa as _cudnn_sdpa
from ..runtime import environment, resolve_device, resolve_dtype
from ..templates import TEMPLATES, template_config
from .metrics import agreement, speedup_bound_fault, spread, summarize_rounds

__all__ = ["run_gpu_check", "format_gpu_check", "register_cli", "SHAPES"]



def _template_shape(name: str) -> dict:
    """A target's and its drafter template's shapes, read from `templates` (not restated here)."""
    t, drafter = TEMPLATES[name], template_config(name)
    return {
        "target": {k: getattr(t, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size")},
        "drafter": {"num_hidden_layers": drafter.num_hidden_layers, "block_size": drafter.block_size,
                    "target_layer_ids": drafter.target_layer_ids, "mask_token_id": drafter.mask_token_id},
    }


SHAPES = {
    # Qwen3-8B and its drafter template (the published z-lab/Qwen3-8B-DFlash-b16 shape).
    "qwen3-8b": {**_template_shape("qwen3-8b"), "prompt_lengths": (256, 512), "num_prompts": 4, "max_new_tokens": 128},
    # The same code at toy size, for the CPU (CI).
    "small": {
        "target": dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, vocab_size=160),
        "drafter": dict(num_hidden_layers=2, block_size=16, target_layer_ids=[1, 3], mask_token_id=159),
        "prompt_lengths": (8, 24), "num_prompts": 3, "max_new_tokens": 24,
    },
}


@contextlib.contextmanager
def _creating_on(device: torch.device, dtype: torch.dtype):
    """Parameters created inside are allocated on `device` in `dtype` (no CPU copy, no cast)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def build_models(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random-weight target and drafter of `SHAPES[shape]`, created on `device`."""
    spec = SHAPES[shape]
    torch.manual_seed(seed)
    config = Qwen3Config(**spec["target"], max_position_embeddings=40960, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    config._attn_implementation = "sdpa"
    with _creating_on(device, dtype):
        target = Qwen3ForCausalLM(config).eval()
        target.generation_config.eos_token_id = None  # random weights: every prompt runs the full budget
        target.generation_config.pad_token_id = 0
        drafter = DFlashDrafter.from_target(target, **spec["drafter"]).eval()
    return target, drafter


class _Timer:
    """Start/stop marks that cost no synchronisation: CUDA events on a GPU, the plain clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else 1000 * (end - start)


class _ForwardLog:
    """Times every target forward, drafter forward and drafter-logits call (the target's LM head called
    outside a target forward) while installed."""

    def __init__(self, target, drafter, timer: _Timer):
        self.timer, self.records, self.inside_target, self.open = timer, [], False, {}
        self.handles = [
            target.register_forward_pre_hook(self._pre("target"), with_kwargs=True),
            target.register_forward_hook(self._post("target"), with_kwargs=True),
            drafter.register_forward_pre_hook(self._pre("draft"), with_kwargs=True),
            drafter.register_forward_hook(self._post("draft"), with_kwargs=True),
            target.get_output_embeddings().register_forward_pre_hook(self._pre("head"), with_kwargs=True),
            target.get_output_embeddings().register_forward_hook(self._post("head"), with_kwargs=True),
        ]

    def _pre(self, kind):
        def hook(module, args, kwargs):
            if kind == "head" and self.inside_target:
                return
            if kind == "target":
                self.inside_target = True
                ids = kwargs.get("input_ids", args[0] if args else None)
                tokens = ids.shape[1] if ids is not None else kwargs["inputs_embeds"].shape[1]
            else:  # drafter(noise_embeds=...) or lm_head(states): the block / slot count
                tokens = (args[0] if args else kwargs["noise_embeds"]).shape[1]
            self.open[kind] = (self.timer.mark(), tokens)
        return hook

    def _post(self, kind):
        def hook(module, args, kwargs, output):
            if kind == "head" and self.inside_target:
                return
            start, tokens = self.open.pop(kind)
            self.records.append((kind, tokens, start, self.timer.mark()))
            if kind == "target":
                self.inside_target = False
        return hook

    def close(self) -> list:
        """[(kind, tokens, ms)] in call order; synchronises once."""
        for handle in self.handles:
            handle.remove()
        if self.timer.cuda:
            torch.cuda.synchronize()
        return [(kind, tokens, self.timer.ms(start, end)) for kind, tokens, start, end in self.records]


def _timed_generate(target, drafter, input_ids, max_new_tokens, timer, speculative: bool):
    log = _ForwardLog(target, drafter, timer)
    kwargs = {"assistant_model": drafter} if speculative else {}
    try:
        if timer.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, **kwargs)
        if timer.cuda:
            torch.cuda.synchronize()
        total_ms = 1000 * (time.perf_counter() - start)
    finally:
        records = log.close()
    return out[0, input_ids.shape[1]:].tolist(), total_ms, records


def _mean(values):
    return sum(values) / len(values) if values else None


def run_gpu_check(small: bool | None = None, device: str | None = None, dtype: str | None = None,
                  num_prompts: int | None = None, max_new_tokens: int | None = None, seed: int = 0,
                  output: str | Path | None = None, progress: bool = True, cudnn_sdpa: bool = True) -> dict:
    """Runs the check and returns (and writes to `output`) the report; see the module docstring.

    `cudnn_sdpa=False` disables PyTorch's cuDNN attention backend for the run (see `runtime.cudnn_sdpa`).
    """
    with _cudnn_sdpa(cudnn_sdpa):
        return _run(small, device, dtype, num_prompts, max_new_tokens, seed, output, progress)


def _run(small, device, dtype, num_prompts, max_new_tokens, seed, output, progress) -> dict:
    start = time.perf_counter()
    notes = []
    device = resolve_device(device)
    if small is None:
        if device.type != "cuda":
            raise ValueError(
                f"no CUDA device (device {device}): gpu-check measures Qwen3-8B shapes on a GPU. Pass --small to run "
                "the same code at tiny shapes on the CPU."
            )
        small = False
    shape = "small" if small else "qwen3-8b"
    dtype = resolve_dtype(dtype or ("float32" if device.type == "cpu" else "bfloat16"), device)
    spec = SHAPES[shape]
    num_prompts = num_prompts or spec["num_prompts"]
    max_new_tokens = max_new_tokens or spec["max_new_tokens"]
    say = (lambda msg: print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)) if progress else (lambda msg: None)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    target, drafter = build_models(shape, device, dtype, seed)
    build_s = time.perf_counter() - t0
    weights_gib = {name: sum(p.numel() * p.element_size() for p in m.parameters()) / 2**30
                   for name, m in (("target", target), ("drafter", drafter))}
    say(f"built {shape} target + drafter on {device} in {dtype} ({build_s:.1f} s; weights "
        f"{weights_gib['target']:.2f} + {weights_gib['drafter']:.2f} GiB)")

    g = torch.Generator().manual_seed(seed)
    low, high = spec["prompt_lengths"]
    vocab = spec["target"]["vocab_size"]
    prompts = [torch.randint(3, vocab - 2, (1, int(torch.randint(low, high + 1, (1,), generator=g))), generator=g).to(device)
               for _ in range(num_prompts)]
    timer = _Timer(device)
    for speculative in (False, True):  # warm-up: kernels, allocator, cuBLAS handles
        _timed_generate(target, drafter, prompts[0], min(16, max_new_tokens), timer, speculative)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    log = _measure(target, drafter, prompts, max_new_tokens, timer, say)
    results = _results(log, drafter.config.block_size)
    if results["throughput"]["measurement_fault"]:
        say(results["throughput"]["measurement_fault"])
    memory = {"weights_gib": weights_gib}
    if device.type == "cuda":
        memory["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        memory["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    else:
        memory["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    report = {
        "schema": "dflash-retrace/gpu-check/v1",
        "config": {"shape": shape, "target": spec["target"], "drafter": spec["drafter"], "num_prompts": num_prompts,
                   "prompt_tokens": [r["prompt_tokens"] for r in log["rows"]], "max_new_tokens": max_new_tokens,
                   "greedy": True, "seed": seed,
                   "sdpa_backends": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                                     "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                                     "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                                     "math": torch.backends.cuda.math_sdp_enabled()}},
        "environment": environment(device, dtype, seed),
        "notes": notes + ["random weights, untrained drafter: tau ~ 1 and speedup < 1 are expected; this checks "
                          "cost and correctness plumbing, not acceptance"],
        **results,
        "memory": memory,
        "prompts": log["rows"],
        "elapsed_s": time.perf_counter() - start,
        "build_s": build_s,
    }
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _measure(target, drafter, prompts, max_new_tokens, timer, say) -> dict:
    """Plain and speculative generate on every prompt, in alternating order, with the forward-level timings of each."""
    log = {key: [] for key in ("plain_out", "spec_out", "rows", "decode_steps", "plain_walls", "verify_full",
                               "verify_all", "drafts", "heads", "round_walls", "lengths", "proposals",
                               "prompt_speedups")}
    log["plain_total"] = log["spec_total"] = 0.0
    for i, ids in enumerate(prompts):
        # Alternate which run goes first, so a slow phase of the machine does not always hit the same one.
        timed, stats = {}, None
        for speculative in ((False, True) if i % 2 == 0 else (True, False)):
            drafter.last_stats = None
            timed[speculative] = _timed_generate(target, drafter, ids, max_new_tokens, timer, speculative)
            if speculative:
                stats = drafter.last_stats
        if stats is None:
            raise RuntimeError("generate(assistant_model=drafter) did not run the DFlash candidate generator")
        log["prompt_speedups"].append(timed[False][1] / timed[True][1])
        _log_plain(log, *timed[False])
        _log_speculative(log, *timed[True], stats, drafter.config.block_size)
        check = agreement([log["plain_out"][-1]], [log["spec_out"][-1]])
        log["rows"].append({"prompt_tokens": ids.shape[1], "new_tokens": len(log["spec_out"][-1]),
                            "rounds": stats.num_rounds, "tau": stats.mean_acceptance_length,
                            "identical": check["first_divergence"][0] is None,
                            "first_divergence": check["first_divergence"][0]})
        tau = "none (no rounds)" if stats.mean_acceptance_length is None else f"{stats.mean_acceptance_length:.2f}"
        say(f"prompt {i + 1}/{len(prompts)}: {ids.shape[1]} prompt tokens, identical={log['rows'][-1]['identical']}, "
            f"tau={tau}")
    return log


def _log_plain(log: dict, tokens, total_ms, records) -> None:
    target_ms = [ms for kind, _, ms in records if kind == "target"]
    steps = target_ms[1:]  # the first forward is the prefill
    log["decode_steps"] += steps
    log["plain_walls"].append((total_ms - target_ms[0]) / max(1, len(steps)))
    log["plain_out"].append(tokens)
    log["plain_total"] += total_ms


def _log_speculative(log: dict, tokens, total_ms, records, stats, block_size: int) -> None:
    forwards = [(n, ms) for kind, n, ms in records if kind == "target"]
    verifies = forwards[1:]  # forwards[0] is the prefill
    log["verify_all"] += [ms for _, ms in verifies]
    log["verify_full"] += [ms for n, ms in verifies if n == block_size]
    log["drafts"] += [ms for kind, _, ms in records if kind == "draft"]
    log["heads"] += [ms for kind, _, ms in records if kind == "head"]
    log["round_walls"].append((total_ms - forwards[0][1]) / max(1, len(verifies)))
    log["spec_out"].append(tokens)
    log["spec_total"] += total_ms
    log["lengths"].append(list(stats.acceptance_lengths))
    log["proposals"].append(list(stats.num_proposals))


def _results(log: dict, block_size: int) -> dict:
    """Agreement, acceptance, the per-round time split against a plain decode step, and throughput."""
    decode_ms = _mean(log["decode_steps"])
    round_ms = _mean(log["round_walls"])
    verify_ms, draft_ms, head_ms = _mean(log["verify_full"]) or _mean(log["verify_all"]), _mean(log["drafts"]), \
        _mean(log["heads"])
    other_ms = round_ms - (_mean(log["verify_all"]) or 0.0) - (draft_ms or 0.0) - (head_ms or 0.0)
    rel = lambda v: None if v is None or not decode_ms else v / decode_ms  # noqa: E731
    check = agreement(log["plain_out"], log["spec_out"])
    rounds = summarize_rounds(log["lengths"], log["proposals"], block_size)
    speedup = log["plain_total"] / log["spec_total"]  # the rate ratio too: no EOS, both runs make max_new_tokens
    return {
        "agreement": {"exact_rate": check["exact_rate"], "prefix_rate": check["prefix_rate"],
                      "all_identical": check["exact_rate"] == 1.0, "first_divergence": check["first_divergence"]},
        "acceptance": {"tau_pooled": rounds["tau_pooled"], "tau_prompt_mean": rounds["tau_prompt_mean"],
                       "num_rounds": rounds["num_rounds"], "histogram_counts": rounds["histogram"]["counts"]},
        "timing_ms": {
            "plain_decode_step": decode_ms,                 # one 1-token target forward inside plain generate
            "plain_step_wall": _mean(log["plain_walls"]),   # per token, generate()'s own overhead included
            "round_wall": round_ms,                         # per target forward after prefill, speculative generate
            "target_verify": verify_ms,                     # one target forward over B tokens
            "drafter_forward": draft_ms,
            "drafter_logits": head_ms,                      # target LM head on the K drafter states
            "other": other_ms,                              # round_wall - verify - drafter forward - drafter logits
        },
        "relative_to_plain_decode_step": {
            "target_verify": rel(verify_ms), "drafter_forward": rel(draft_ms), "drafter_logits": rel(head_ms),
            "other": rel(other_ms), "round_wall": rel(round_ms),
        },
        "throughput": {"plain_tokens_per_s": sum(map(len, log["plain_out"])) / (log["plain_total"] / 1000),
                       "speculative_tokens_per_s": sum(map(len, log["spec_out"])) / (log["spec_total"] / 1000),
                       "speedup": speedup,
                       "speedup_spread": spread(log["prompt_speedups"]),  # per-prompt plain / speculative time
                       "measurement_fault": speedup_bound_fault(speedup, rounds["tau_pooled"])},  # else None
    }


def format_gpu_check(report: dict) -> str:
    t, r = report["timing_ms"], report["relative_to_plain_decode_step"]
    env, cfg, agree, mem = report["environment"], report["config"], report["agreement"], report["memory"]
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = [
        f"gpu-check {cfg['shape']} | {env['device_name']} ({env['device']}) {env['dtype']} | torch {env['torch']} | "
        f"transformers {env['transformers']} | {cfg['num_prompts']} prompts x {cfg['max_new_tokens']} new tokens | "
        f"cuDNN SDPA {'on' if cfg['sdpa_backends']['cudnn'] else 'off'}",
        f"{'per round (ms)':<34}{'ms':>9}{'x plain step':>14}",
    ]
    for label, key in (("plain decode step (1-token fwd)", "plain_decode_step"), ("target verify (B tokens)", "target_verify"),
                       ("drafter forward", "drafter_forward"), ("drafter logits (LM head)", "drafter_logits"),
                       ("everything else", "other"), ("speculative round, wall", "round_wall")):
        lines.append(f"{label:<34}{f(t[key]):>9}{f(r.get(key) if key != 'plain_decode_step' else 1.0):>14}")
    lines.append(f"plain step wall (generate overhead incl.): {f(t['plain_step_wall'])} ms")
    peak = mem.get("peak_allocated_gib", mem.get("peak_rss_gib"))
    lines.append(f"greedy agreement with plain: exact {f(agree['exact_rate'], '.0%')} of prompts, prefix "
                 f"{f(agree['prefix_rate'], '.1%')} of tokens (all identical: {agree['all_identical']})")
    tau = report["acceptance"]["tau_pooled"]
    lines.append(f"tau pooled {'none (no rounds)' if tau is None else f(tau, '.3f')} over "
                 f"{report['acceptance']['num_rounds']} rounds | "
                 f"speedup {f(report['throughput']['speedup'], '.3f')} (untrained drafter; per prompt "
                 f"{_spread_text(report['throughput'].get('speedup_spread'))}) | peak memory "
                 f"{f(peak)} GiB ({'GPU allocated' if 'peak_allocated_gib' in mem else 'process RSS'}) | "
                 f"{report['elapsed_s']:.0f} s")
    if report["throughput"].get("measurement_fault"):
        lines.append(report["throughput"]["measurement_fault"])
    return "\n".join(lines)


def _spread_text(values: dict | None) -> str:
    return "-" if not values else f"{values['min']:.3f}..{values['max']:.3f}, median {values['median']:.3f}"


def _cli(args) -> int:
    report = run_gpu_check(small=True if args.small else None, device=args.device, dtype=args.dtype,
                           num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           output=args.output, cudnn_sdpa=not args.no_cudnn_sdpa)
    print(format_gpu_check(report))
    if args.output:
        print(f"JSON: {args.output}")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "gpu-check", help="time and check DFlash at Qwen3-8B shapes on one GPU (random weights, nothing downloaded)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--output", default="gpu_check.json", help="JSON report path (default: gpu_check.json)")
    p.add_argument("--small", action="store_true", help="tiny shapes on the CPU, fp32 (required without CUDA)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cuda:1, cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--num-prompts", type=int, default=None, help="default: 4 (3 with --small)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 128 (24 with --small)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cudnn-sdpa", action="store_true",
                   help="disable PyTorch's cuDNN attention backend (it re-plans for every new KV length)")
    p.set_defaults(func=_cli)
