"""The DFlash training objective: random anchors, block attention rule, decay-weighted CE.

Pure functions on tensors, shared by the training loop, the ReTrace stage and tests.

Per sequence x (length T) with target features F (`context_features` of a target forward on the clean
sequence: computed online by `target_features`, or precomputed and passed as `features=`):
- anchors p are drawn among supervised positions with p + K inside the sequence;
- each block is `[x_p, MASK x K]` at positions p..p+K; all blocks form one query stream;
- a block query sees context features of positions < p (at inference the anchor has no features yet)
  and its own block (bidirectionally), nothing else;
- slot k predicts x_{p+k}; CE weighted w_k = exp(-(k-1)/gamma), normalised over valid slots
  (`loss="vat"`: verification-aware weights instead, see `vat_weights`).

Batches: `input_ids`/`loss_mask` (b, T) right-padded (padding has loss_mask False) and `anchors` (b, N)
padded with -1. A padding block sees no context, only itself, and has no labels.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..modeling_dflash import context_features
from .target_kv import cached_kv

DEFAULT_GAMMA = {16: 7.0, 8: 4.0}
LOGITS_CHUNK = 4096  # slots per LM-head chunk on accelerators; above it the chunks are recomputed in backward
CPU_LOGITS_BYTES = 16 << 20  # on the CPU a chunk's fp32 logits stay under this (see `logits_chunk_size`)


def default_gamma(block_size: int) -> float:
    """gamma = 7 for B = 16 and 4 for B = 8 (DFlash recipe); otherwise scaled linearly with B."""
    return DEFAULT_GAMMA.get(block_size, 7.0 * block_size / 16)


def sample_anchors(loss_mask: torch.Tensor, max_anchors: int, generator=None) -> torch.Tensor:
    """Random anchor positions of one sequence, sorted.

    loss_mask (T,) bool: supervised (response) positions. An anchor p is a response token (as at inference,
    where the anchor is the last committed token) with context before it (p >= 1) and at least one label
    (p + 1 < T); slots past the end of the sequence get no label (see `block_inputs`), so the last block
    can still learn to propose an early EOS.
    """
    T = loss_mask.shape[0]
    if T < 3:
        return torch.zeros(0, dtype=torch.long)
    candidates = torch.arange(1, T - 1)
    candidates = candidates[loss_mask[candidates].bool().cpu()]
    if candidates.numel() > max_anchors:
        order = torch.randperm(candidates.numel(), generator=generator)[:max_anchors]
        candidates = candidates[order].sort().values
    return candidates


def pad_anchors(anchor_lists: list) -> torch.Tensor:
    """List of (N_i,) anchor tensors -> (b, max N_i) padded with -1 (at least one column)."""
    width = max([1] + [int(a.numel()) for a in anchor_lists])
    out = torch.full((len(anchor_lists), width), -1, dtype=torch.long)
    for i, a in enumerate(anchor_lists):
        out[i, : a.numel()] = a
    return out


def block_inputs(input_ids, loss_mask, anchors, block_size, mask_token_id, label_ids=None):
    """Query stream for the given anchors.

    input_ids/loss_mask (T,) with anchors (N,), or (b, T) with anchors (b, N) padded with -1.
    Returns block_ids, positions, labels, label_valid, each (N*B,) or (b, N*B). Slot 0 of each block
    (the anchor), padding blocks and slots past the sequence end have no label. `label_ids` (shaped as
    input_ids): the label of each position, if not the token itself (see `target_labels`).
    """
    if input_ids.dim() == 1:
        outs = block_inputs(input_ids[None], loss_mask[None], anchors[None], block_size, mask_token_id,
                            None if label_ids is None else label_ids[None])
        return tuple(t[0] for t in outs)
    bsz, T = input_ids.shape
    anchors = anchors.to(input_ids.device)
    real = anchors >= 0  # (b, N)
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = (anchors.clamp_min(0)[:, :, None] + offsets).reshape(bsz, -1)  # (b, N*B)
    inside = positions < T
    index = positions.clamp_max(T - 1)
    tokens = input_ids.gather(1, index)
    labels = tokens if label_ids is None else label_ids.to(input_ids.device).gather(1, index)
    is_anchor = (offsets == 0).repeat(anchors.shape[1])[None]  # (1, N*B)
    label_valid = loss_mask.bool().gather(1, index) & inside & real.repeat_interleave(block_size, 1) & ~is_anchor
    block_ids = torch.where(is_anchor, tokens, torch.full_like(tokens, mask_token_id))
    return block_ids, positions, labels, label_valid


def block_attention_mask(context_length, anchors, block_size, device=None) -> torch.Tensor:
    """Bool mask, True = visible: context strictly before the anchor, own block only.

    anchors (N,) -> (1, 1, N*B, T + N*B); anchors (b, N) padded with -1 -> (b, 1, N*B, T + N*B).
    """
    anchors = anchors.to(device)
    if anchors.dim() == 1:
        anchors = anchors[None]
    num_blocks = anchors.shape[1]
    query_block = torch.arange(num_blocks, device=device).repeat_interleave(block_size)  # (N*B,)
    limit = anchors[:, query_block].clamp_min(0)  # (b, N*B): a padding block sees no context
    ctx = torch.arange(context_length, device=device)[None, None, :] < limit[:, :, None]  # (b, N*B, T)
    own = (query_block[:, None] == query_block[None, :]).expand(anchors.shape[0], -1, -1)  # (b, N*B, N*B)
    return torch.cat([ctx, own], dim=2)[:, None]


def flex_block_mask(context_length, anchors, block_size):
    """The same rule as `block_attention_mask`, as a flex_attention `BlockMask` (for CUDA training).

    Built from a `mask_mod` so no dense (q, kv) tensor exists; anchors (b, N) padded with -1.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if anchors.dim() == 1:
        anchors = anchors[None]
    bsz, num_blocks = anchors.shape
    limit = anchors.clamp_min(0)  # (b, N)

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        before_anchor = kv_idx < limit[b, block]  # context keys come first, at indices 0..T-1
        same_block = (kv_idx >= context_length) & ((kv_idx - context_length) // block_size == block)
        return before_anchor | same_block

    q_len = num_blocks * block_size
    return create_block_mask(mask_mod, bsz, None, q_len, context_length + q_len, device=anchors.device)


@dataclass
class BlockLocalMask:
    """The training attention rule in structured form, for `attention="local"`: the query stream is N blocks of
    `block_size`; block n sees context keys `< anchors[:, n]` (-1: padding, no context) and its own block, nothing
    else. The same rule as `block_attention_mask`, but N*B*(T + B) scores instead of N*B*(T + N*B). The drafter's
    attention calls `attend` for any mask that has one."""

    anchors: torch.Tensor  # (b, N) long
    block_size: int

    def attend(self, query, key, value, scaling, num_key_value_groups, dropout=0.0):
        """query (b, h, N*B, d); key/value (b, kvh, T + N*B, d), the T context keys first -> (b, N*B, h, d).

        On the CPU the blocks go through in groups whose fp32 scores stay under `CPU_LOGITS_BYTES` (the same rows,
        so the same output; see `logits_chunk_size` for why buffers are kept small there)."""
        bsz, heads, q_len, _ = query.shape
        B = self.block_size
        N, T = q_len // B, key.shape[2] - q_len
        group = N
        if query.device.type == "cpu" and not torch.compiler.is_compiling():  # compiled: one group, no shape guards
            group = max(1, CPU_LOGITS_BYTES // (4 * bsz * heads * B * (T + B)))
        key = key.repeat_interleave(num_key_value_groups, dim=1)  # once, not once per group
        value = value.repeat_interleave(num_key_value_groups, dim=1)
        context = (key[:, :, :T], value[:, :, :T])
        if group >= N:
            return _attend_blocks(self.anchors, B, query, context, (key[:, :, T:], value[:, :, T:]), scaling, dropout)
        outs = []
        for start in range(0, N, group):
            stop = min(N, start + group)
            own = slice(T + start * B, T + stop * B)
            outs.append(_attend_blocks(self.anchors[:, start:stop], B, query[:, :, start * B: stop * B], context,
                                       (key[:, :, own], value[:, :, own]), scaling, dropout))
        return torch.cat(outs, dim=1)  # two groups or more: one group returned above


def _attend_blocks(anchors, B, query, context, own_kv, scaling, dropout):
    """`BlockLocalMask.attend` on one group of N blocks: anchors (b, N), query (b, h, N*B, d), the context's keys and
    values (b, h, T, d) each and the group's own (b, h, N*B, d) each, heads already expanded -> (b, N*B, h, d)."""
    bsz, heads, q_len, dim = query.shape
    (ctx_key, ctx_value), (own_key, own_value) = context, own_kv
    N, T = q_len // B, ctx_key.shape[2]
    ctx_scores = torch.matmul(query, ctx_key.transpose(2, 3)) * scaling  # (b, h, N*B, T)
    limit = anchors.to(query.device).clamp_min(0).repeat_interleave(B, dim=1)  # (b, N*B)
    hidden = torch.arange(T, device=query.device)[None, None, :] >= limit[:, :, None]  # (b, N*B, T)
    ctx_scores = ctx_scores.masked_fill(hidden[:, None], torch.finfo(ctx_scores.dtype).min)
    q_blocks = query.reshape(bsz, heads, N, B, dim)
    k_blocks = own_key.reshape(bsz, heads, N, B, dim)
    own_scores = torch.matmul(q_blocks, k_blocks.transpose(3, 4)).reshape(bsz, heads, q_len, B) * scaling
    probs = F.softmax(torch.cat([ctx_scores, own_scores], dim=-1), dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout)
    own = torch.matmul(probs[..., T:].reshape(bsz, heads, N, B, B),
                       own_value.reshape(bsz, heads, N, B, dim))  # (b, h, N, B, d)
    out = torch.matmul(probs[..., :T], ctx_value) + own.reshape(bsz, heads, q_len, dim)
    return out.transpose(1, 2)


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """(B,) weights per slot: 0 for the anchor, exp(-(k-1)/gamma) for proposal slot k."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


LOSSES = ("dflash", "vat")


@torch.no_grad()
def vat_weights(hits, label_valid, block_size: int, gamma: float) -> torch.Tensor:
    """VAT (verification-aware training) slot weights, shaped as `label_valid` (..., N*B).

    Per block, k* is the first proposal slot whose prediction misses its label (the first would-be rejection;
    no miss: the last slot). w_k = 1 for k <= k*, exp(-(k - k*)/gamma) beyond: the DFlash decay re-anchored at the
    first rejection instead of slot 1 (k* = 1 gives the DFlash weights). Slots without a label weigh 0.
    `hits` (..., N*B) bool: the drafter's prediction equals the label (detached)."""
    shape = label_valid.shape
    valid = label_valid.reshape(*shape[:-1], -1, block_size)  # (..., N, B)
    miss = valid & ~hits.reshape(valid.shape).bool()
    miss[..., 0] = False  # the anchor is no proposal
    k = torch.arange(block_size, device=valid.device, dtype=torch.float32)
    first = miss.float().argmax(-1).float()  # index of the first miss (argmax returns the first maximum)
    k_star = torch.where(miss.any(-1), first, torch.full_like(first, block_size - 1))[..., None]  # (..., N, 1)
    w = torch.where(k <= k_star, torch.ones_like(k_star), torch.exp(-(k - k_star) / gamma))
    return (w * valid).reshape(shape)


@torch.no_grad()
def target_features(target, input_ids, layer_ids, attention_mask=None, with_final=False, with_labels=False,
                    kv_layer_ids=None):
    """`context_features` of one target forward, (b, T, n*H); plus the final-norm states, the target's own labels
    (`target_labels`) and the K/V its layers `kv_layer_ids` cached (`cached_kv`), each if asked, from the same forward,
    in that order."""
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                 use_cache=kv_layer_ids is not None)
    feats = context_features(out.hidden_states, layer_ids)
    extra = ([out.hidden_states[-1]] if with_final else []) + ([target_labels(input_ids, out.logits)] if with_labels
                                                               else [])
    if kv_layer_ids is not None:
        extra.append(cached_kv(out, kv_layer_ids, input_ids.shape[1]))
    return (feats, *extra) if extra else feats


def target_labels(input_ids, logits):
    """(b, T) labels from the target's own next-token argmax: position j gets argmax of the logits at j - 1
    (position 0 keeps its token). On the target's greedy output these are the tokens themselves; on other text
    each is what the target would have said there (teacher-forced self-distillation)."""
    return torch.cat([input_ids[:, :1], logits[:, :-1].argmax(-1).to(input_ids.dtype)], dim=1)


def drafter_core(model):
    """The DFlash drafter inside DDP / torch.compile / PEFT wrappers (for its config and helpers)."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)):  # peft.PeftModel
            model = model.get_base_model()
        else:
            return model


def block_hidden_states(drafter, target, input_ids, loss_mask, anchors, features=None, retrace_memory=None,
                        attention="dense", label_ids=None, target_kv=None):
    """Drafter output states of the blocks anchored at `anchors` (shapes as in `block_inputs`).

    `drafter` may be wrapped (DDP, PEFT): its forward is called as is. `attention` is "dense" (bool mask,
    any device) or "flex" (a flex_attention BlockMask; needs `config._attn_implementation="flex_attention"`).
    `target_kv` (kv/hybrid drafters): the target's K/V of positions 0..T-1 per drafter layer (`target_features`
    with `kv_layer_ids`); computed online when not given. The context part of the block rule masks them.
    Returns hidden (b, N*B, H), labels (b, N*B), label_valid (b, N*B).
    """
    core = drafter_core(drafter)
    cfg = core.config
    B = cfg.block_size
    device = next(core.parameters()).device
    if input_ids.dim() == 1:
        input_ids, loss_mask, anchors = input_ids[None], loss_mask[None], anchors[None]
    input_ids, loss_mask, anchors = input_ids.to(device), loss_mask.to(device), anchors.to(device)
    bsz, T = input_ids.shape
    if cfg.context != "hidden" and target_kv is None:  # features and K/V from one forward
        online, target_kv = target_features(target, input_ids, cfg.feature_layer_ids, kv_layer_ids=cfg.kv_layer_ids)
        features = online if features is None else features
    if features is None:  # right padding needs no mask: causal attention never looks ahead to it
        features = target_features(target, input_ids, cfg.feature_layer_ids)
    if label_ids is not None and label_ids.dim() == 1:
        label_ids = label_ids[None]
    block_ids, positions, labels, label_valid = block_inputs(input_ids, loss_mask, anchors, B, cfg.mask_token_id,
                                                             label_ids)
    noise = core.embed_block(target.get_input_embeddings(), block_ids).to(device)  # (b, N*B, H)
    pos = torch.cat([torch.arange(T, device=device).expand(bsz, -1), positions], dim=1)  # (b, T + N*B)
    if attention == "flex":
        mask = flex_block_mask(T, anchors, B)
    elif attention == "local":  # the same rule, structured: N*B*(T+B) scores instead of N*B*(T+N*B)
        mask = BlockLocalMask(anchors, B)
    else:
        mask = block_attention_mask(T, anchors, B, device)
    hidden = drafter(
        noise_embeds=noise, context_hidden_states=features, position_ids=pos, attention_mask=mask,
        retrace_memory=retrace_memory, **({} if target_kv is None else {"target_kv": target_kv}),
    ).last_hidden_state
    return hidden, labels, label_valid


def _ce_and_argmax(hidden, labels, core, lm_head, soft_ids=None, soft_logits=None, distill=0.0):
    """Per-slot CE and argmax; with soft targets (ids in the head's own index, -1 outside it; logits -inf where
    there is none), (1 - distill) * CE(label) + distill * CE(softmax of the soft logits over the ids inside)."""
    logits = core.compute_draft_logits(hidden, lm_head).float()  # (n, V) or (n, draft vocabulary)
    ce = F.cross_entropy(logits, labels, reduction="none")
    if soft_ids is not None and distill:
        soft_logits = soft_logits.masked_fill(soft_ids < 0, float("-inf"))
        teacher = torch.softmax(soft_logits, dim=-1).nan_to_num(0.0)  # a slot with no soft target: all zeros
        logp = torch.log_softmax(logits, dim=-1).gather(1, soft_ids.clamp_min(0))
        soft = -(teacher * logp).sum(-1)
        has_soft = teacher.sum(-1) > 0
        ce = torch.where(has_soft, (1 - distill) * ce + distill * soft, ce)
    return ce, logits.argmax(-1)


def greedy_chain_mask(input_ids, label_ids, anchors, block_size) -> torch.Tensor:
    """(b, N*B) bool: slot k of the block anchored at p lies on the target's greedy chain from p, i.e. the text
    agrees with the target's own choice (`label_ids`) at p+1..p+k-1. Beyond the first disagreement the true prefix
    is not what the target would have generated, so its label is not what verification would accept."""
    bsz, T = input_ids.shape
    N = anchors.shape[1]
    agree = input_ids == label_ids.to(input_ids.device)  # (b, T)
    pos = anchors.clamp_min(0)[:, :, None] + torch.arange(1, block_size - 1, device=input_ids.device)  # (b, N, B-2)
    on_chain = agree.gather(1, pos.clamp_max(T - 1).reshape(bsz, -1)).view(bsz, N, -1) & (pos < T)
    chain = torch.ones(bsz, N, block_size, dtype=torch.bool, device=input_ids.device)
    chain[:, :, 2:] = torch.cumprod(on_chain.long(), dim=-1).bool()
    return chain.view(bsz, N * block_size)


def draft_vocabulary(counts: torch.Tensor, size: int, always=()) -> torch.Tensor:
    """Sorted target ids of a draft vocabulary: the `size` most frequent labels in `counts` (V,), `always` included
    (EOS ids: the drafter must be able to propose the end; an --init drafter's own ids when its vocabulary grows)."""
    keep = {int(i) for i in always}
    if len(keep) > size:
        raise ValueError(f"A draft vocabulary of {size} ids cannot keep the {len(keep)} it must keep.")
    ranked = [int(i) for i in torch.argsort(counts, descending=True, stable=True)[: size + len(keep)]]
    ids = keep | set([i for i in ranked if i not in keep][: max(0, size - len(keep))])
    return torch.tensor(sorted(ids), dtype=torch.long)


class _RowsHead(torch.nn.Module):
    """The LM head restricted to some vocabulary rows (frozen: no gradient reaches the target's weights)."""

    def __init__(self, lm_head, rows):
        super().__init__()
        self.weight = lm_head.weight.detach()[rows]
        bias = getattr(lm_head, "bias", None)
        self.bias = None if bias is None else bias.detach()[rows]

    def forward(self, hidden):
        return F.linear(hidden, self.weight, self.bias)


def vocab_rows(examples_ids, extra=()) -> torch.Tensor:
    """Sorted token ids occurring in the given id tensors (and `extra`): a training loss vocabulary."""
    ids = [t.reshape(-1) for t in examples_ids] + [torch.as_tensor(list(extra), dtype=torch.long)]
    return torch.unique(torch.cat(ids).long())


def dflash_block_loss(drafter, target, input_ids, loss_mask, anchors, gamma=None, features=None, retrace_memory=None,
                      attention="dense", logits_chunk=None, vocab=None, label_ids=None, chain=False,
                      loss="dflash", target_kv=None, soft_targets=None, distill=0.0):
    """Decay-weighted CE of the blocks of one sequence (input_ids/loss_mask (T,), anchors (N,)) or of a batch
    (b, T) with anchors (b, N) padded with -1. Normalised by the total weight of the valid slots.

    `loss`: "dflash" (w_k = exp(-(k-1)/gamma)) or "vat" (`vat_weights`: full weight up to each block's first
    would-be rejection under the drafter's own argmax over the training vocabulary, decay from there).

    `vocab`: sorted token ids (see `vocab_rows`) to restrict the softmax to (every label must be among them);
    the LM head then costs len(vocab)/V of the full one. None: the full vocabulary. `label_ids`: per-position
    labels (`target_labels`) instead of the tokens themselves; with `chain`, only slots on the target's greedy chain
    (`greedy_chain_mask`) are supervised. `target_kv`: see `block_hidden_states`. A drafter with a draft vocabulary (`draft_to_target`) is trained over
    it: labels outside it are not in the loss and count as misses. `soft_targets`: (ids, logits), each (b, T, k),
    the target's top-k at each label position (`features.stored_soft_targets`); each slot's CE is then
    (1 - distill) * CE(label) + distill * CE(their softmax over the ids inside the head's vocabulary).

    Returns (loss, stats) where stats holds per-slot `correct` / `counted` tensors (B,) for accuracy.
    The LM head runs in chunks of `logits_chunk` slots (None: `logits_chunk_size`), recomputed in backward above
    `LOGITS_CHUNK` slots in all, so the (slots, vocab) logits never all live at once.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}.")
    core = drafter_core(drafter)
    B = core.config.block_size
    gamma = gamma or default_gamma(B)
    hidden, labels, label_valid = block_hidden_states(
        drafter, target, input_ids, loss_mask, anchors, features=features, retrace_memory=retrace_memory,
        attention=attention, label_ids=label_ids, target_kv=target_kv,
    )
    device = hidden.device
    if chain and label_ids is not None:
        ids2d = input_ids if input_ids.dim() == 2 else input_ids[None]
        lab2d = label_ids if label_ids.dim() == 2 else label_ids[None]
        anc2d = anchors if anchors.dim() == 2 else anchors[None]
        label_valid = label_valid & greedy_chain_mask(ids2d.to(device), lab2d, anc2d.to(device), B)
    slot = torch.arange(B, device=device).repeat(hidden.shape[1] // B).expand_as(label_valid)[label_valid]  # (n,)
    soft_ids = soft_logits = None
    if soft_targets is not None and distill:
        soft_ids, soft_logits = _slot_soft_targets(soft_targets, anchors, B, label_valid)
    hidden, labels = hidden[label_valid], labels[label_valid]  # (n, H), (n,)
    lm_head = target.get_output_embeddings()
    draft = core.draft_to_target
    if draft is not None and vocab is not None:
        raise ValueError("This drafter has a draft vocabulary: its loss runs over it; do not also pass a loss "
                         "vocabulary (loss_vocab='data').")
    inside = None  # with a draft vocabulary: which labels it holds
    if draft is not None:
        vocab = draft.to(device)  # pred and labels are mapped as for a loss vocabulary below
    if vocab is not None:
        vocab = vocab.to(device)
        position = torch.full((lm_head.weight.shape[0],), -1, dtype=torch.long, device=device)
        position[vocab] = torch.arange(vocab.numel(), device=device)
        labels_full, labels = labels, position[labels]
        if soft_ids is not None:
            soft_ids = position[soft_ids]  # -1 outside the vocabulary: no weight
        if draft is not None:  # outside the draft vocabulary: not in the loss, a miss
            inside = labels >= 0
            labels = labels.clamp_min(0)
        elif bool((labels < 0).any()):
            raise ValueError("A label is outside the loss vocabulary: build it from every training sequence "
                             "(`vocab_rows`).")
        else:
            lm_head = _RowsHead(lm_head, vocab)
    soft = None if soft_ids is None else (soft_ids, soft_logits, distill)
    ce, pred = _chunked_ce(hidden, labels, core, lm_head, logits_chunk, soft)
    if vocab is not None:
        pred, labels = vocab[pred], labels_full
    correct = (pred == labels).float()
    hits = torch.zeros_like(label_valid).masked_scatter_(label_valid, correct.bool())  # (b, N*B)
    if loss == "vat":
        w = vat_weights(hits, label_valid, B, gamma)[label_valid]
    else:
        w = slot_weights(B, gamma, device)[slot]
    if inside is not None:
        w = w * inside
    loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
    return loss, _slot_stats(correct, hits, label_valid, slot, B)


def logits_chunk_size(device, width: int) -> int:
    """Supervised slots per LM-head call for a head `width` rows wide: `LOGITS_CHUNK` on accelerators; on the CPU as
    many as keep the chunk's fp32 logits under `CPU_LOGITS_BYTES` (512 slots for a draft vocabulary of 8,192).

    On the CPU every buffer above glibc's mmap threshold (32 MiB at most) is mapped afresh and faulted in page by page
    on each allocation; in the VMs we train on that made the softmax of 4,096 x 8,192 logits and its backward take more
    than half of a training step (`results/training_profile/`)."""
    if torch.device(device).type != "cpu":
        return LOGITS_CHUNK
    return max(64, CPU_LOGITS_BYTES // (4 * max(1, int(width))))


def _chunked_ce(hidden, labels, core, lm_head, logits_chunk, soft=None) -> tuple:
    """(per-slot CE, argmax) through the LM head in chunks of `logits_chunk` slots (None: `logits_chunk_size`).
    Above `LOGITS_CHUNK` slots in all, each chunk is recomputed in backward, so the (slots, vocab) logits never all live
    at once; below, the chunks keep their activations (a chunk size smaller than that only keeps each buffer small).
    `soft`: (ids, logits, distill) for `_ce_and_argmax`."""
    if logits_chunk is None:  # sized by the width of the head the logits come from
        draft = core.draft_to_target
        logits_chunk = logits_chunk_size(hidden.device, lm_head.weight.shape[0] if draft is None else draft.numel())
    ce_parts, pred_parts = [], []
    recompute = hidden.shape[0] > LOGITS_CHUNK and torch.is_grad_enabled()
    for start in range(0, max(1, hidden.shape[0]), logits_chunk):
        part = slice(start, start + logits_chunk)
        extra = () if soft is None else (soft[0][part], soft[1][part], soft[2])
        if recompute:
            ce, pred = checkpoint(_ce_and_argmax, hidden[part], labels[part], core, lm_head, *extra,
                                  use_reentrant=False)
        else:
            ce, pred = _ce_and_argmax(hidden[part], labels[part], core, lm_head, *extra)
        ce_parts.append(ce)
        pred_parts.append(pred)
    return torch.cat(ce_parts), torch.cat(pred_parts)


def _slot_soft_targets(soft_targets, anchors, B, label_valid) -> tuple:
    """(ids (n, k), logits (n, k)) of the supervised slots, gathered at their label positions as `block_inputs`
    gathers labels."""
    ids, logits = soft_targets
    if ids.dim() == 2:
        ids, logits = ids[None], logits[None]
    anchors = anchors if anchors.dim() == 2 else anchors[None]
    device = label_valid.device
    T, k = ids.shape[1], ids.shape[2]
    positions = (anchors.to(device).clamp_min(0)[:, :, None] + torch.arange(B, device=device)).reshape(len(ids), -1)
    index = positions.clamp_max(T - 1)[..., None].expand(-1, -1, k)
    ids, logits = ids.to(device).gather(1, index), logits.to(device).gather(1, index)
    return ids[label_valid], logits[label_valid]


def _slot_stats(correct, hits, label_valid, slot, B) -> dict:
    """Per-slot `correct` / `counted` (B,) and the teacher-forced acceptance counts of `dflash_block_loss`."""
    full = label_valid.view(*label_valid.shape[:-1], -1, B)[..., 1:].all(-1)  # blocks with every slot supervised
    lead = torch.cumprod(hits.view(*hits.shape[:-1], -1, B)[..., 1:].long(), dim=-1).sum(-1)  # leading hits
    return {
        "correct": torch.zeros(B, device=correct.device).index_add_(0, slot, correct),
        "counted": torch.zeros(B, device=correct.device).index_add_(0, slot, torch.ones_like(correct)),
        # Teacher-forced acceptance: on blocks whose labels are the target's whole greedy chain, verification
        # would accept the leading correct proposals; 1 + lead / full_blocks estimates τ (bonus included).
        "lead": lead[full].sum(), "full_blocks": full.sum(),
    }


def cosine_lr(step: int, total: int, warmup: int) -> float:
    """Multiplier for the base lr: linear warm-up then cosine to 0."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
