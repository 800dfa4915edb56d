"""The target's forward in fp32 on one thread: a decode step (1 token) and an 8-token verify at a 300-token context,
with every nn.Linear on torch's default CPU path (MKL's sgemm) or on oneDNN's packed fp32 linear (the kernel
torch.compile's CPU freezing uses), alternating in one process. Prints median times and the verify/decode ratio,
and the largest logit difference between the two paths on the same inputs.

    OMP_NUM_THREADS=1 python results/fp32_avx2_linear/verify_cost.py [OUTPUT.json]
"""

import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from dflash_retrace.assets import resolve_model


def packed_forward(linear):
    weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
    bias = linear.bias

    def forward(x):
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
        return y.reshape(*x.shape[:-1], y.shape[-1])

    return forward


def main(output=None):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"), dtype=torch.float32).eval()
    context = torch.randint(0, 40000, (1, 300))
    new = {n: torch.randint(0, 40000, (1, n)) for n in (1, 8)}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    default = {m: m.forward for m in linears}
    packed = {m: packed_forward(m) for m in linears}
    with torch.inference_mode():
        cache = DynamicCache()
        model(context, cache=cache, use_cache=True)
        times = {(mode, n): [] for mode in ("default", "packed") for n in (1, 8)}
        logits = {}
        for rep in range(14):
            for mode, forwards in (("default", default), ("packed", packed)):
                for m in linears:
                    m.forward = forwards[m]
                for n in (1, 8):
                    start = time.perf_counter()
                    logits[mode, n] = model(new[n], cache=cache, use_cache=True).logits
                    if rep >= 2:  # warm-up
                        times[mode, n].append(time.perf_counter() - start)
                    cache.crop(-n)
    ms = {f"{mode}_{n}": 1e3 * statistics.median(t) for (mode, n), t in times.items()}
    result = {
        "median_ms": {k: round(v, 2) for k, v in ms.items()},
        "verify8_over_decode": {mode: round(ms[f"{mode}_8"] / ms[f"{mode}_1"], 3) for mode in ("default", "packed")},
        "packed_verify8_over_default_decode": round(ms["packed_8"] / ms["default_1"], 3),
        "max_logit_difference": {n: float((logits["packed", n] - logits["default", n]).abs().max()) for n in (1, 8)},
        "same_argmax": {n: bool(torch.equal(logits["packed", n].argmax(-1), logits["default", n].argmax(-1)))
                        for n in (1, 8)},
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=1))
    if output:
        with open(output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
