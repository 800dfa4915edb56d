"""KVShot target-KV reuse: drafter layers that attend to the target's own KV cache (`context="kv"|"hybrid"`).

Part of the Hub payload: imports only torch (no sibling: `layers_dflash` and `generation_dflash` import it).

KVShot's paper is public as an abstract only (three modes: hidden-only, KV-only, hybrid; long-range acceptance
improves, end-to-end speedup is marginal, shallow drafters struggle to form matching queries). What follows is
this project's reconstruction, not the paper's code:

- `context="hidden"`: DFlash as is (the default).
- `context="kv"`: drafter layer d's keys/values are [target layer `kv_layer_ids[d]`'s cached K/V of the context
  positions ; the block's own K/V], one softmax. The drafter's fused context (`fc`, `hidden_norm`) is not attended
  (the weights stay, so DFlash checkpoints load and a context-driven gate can still read it). A DFlash checkpoint
  loaded with `context="kv"` is NOT an exact copy of itself: its keys came from its own projections of the fused
  context, now they come from the target, so a kv drafter must be trained.
- `context="hybrid"`: DFlash's attention as is, PLUS an attention of the same (RoPE-rotated) block queries over the
  target's K/V alone, whose output enters through its own zero-initialised projection `self_attn.kv.o_proj`:
  `from_pretrained(dflash_checkpoint, context="hybrid")` drafts exactly as the DFlash checkpoint at step 0.
- The target's cached keys are already RoPE-rotated (and k-normed, for Qwen3) by the target: they are used as they
  are. Drafter queries are rotated with the drafter's RoPE at absolute positions, whose theta must be the
  target's (`check_kv_target`). The query of a block anchored at p sees target K/V of positions < p, exactly the
  context rule of the hidden-state features (at inference: the target cache holds positions 0..p-1).
- Default `kv_layer_ids`: evenly spaced over the target's upper half, ending at its last layer, one per drafter
  layer, shallow to deep (`default_kv_layer_ids`; L=36, D=5 -> [20, 24, 27, 31, 35]).
"""

import torch
import torch.nn.functional as F
from torch import nn

CONTEXT_MODES = ("hidden", "kv", "hybrid")
# Cache layers whose `.keys`/`.values` hold the full, unquantized K/V of every cached position from 0.
READABLE_CACHE_LAYERS = ("DynamicLayer", "StaticLayer")


def default_kv_layer_ids(num_target_layers: int, num_drafter_layers: int) -> list:
    """One target layer per drafter layer, evenly spaced over the upper half, the last one the target's last."""
    lower = num_target_layers // 2
    upper = num_target_layers - lower
    return [lower + (upper * (d + 1)) // num_drafter_layers - 1 for d in range(num_drafter_layers)]


def resolve_kv_layer_ids(config) -> None:
    """Fills `config.kv_layer_ids` with the default for a kv/hybrid drafter and checks it has one id per layer."""
    if config.context == "hidden":
        return
    if config.kv_layer_ids is None:
        if config.num_target_layers is None:
            raise ValueError(
                f"context={config.context!r} needs `kv_layer_ids` (target layers whose KV cache each drafter layer "
                "reads) or `num_target_layers` to derive them: set one in the config.")
        config.kv_layer_ids = default_kv_layer_ids(config.num_target_layers, config.num_hidden_layers)
    if len(config.kv_layer_ids) != config.num_hidden_layers:
        raise ValueError(
            f"kv_layer_ids={config.kv_layer_ids} names {len(config.kv_layer_ids)} target layers but the drafter has "
            f"num_hidden_layers={config.num_hidden_layers}: give one target layer per drafter layer (or drop "
            "kv_layer_ids for the default).")


def _rope_of(config) -> tuple:
    """(rope type, theta) of a transformers config (5.x `rope_parameters`, or the older fields)."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    return kind, float(params.get("rope_theta", getattr(config, "rope_theta", 0.0) or 0.0))


def check_kv_target(config, target_config, name: str) -> None:
    """Raises a ValueError with the fix if a kv/hybrid drafter cannot read `target_config`'s attention layout."""
    if config.context == "hidden":
        return
    fix = "Use context='hidden' for this target, or build the drafter with `DFlashDrafter.from_target(target, ...)`."
    tc = target_config
    heads = getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    if (config.head_dim, config.num_key_value_heads) != (head_dim, heads):
        raise ValueError(
            f"context={config.context!r} reads the target's KV cache, so the drafter's head_dim and "
            f"num_key_value_heads must equal the target's: drafter ({config.head_dim}, {config.num_key_value_heads}) "
            f"vs {name} ({head_dim}, {heads}). {fix}")
    bad = [i for i in config.kv_layer_ids if not 0 <= i < tc.num_hidden_layers]
    if bad:
        raise ValueError(f"kv_layer_ids {config.kv_layer_ids} has ids {bad} outside {name}'s decoder layers "
                         f"0..{tc.num_hidden_layers - 1}: fix `kv_layer_ids` in the drafter config.")
    layer_types = getattr(tc, "layer_types", None) or []
    sliding = [i for i in config.kv_layer_ids if i < len(layer_types) and layer_types[i] != "full_attention"]
    if sliding:
        raise ValueError(
            f"kv_layer_ids {config.kv_layer_ids} include {name} layers {sliding} that are not full attention "
            f"({[layer_types[i] for i in sliding]}): their cache keeps a window, not every context position. "
            "Choose full-attention layers in `kv_layer_ids`.")
    kind, theta = _rope_of(tc)
    if kind != "default" or theta != config.rope_theta:
        raise ValueError(
            f"context={config.context!r}: drafter queries must be rotated as {name} rotated its cached keys, but "
            f"{name} uses RoPE {kind!r} theta {theta} and the drafter default RoPE theta {config.rope_theta}. "
            f"Set the drafter's rope_theta to {theta} (default RoPE targets only). {fix}")


def read_target_kv(cache, layer_ids, length: int, device, dtype) -> list:
    """[(keys, values) (1, kvh, length, d) for each layer in `layer_ids`]: views of the target cache's first `length`
    positions (a copy only when the drafter's device or dtype differs). Raises if the cache cannot be read or does
    not hold exactly `length` positions (the committed ones before the anchor)."""
    layers = getattr(cache, "layers", None)
    if layers is None or getattr(cache, "offloading", False):
        raise ValueError(
            f"A kv/hybrid DFlash drafter reads the target's KV cache, but generate() gave a "
            f"{type(cache).__name__}{' with offloading' if layers is not None else ''} whose keys it cannot read. "
            "Use the default dynamic cache or cache_implementation='static', or a context='hidden' drafter.")
    out = []
    for layer_id in layer_ids:
        layer = layers[layer_id]
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer).__name__ not in READABLE_CACHE_LAYERS or not isinstance(keys, torch.Tensor):
            raise ValueError(
                f"Target cache layer {layer_id} is a {type(layer).__name__}: a kv/hybrid drafter reads only "
                f"{' / '.join(READABLE_CACHE_LAYERS)} layers (full, unquantized K/V). Use the default dynamic cache or "
                "cache_implementation='static', or a context='hidden' drafter.")
        stored = int(layer.get_seq_length())
        if stored != length or keys.shape[2] < length:
            raise RuntimeError(
                f"Target cache layer {layer_id} holds {stored} positions where the {length} committed positions "
                "before the anchor were expected: transformers' assisted loop did not crop it as this drafter "
                "assumes. Please report this with the transformers version.")
        k, v = keys[:, :, :length], values[:, :, :length]  # static buffers are max-length: the committed prefix
        if k.device != device or k.dtype != dtype:
            k, v = k.to(device, dtype), v.to(device, dtype)
        out.append((k, v))
    return out


