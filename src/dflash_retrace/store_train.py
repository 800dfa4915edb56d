"""Fast DFlash-stage training from a feature store (no target layers run), with a draft vocabulary and bf16.

Labels are the target's own greedy chain: slot k of a block anchored at p is supervised with the target's
argmax after the true prefix x_{<p+k}, and only while the true text agrees with the target's greedy choices
at p+1..p+k-1 (beyond the first disagreement the true prefix is no longer the target's greedy continuation,
so the label would not be what verification accepts). On the target's own output every slot is supervised;
on other text the blocks are cut where the target would have said something else.

The LM head is the rows of the target's head for the draft vocabulary (the most frequent target labels of the
training split); labels outside it cannot be proposed and count as misses.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .feature_store import FeatureStore
from .modeling_dflash import BlockLocalMask, DFlashDrafter
from .training_core import block_inputs, cosine_lr, default_gamma, slot_weights


def chain_valid(input_ids, labels, positions, label_valid, block_size):
    """label_valid narrowed to the greedy chain: slot k needs x == label at slots 1..k-1 of its block."""
    T = input_ids.shape[-1]
    agree = (input_ids == labels)[..., positions.clamp_max(T - 1)] & (positions < T)  # (N*B,)
    agree = agree.view(-1, block_size)
    chain = torch.ones_like(agree)
    chain[:, 2:] = torch.cumprod(agree[:, 1:-1].long(), dim=1).bool()
    return label_valid & chain.view(-1)


def draft_vocabulary(counts: torch.Tensor, size: int, always=()) -> torch.Tensor:
    """Sorted target ids of the `size` most frequent labels (plus `always`, e.g. EOS ids)."""
    order = torch.argsort(counts, descending=True, stable=True)
    keep = set(int(i) for i in always)
    ids = [int(i) for i in order[: size - len(keep)] if int(i) not in keep]
    return torch.tensor(sorted(set(ids[: size - len(keep)]) | keep), dtype=torch.long)


class DraftHead(torch.nn.Module):
    """Frozen rows of the target's LM head; `targets_to_draft` maps target ids to draft ids (-1 outside)."""

    def __init__(self, lm_head, draft_ids):
        super().__init__()
        self.register_buffer("weight", lm_head.weight.detach()[draft_ids].clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.clone(), persistent=False)
        index = torch.full((lm_head.weight.shape[0],), -1, dtype=torch.long)
        index[draft_ids] = torch.arange(draft_ids.numel())
        self.register_buffer("index", index, persistent=False)

    def forward(self, hidden):
        return F.linear(hidden, self.weight.to(hidden.dtype))


def block_loss(drafter, embed, head, row, max_anchors, gamma, generator, train=True):
    """(loss, per-slot correct (B,), counted (B,), leading-correct histogram) of one stored row."""
    cfg = drafter.config
    B = cfg.block_size
    ids, mask, labels = row.input_ids, row.loss_mask, row.labels
    T = ids.shape[0]
    cand = torch.arange(1, T - 1)
    cand = cand[mask[cand]]
    if cand.numel() == 0:
        return None
    if cand.numel() > max_anchors:
        cand = cand[torch.randperm(cand.numel(), generator=generator)[:max_anchors]].sort().values
    block_ids, positions, lab, valid = block_inputs(ids, mask, cand, B, cfg.mask_token_id, labels)
    valid = chain_valid(ids, labels, positions, valid, B)
    noise = F.embedding(block_ids, embed)[None]  # (1, N*B, H)
    pos = torch.cat([torch.arange(T), positions])[None]
    attn = BlockLocalMask(cand[None], B)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = drafter(noise_embeds=noise, context_hidden_states=row.features[None], position_ids=pos,
                         attention_mask=attn).last_hidden_state[0]  # (N*B, H)
        slot = torch.arange(B).repeat(cand.numel())
        dl = head.index[lab]  # draft ids, -1 outside the draft vocabulary
        sel = valid
        logits = head(hidden[sel]).float()
    target = dl[sel]
    w = slot_weights(B, gamma)[slot[sel]]
    ce = F.cross_entropy(logits, target.clamp_min(0), reduction="none") * (target >= 0)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
    hit = (logits.argmax(-1) == target) & (target >= 0)
    correct = torch.zeros(B).index_add_(0, slot[sel], hit.float())
    counted = torch.zeros(B).index_add_(0, slot[sel], torch.ones_like(hit, dtype=torch.float))
    # acceptance per block if the drafter's proposals were verified against this greedy chain: 1 + leading hits
    full = torch.zeros(cand.numel() * B, dtype=torch.bool)
    full[sel.nonzero()[:, 0]] = hit
    lead = torch.cumprod(full.view(-1, B)[:, 1:].long(), dim=1).sum(1)  # (N,)
    chain_len = valid.view(-1, B)[:, 1:].sum(1)
    return loss, correct, counted, (lead, chain_len)


