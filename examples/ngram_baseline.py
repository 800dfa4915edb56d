"""How much of a drafter's per-slot accuracy plain token statistics already reach: a back-off n-gram predictor of
the token at anchor+k from the last `n` tokens up to the anchor, fitted on training rows, scored on held-out rows.

    python examples/ngram_baseline.py --target smollm2-135m-instruct --train regen00.jsonl,regen_mix1.jsonl \
        --held-out heldout.jsonl --output ngram.json

Rows are tokenized exactly as `features` / `train` tokenize them (`tokenize_rows`, chat template on). Anchors are
the response positions a training block may start at (`sample_anchors`: p >= 1, p + 1 inside the sequence); slot k
is scored where anchor+k is a response token. The predictor is the most frequent continuation of the longest
context (`--orders`, longest first) seen in training, then the most frequent token at that slot. The drafter's
teacher-forced `held_out_slot_accuracy` (`train --eval-features`, `examples/eval_held_out.py`) is measured on the
same kind of positions, with the target's own labels (on its greedy answers: the tokens themselves, up to bf16
near-ties), so the two compare; a drafter near this baseline is not yet using the target's hidden states much.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from dflash_retrace.runtime import eos_token_ids, load_target
from dflash_retrace.training.data import load_rows, tokenize_rows


def _sequences(rows, tokenizer, eos):
    return [(ex.input_ids.numpy(), ex.loss_mask.numpy().astype(bool)) for ex in tokenize_rows(rows, tokenizer,
                                                                                               eos_token_id=eos)]


def _pairs(seqs, n, k):
    """(contexts (m, n), next tokens (m,)): every anchor p with n tokens up to it and a response token at p+k."""
    ctx, nxt = [], []
    for ids, mask in seqs:
        T = len(ids)
        p = np.arange(max(1, n - 1), T - k)
        p = p[mask[p] & mask[p + k]]
        if p.size:
            ctx.append(np.stack([ids[p - n + 1 + j] for j in range(n)], axis=1))
            nxt.append(ids[p + k])
    if not ctx:
        return np.zeros((0, n), dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ctx), np.concatenate(nxt)


def _fit(ctx, nxt) -> dict:
    """context tuple -> its most frequent next token (ties: the smaller id)."""
    pairs, counts = np.unique(np.concatenate([ctx, nxt[:, None]], axis=1), axis=0, return_counts=True)
    order = np.lexsort((pairs[:, -1], -counts, *pairs[:, :-1].T[::-1]))  # by context, then count desc, then id
    pairs = pairs[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = (pairs[1:, :-1] != pairs[:-1, :-1]).any(axis=1)
    return {tuple(row[:-1]): int(row[-1]) for row in pairs[first]}


def slot_baseline(train, held_out, block_size=8, orders=(3, 2, 1)) -> dict:
    """Per proposal slot 1..block_size-1: back-off n-gram top-1 accuracy on `held_out`, and how often each order
    (or the slot's most frequent token, order 0) made the prediction."""
    result = {"slots": [], "accuracy": [], "positions": [], "order_share": []}
    for k in range(1, block_size):
        pairs = {n: _pairs(train, n, k) for n in {*orders, 1}}
        tables = {n: _fit(*pairs[n]) for n in orders}
        train_next = pairs[1][1]  # every anchor with a label at slot k
        fallback = int(np.bincount(train_next).argmax()) if train_next.size else -1
        hits = total = 0
        used = {n: 0 for n in (*orders, 0)}
        for ids, mask in held_out:
            T = len(ids)
            for p in range(1, T - k):
                if not (mask[p] and mask[p + k]):
                    continue
                guess, order = fallback, 0
                for n in orders:
                    if p - n + 1 >= 0 and (hit := tables[n].get(tuple(ids[p - n + 1:p + 1]))) is not None:
                        guess, order = hit, n
                        break
                used[order] += 1
                hits += guess == ids[p + k]
                total += 1
        result["slots"].append(k)
        result["accuracy"].append(round(hits / max(1, total), 4))
        result["positions"].append(total)
        result["order_share"].append({str(n): round(c / max(1, total), 4) for n, c in used.items()})
        print(f"slot {k}: n-gram top-1 {hits / max(1, total):.3f} over {total} held-out positions "
              f"(orders used: {result['order_share'][-1]})", flush=True)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="registry name, folder or Hub id (its tokenizer and EOS ids)")
    parser.add_argument("--train", required=True, help="comma-separated JSONL rows (prompt + response) to count")
    parser.add_argument("--held-out", required=True, help="JSONL rows to score (never among --train)")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--orders", default="3,2,1", help="context lengths, tried longest first")
    parser.add_argument("--output", help="JSON file")
    args = parser.parse_args(argv)
    target, tokenizer = load_target(args.target)  # for its tokenizer and EOS ids only
    eos = eos_token_ids(target, tokenizer)
    train_paths = [p for p in args.train.split(",") if p]
    train_rows = [row for path in train_paths for row in load_rows(path)]
    held_rows = load_rows(args.held_out)
    shared = ({str(r.get("id")) for r in train_rows} - {"None"}) & {str(r.get("id")) for r in held_rows}
    if shared:
        raise SystemExit(f"{len(shared)} held-out rows are also training rows (e.g. {sorted(shared)[:3]}): "
                         "score on rows the counts never saw.")
    orders = tuple(sorted({int(x) for x in args.orders.split(",")}, reverse=True))
    train, held = _sequences(train_rows, tokenizer, eos), _sequences(held_rows, tokenizer, eos)
    report = {"target": args.target, "train": train_paths, "held_out": args.held_out, "orders": list(orders),
              "train_rows": len(train), "train_tokens": int(sum(len(ids) for ids, _ in train)),
              "held_out_rows": len(held), **slot_baseline(train, held, args.block_size, orders)}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
