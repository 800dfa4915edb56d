"""The DFlash training objective: random anchors, block attention rule, decay-weighted CE.

Pure functions on tensors, shared by the trainer (`dflash_retrace.train`), the ReTrace stage and tests.

Per sequence x (length T) with target features F (computed online from the clean sequence):
- anchors p are drawn among supervised positions with p + K inside the sequence;
- each block is `[x_p, MASK x K]` at positions p..p+K; all blocks form one query stream;
- a block query sees context features of positions < p (at inference the anchor has no features yet)
  and its own block (bidirectionally), nothing else;
- slot k predicts x_{p+k}; CE weighted w_k = exp(-(k-1)/gamma), normalised over valid slots.
"""

import math

import torch
import torch.nn.functional as F

DEFAULT_GAMMA = {16: 7.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """gamma = 7 for B = 16 and 4 for B = 8 (DFlash recipe); otherwise scaled linearly with B."""
    return DEFAULT_GAMMA.get(block_size, 7.0 * block_size / 16)


def sample_anchors(loss_mask: torch.Tensor, block_size: int, max_anchors: int, generator=None) -> torch.Tensor:
    """Random anchor positions of one sequence.

    loss_mask (T,) bool: supervised (response) positions. An anchor p needs context (p >= 1), a supervised
    first label (p + 1) and its whole block inside the sequence (p + block_size - 1 < T).
    """
    T = loss_mask.shape[0]
    last = T - block_size  # largest p with p + K <= T - 1
    if last < 1:
        return torch.zeros(0, dtype=torch.long)
    candidates = torch.arange(1, last + 1)
    candidates = candidates[loss_mask[candidates + 1].cpu()]
    if candidates.numel() > max_anchors:
        order = torch.randperm(candidates.numel(), generator=generator)[:max_anchors]
        candidates = candidates[order].sort().values
    return candidates


def block_inputs(input_ids, loss_mask, anchors, block_size, mask_token_id):
    """Query stream of one sequence for the given anchors.

    Returns block_ids (N*B,), positions (N*B,), labels (N*B,), label_valid (N*B,) where slot 0 of each
    block (the anchor) has no label.
    """
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = (anchors.to(input_ids.device)[:, None] + offsets[None]).reshape(-1)  # (N*B,)
    block_ids = torch.full_like(positions, mask_token_id)
    block_ids[::block_size] = input_ids[positions[::block_size]]
    labels = input_ids[positions]
    label_valid = loss_mask[positions].clone()
    label_valid[::block_size] = False
    return block_ids, positions, labels, label_valid


def block_attention_mask(context_length, anchors, block_size, device=None) -> torch.Tensor:
    """Bool (1, 1, N*B, T + N*B), True = visible: context strictly before the anchor, own block only."""
    anchors = anchors.to(device)
    num_blocks = anchors.shape[0]
    query_block = torch.arange(num_blocks, device=device).repeat_interleave(block_size)  # (N*B,)
    ctx = torch.arange(context_length, device=device)[None, :] < anchors[query_block][:, None]  # (N*B, T)
    own = query_block[:, None] == query_block[None, :]  # (N*B, N*B)
    return torch.cat([ctx, own], dim=1)[None, None]


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """(B,) weights per slot: 0 for the anchor, exp(-(k-1)/gamma) for proposal slot k."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


@torch.no_grad()
def target_features(target, input_ids, layer_ids, attention_mask=None, with_final=False):
    """Concatenated `hidden_states[i + 1]` for i in layer_ids, (b, T, n*H); plus the final-norm states if asked."""
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return (feats, out.hidden_states[-1]) if with_final else feats


def dflash_block_loss(drafter, target, input_ids, loss_mask, anchors, gamma=None, features=None, retrace_memory=None):
    """Decay-weighted CE of one sequence's blocks. input_ids/loss_mask (T,), anchors (N,).

    Returns (loss, stats) where stats holds per-slot correct / counted tensors (B,) for accuracy.
    """
    cfg = drafter.config
    B = cfg.block_size
    gamma = gamma or default_gamma(B)
    device = next(drafter.parameters()).device
    input_ids, loss_mask, anchors = input_ids.to(device), loss_mask.to(device), anchors.to(device)
    if features is None:
        features = target_features(target, input_ids[None], cfg.target_layer_ids)
    block_ids, positions, labels, label_valid = block_inputs(input_ids, loss_mask, anchors, B, cfg.mask_token_id)
    T = input_ids.shape[0]
    noise = drafter.embed_block(target.get_input_embeddings(), block_ids[None]).to(device)
    pos = torch.cat([torch.arange(T, device=device), positions])[None]
    mask = block_attention_mask(T, anchors, B, device)
    hidden = drafter(
        noise_embeds=noise, context_hidden_states=features, position_ids=pos, attention_mask=mask,
        retrace_memory=retrace_memory,
    ).last_hidden_state[0]  # (N*B, H)
    logits = drafter.compute_logits(hidden[label_valid], target.get_output_embeddings()).float()
    w = slot_weights(B, gamma, device).repeat(anchors.shape[0])[label_valid]
    ce = F.cross_entropy(logits, labels[label_valid], reduction="none")
    loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
    slot = torch.arange(B, device=device).repeat(anchors.shape[0])[label_valid]
    correct = (logits.argmax(-1) == labels[label_valid]).float()
    stats = {
        "correct": torch.zeros(B, device=device).index_add_(0, slot, correct),
        "counted": torch.zeros(B, device=device).index_add_(0, slot, torch.ones_like(correct)),
    }
    return loss, stats


def cosine_lr(step: int, total: int, warmup: int) -> float:
    """Multiplier for the base lr: linear warm-up then cosine to 0."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
