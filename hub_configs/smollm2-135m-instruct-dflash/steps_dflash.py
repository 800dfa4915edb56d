"""PAD-Rec step-position embeddings for the DFlash drafter (`step_embeddings=True`).

Part of the Hub payload: imports only torch, transformers and sibling modules.

PAD-Rec is public as an abstract only: "a learned embedding per draft step, mixed in through a context-driven
gate, so the drafter can adapt to uncertainty that grows with depth". Everything below beyond that sentence is
this project's reconstruction, not the paper's equations:

    c    = context[anchor - 1]              # fused context (hidden_norm(fc(features))) at the last committed position
    g    = sigmoid(W_g c + b)               # W_g: Linear(H -> block_size), one gate per slot
    e'_i = e_i + g_i * E_i   (i >= 1)       # E: (block_size, H), zero-initialised; slot 0 (the anchor) untouched

- A block sees context strictly before its anchor; at inference the newest context row is exactly anchor - 1,
  in training (context rows at positions 0..T-1) it is row anchor - 1 of the sequence.
- With E = 0 a drafter with step embeddings is exactly its DFlash backbone (`from_pretrained(dflash_ckpt,
  step_embeddings=True)` is lossless and τ-identical at step 0).
- Applied to the block's embeddings before the ReTrace conditioner.
"""

import torch
from torch import nn

from .configuration_dflash import DFlashConfig


class StepEmbeddings(nn.Module):
    """Gated per-slot embeddings added to the proposal slots of every block of a query stream."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        # E, one row per slot (row 0, the anchor's, is never used); zeroed by the drafter's `_init_weights`, which
        # also runs after transformers' meta-device loading when the checkpoint has no `steps.*` weights.
        self.table = nn.Parameter(torch.zeros(config.block_size, config.hidden_size))
        self.gate = nn.Linear(config.hidden_size, config.block_size)  # W_g, b

    def forward(self, embeds, context, position_ids, block_size: int) -> torch.Tensor:
        """embeds (b, q, H): blocks of `block_size` (the last may be shorter); context (b, c, H): fused context at
        positions `position_ids[:, :c]` (contiguous); position_ids (b, c + q). Returns embeds with the step terms."""
        bsz, q_len, _ = embeds.shape
        rows = self.table.shape[0]
        if block_size > rows:
            raise ValueError(
                f"This drafter's step-embedding table has {rows} slots (it was built with block_size={rows}) but "
                f"config.block_size={block_size}: a longer block has slots without a step embedding. Use "
                f"block_size <= {rows}, or retrain the step embeddings at the new block size."
            )
        slot = torch.arange(q_len, device=embeds.device) % block_size  # (q,)
        block = torch.arange(q_len, device=embeds.device) // block_size  # (q,)
        c = anchor_context(context, position_ids, block_size)  # (b, n_blocks, H)
        g = torch.sigmoid(self.gate(c.to(self.gate.weight.dtype)))  # (b, n_blocks, rows)
        gate = g[:, block, slot] * (slot > 0)  # (b, q): the anchor slot is untouched
        return embeds + (gate[..., None] * self.table[slot]).to(embeds.dtype)


def anchor_context(context, position_ids, block_size: int) -> torch.Tensor:
    """(b, n_blocks, H): the fused context row at position anchor - 1 of each block of the query stream.

    A block anchored at position 0 has no context before it (training's padding blocks, anchor -1, sit there):
    it gets a zero row. Any other anchor whose position anchor - 1 is not among this call's context rows is an
    error: the gate must read the same row in training and at inference."""
    ctx_len = context.shape[1]
    position_ids = position_ids.reshape(-1, position_ids.shape[-1]).expand(context.shape[0], -1)  # (b, c + q)
    anchors = position_ids[:, ctx_len::block_size]  # (b, n_blocks): slot 0 of each block
    if ctx_len == 0:
        index = torch.full_like(anchors, -1)
    else:
        index = anchors - 1 - position_ids[:, :1]  # context rows are positions first..first + c - 1
    outside = (anchors > 0) & ((index < 0) | (index >= ctx_len))
    if bool(outside.any()):
        first = int(position_ids[0, 0]) if ctx_len else None
        raise ValueError(
            f"Step embeddings read the fused context at position anchor - 1, but a block anchored at position "
            f"{int(anchors[outside][0])} came with context rows for positions "
            f"{'none' if first is None else f'{first}..{first + ctx_len - 1}'}. Pass the context features of the "
            "positions up to the anchor (as the DFlash candidate generator and the training objective do)."
        )
    if ctx_len == 0:
        return context.new_zeros(*anchors.shape, context.shape[-1])
    rows = context.gather(1, index.clamp(0, ctx_len - 1)[..., None].expand(-1, -1, context.shape[-1]))
    return rows * (anchors > 0)[..., None].to(rows.dtype)


__all__ = ["StepEmbeddings", "anchor_context"]
