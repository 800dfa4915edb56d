"""Training step before and after the small-buffer change (LM-head chunks of 512 slots instead of 4,096, block-local
attention in groups of blocks under 16 MiB of fp32 scores), one process, same rows and anchors, the variants
alternating row by row. Run recipe: the WIP drafter, 256 anchors, greedy-chain labels, bf16 autocast, AdamW.
Prints and writes slot-tokens per second and minor page faults per row. ONLY=before|after runs that variant alone
(for two processes side by side, one per core, as two training jobs run here).

    OMP_NUM_THREADS=1 python results/training_profile/step_ab.py STORE OUT.json [ROWS]     # from the repository root
"""
import os
import json, resource, sys, time
import torch
from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import environment, load_target
from dflash_retrace.training import objective
from dflash_retrace.training.features import FeatureStore
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors

store, out = FeatureStore(sys.argv[1]), sys.argv[2]
n_rows = int(sys.argv[3]) if len(sys.argv) > 3 else 24
rows = [round(i * (len(store) - 1) / (n_rows - 1)) for i in range(n_rows)]  # spread over the store
target, _ = load_target("smollm2-135m-instruct", "cpu", "float32")
target.requires_grad_(False)
drafter = DFlashDrafter.from_pretrained("checkpoints/smollm2-135m-instruct-dflash-b8-wip").float().train()
opt = torch.optim.AdamW(drafter.parameters(), lr=1e-5)
budget = objective.CPU_LOGITS_BYTES
VARIANTS = {"before": (4096, 1 << 62), "after": (None, budget)}  # (logits_chunk, attention group budget)
if os.environ.get("ONLY"):
    VARIANTS = {os.environ["ONLY"]: VARIANTS[os.environ["ONLY"]]}


def step(i, name):
    chunk, objective.CPU_LOGITS_BYTES = VARIANTS[name]
    row = store[i]
    anchors = sample_anchors(row.loss_mask, 256, generator=torch.Generator().manual_seed(i))
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = dflash_block_loss(drafter, target, row.input_ids, row.loss_mask, anchors, logits_chunk=chunk,
                                        features=row.features[None], label_ids=row.labels, attention="local",
                                        chain=True)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start, int(stats["counted"].sum()),
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


for name in VARIANTS:  # warm-up
    step(rows[0], name)
acc = {n: [0.0, 0, 0] for n in VARIANTS}
lengths = []
for k, i in enumerate(rows):
    lengths.append(store[i].input_ids.numel())
    for name in (list(VARIANTS) if k % 2 == 0 else list(VARIANTS)[::-1]):
        for j, x in enumerate(step(i, name)):
            acc[name][j] += x
    print(f"row {i} (T {lengths[-1]}): " + ", ".join(f"{n} {a[1] / a[0]:.0f}/s" for n, a in acc.items()), flush=True)
report = {"store": sys.argv[1], "rows": rows, "mean_T": sum(lengths) / len(lengths), "threads": torch.get_num_threads(),
          "variants": {n: {"seconds": round(a[0], 3), "slot_tokens": a[1], "slot_tokens_per_s": round(a[1] / a[0], 1),
                           "minor_faults_per_row": a[2] // len(rows)} for n, a in acc.items()},
          "environment": environment(torch.device("cpu"), torch.bfloat16, 0)}
if len(VARIANTS) == 2:
    report["after_over_before"] = round(report["variants"]["after"]["slot_tokens_per_s"]
                                        / report["variants"]["before"]["slot_tokens_per_s"], 3)
open(out, "w").write(json.dumps(report, indent=2) + "\n")
print(json.dumps(report["variants"]), "after/before", report.get("after_over_before"))
