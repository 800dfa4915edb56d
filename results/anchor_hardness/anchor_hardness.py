"""Are the positions where speculative rounds start harder for the drafter than positions in general?

On the held-out split (data/smollm2-135m-instruct/held-out-ids.json; never trained on, no evaluation set), exact
fp32: for every position p of each plain greedy answer, the drafter drafts a block anchored at p from the target's
own states (as `generate(assistant_model=drafter)` would if a round started there) and we count its accepted
proposals. Then we compare all positions with the positions where the replayed greedy rounds actually start
(`dflash-retrace replay`'s rounds, exact). Training samples anchors uniformly over positions; generation starts a round
right after the previous round's first rejection.

    python results/anchor_hardness/anchor_hardness.py --drafter hub_configs/smollm2-135m-instruct-dflash \
        --rows heldout.jsonl --references refs.jsonl --output results/anchor_hardness/run8_heldout64.json
(heldout.jsonl: `gunzip -c data/smollm2-135m-instruct/regen-mix-part01.jsonl.gz | sed -n 577,640p`)
"""

import argparse
import json

import torch

from dflash_retrace.evaluation.replay import References, replay_turn, target_forward
from dflash_retrace.runtime import encode_messages, load_drafter, load_target


def accepted_at(drafter, target, features, full, p, block):
    """Proposals a round anchored at position p would accept (block fully inside the answer: p + block - 1 < end)."""
    ids = torch.full((1, block), drafter.config.mask_token_id, dtype=torch.long)
    ids[0, 0] = full[0, p]
    noise = drafter.embed_block(target.get_input_embeddings(), ids)
    out = drafter(noise_embeds=noise, context_hidden_states=features[:, :p],
                  position_ids=torch.arange(0, p + block)[None])
    drafts, _ = drafter.greedy_proposals(out.last_hidden_state[:, 1:], target.get_output_embeddings())
    truth = full[0, p + 1 : p + block]
    hits = (drafts[0] == truth).int().tolist()
    return next((k for k, h in enumerate(hits) if not h), len(hits))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--references")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    target, tokenizer = load_target(args.target, "cpu", "float32")
    drafter = load_drafter(args.drafter, target)
    block = drafter.config.block_size
    references = References(args.references, args.target, torch.float32)
    every, starts, checks = [], [], []
    for line in open(args.rows):
        row = json.loads(line)
        input_ids = torch.tensor([encode_messages(tokenizer, [{"role": "user", "content": row["prompt"]}])])
        new_ids = references.get(target, input_ids, args.max_new_tokens)
        full = torch.cat([input_ids, torch.tensor([new_ids])], dim=-1)
        forward = target_forward(target, full, False)
        replay = replay_turn(target, drafter, input_ids, new_ids, args.max_new_tokens, forward)
        end = full.shape[1] if replay["cut_at"] is None else input_ids.shape[1] + replay["cut_at"]
        features = drafter.context_features(forward.hidden_states)
        anchor, round_starts = input_ids.shape[1], {}
        for a in replay["acceptance_lengths"]:
            round_starts[anchor] = a - 1
            anchor += a
        for p in range(input_ids.shape[1], end - block + 1):
            accepted = accepted_at(drafter, target, features, full, p, block)
            every.append(accepted)
            if p in round_starts:
                starts.append(accepted)
                checks.append(accepted == round_starts[p])
    summary = {}
    for name, values in (("all_positions", every), ("round_starts", starts)):
        n = len(values)
        summary[name] = {"anchors": n, "tau": 1 + sum(values) / n,
                         "slot_acceptance": [sum(v >= k for v in values) / max(sum(v >= k - 1 for v in values), 1)
                                             for k in range(1, block)]}
    summary["round_starts_match_replay"] = sum(checks) / len(checks)
    json.dump({"args": vars(args), "summary": summary}, open(args.output, "w"), indent=1)
    for name in ("all_positions", "round_starts"):
        s = summary[name]
        print(f"{name:14s} anchors {s['anchors']:5d}  tau {s['tau']:.3f}  slot acceptance "
              + " ".join(f"{r:.2f}" for r in s["slot_acceptance"]))
    print(f"round starts whose per-anchor count equals the replayed round: {summary['round_starts_match_replay']:.1%}")


if __name__ == "__main__":
    main()
