"""Updates of 4 sequences as the runs train them (run 23's weights, 256 anchors, greedy-chain labels, block-local
attention, bf16 autocast, fused AdamW): 4 micro-batches of 1 row against 1 micro-batch of 4 right-padded rows, the
same 48 rows from FIRST, alternating per update.

    OMP_NUM_THREADS=1 python results/training_profile/batch_ab.py STORE FIRST
"""
import sys, time, torch
from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import load_target
from dflash_retrace.training.data import collate
from dflash_retrace.training.features import FeatureStore, StoredRef, stored_features
from dflash_retrace.training.objective import dflash_block_loss
torch.manual_seed(0)
store = FeatureStore(sys.argv[1])
target, _ = load_target("smollm2-135m-instruct", "cpu", "float32"); target.requires_grad_(False)
d = DFlashDrafter.from_pretrained("results/wip_run23/run23").float().train()
opt = torch.optim.AdamW(d.parameters(), lr=1e-5, fused=True)
idx = list(range(int(sys.argv[2]), int(sys.argv[2]) + 48))
def update(group, bs):
    n = 0
    for k in range(0, len(group), bs):
        items = [(i, StoredRef(store, i)) for i in group[k:k + bs]]
        ids, mask, anchors, _ = collate(items, 8, 256, 0, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            feats, labels = stored_features(items, ids.shape[1], "cpu")
            loss, stats = dflash_block_loss(d, target, ids, mask, anchors, features=feats, label_ids=labels,
                                            attention="local", chain=True)
        (loss / (len(group) // bs)).backward()
        n += int(stats["counted"].sum())
    opt.step(); opt.zero_grad(set_to_none=True)
    return n
update(idx[:4], 1); update(idx[:4], 4)
res = {1: [0, 0.0], 4: [0, 0.0]}
for u in range(0, 48, 4):
    for bs in (1, 4) if u % 8 else (4, 1):
        t = time.perf_counter(); n = update(idx[u:u + 4], bs); res[bs][1] += time.perf_counter() - t; res[bs][0] += n
for bs, (n, s) in res.items(): print(f"bs{bs}: {n} slots {s:.1f}s {n/s:.0f} slot-tokens/s")
