"""The block-local training attention (`BlockLocalMask.attend`, fp32 softmax over materialised scores) against a
chunked variant (`chunked_attend`: `chunk` blocks at a time, one fused `scaled_dot_product_attention` each over the
context keys before the chunk's last anchor and the chunk's own keys), forward + backward in bf16 at SmolLM2 drafter
shapes (9 heads, 3 KV heads, d 64, 256 anchors, block 8), one thread. Prints ms and the largest difference.

    OMP_NUM_THREADS=1 python results/training_profile/attn_bench.py 600      # context length T
"""
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from dflash_retrace.training.objective import BlockLocalMask, sample_anchors
from dflash_retrace.training import objective

objective.CPU_LOGITS_BYTES = 1 << 62  # the baseline as measured: all blocks in one group (no CPU grouping)

from attn_bench_impl import chunked_attend

torch.manual_seed(0)
T, N, B, h, kvh, d = int(sys.argv[1]) if len(sys.argv) > 1 else 600, 256, 8, 9, 3, 64
dtype = torch.bfloat16
mask = torch.zeros(T, dtype=torch.bool); mask[100:] = True
anchors = sample_anchors(mask, N, generator=torch.Generator().manual_seed(0))[None]
N = anchors.shape[1]
q = torch.randn(1, h, N * B, d, dtype=dtype, requires_grad=True)
k = torch.randn(1, kvh, T + N * B, d, dtype=dtype, requires_grad=True)
v = torch.randn(1, kvh, T + N * B, d, dtype=dtype, requires_grad=True)
g = torch.randn(1, N * B, h, d, dtype=dtype)
ref_mask = BlockLocalMask(anchors, B)
def run(fn):
    for t in (q, k, v): t.grad = None
    out = fn(); (out.float() * g.float()).sum().backward()
    return out.detach().float(), [t.grad.float().clone() for t in (q, k, v)]
fns = {"local": lambda: ref_mask.attend(q, k, v, d ** -0.5, h // kvh),
       **{f"sdpa{c}": (lambda c=c: chunked_attend(anchors, B, q, k, v, d ** -0.5, h // kvh, c)) for c in (8, 16, 32, 64, 256)}}
ref = run(fns["local"])
for name, fn in fns.items():
    out, grads = run(fn)
    err = max([(out - ref[0]).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(grads, ref[1])])
    t0 = time.perf_counter()
    for _ in range(3): run(fn)
    print(f"{name}: {(time.perf_counter() - t0) / 3 * 1000:.0f} ms fwd+bwd, max diff vs local {err:.3g}", flush=True)