def split_rows(store, heldout: float, seed: int):
    order = list(range(len(store)))
    random.Random(seed).shuffle(order)
    n = max(1, int(len(order) * heldout))
    return sorted(order[n:]), sorted(order[:n])


@torch.no_grad()
def evaluate(drafter, embed, head, stores, rows, gamma, B):
    drafter.eval()
    g = torch.Generator().manual_seed(0)
    tot_loss = n = 0
    correct = torch.zeros(B)
    counted = torch.zeros(B)
    leads, full_leads = [], []
    for si, i in rows:
        out = block_loss(drafter, embed, head, stores[si][i], 10**9, gamma, g, train=False)
        if out is None:
            continue
        loss, c, k, (lead, chain_len) = out
        tot_loss += float(loss)
        n += 1
        correct += c
        counted += k
        full = chain_len == B - 1  # blocks whose whole chain is the target's (regenerated text): τ estimate
        full_leads.append(lead[full])
        leads.append(lead)
    drafter.train()
    lead_all = torch.cat(leads).float()
    lead_full = torch.cat(full_leads).float()
    return {"loss": tot_loss / max(1, n), "slot_acc": (correct / counted.clamp_min(1)).tolist()[1:],
            "tau_est_all": 1 + float(lead_all.mean()) if lead_all.numel() else None,
            "tau_est_full_chain": 1 + float(lead_full.mean()) if lead_full.numel() else None,
            "blocks_full_chain": int(lead_full.numel())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--features", nargs="+", required=True, help="feature store folders")
    p.add_argument("--out", required=True)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--layer-ids", default=None, help="comma-separated target layers (default: the store's)")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=float, default=0.02)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--max-anchors", type=int, default=256)
    p.add_argument("--heldout", type=float, default=0.03)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--save-every", type=int, default=250)
    p.add_argument("--init", default=None, help="a drafter folder to start from")
    p.add_argument("--init-norm-from-target", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)

    from .regenerate import load_target

    torch.manual_seed(args.seed)
    target, tok = load_target(args.target, "float32", "cpu")
    for prm in target.parameters():
        prm.requires_grad_(False)
    layer_ids = [int(x) for x in args.layer_ids.split(",")] if args.layer_ids else None
    stores = [FeatureStore(s, layer_ids) for s in args.features]
    layer_ids = stores[0].layer_ids
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    splits = [split_rows(s, args.heldout, args.seed) for s in stores]
    train_rows = [(si, i) for si, (tr, _) in enumerate(splits) for i in tr]
    held_rows = [(si, i) for si, (_, ho) in enumerate(splits) for i in ho]
    (out / "split.json").write_text(json.dumps({"heldout": [[args.features[si], stores[si].rows[i]["id"]]
                                                             for si, i in held_rows]}))
    V = target.config.vocab_size
    eos = target.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    vocab_path = out / "draft_vocab.pt"
    if vocab_path.exists():
        draft_ids = torch.load(vocab_path)
    else:
        counts = torch.zeros(V, dtype=torch.long)
        for si, s in enumerate(stores):
            counts += s.token_counts(V, splits[si][0])
        draft_ids = draft_vocabulary(counts, args.draft_vocab_size, always=[e for e in eos if e is not None])
        torch.save(draft_ids, vocab_path)
        held_counts = torch.zeros(V, dtype=torch.long)
        for si, s in enumerate(stores):
            held_counts += s.token_counts(V, splits[si][1])
        cover = float(held_counts[draft_ids].sum() / held_counts.sum().clamp_min(1))
        print(f"[vocab] {draft_ids.numel()} draft tokens cover {cover:.4f} of held-out target labels", flush=True)
        (out / "vocab_coverage.json").write_text(json.dumps({"draft_vocab_size": draft_ids.numel(),
                                                             "heldout_coverage": cover}))
    head = DraftHead(target.get_output_embeddings(), draft_ids)
    embed = target.get_input_embeddings().weight.detach()
    if args.init:
        drafter = DFlashDrafter.from_pretrained(args.init, dtype=torch.float32)
    else:
        drafter = DFlashDrafter.from_target(target, num_hidden_layers=args.num_layers, block_size=args.block_size,
                                            target_layer_ids=layer_ids)
        if args.init_norm_from_target:
            drafter.norm.weight.data.copy_(target.model.norm.weight.data)
    drafter.train()
    B = drafter.config.block_size
    gamma = default_gamma(B)
    decay = [q for n_, q in drafter.named_parameters() if q.dim() >= 2]
    no_decay = [q for n_, q in drafter.named_parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    total = int(math.ceil(len(train_rows) * args.epochs / args.grad_accum))
    warm = max(1, int(total * args.warmup))
    step, micro, log = 0, 0, []
    ckpt = out / "ckpt.pt"
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["opt"])
        step, micro, log = state["step"], state["micro"], state["log"]
        print(f"[resume] step {step}, micro {micro}", flush=True)
    g = torch.Generator().manual_seed(args.seed + micro)
    rng = random.Random(args.seed)
    order = []
    for ep in range(int(math.ceil(args.epochs)) + 1):
        o = list(train_rows)
        random.Random(args.seed * 1000 + ep).shuffle(o)
        order += o
    t0 = time.time()
    acc_c = torch.zeros(B)
    acc_n = torch.zeros(B)
    loss_sum, slots_seen, slots_total = 0.0, 0, sum(e.get("slots", 0) for e in log[-1:]) if log else 0
    while step < total:
        si, i = order[micro]
        micro += 1
        res = block_loss(drafter, embed, head, stores[si][i], args.max_anchors, gamma, g)
        if res is None:
            continue
        loss, c, k, _ = res
        (loss / args.grad_accum).backward()
        acc_c += c
        acc_n += k
        loss_sum += float(loss)
        slots_seen += int(k.sum())
        if micro % args.grad_accum:
            continue
        for grp in opt.param_groups:
            grp["lr"] = args.lr * cosine_lr(step, total, warm)
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0:
            slots_total += slots_seen
            entry = {"step": step, "loss": loss_sum / (25 * args.grad_accum), "slots": slots_total,
                     "slot1_acc": float(acc_c[1] / acc_n[1].clamp_min(1)), "lr": opt.param_groups[0]["lr"],
                     "elapsed": time.time() - t0, "slot_tok_per_s": slots_seen / max(1e-9, time.time() - t0)}
            t0 = time.time()
            print(json.dumps(entry), flush=True)
            log.append(entry)
            acc_c.zero_()
            acc_n.zero_()
            loss_sum, slots_seen = 0.0, 0
        if step % args.eval_every == 0 or step == total:
            ev = evaluate(drafter, embed, head, stores, held_rows[:200], gamma, B)
            ev.update(step=step, slots=slots_total, eval=True)
            print(json.dumps(ev), flush=True)
            log.append(ev)
        if step % args.save_every == 0 or step == total:
            torch.save({"drafter": drafter.state_dict(), "opt": opt.state_dict(), "step": step, "micro": micro,
                        "log": log, "args": vars(args)}, out / "ckpt.tmp")
            (out / "ckpt.tmp").replace(ckpt)
            (out / "log.json").write_text(json.dumps(log))
    drafter.save_pretrained(out / "final")
    torch.save(draft_ids, out / "final" / "draft_vocab.pt")


if __name__ == "__main__":
    main()