def context_part(mask, length: int):
    """The part of a drafter attention mask over the first `length` (context) keys, as a bool (b, 1, q, length)
    tensor or None (all visible). Understands bool/additive 4D tensors and `BlockLocalMask` (anchors, block_size)."""
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        mask = mask if mask.dtype == torch.bool else mask == 0
        return mask[..., :length]
    if hasattr(mask, "anchors") and hasattr(mask, "block_size"):  # block n sees context positions < anchors[:, n]
        limit = mask.anchors.clamp_min(0).repeat_interleave(mask.block_size, dim=1)  # (b, N*B)
        return (torch.arange(length, device=limit.device)[None, None, :] < limit[:, :, None])[:, None]
    raise ValueError(
        f"A hybrid drafter cannot split a {type(mask).__name__} attention mask into its context part: train it with "
        "attention='local' or 'dense' (not flex).")


def grouped_attention(query, key, value, mask, scaling):
    """query (b, h, q, d); key/value (b, kvh, k, d) read in place (no repeat per query group); mask bool
    (b, 1, q, k) or None -> (b, q, h, d). A fully masked row gives the uniform average (no NaN)."""
    bsz, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    grouped = query.reshape(bsz, kv_heads, groups * q_len, dim)  # head h reads kv head h // groups
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scaling  # (b, kvh, g*q, k)
    if mask is not None:
        hidden = ~mask.expand(bsz, 1, q_len, -1).repeat(1, 1, groups, 1)  # (b, 1, g*q, k)
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value).reshape(bsz, heads, q_len, dim)
    return out.transpose(1, 2)


class TargetKVAttention(nn.Module):
    """Hybrid mode's second attention: the layer's block queries over the target's K/V of the context, out through
    a zero-initialised projection (`o_proj`), so the drafter starts as its DFlash backbone."""

    def __init__(self, config):
        super().__init__()
        width = config.num_attention_heads * config.head_dim
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.attention_bias)
        self.o_proj._zero_init = True  # read by _init_weights, whatever order modules are initialised in
        self.scaling = config.head_dim**-0.5

    def forward(self, query, target_kv, attention_mask=None):
        """query (b, h, q, d) rotated; target_kv (keys, values) (b, kvh, T, d) -> (b, q, H)."""
        keys, values = target_kv
        mask = context_part(attention_mask, keys.shape[2])
        out = grouped_attention(query, keys.to(query.dtype), values.to(query.dtype), mask, self.scaling)
        return self.o_proj(out.reshape(*out.shape[:2], -1))


def check_target_kv(config, target_kv) -> None:
    """Raises unless `target_kv` suits the drafter's `context` (given exactly when it is kv/hybrid, one per layer)."""
    if config.context == "hidden":
        if target_kv is not None:
            raise ValueError("target_kv was given to a context='hidden' drafter, which does not read the target's KV "
                             "cache: load it with context='kv' or 'hybrid' (or drop target_kv).")
        return
    if target_kv is None:
        raise ValueError(
            f"This drafter (context={config.context!r}) attends to the target's KV cache: pass `target_kv` (one "
            "(keys, values) pair per drafter layer). transformers' built-in DFlash path (speculation_type='dflash') "
            "gives none: call generate(assistant_model=drafter) without speculation_type.")
    if len(target_kv) != config.num_hidden_layers:
        raise ValueError(f"target_kv has {len(target_kv)} (keys, values) pairs for {config.num_hidden_layers} "
                         "drafter layers: give one per layer (target layers `kv_layer_ids`).")


__all__ = ["CONTEXT_MODES", "TargetKVAttention", "check_kv_target", "check_target_kv", "context_part",
           "default_kv_layer_ids", "grouped_attention", "read_target_kv", "resolve_kv_layer_ids"]
