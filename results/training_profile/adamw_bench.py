"""One AdamW step over the WIP drafter's trainable weights (9.07M parameters, 25 tensors): the for-loop, foreach and
fused implementations, one thread, same run.

    OMP_NUM_THREADS=1 python results/training_profile/adamw_bench.py        # from the repository root
"""
import time
import torch
from dflash_retrace import DFlashDrafter

drafter = DFlashDrafter.from_pretrained("checkpoints/smollm2-135m-instruct-dflash-b8-wip").float()
params = [p for p in drafter.parameters() if p.requires_grad]
print(f"{sum(p.numel() for p in params) / 1e6:.2f}M parameters in {len(params)} tensors")
for p in params:
    p.grad = torch.randn_like(p) * 1e-3
ms = {}
for kind in ("for-loop", "foreach", "fused") * 2:  # twice each, the second pass kept
    options = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[kind]
    optimizer = torch.optim.AdamW(params, lr=1e-5, **options)
    for _ in range(2):
        optimizer.step()
    start = time.perf_counter()
    for _ in range(10):
        optimizer.step()
    ms[kind] = (time.perf_counter() - start) / 10 * 1000
print(", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()))
