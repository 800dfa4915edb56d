"""Slot-tokens per second and a profile of training micro-steps of the run recipe (feature-store rows, the WIP drafter,
256 anchors, greedy-chain labels, block-local attention, bf16 autocast, AdamW), one thread. `chunked` swaps in
attn_bench.py's chunked SDPA attention.

    OMP_NUM_THREADS=1 python results/training_profile/profile_step.py STORE local|chunked     # from the repository root
"""
import sys, time, torch
from torch.profiler import profile, ProfilerActivity
from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import load_target
from dflash_retrace.training.features import FeatureStore
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors

store = FeatureStore(sys.argv[1])
target, _ = load_target("smollm2-135m-instruct", "cpu", "float32"); target.requires_grad_(False)
drafter = DFlashDrafter.from_pretrained("checkpoints/smollm2-135m-instruct-dflash-b8-wip").float().train()
opt = torch.optim.AdamW(drafter.parameters(), lr=1e-5)
attention = "local"
if len(sys.argv) > 2 and sys.argv[2] == "chunked":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from attn_bench_impl import chunked_attend
    from dflash_retrace.training.objective import BlockLocalMask
    BlockLocalMask.attend = lambda self, q, k, v, scaling, groups, dropout=0.0: chunked_attend(
        self.anchors, self.block_size, q, k, v, scaling, groups, 32)
def step(i):
    row = store[i]
    anchors = sample_anchors(row.loss_mask, 256, generator=torch.Generator().manual_seed(i))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = dflash_block_loss(drafter, target, row.input_ids, row.loss_mask, anchors,
                                        features=row.features[None], label_ids=row.labels, attention=attention, chain=True)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return int(stats["counted"].sum()), row.input_ids.numel()
for i in range(2): step(i)
t = time.perf_counter(); n = 0; toks = 0
for i in range(2, 10):
    a, b = step(i); n += a; toks += b
dt = time.perf_counter() - t
print(f"{sys.argv[2] if len(sys.argv) > 2 else attention}: {n} slots in {dt:.2f}s: {n/dt:.0f} slot-tokens/s; mean T {toks/8:.0f}")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(10, 13): step(i)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
