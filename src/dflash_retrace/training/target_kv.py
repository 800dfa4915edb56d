"""The target's K/V for training KVShot drafters (`context="kv"|"hybrid"`, see `kv_dflash`).

Online: the K/V come from the same target forward as the context features (`use_cache=True`, read from its
cache). From a feature store: target layer l's K/V are recomputed from the stored input of that layer, the output
of layer l-1 (`hidden_states[l]`, stored layer id l-1; layer 0 reads the input embedding), by running the target
layer's own `input_layernorm` and attention on it and recording what the attention hands its cache: the same
projections, k-norm and RoPE as the full forward, one layer deep. Stores hold bf16 hidden states, so stored K/V
equal the online ones to bf16 rounding, not bit for bit.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from ..kv_dflash import read_target_kv


def forward_cache(out):
    """The cache of a target forward's output (`cache` from transformers 5.24, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def cached_kv(out, kv_layer_ids, length: int) -> list:
    """[(keys, values) (b, kvh, length, d)] of a full target forward's cache, for the drafter layers."""
    keys = forward_cache(out).layers[kv_layer_ids[0]].keys
    return read_target_kv(forward_cache(out), kv_layer_ids, length, keys.device, keys.dtype)


class _Recorder:
    """Stands in for a cache: keeps the keys/values an attention module hands to `update`."""

    def update(self, key, value, *args, **kwargs):
        self.keys, self.values = key, value
        return key, value


def _decoder(target):
    base = target.get_decoder() if callable(getattr(target, "get_decoder", None)) else target.model
    if not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
        raise ValueError(f"{type(target).__name__}: cannot find its decoder layers and rotary embedding to recompute "
                         "target K/V from stored hidden states; train without --features (online K/V).")
    return base


@torch.no_grad()
def recompute_layer_kv(target, layer_id: int, layer_input: torch.Tensor) -> tuple:
    """(keys, values) (b, kvh, T, d) that target layer `layer_id` caches for `layer_input` (b, T, H), the output of
    layer `layer_id - 1` (`hidden_states[layer_id]`) at positions 0..T-1."""
    base = _decoder(target)
    layer = base.layers[layer_id]
    param = next(layer.parameters())
    h = layer.input_layernorm(layer_input.to(param.device, param.dtype))
    positions = torch.arange(h.shape[1], device=h.device)[None].expand(h.shape[0], -1)
    cos_sin = base.rotary_emb(h, positions)
    attn = layer.self_attn
    name = "cache" if "cache" in inspect.signature(attn.forward).parameters else "past_key_values"  # 5.24 rename
    recorder = _Recorder()
    attn(hidden_states=h, position_embeddings=cos_sin, attention_mask=None, **{name: recorder})
    return recorder.keys, recorder.values


def check_store_kv_layers(store, kv_layer_ids) -> None:
    """Raises with the `features` command to run if the store lacks the input of some K/V layer (layer l needs the
    stored output of layer l-1; layer 0 reads the embedding)."""
    stored = store.manifest["layer_ids"]
    missing = sorted({i - 1 for i in kv_layer_ids if i > 0 and i - 1 not in stored})
    if missing:
        wanted = sorted(set(stored) | set(missing))
        raise ValueError(
            f"The drafter reads the KV cache of target layers {list(kv_layer_ids)}, recomputed from the stored outputs "
            f"of layers {sorted({i - 1 for i in kv_layer_ids if i > 0})}, but the feature store {store.path} holds "
            f"layers {stored} (missing {missing}). Build one with `dflash-retrace features --layers "
            f"{','.join(map(str, wanted))}` or train without --features (online K/V).")


def stored_target_kv(target, items, width: int, kv_layer_ids) -> list:
    """[(keys, values) (b, kvh, width, d)] per drafter layer for a micro-batch of `(index, StoredRef)`, recomputed
    from the stored layer inputs (right-padded with zeros; padding is never attended). Each row is read from its
    own store (a micro-batch may mix the stores of `open_stores`)."""
    embed = target.get_input_embeddings()
    device = embed.weight.device
    out = []
    for layer_id in kv_layer_ids:
        inputs = torch.zeros(len(items), width, embed.weight.shape[-1], dtype=embed.weight.dtype, device=device)
        for row, (_, ref) in enumerate(items):
            if layer_id == 0:
                h = embed(ref.input_ids.to(device))
            else:
                H = ref.store.manifest["hidden_size"]
                column = ref.store.manifest["layer_ids"].index(layer_id - 1) * H
                stored_h = np.ascontiguousarray(ref.store.field(ref.index, "features")[:, column : column + H])
                h = torch.from_numpy(stored_h).view(torch.bfloat16)
            inputs[row, : h.shape[0]] = h.to(device, inputs.dtype)
        out.append(recompute_layer_kv(target, layer_id, inputs))
    return out


__all__ = ["cached_kv", "check_store_kv_layers", "forward_cache", "recompute_layer_kv", "stored_target_kv"]
