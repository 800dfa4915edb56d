"""Cost of ReTrace per round: memory kept between rounds (bytes) and the conditioner's extra drafter time.

Runs the same drafter forward (a 16-token block after a 256-position context, SmolLM2-135M shapes by default)
with and without ReTrace memory, interleaved in one run, and prints/writes the ratio.

    python examples/retrace_overhead.py --output retrace_overhead.json
"""

import argparse
import json
import statistics
import time

import torch

from dflash_retrace import DFlashConfig, DFlashDrafter, ReTraceMemory
from dflash_retrace.generation_dflash import DFlashContextCache


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=576)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--intermediate-size", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=256, help="cached context positions")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    H, B = args.hidden_size, args.block_size
    config = DFlashConfig(
        hidden_size=H, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.layers, block_size=B,
        target_layer_ids=[1, 15], num_target_layers=30, mask_token_id=0, vocab_size=49152, retrace=True,
    )
    drafter = DFlashDrafter(config).to(dtype).eval()
    ctx_feats = torch.randn(1, 1, 2 * H, dtype=dtype)
    noise = torch.randn(1, B, H, dtype=dtype)
    valid = torch.zeros(1, B, dtype=torch.bool)
    valid[:, 1:10] = True
    memory = ReTraceMemory(torch.randn(1, B, H, dtype=dtype), torch.randn(1, B, H, dtype=dtype), valid)

    kv_shape = (1, args.kv_heads, args.context, H // args.heads)
    cached = [(torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype)) for _ in range(args.layers)]
    positions = torch.arange(args.context - 1, args.context + B)[None]  # one new context position, then the block

    def one(mem):
        cache = DFlashContextCache()
        for i, (k, v) in enumerate(cached):  # a context already in the drafter cache
            cache.update(k, v, i)
        with torch.no_grad():
            start = time.perf_counter()
            drafter(noise_embeds=noise, context_hidden_states=ctx_feats, position_ids=positions, cache=cache,
                    retrace_memory=mem)
            return time.perf_counter() - start

    for _ in range(10):
        one(None), one(memory)
    plain, retrace = [], []
    for _ in range(args.reps):  # interleaved: both see the same machine state
        plain.append(one(None))
        retrace.append(one(memory))
    element = torch.finfo(dtype).bits // 8
    # Per round: m and u for each of the K proposal slots, in the drafter's dtype.
    bytes_per_round = 2 * (B - 1) * H * element
    result = {
        "hidden_size": H, "block_size": B, "layers": args.layers, "context": args.context, "dtype": args.dtype,
        "memory_bytes_per_round": bytes_per_round,
        "drafter_forward_ms_plain": 1e3 * statistics.median(plain),
        "drafter_forward_ms_retrace": 1e3 * statistics.median(retrace),
        "conditioner_overhead_ratio": statistics.median(retrace) / statistics.median(plain),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
