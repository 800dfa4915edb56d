"""What a verification forward costs against its length, in plain decode steps, on this machine.

A round verifies its proposals plus the bonus in one target forward. On a GPU that forward costs about one decode
step whatever its length; on a CPU (fp32 especially) it grows with the length, so verifying proposals that are
rarely accepted costs time. This measures the target forward on `--context` cached positions for each length
(1 = a plain decode step) and the drafter's forward for one block, all in one process and interleaved (these
machines are noisy), and writes JSON. Use it to choose `max_proposals` / `proposal_threshold`
(see the README's "Shorter rounds").

    python examples/verify_cost.py --target smollm2-135m-instruct \
        --drafter checkpoints/smollm2-135m-instruct-dflash-b8-wip --dtype float32 --output verify_cost.json
"""

import argparse
import json
import statistics
import time

import torch

import transformers

from dflash_retrace.generation_dflash import DFlashContextCache, _version_tuple
from dflash_retrace.runtime import environment, load_drafter, load_target

# transformers 5.24 renamed the forward's cache argument (`past_key_values` before)
CACHE_KW = "cache" if _version_tuple(transformers.__version__) >= (5, 24, 0) else "past_key_values"
NEW_CONTEXT = 2  # context positions a drafter call adds to its cache (about one round's commit at τ ~ 2)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=300, help="cached positions before each forward")
    parser.add_argument("--repeats", type=int, default=7, help="timings per length (the median is reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default="verify_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target, _ = load_target(args.target, args.device, args.dtype, inference=True)
    drafter = load_drafter(args.drafter, target, 0).to(target.device, target.dtype)
    block = drafter.config.block_size
    lengths = list(range(1, block + 1))
    g = torch.Generator().manual_seed(0)
    vocab = target.config.get_text_config().vocab_size
    context = torch.randint(0, vocab, (1, args.context), generator=g).to(target.device)
    times = {n: [] for n in lengths}
    drafter_s = []
    with torch.no_grad():
        out = target(context, use_cache=True, output_hidden_states=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        features = drafter.context_features(out.hidden_states, args.context)
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        block_ids = torch.full((1, block), drafter.config.mask_token_id, device=target.device)
        noise = drafter.embed_block(embed, block_ids)
        cached = args.context - NEW_CONTEXT
        drafter_cache = DFlashContextCache()
        drafter(noise_embeds=noise, context_hidden_states=features[:, :cached], cache=drafter_cache,
                position_ids=torch.arange(cached + block, device=target.device)[None])
        drafter_cache.crop(cached)
        positions = torch.arange(cached, args.context + block, device=target.device)[None]

        def draft():  # as a round runs it: the new context positions and the block, then the LM head and argmax
            states = drafter(noise_embeds=drafter.embed_block(embed, block_ids), position_ids=positions,
                             context_hidden_states=features[:, cached:], cache=drafter_cache).last_hidden_state
            drafter.compute_logits(states[:, 1:], head).argmax(-1)
            drafter_cache.crop(cached)

        for repeat in range(args.repeats + 1):  # the first pass warms up and is dropped
            for n in lengths:
                ids = torch.randint(0, vocab, (1, n), generator=g).to(target.device)
                seconds = _timed(lambda: target(ids, use_cache=True, output_hidden_states=True, **{CACHE_KW: cache}))
                cache.crop(-n)  # back to the context (a negative crop drops the last n positions)
                if repeat:
                    times[n].append(seconds)
            seconds = _timed(draft)
            if repeat:
                drafter_s.append(seconds)
    step = statistics.median(times[1])
    report = {
        "config": vars(args),
        "environment": environment(target.device, target.dtype, 0),
        "decode_step_ms": 1000 * step,
        "verify": {str(n): {"ms": 1000 * statistics.median(times[n]), "steps": statistics.median(times[n]) / step}
                   for n in lengths},
        "drafter_block_ms": 1000 * statistics.median(drafter_s),
        "drafter_block_steps": statistics.median(drafter_s) / step,
    }
    print(f"decode step {report['decode_step_ms']:.1f} ms; drafter block of {block}: "
          f"{report['drafter_block_ms']:.1f} ms ({report['drafter_block_steps']:.2f} steps)")
    for n in lengths:
        v = report["verify"][str(n)]
        print(f"verify {n - 1} proposals + bonus ({n} tokens): {v['ms']:.1f} ms = {v['steps']:.2f} steps")
    with open(args.output, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
