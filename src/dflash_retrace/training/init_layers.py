"""Layer initialisation: `--init-layers target-top` (a fresh drafter's decoder layers start as copies of the target's top
layers) and `--add-layers N` (an --init drafter grows by N layers that start as the identity, `add_top_layers`).

A DFlash layer is a target decoder layer whose keys and values also read the fused target context, so a target
layer's attention and MLP weights fit it tensor for tensor when the drafter has the target's width and head
layout (`DFlashDrafter.from_target` gives it exactly that). Drafter layer i gets target layer L-n+i (the last n),
and the drafter's final norm the target's. Tensors the target layer does not have stay as initialised (q/k norms of
a Llama target: ones, the identity scale; KVShot / fusion weights). The fc projection of the context has no
counterpart and stays random: the copy is a starting point for training, not a working drafter.
"""

from __future__ import annotations

import torch

__all__ = ["INIT_LAYERS", "add_top_layers", "copy_target_layers"]

INIT_LAYERS = ("random", "target-top")
_REQUIRED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def _decoder(target):
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"--init-layers target-top copies the target's decoder layers, but "
                         f"{type(target).__name__} exposes no `get_decoder().layers`: use --init-layers random.")
    return decoder, layers


@torch.no_grad()
def copy_target_layers(drafter, target) -> dict:
    """Copies the target's last `num_hidden_layers` decoder layers (and its final norm) into `drafter` in place.

    Returns what was copied: `{"target_layers": [...], "copied": n_tensors, "kept": [names left as initialised]}`.
    Raises if a tensor both have differs in shape, or if the target's layers lack the attention/MLP projections."""
    decoder, layers = _decoder(target)
    n = len(drafter.layers)
    if n > len(layers):
        raise ValueError(f"--init-layers target-top: the drafter has {n} layers, the target only {len(layers)}.")
    sources = list(range(len(layers) - n, len(layers)))
    copied, kept = 0, set()
    for mine, src in zip(drafter.layers, sources):
        theirs = layers[src].state_dict()
        missing = [name for name in _REQUIRED if name not in theirs]
        if missing:
            raise ValueError(f"--init-layers target-top: target layer {src} ({type(layers[src]).__name__}) has no "
                             f"{missing}; its layout differs from a DFlash layer's: use --init-layers random.")
        for name, param in mine.state_dict(keep_vars=True).items():
            if name not in theirs:
                kept.add(name)
                continue
            if theirs[name].shape != param.shape:
                raise ValueError(f"--init-layers target-top: {name} is {tuple(param.shape)} in the drafter and "
                                 f"{tuple(theirs[name].shape)} in target layer {src}: the drafter must have the "
                                 "target's width and head layout (a fresh drafter from `train` has).")
            param.copy_(theirs[name].to(param.dtype))
            copied += 1
    norm = getattr(decoder, "norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == drafter.norm.weight.shape:
        drafter.norm.weight.copy_(norm.weight.to(drafter.norm.weight.dtype))
        copied += 1
    return {"target_layers": sources, "copied": copied, "kept": sorted(kept)}


@torch.no_grad()
def add_top_layers(drafter, n: int) -> int:
    """Adds `n` decoder layers on top of `drafter`, in place; returns its new layer count.

    Each new layer is a copy of the current top layer with its two residual outputs (attention `o_proj`, MLP
    `down_proj`) set to zero: it adds nothing to the residual stream, so the grown drafter computes exactly what the
    drafter computed, and training opens the layer through those two matrices (as ReTrace's gated residual opens).
    Only a plain DFlash drafter grows: per-layer KVShot ids, layer-wise fusion mixes and a ReTrace conditioner were
    trained for the layers they have."""
    from ..layers_dflash import DFlashDecoderLayer

    cfg = drafter.config
    reasons = [why for bad, why in ((cfg.context != "hidden", f"its context is {cfg.context!r} (per-layer target KV)"),
                                    (drafter.fusion is not None, "it has layer-wise fusion weights (one mix per layer)"),
                                    (drafter.retrace is not None, "it has a ReTrace conditioner")) if bad]
    if reasons:
        raise ValueError(f"--add-layers grows a plain DFlash drafter, and this one cannot grow: {'; '.join(reasons)}. "
                         "Grow its DFlash backbone first, then add the option.")
    if n < 1:
        raise ValueError(f"--add-layers adds at least one layer, got {n}.")
    top = drafter.layers[-1]
    param = next(top.parameters())
    for _ in range(n):
        layer = DFlashDecoderLayer(cfg, len(drafter.layers)).to(device=param.device, dtype=param.dtype)
        layer.load_state_dict(top.state_dict())
        for output in (layer.self_attn.o_proj, layer.mlp.down_proj):
            for tensor in output.parameters():  # weight, and bias where it has one
                tensor.zero_()
        drafter.layers.append(layer)
    cfg.num_hidden_layers = len(drafter.layers)
    return cfg.num_hidden_layers
