"""What ReTrace's memory could give at this acceptance level, measured on real rounds (issue 13).

Rolls out held-out prompts greedily with a ReTrace drafter **with its memory withheld** (so every proposal is its DFlash
backbone's), and records for every round: its anchor, the backbone's proposal logits per slot, and the memory that
would have entered (u: the target's final-norm state that scored the old proposal now at that position, on the
rejected trajectory). Offline, for each round with memory:

- how often the target's own argmax from u (its view of the rejected suffix, over the drafter's head) equals the token
  actually committed there, against how often the backbone's proposal does;
- an upper bound: the acceptance length if an oracle took, at each slot with memory, u's argmax where it is right
  (what any rule choosing between the two argmaxes can reach);
- the acceptance length the round would have had with proposals from `log_softmax(drafter) + lam * log_softmax(u)` at
  the slots with memory (a parameter-free use of the memory; proposals of one block do not depend on each other, so this
  is exact for the recorded rounds; the trajectory itself would shift, which this does not model).

Usage (one core): OMP_NUM_THREADS=1 python results/memory_oracle/memory_oracle.py --drafter DIR --rows a.jsonl,b.jsonl
    --max-rows 48 --max-new-tokens 128 --output results/memory_oracle/oracle.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.generation_dflash import DFlashCandidateGenerator
from dflash_retrace.runtime import encode_prompt, eos_token_ids, load_target

LAMBDAS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 1e6)


class _Withheld(DFlashCandidateGenerator):
    """The library's generator; computes each round's memory, records it, and drafts without it (DFlash)."""

    def __init__(self, *args, log: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.log, self._u = log, None

    def _memory(self, *args, **kwargs):
        memory, _ = super()._memory(*args, **kwargs)
        self._u = None if memory is None else (memory.target_states[0].float(), memory.valid[0])
        return None, 0

    def get_candidates(self, input_ids, *args, **kwargs):
        self._u, captured = None, []
        original = self.drafter.greedy_proposals

        def capture(states, lm_head, *a):
            captured.append(self.drafter.compute_draft_logits(states, lm_head)[0].float())
            return original(states, lm_head, *a)

        self.drafter.greedy_proposals = capture
        try:
            candidates, logits = super().get_candidates(input_ids, *args, **kwargs)
        finally:
            del self.drafter.greedy_proposals
        n = candidates.shape[1] - input_ids.shape[1]
        if n > 0:
            u_logits = None
            if self._u is not None:
                u, valid = self._u
                u_logits = (self.drafter.compute_draft_logits(u[1:1 + n], self.lm_head).float(), valid[1:1 + n])
            self.log.append(dict(anchor=input_ids.shape[1] - 1, drafter=captured[0][:n], u=u_logits))
        return candidates, logits


def _accepted(proposals, truth):
    k = 0
    while k < len(proposals) and k < len(truth) and proposals[k] == truth[k]:
        k += 1
    return k


def analyse(rounds, sequence, draft_to_target):
    """Per-round records: accepted count under each lambda, and slot-level agreement on memory slots."""
    out = []
    for r in rounds:
        n = r["drafter"].shape[0]
        truth = sequence[r["anchor"] + 1: r["anchor"] + 1 + n]
        d_lp = r["drafter"].log_softmax(-1)
        rec = dict(n=n, has_memory=r["u"] is not None)
        own = draft_to_target[d_lp.argmax(-1)].tolist()
        rec["accepted"] = {}
        if r["u"] is None:
            for lam in (*LAMBDAS, "oracle"):
                rec["accepted"][lam] = _accepted(own, truth)
            out.append(rec)
            continue
        u_logits, valid = r["u"]
        u_lp = u_logits.log_softmax(-1)
        u_tok = draft_to_target[u_lp.argmax(-1)].tolist()
        rec["slots"] = [dict(slot=i + 1, valid=bool(valid[i]), truth=truth[i] if i < len(truth) else None,
                             drafter=own[i], target_u=u_tok[i]) for i in range(n)]
        oracle = [t if (v and t == u_tok[i]) else own[i] for i, (t, v) in enumerate(zip(truth, valid.tolist()))]
        rec["accepted"]["oracle"] = _accepted(oracle, truth)
        for lam in LAMBDAS:
            mix = d_lp + valid[:, None].float() * lam * u_lp if lam < 1e6 else \
                torch.where(valid[:, None], u_lp, d_lp)
            rec["accepted"][lam] = _accepted(draft_to_target[mix.argmax(-1)].tolist(), truth)
        out.append(rec)
    return out


def summarise(records):
    with_mem = [r for r in records if r["has_memory"]]
    s = dict(rounds=len(records), rounds_with_memory=len(with_mem))
    s["tau"] = {str(lam): 1 + sum(r["accepted"][lam] for r in records) / len(records) for lam in (*LAMBDAS, "oracle")}
    slots = [x for r in with_mem for x in r["slots"] if x["valid"] and x["truth"] is not None]
    s1 = [x for x in slots if x["slot"] == 1]
    for name, group in (("all_memory_slots", slots), ("slot_1", s1)):
        n = max(len(group), 1)
        dr = sum(x["drafter"] == x["truth"] for x in group)
        ur = sum(x["target_u"] == x["truth"] for x in group)
        u_only = sum(x["target_u"] == x["truth"] != x["drafter"] for x in group)
        d_only = sum(x["drafter"] == x["truth"] != x["target_u"] for x in group)
        s[name] = dict(count=len(group), drafter_right=dr / n, target_u_right=ur / n,
                       u_right_drafter_wrong=u_only / n, drafter_right_u_wrong=d_only / n)
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--drafter", required=True, help="a ReTrace drafter folder (its backbone drafts; memory withheld)")
    p.add_argument("--rows", required=True, help="comma-separated JSONL files of prompt rows (held-out splits)")
    p.add_argument("--max-rows", type=int, default=48, help="rows per file")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--output", required=True)
    args = p.parse_args()

    target, tok = load_target(args.target, device="cpu", dtype=args.dtype, inference=True)
    drafter = DFlashDrafter.from_pretrained(args.drafter).to(target.dtype).eval()
    if drafter.retrace is None:
        raise SystemExit(f"{args.drafter} has no ReTrace module: the memory is only computed for ReTrace drafters.")
    d2t = drafter.draft_to_target.cpu()
    report, started = dict(drafter=args.drafter, rows=args.rows, max_new_tokens=args.max_new_tokens,
                           dtype=args.dtype, lambdas=list(LAMBDAS), files={}), time.time()
    for path in args.rows.split(","):
        records = []
        rows = [json.loads(line) for line in open(path)][: args.max_rows]
        for i, row in enumerate(rows):
            log = []

            def make(target_, generation_config, logits_processor, model_kwargs, stopping_criteria=None):
                return _Withheld(drafter, target_, generation_config, logits_processor, model_kwargs,
                                 stopping_criteria=stopping_criteria, log=log)

            drafter.make_candidate_generator = make
            ids = torch.tensor([encode_prompt(tok, row)])
            with torch.inference_mode():
                out = target.generate(ids, assistant_model=drafter, do_sample=False,
                                      max_new_tokens=args.max_new_tokens, eos_token_id=eos_token_ids(target, tok))
            del drafter.make_candidate_generator
            records += analyse(log, out[0].tolist(), d2t)
            print(f"{path}: {i + 1}/{len(rows)} rows, {len(records)} rounds, {time.time() - started:.0f} s", flush=True)
        report["files"][path] = summarise(records)
        print(json.dumps(report["files"][path], indent=1), flush=True)
    json.dump(report, open(args.output, "w"), indent=1)


if __name__ == "__main__":
    main()
