"""The CPU kernel behind issue 13's draft-head fix: a bf16 linear over a 3-D slice whose size-1 batch dimension keeps
its parent's stride (what `[:, 1:]` of a (1, B, H) block gives) against the same rows as a 2-D tensor.

torch's matmul folds a contiguous 3-D input into one mm, but its check also compares the stride of a size-1
dimension (pytorch/pytorch#186148), so such a slice goes to bmm, which is slow for bf16 on CPUs (#151934).

    OMP_NUM_THREADS=1 python results/draft_head/linear_slice.py --output results/draft_head/linear_slice.json
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F


def ms(fn, repeats=30):
    fn(), fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    # SmolLM2-135M shapes: the 8,192-row draft head, the drafter's fc (6 x 576 -> 576), an MLP projection
    for dtype in (torch.bfloat16, torch.float32):
        for name, out_features, in_features in (("draft head", 8192, 576), ("fc", 576, 3456), ("mlp up", 1536, 576)):
            weight = torch.randn(out_features, in_features, dtype=dtype) * in_features ** -0.5
            block = torch.randn(1, 8, in_features, dtype=dtype)
            sliced = block[:, 1:]  # (1, 7, H), strides (8H, H, 1)
            flat = sliced.reshape(-1, in_features)  # the same rows, (7, H)
            row = {"weight": name, "shape": [out_features, in_features], "dtype": str(dtype).replace("torch.", ""),
                   "slice_ms": ms(lambda: F.linear(sliced, weight)), "rows_2d_ms": ms(lambda: F.linear(flat, weight))}
            row["ratio"] = row["slice_ms"] / row["rows_2d_ms"]
            rows.append(row)
            print(f"{row['dtype']:8s} {name:10s} {out_features}x{in_features}: 3-D slice {row['slice_ms']:.2f} ms, "
                  f"2-D rows {row['rows_2d_ms']:.2f} ms ({row['ratio']:.1f}x)")
    if args.output:
        json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows},
                  open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
