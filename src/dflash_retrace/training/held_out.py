"""Held-out measures of a drafter during training: DFlash loss and per-slot accuracy, and τ with the real generator."""

from __future__ import annotations

import torch

from .data import anchor_generator
from .objective import dflash_block_loss, drafter_core, sample_anchors, target_features

__all__ = ["HELD_OUT_SEED", "evaluate_slots", "held_out_metrics", "measure_acceptance"]

# The held-out anchors are drawn with this seed whatever the run's `--seed`: runs with different training seeds are
# then judged on the same blocks.
HELD_OUT_SEED = 0


@torch.no_grad()
def measure_acceptance(target, drafter, prompts, max_new_tokens=256) -> dict:
    """τ (bonus included) of `drafter` on `prompts` (list of (1, T) id tensors) with the real generator, greedy.

    Returns the pooled mean over all rounds (`tau`), the mean of per-prompt means (`tau_per_prompt`),
    the number of rounds, the tokens generated and the slots that received ReTrace memory.
    """
    core = drafter_core(drafter)
    device = next(target.parameters()).device
    lengths, per_prompt, tokens, conditioned = [], [], 0, 0
    for prompt in prompts:
        prompt = prompt.to(device)
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter,
                              max_new_tokens=max_new_tokens, do_sample=False)
        stats = core.last_stats
        tokens += out.shape[1] - prompt.shape[1]
        conditioned += sum(stats.conditioned_slots)
        if stats.acceptance_lengths:
            lengths += stats.acceptance_lengths
            per_prompt.append(stats.mean_acceptance_length)
    return {
        "tau": sum(lengths) / len(lengths) if lengths else float("nan"),
        "tau_per_prompt": sum(per_prompt) / len(per_prompt) if per_prompt else float("nan"),
        "rounds": len(lengths),
        "tokens": int(tokens),
        "conditioned_slots": int(conditioned),  # block slots that received ReTrace memory
    }


@torch.no_grad()
def evaluate_slots(drafter, target, examples, max_anchors=512, gamma=None, seed=0, attention="dense",
                   labels="data") -> dict:
    """Held-out DFlash loss and per-slot accuracy (slots 1..K, random anchors, no ReTrace memory), on the labels
    training uses: unless `labels` is "data", the target's (`target_labels`), which stored rows (`StoredRef`) bring
    with their features and other rows get from a target forward, as in training.

    The loss is the plain DFlash one whatever the training loss (`--loss vat` included), so runs stay comparable."""
    core = drafter_core(drafter)
    B = core.config.block_size
    device = next(target.parameters()).device
    kv_layer_ids = core.config.kv_layer_ids if core.config.context != "hidden" else None
    correct = torch.zeros(B)
    counted = torch.zeros(B)
    losses, lead, full = [], 0, 0
    for index, ex in enumerate(examples):
        anchors = sample_anchors(ex.loss_mask, max_anchors, generator=anchor_generator(seed, 1 << 20, index))
        if anchors.numel() == 0:
            continue
        given = {}
        if hasattr(ex, "store"):  # a StoredRef
            row = ex.store[ex.index]
            given = {"features": row.features[None].to(device), "label_ids": None if labels == "data" else row.labels}
        elif labels != "data":  # features, labels (and K/V) from one forward, as the training step computes them
            features, label_ids, *kv = target_features(target, ex.input_ids[None].to(device),
                                                       core.config.feature_layer_ids, with_labels=True,
                                                       kv_layer_ids=kv_layer_ids)
            given = {"features": features, "label_ids": label_ids[0], "target_kv": kv[0] if kv else None}
        loss, stats = dflash_block_loss(drafter, target, ex.input_ids, ex.loss_mask, anchors, gamma=gamma,
                                        attention=attention, chain=labels == "target-chain", **given)
        losses.append(float(loss))
        correct += stats["correct"].cpu()
        counted += stats["counted"].cpu()
        lead, full = lead + int(stats["lead"]), full + int(stats["full_blocks"])
    acc = (correct / counted.clamp_min(1))[1:]
    return {"loss": sum(losses) / len(losses) if losses else float("nan"),
            "slot_accuracy": [round(float(a), 4) for a in acc], "blocks": int(counted[1]),
            "tau_estimate": 1 + lead / full if full else None, "full_chain_blocks": full}


def held_out_metrics(model, target, held_out, cfg, attention) -> dict:
    ev = evaluate_slots(model, target, held_out, cfg.max_anchors, cfg.gamma, HELD_OUT_SEED, attention, cfg.labels)
    chosen = held_out[: cfg.eval_prompts]
    acc = {"tau": None, "tau_per_prompt": None, "rounds": 0}  # --eval-prompts 0: no generation
    if chosen:
        prompts = [ex.input_ids[: ex.prompt_length][None] for ex in chosen]
        budget = min(cfg.eval_max_new_tokens, max(int(ex.input_ids.numel() - ex.prompt_length) for ex in chosen))
        acc = measure_acceptance(target, model, prompts, max(1, budget))
    return {
        "held_out_loss": ev["loss"],
        "held_out_slot_accuracy": ev["slot_accuracy"],  # slots 1..K, random anchors, no memory
        "held_out_tau_estimate": ev["tau_estimate"],  # teacher-forced, on blocks of the target's own greedy chain
        "held_out_tau": acc["tau"],  # real generator, greedy, pooled over rounds, bonus included
        "held_out_tau_per_prompt": acc["tau_per_prompt"],
        "held_out_rounds": acc["rounds"],
    }
