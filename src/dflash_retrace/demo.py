"""The main job: a real target, the shipped ReTrace drafter, a streamed answer, τ and speedup measured in one run.

Defaults need no Hugging Face Hub: SmolLM2-135M-Instruct comes from the package registry
(`dflash_retrace.assets`) and the drafter from this repository's `hub_configs/`.
"""

import time
from pathlib import Path

import torch

from .runtime import INFERENCE_DTYPE_HELP, encode_messages, load_drafter, load_target, speedup_bound_fault

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFTER = Path(__file__).resolve().parents[2] / "hub_configs" / "smollm2-135m-instruct-retrace"
DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome, and explain it briefly."


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run_demo(target=DEFAULT_TARGET, drafter=DEFAULT_DRAFTER, prompt=DEFAULT_PROMPT, max_new_tokens=128,
             stream=True, dtype="auto") -> dict:
    """`dtype` auto: bfloat16 on CPUs with bf16 matrix units (fast there), else float32. float32: the output must
    equal plain generate() (else an error: a bug); bfloat16/float16: it is equal up to near-ties (a batched verify
    rounds differently from one-token decoding), and the demo says which."""
    from transformers import TextStreamer

    drafter_path = Path(str(drafter))
    if not drafter_path.exists() and str(drafter) == str(DEFAULT_DRAFTER):
        raise FileNotFoundError(
            f"The shipped drafter is not at {drafter_path}. Run the demo from a clone of the repository, "
            "or pass --drafter PATH_OR_HUB_ID."
        )
    torch.manual_seed(0)
    model, tokenizer = load_target(target, "cpu", dtype, inference=True)
    dtype = str(model.dtype).replace("torch.", "")
    draft = load_drafter(drafter, model)  # the target's dtype
    input_ids = torch.tensor([encode_messages(tokenizer, [{"role": "user", "content": prompt}])])
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)

    model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up, not timed
    model.generate(**inputs, assistant_model=draft, max_new_tokens=4, do_sample=False)

    print(f"\n>>> {prompt}\n")
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    spec, spec_time = _timed(lambda: model.generate(**inputs, assistant_model=draft, streamer=streamer, **kwargs))
    stats = draft.last_stats
    plain, plain_time = _timed(lambda: model.generate(**inputs, **kwargs))
    start = inputs["input_ids"].shape[1]
    new_tokens = spec.shape[1] - start
    new_plain, new_spec = plain[0, start:].tolist(), spec[0, start:].tolist()
    first_difference = None if new_plain == new_spec else next(
        (i for i, (a, b) in enumerate(zip(new_plain, new_spec)) if a != b), min(len(new_plain), len(new_spec)))
    if first_difference is not None and model.dtype == torch.float32:
        raise AssertionError("speculative output differs from plain generate() in fp32: please report this bug")
    result = {
        "target": str(target),
        "drafter": str(drafter),
        "new_tokens": int(new_tokens),
        "rounds": stats.num_rounds,
        "tau": stats.mean_acceptance_length,
        "speculative_seconds": spec_time,
        "plain_seconds": plain_time,
        "speedup": plain_time / spec_time,
        "dtype": dtype,
        "identical_to_plain": first_difference is None,
        "first_difference": first_difference,
        # tokens/s ratio: the outputs may differ in length (bf16 near-ties)
        "measurement_fault": speedup_bound_fault(new_tokens / spec_time / ((plain.shape[1] - start) / plain_time),
                                                 stats.mean_acceptance_length),
    }
    tau = "none (no rounds)" if result["tau"] is None else f"{result['tau']:.2f}"
    same = ("identical to plain generate()" if first_difference is None else
            f"differs from plain generate() from new token {first_difference}: a near-tie in {dtype}, where a batched "
            "verify rounds differently from one-token decoding (exact in float32)")
    print(
        f"\n\n{new_tokens} new tokens in {stats.num_rounds} rounds: τ = {tau} tokens per target "
        f"forward (bonus included)\nspeculative {spec_time:.2f} s, plain generate() {plain_time:.2f} s: "
        f"speedup {result['speedup']:.2f}x (same run, same prompt)\noutput ({dtype}): {same}"
    )
    if result["measurement_fault"]:
        print(result["measurement_fault"])
    return result


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="stream an answer with the shipped ReTrace drafter; print τ and speedup (no Hub needed)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="registry name, local folder or Hub id")
    parser.add_argument("--drafter", default=str(DEFAULT_DRAFTER), help="drafter folder or Hub id")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help=f"{INFERENCE_DTYPE_HELP}. float32: output must equal plain generate(); bf16/fp16: equal "
                             "up to near-ties (shown)")
    parser.set_defaults(
        func=lambda a: run_demo(a.target, a.drafter, a.prompt, a.max_new_tokens, dtype=a.dtype) and 0
    )
