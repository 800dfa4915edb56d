"""Layer-wise fusion of target features (`fusion="layerwise"`), after DFlare.

Part of the Hub payload: imports only torch, transformers and sibling modules.

DFlash feeds every drafter layer the same context, `hidden_norm(fc(F))` of the `target_layer_ids` features F.
DFlare gives each drafter layer its own learned combination of a broad set of target layers. Only DFlare's
abstract is public; everything below is OUR RECONSTRUCTION, chosen so that the option starts as an exact copy
of a DFlash drafter:

    x_t   = F_t / rms(F_t)                                    t over fusion_layer_ids (T layers), parameter-free
    w_d   = softmax(a_d)                                      a_d (T,): init 0, plus 2.0 at t = int(d / D * T)
    c_d   = hidden_norm(fc(F)) + P_d(norm_d(sum_t w_d,t x_t)) drafter layer d of D; P_d: Linear(H -> H), init 0

- The per-layer term is a residual on DFlash's fused context rather than a replacement of `fc` (DFlare, as
  its summary describes it, drops `fc` and gives the context its own k/v projections): with P_d = 0 a DFlash
  checkpoint loaded with `fusion="layerwise"` drafts exactly as before (lossless and τ-identical at step 0),
  and training moves away from it.
- Each target layer is RMS-normalised before mixing: hidden-state scales grow by orders of magnitude with depth,
  and a softmax mix of raw states would be the deepest layer's.
- The broad set (`default_fusion_layer_ids`): every ceil(L/9)-th layer counted back from the last, at most 9
  (DFlare mentions 9 layers at stride 4 of a 36-layer target).
"""

import torch
from torch import nn

from .configuration_dflash import DFlashConfig, default_fusion_layer_ids
from .layers_dflash import DFlashRMSNorm

INITIAL_PREFERENCE = 2.0  # logit bonus of drafter layer d's "own" target layer at init


def resolve_fusion_layer_ids(config: DFlashConfig) -> None:
    """Fills `config.fusion_layer_ids` of a layer-wise config (the default broad set); raises if it cannot."""
    if config.fusion != "layerwise":
        if config.fusion_layer_ids is not None:
            raise ValueError(
                f"fusion_layer_ids={config.fusion_layer_ids} is read only with fusion='layerwise' (this config has "
                f"fusion={config.fusion!r}): set fusion='layerwise' or drop fusion_layer_ids."
            )
        return
    if config.fusion_layer_ids is None:
        if config.num_target_layers is None:
            raise ValueError(
                "fusion='layerwise' needs fusion_layer_ids, or num_target_layers to derive the default broad set: "
                "set one of them in the config (or build with `DFlashDrafter.from_target(target, fusion='layerwise')`)."
            )
        config.fusion_layer_ids = default_fusion_layer_ids(config.num_target_layers)


def initial_mix_logits(num_layers: int, num_fusion_layers: int) -> torch.Tensor:
    """(D, T) zeros plus INITIAL_PREFERENCE at t = int(d / D * T): shallow drafter layers start on shallow target
    layers, deep ones on deep target layers."""
    logits = torch.zeros(num_layers, num_fusion_layers)
    for d in range(num_layers):
        logits[d, int(d / num_layers * num_fusion_layers)] = INITIAL_PREFERENCE
    return logits


class LayerwiseFusion(nn.Module):
    """One context per drafter layer: DFlash's fused context plus that layer's own mix of the fusion layers."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        hidden, depth = config.hidden_size, config.num_hidden_layers
        self.num_fusion_layers = len(config.fusion_layer_ids)
        self.eps = config.rms_norm_eps
        # Positions of the fusion layers among `config.feature_layer_ids` (the columns of the context features).
        self.feature_index = [config.feature_layer_ids.index(i) for i in config.fusion_layer_ids]
        self.mix_logits = nn.Parameter(initial_mix_logits(depth, self.num_fusion_layers))  # (D, T)
        self.norms = nn.ModuleList([DFlashRMSNorm(hidden, eps=config.rms_norm_eps) for _ in range(depth)])
        self.projections = nn.ModuleList([nn.Linear(hidden, hidden, bias=False) for _ in range(depth)])
        for projection in self.projections:
            projection._zero_init = True  # read by _init_weights: the drafter starts as plain DFlash

    def init_mix_logits(self, init) -> None:
        """`init`: transformers' init functions (they skip tensors already loaded from a checkpoint)."""
        init.copy_(self.mix_logits, initial_mix_logits(*self.mix_logits.shape))

    def forward(self, features: torch.Tensor, context: torch.Tensor) -> list:
        """features (b, c, n*H): raw target features of `feature_layer_ids`; context (b, c, H): DFlash's fused
        context. Returns one (b, c, H) context per drafter layer."""
        bsz, length, _ = features.shape
        hidden = context.shape[-1]
        index = torch.tensor(self.feature_index, device=features.device)  # (not a buffer: meta loading skips those)
        layers = features.view(bsz, length, features.shape[-1] // hidden, hidden).index_select(2, index)  # (b, c, T, H)
        layers = layers.float()
        layers = layers * torch.rsqrt(layers.pow(2).mean(-1, keepdim=True) + self.eps)
        weights = torch.softmax(self.mix_logits.float(), dim=-1)  # (D, T)
        mixed = torch.einsum("bcth,dt->dbch", layers, weights).to(context.dtype)  # (D, b, c, H)
        return [context + proj(norm(mixed[d])) for d, (norm, proj) in enumerate(zip(self.norms, self.projections))]


__all__ = ["LayerwiseFusion", "initial_mix_logits", "resolve_fusion_layer_ids"]
