"""FLOPs of one training step per supervised slot-token (forward + backward, `torch.utils.flop_counter`), and the
bf16 matrix-product rate of one core, to bound the slot-tokens per second any implementation of this step can reach.

    OMP_NUM_THREADS=1 python results/training_profile/flops_per_slot.py STORE OUT.json [FIRST_ROW ROWS MAX_ANCHORS]   # default 1001 12 512: the rows the
    # example `examples/training_throughput.py --first-row 1000 --rows 12` times, its anchors
"""
import json, sys, time
import torch
from torch.utils.flop_counter import FlopCounterMode
from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import environment, load_target
from dflash_retrace.training.features import FeatureStore
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors

store, out = FeatureStore(sys.argv[1]), sys.argv[2]
first, rows, max_anchors = (int(a) for a in (sys.argv[3:6] if len(sys.argv) > 5 else (1001, 12, 512)))
target, _ = load_target("smollm2-135m-instruct", "cpu", "float32")
target.requires_grad_(False)
drafter = DFlashDrafter.from_pretrained("checkpoints/smollm2-135m-instruct-dflash-b8-wip").float().train()
flops = slots = 0


def step(row, i, optimizer=None):
    anchors = sample_anchors(row.loss_mask, max_anchors, generator=torch.Generator().manual_seed(i))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, stats = dflash_block_loss(drafter, target, row.input_ids, row.loss_mask, anchors,
                                        features=row.features[None], label_ids=row.labels, attention="local")
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    drafter.zero_grad(set_to_none=True)
    return int(stats["counted"].sum())


for i in range(first, first + rows):
    with FlopCounterMode(display=False) as counter:
        slots += step(store[i], i)
    flops += counter.get_total_flops()


def matmul_rate(m, k, n, reps=20):
    """bf16 FLOP/s of an (m, k) @ (k, n) product on this thread."""
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return reps * 2 * m * k * n / (time.perf_counter() - start)


# a square product, and the step's own: 2,048 block queries through the MLP (up, down) and the draft LM head
shapes = {"2048x2048x2048": (2048, 2048, 2048), "mlp up 2048x576x1536": (2048, 576, 1536),
          "mlp down 2048x1536x576": (2048, 1536, 576), "head 512x576x8192": (512, 576, 8192)}
before = {name: matmul_rate(*shape) for name, shape in shapes.items()}
optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5, fused=True)
step(store[first], first, optimizer)  # warm-up
start = time.perf_counter()
timed = sum(step(store[i], i, optimizer) for i in range(first, first + rows))
step_rate = timed / (time.perf_counter() - start)
after = {name: matmul_rate(*shape) for name, shape in shapes.items()}
rates = {name: (before[name] + after[name]) / 2 for name in shapes}
peak = rates["2048x2048x2048"]
step_peak = sum(list(rates.values())[1:]) / 3
step_flops = step_rate * flops / slots
report = {"store": sys.argv[1], "first_row": first, "rows": rows, "max_anchors": max_anchors, "slot_tokens": slots,
          "flops": flops, "flops_per_slot_token": flops / slots, "bf16_matmul_flops_per_s": rates,
          "bf16_matmul_flops_per_s_before_after": {"before": before, "after": after},
          "step_slot_tokens_per_s": step_rate, "step_flops_per_s": step_flops,
          "step_share_of_square_rate": step_flops / peak, "step_share_of_step_shapes_rate": step_flops / step_peak,
          "slot_tokens_per_s_at_square_rate": peak / (flops / slots),
          "slot_tokens_per_s_at_step_shapes_rate": step_peak / (flops / slots), "threads": torch.get_num_threads(),
          "environment": environment(torch.device("cpu"), torch.bfloat16, 0)}
open(out, "w").write(json.dumps(report, indent=2) + "\n")
print(f"{flops / slots / 1e6:.1f} MFLOP per slot-token over {slots} slot-tokens; bf16 GFLOP/s "
      + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates.items())
      + f" -> at most {peak / (flops / slots):.0f} slot-tokens/s at the square rate, "
      f"{step_peak / (flops / slots):.0f} at the step's shapes; the step itself {step_rate:.0f} slot-tokens/s, "
      f"{step_flops / 1e9:.0f} GFLOP/s = {step_flops / peak:.0%} / {step_flops / step_peak:.0%} of those rates")
