"""DFlash block-diffusion drafter with the optional ReTrace conditioner.

Part of the Hub payload: imports only torch, transformers and sibling modules.

The drafter is a stack of Qwen3-style decoder layers at the target's hidden size, with no embedding
and no LM head of its own. One forward denoises a block `[anchor, MASK x K]`:
- context features: target hidden states of `target_layer_ids`, concatenated, `fc`, `hidden_norm`; with
  `fusion="layerwise"` each layer adds its own mix of `fusion_layer_ids` to that context (`fusion_dflash`);
- every layer projects the context with its own `k_proj`/`v_proj` and prepends it to the block's
  keys/values; queries come from the block only; nothing is causal;
- output: final `norm`; logits come from the target's LM head (see `DFlashDrafter.compute_logits`).
Checkpoint keys follow z-lab's `DFlashDraftModel` so its checkpoints load unchanged.

`forward` is pure: it reads tensors, updates the cache it is given, and returns states. Sampling,
cache cropping, ReTrace memory and statistics live in `generation_dflash`.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast

from .configuration_dflash import (
    DEFAULT_BLOCK_SIZE,
    DFlashConfig,
    check_variant_combination,
    default_target_layer_ids,
)
from .fusion_dflash import LayerwiseFusion, resolve_fusion_layer_ids
from .dispatch_dflash import _check_generation_config, _check_single_sequence, install_dispatch
from .generation_dflash import (
    DFlashCandidateGenerator,
    DFlashContextCache,
    DFlashStats,
    ReTraceMemory,
)
from .layers_dflash import (  # noqa: F401  (re-exported: the building blocks were defined here before)
    ATTENTION_FUNCTIONS,
    DFlashAttention,
    DFlashDecoderLayer,
    DFlashMLP,
    DFlashRMSNorm,
    DFlashRotaryEmbedding,
    ReTraceConditioner,
    eager_attention,
    rotate_half,
    sdpa_attention,
)
from .steps_dflash import StepEmbeddings
from .kv_dflash import TargetKVAttention, check_kv_target, check_target_kv, resolve_kv_layer_ids
from .vocab_dflash import DraftHeadMixin, _linear_rows

try:  # transformers >= 5: init functions that skip weights already loaded from a checkpoint
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init


class DFlashPreTrainedModel(PreTrainedModel):
    config_class = DFlashConfig
    base_model_prefix = ""
    supports_gradient_checkpointing = False
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = True
    _supports_attention_backend = True
    main_input_name = "noise_embeds"

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, StepEmbeddings):  # E = 0: starts as plain DFlash (its gate is a Linear, below)
            init.zeros_(module.table)
        elif isinstance(module, nn.Linear):
            if getattr(module, "_zero_init", False):  # ReTrace W_v, hybrid kv.o_proj, fusion projections: start as DFlash
                init.zeros_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, DFlashRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, LayerwiseFusion):
            module.init_mix_logits(init)


class DFlashDrafter(DraftHeadMixin, DFlashPreTrainedModel):
    """DFlash drafter (optionally with ReTrace) usable as `target.generate(..., assistant_model=drafter)`."""

    # Marker read by the generate() dispatch: an attribute, not a class check, because a class loaded
    # through trust_remote_code is a different class object from the library's.
    _is_dflash_drafter = True

    def __init__(self, config: DFlashConfig):
        super().__init__(config)
        if not config.target_layer_ids:
            raise ValueError(
                "DFlashConfig needs `target_layer_ids` (or `num_target_layers` to derive them). "
                "Build a fresh drafter with `DFlashDrafter.from_target(target, ...)`."
            )
        resolve_kv_layer_ids(config)
        resolve_fusion_layer_ids(config)
        check_variant_combination(config.fusion, config.context)
        self.layers = nn.ModuleList([DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DFlashRotaryEmbedding(config)
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.retrace = ReTraceConditioner(config) if config.retrace else None
        self.steps = StepEmbeddings(config) if config.step_embeddings else None  # PAD-Rec (reconstruction)
        self.fusion = LayerwiseFusion(config) if config.fusion == "layerwise" else None
        # Draft vocabulary: target ids of the head rows (saved with the weights); None = the full vocabulary.
        self.register_buffer("draft_to_target", None if config.draft_vocab_size is None else
                             torch.arange(config.draft_vocab_size, dtype=torch.long))
        self.last_stats: DFlashStats | None = None
        self.post_init()

    def __getattr__(self, name):
        if name == "generation_config":
            # transformers' generic assisted path reads it: the generate() dispatch is not in the way.
            raise AttributeError(
                f"{type(self).__name__} has no generation_config: it is a DFlash drafter, not an ordinary assistant "
                "model, and generate(assistant_model=drafter) reached transformers' generic assisted path because the "
                "dflash-retrace generate() dispatch is disabled (inside `no_dispatch()`) or uninstalled "
                "(`uninstall_dispatch()`). Reinstall it (`dflash_retrace.install_dispatch()`, or leave the "
                "`no_dispatch()` block) for DFlash(+ReTrace), or pass speculation_type=\"dflash\" for transformers' "
                "built-in plain DFlash."
            )
        return super().__getattr__(name)

    # ----------------------------------------------------------------------------------- build
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' loader, except that a checkpoint which does not fill the model exactly is an error.

        Missing, unexpected or mismatched drafter weights mean the config disagrees with the checkpoint (a
        missing `num_hidden_layers`, `target_layer_ids` of another length, ...); the error names the keys and
        the config value. Only the weights of options that start zero-initialised may be missing altogether:
        `retrace=True`, `step_embeddings=True`, `context="hybrid"` or `fusion="layerwise"` on a DFlash checkpoint
        adds them.
        """
        wants_info = kwargs.pop("output_loading_info", False)
        kwargs["ignore_mismatched_sizes"] = True  # report mismatches below, with the config value that disagrees
        model, info = super().from_pretrained(pretrained_model_name_or_path, *model_args, output_loading_info=True,
                                              **kwargs)
        check_loaded_weights(model, info, pretrained_model_name_or_path)
        return (model, info) if wants_info else model

    @classmethod
    def from_target(
        cls,
        target: PreTrainedModel,
        num_hidden_layers: int = 1,
        block_size: int = DEFAULT_BLOCK_SIZE,
        retrace: bool = False,
        mask_token_id: int | None = None,
        num_target_features: int | None = None,
        target_layer_ids: list | None = None,
        **config_overrides,
    ) -> "DFlashDrafter":
        """A freshly initialised drafter sized for `target` (same hidden size, head layout and vocabulary).

        `target_layer_ids` defaults to DFlash's rule with one feature per drafter layer (as the published
        drafters); `mask_token_id` defaults to the last row of the target's input embedding.
        """
        tc = target.config.get_text_config()
        num_target_layers = tc.num_hidden_layers
        if target_layer_ids is None and num_target_features is not None:  # else the config's default
            target_layer_ids = default_target_layer_ids(num_target_layers, num_target_features)
        if mask_token_id is None:
            mask_token_id = target.get_input_embeddings().weight.shape[0] - 1
        rope = getattr(tc, "rope_parameters", None) or {}
        fields = dict(
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=target_layer_ids,
            num_target_layers=num_target_layers,
            hidden_size=tc.hidden_size,
            intermediate_size=tc.intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 1_000_000.0))),
            max_position_embeddings=getattr(tc, "max_position_embeddings", 40960),
            vocab_size=tc.vocab_size,
            retrace=retrace,
            eos_token_id=getattr(tc, "eos_token_id", None),
        )
        fields.update(config_overrides)
        drafter = cls(DFlashConfig(**fields))
        param = next(target.parameters())
        return drafter.to(device=param.device, dtype=param.dtype)

    def add_retrace(self) -> "DFlashDrafter":
        """Adds zero-initialised ReTrace weights in place (the drafter then behaves exactly as before)."""
        if self.retrace is None:
            self.config.retrace = True
            param = self.fc.weight
            self.retrace = ReTraceConditioner(self.config).to(device=param.device, dtype=param.dtype)
            for module in self.retrace.children():
                self._init_weights(module)
        return self

    def add_step_embeddings(self) -> "DFlashDrafter":
        """Adds zero-initialised step-position embeddings in place (the drafter then behaves exactly as before)."""
        if self.steps is None:
            self.config.step_embeddings = True
            param = self.fc.weight
            self.steps = StepEmbeddings(self.config).to(device=param.device, dtype=param.dtype)
            self.steps.apply(self._init_weights)
        return self

    def set_context(self, context: str, kv_layer_ids: list | None = None) -> "DFlashDrafter":
        """Switches what the layers attend to (KVShot, see `kv_dflash`) in place. "hybrid" adds zero-initialised
        `layers.*.self_attn.kv.*` weights (the drafter then drafts exactly as before); "kv" adds none but does NOT
        draft as before (its keys now come from the target): train it."""
        check_variant_combination(self.config.fusion, context)
        self.config.context = context
        self.config.kv_layer_ids = kv_layer_ids if kv_layer_ids is not None else self.config.kv_layer_ids
        resolve_kv_layer_ids(self.config)
        param = self.fc.weight
        for layer in self.layers:
            attn = layer.self_attn
            if context != "hybrid":
                attn.kv = None
            elif attn.kv is None:
                attn.kv = TargetKVAttention(self.config).to(device=param.device, dtype=param.dtype)
                self._init_weights(attn.kv.o_proj)
        return self

    def add_fusion(self, fusion_layer_ids: list | None = None) -> "DFlashDrafter":
        """Adds zero-initialised layer-wise fusion weights in place (the drafter then behaves exactly as before)."""
        if self.fusion is None:
            check_variant_combination("layerwise", self.config.context)
            self.config.fusion_layer_ids = None if fusion_layer_ids is None else list(fusion_layer_ids)
            self.config.fusion = "layerwise"
            resolve_fusion_layer_ids(self.config)
            param = self.fc.weight
            self.fusion = LayerwiseFusion(self.config).to(device=param.device, dtype=param.dtype)
            for module in self.fusion.modules():
                self._init_weights(module)
        elif fusion_layer_ids is not None and list(fusion_layer_ids) != self.config.fusion_layer_ids:
            raise ValueError(f"This drafter already mixes fusion_layer_ids={self.config.fusion_layer_ids}; its fusion "
                             f"weights do not fit {list(fusion_layer_ids)}.")
        return self

    # --------------------------------------------------------------------------------- forward
    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        retrace_memory: ReTraceMemory | None = None,
        target_kv: list | None = None,
        past_key_values=None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        r"""
        noise_embeds (b, q, H): target-embedding rows of the query stream (`[anchor, MASK x K]` per block).
        context_hidden_states (b, c, n*H): raw target features of the new context positions
            (`hidden_states[i + 1]` for i in `config.feature_layer_ids`, concatenated); may be empty.
        position_ids (b, c + q): absolute positions of the context, then of the query stream.
        attention_mask: None (everything visible), a 2D (b, kv) padding mask, or a 4D bool
            (b, 1, q, kv) mask with True = visible over [cached context, new context, queries].
        cache: anything with `update(key, value, layer_idx)` (a transformers `Cache` or
            `DFlashContextCache`); receives context and block keys/values, the caller crops the block.
            `past_key_values` is accepted as the pre-5.24 name of the same argument.
        retrace_memory: previous-round memory aligned to the query stream (ReTrace drafters only).
        target_kv: context="kv"/"hybrid" drafters only: per drafter layer, the (keys, values) (b, kvh, T, d) that target
            layer `kv_layer_ids[d]` cached for the T context positions (RoPE applied by the target). In "kv" mode the
            keys are [target_kv ; block] and `attention_mask` spans them (T + q); in "hybrid" its first T columns
            mask the target part.
        Returns `last_hidden_state` (b, q, H) after the final norm, in the dtype of `noise_embeds`: transformers'
        built-in DFlash path embeds with the target and applies the target's LM head to it directly.
        """
        cache = cache if cache is not None else past_key_values
        check_target_kv(self.config, target_kv)
        if (self.config.context == "hybrid") != (self.layers[0].self_attn.kv is not None):
            raise ValueError(f"config.context={self.config.context!r} was set without the weights it needs: use "
                             "`drafter.set_context(...)` (or from_pretrained(..., context=...)).")
        bsz, q_len, hidden = noise_embeds.shape
        # DFlash's fused context (b, c, H), and one context per layer (the same tensor unless fusion="layerwise")
        context, contexts = self._layer_contexts(context_hidden_states, noise_embeds)
        ctx_len = context.shape[1]
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + ctx_len + q_len, device=noise_embeds.device)[None]
        hidden_states = noise_embeds.to(self.fc.weight.dtype)
        if self.steps is not None:  # step embeddings (gate read from the fused context), then ReTrace
            hidden_states = self.steps(hidden_states, context, position_ids, self.config.block_size)
        if retrace_memory is not None:
            if self.retrace is None:
                raise ValueError("retrace_memory was given but this drafter has no ReTrace weights (config.retrace=False).")
            hidden_states = self.retrace(hidden_states, retrace_memory, self.config.retrace_beta)

        mask = _as_bool_mask(attention_mask, q_len)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for i, (layer, layer_context) in enumerate(zip(self.layers, contexts)):
            layer_kv = None if target_kv is None else target_kv[i]
            hidden_states = layer(hidden_states, layer_context, position_embeddings, mask, cache, layer_kv)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states).to(noise_embeds.dtype))

    # ------------------------------------------------------------------------------ helpers
    def _layer_contexts(self, features, noise_embeds) -> tuple:
        """(b, c, n*H) raw features -> (DFlash's fused context `hidden_norm(fc(.))` of the `target_layer_ids`
        columns, one context per drafter layer: that one plus the layer's own fusion term with `fusion="layerwise"`)."""
        dtype, hidden = self.fc.weight.dtype, self.config.hidden_size
        width = len(self.config.feature_layer_ids) * hidden
        if features is None:
            features = noise_embeds.new_zeros(noise_embeds.shape[0], 0, width)
        if features.shape[-1] != width:
            builtin = self.fusion is not None and features.shape[-1] == self.fc.in_features
            raise ValueError(
                f"context_hidden_states has {features.shape[-1]} features per position, but this drafter reads "
                f"{width} (hidden states of target layers {self.config.feature_layer_ids}, concatenated). "
                + ("Its layer-wise fusion also reads fusion_layer_ids, which transformers' built-in DFlash path "
                   "(speculation_type='dflash') does not pass: use `generate(assistant_model=drafter)` without "
                   "speculation_type." if builtin else "Compute them with `drafter.context_features(hidden_states)`.")
            )
        features = features.to(dtype)
        # a strided slice when the features hold fusion layers too
        context = self.hidden_norm(_linear_rows(self.fc, features[..., : self.fc.in_features]))  # (b, c, H)
        if self.fusion is None:
            return context, [context] * len(self.layers)
        return context, self.fusion(features, context)

    def context_features(self, hidden_states, num_positions: int | None = None) -> torch.Tensor:
        """(b, c, n*H) raw context features from a target forward's `hidden_states` (see `context_features`)."""
        return context_features(hidden_states, self.config.feature_layer_ids, num_positions)

    def embed_block(self, target_embeddings: nn.Module, token_ids: torch.LongTensor) -> torch.Tensor:
        """Raw rows of the target's embedding table (no embedding-side scaling), times `input_embedding_scale`."""
        weight = target_embeddings.weight
        embeds = F.embedding(token_ids.to(weight.device), weight)
        if self.config.input_embedding_scale != 1.0:
            embeds = embeds * self.config.input_embedding_scale
        return embeds

    def check_target(self, target: PreTrainedModel) -> None:
        """Raises a ValueError with the fix if this drafter cannot serve `target`."""
        tc = target.config.get_text_config()
        cfg = self.config
        name = type(target).__name__
        if cfg.hidden_size != tc.hidden_size:
            raise ValueError(
                f"Drafter hidden_size={cfg.hidden_size} does not match the target's ({name}) hidden_size={tc.hidden_size}. "
                "A DFlash drafter works at its target's width: load the drafter trained for this target, or build one "
                "with `DFlashDrafter.from_target(target)`."
            )
        num_rows = target.get_input_embeddings().weight.shape[0]
        if cfg.vocab_size != tc.vocab_size:
            raise ValueError(
                f"Drafter vocab_size={cfg.vocab_size} does not match the target's ({name}) vocab_size={tc.vocab_size}. "
                "The drafter reuses the target's embedding and LM head, so it needs the same tokenizer and vocabulary."
            )
        if cfg.num_target_layers is not None and cfg.num_target_layers != tc.num_hidden_layers:
            raise ValueError(
                f"Drafter was built for a target with num_target_layers={cfg.num_target_layers}, but {name} has "
                f"{tc.num_hidden_layers} decoder layers. Use the drafter trained for this target (or, if you know the "
                "features are right, set `drafter.config.num_target_layers` to match)."
            )
        for field in ("target_layer_ids", "fusion_layer_ids") if cfg.fusion == "layerwise" else ("target_layer_ids",):
            ids = getattr(cfg, field)
            bad = [i for i in ids if not 0 <= i < tc.num_hidden_layers]
            if bad:
                raise ValueError(
                    f"{field} {ids} has ids {bad} outside the target's decoder layers 0..{tc.num_hidden_layers - 1}. "
                    f"Fix `{field}` in the drafter config."
                )
        if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < num_rows:
            raise ValueError(
                f"mask_token_id={cfg.mask_token_id} is not a row of the target's input embedding (0..{num_rows - 1}). "
                "Set `drafter.config.mask_token_id` to a token id of the target's vocabulary (DFlash Qwen3 drafters use 151669)."
            )
        check_kv_target(cfg, tc, name)
        head_rows = target.get_output_embeddings().weight.shape[0]
        if self.draft_to_target is not None and int(self.draft_to_target.max()) >= head_rows:
            raise ValueError(
                f"The draft vocabulary (`draft_to_target`) holds token ids up to {int(self.draft_to_target.max())}, but "
                f"the target's LM head has {head_rows} rows. Use the drafter trained for this target's tokenizer."
            )

    def check_generation(self, generation_config, input_ids: torch.Tensor | None = None) -> None:
        """Raises a ValueError with the fix if `generate()` asks for what a DFlash drafter cannot run with
        (beam search, several sequences, another speculation method in the same call)."""
        _check_generation_config(generation_config, self)
        if input_ids is not None:
            _check_single_sequence(input_ids)

    def make_candidate_generator(self, target, generation_config, logits_processor, model_kwargs,
                                 stopping_criteria=None):
        """Builds the candidate generator that travelled with this drafter's code (used by the generate() dispatch).

        `stopping_criteria`: the call's criteria; drafts are cut so that none fires inside a round.
        """
        return DFlashCandidateGenerator(
            drafter=self,
            target=target,
            generation_config=generation_config,
            logits_processor=logits_processor,
            model_kwargs=model_kwargs,
            stopping_criteria=stopping_criteria,
        )


def context_features(hidden_states, target_layer_ids, num_positions: int | None = None) -> torch.Tensor:
    """The drafter's context input: `hidden_states[i + 1]` (index 0 is the embedding output) for i in
    `target_layer_ids` (a drafter's `config.feature_layer_ids`), first `num_positions` positions (default: all),
    concatenated: (b, c, n*H).

    The one definition shared by the candidate generator and the training objective.
    """
    return torch.cat([hidden_states[i + 1][:, :num_positions] for i in target_layer_ids], dim=-1)


def check_loaded_weights(drafter, info: dict, source) -> None:
    """Raises a ValueError naming the keys and the config value when a checkpoint does not fill the drafter."""
    config, state = drafter.config, drafter.state_dict()
    missing, unexpected = set(info.get("missing_keys") or ()), set(info.get("unexpected_keys") or ())
    mismatched = {key: (tuple(ckpt), tuple(shape)) for key, ckpt, shape in info.get("mismatched_keys") or ()}
    # A DFlash checkpoint loaded with a variant on (retrace, steps, fusion, hybrid) misses its zero-initialised group.
    for group in ({k for k in state if k.startswith("retrace.")}, {k for k in state if k.startswith("steps.")},
                  {k for k in state if k.startswith("fusion.")}, {k for k in state if ".self_attn.kv." in k}):
        if group and group <= missing:
            missing -= group
    if not (missing or unexpected or mismatched):
        return
    layer = lambda k: int(k.split(".")[1])  # noqa: E731
    backbone = lambda keys: {k for k in keys if k.startswith("layers.") and ".self_attn.kv." not in k}  # noqa: E731
    owned = backbone(state)
    gone = {i for i in set(map(layer, owned)) if all(k in missing for k in owned if layer(k) == i)}  # whole layers
    extra = set(map(layer, backbone(unexpected))) - set(map(layer, owned))
    problems = []
    if gone or extra:
        n = min(gone) if gone else max(extra) + 1
        problems.append(
            f"config num_hidden_layers={config.num_hidden_layers} (1 when config.json has none) but the checkpoint "
            f"has {n} decoder layers (layers.0-{n - 1}.*): set \"num_hidden_layers\": {n} in config.json"
        )
    kv_extra = config.context != "hybrid" and any(".self_attn.kv." in k for k in unexpected)  # explained below
    part = lambda keys: sorted(k for k in keys if k.startswith("layers.") and layer(k) not in gone | extra  # noqa: E731
                               and not (kv_extra and ".self_attn.kv." in k))
    for keys, what in ((part(missing), "lacks"), (part(unexpected), "has extra")):
        if keys:
            problems.append(f"the checkpoint {what} weights of layers it has ({', '.join(keys[:6])}"
                            f"{' ...' if len(keys) > 6 else ''}): an incomplete or edited save (save the trained drafter "
                            "again), or config.json differs from it in attention_bias, head_dim or context")
    if "fc.weight" in mismatched and mismatched["fc.weight"][0][0] == mismatched["fc.weight"][1][0]:
        ckpt, shape = mismatched.pop("fc.weight")  # (H, n*H): only the number of target features differs
        problems.append(
            f"fc.weight in the checkpoint {list(ckpt)} takes {ckpt[1] // config.hidden_size} target features but "
            f"config target_layer_ids={config.target_layer_ids} ({len(config.target_layer_ids)} features; derived from "
            "num_target_layers when config.json has none) gives " + f"{list(shape)}: set target_layer_ids (z-lab "
            "layout: dflash_config.target_layer_ids) to the target layers the drafter was trained on"
        )
    if "draft_to_target" in missing | unexpected | set(mismatched):
        n = mismatched.pop("draft_to_target", (("the number of its ids",),))[0][0]
        problems.append("the checkpoint has no draft vocabulary (draft_to_target): remove draft_vocab_size="
                        f"{config.draft_vocab_size} from config.json" if "draft_to_target" in missing else
                        f"config draft_vocab_size={config.draft_vocab_size} but the checkpoint has a draft vocabulary "
                        f"(draft_to_target): set \"draft_vocab_size\": {n} in config.json")
    if any(k.startswith("retrace.") for k in unexpected) and not config.retrace:
        problems.append("the checkpoint has ReTrace weights (retrace.*) but config retrace=False: load it with "
                        "retrace=True (or set \"retrace\": true in config.json)")
    if any(k.startswith("steps.") for k in unexpected) and not config.step_embeddings:
        problems.append("the checkpoint has step-position embeddings (steps.*) but config step_embeddings=False: load "
                        "it with step_embeddings=True (or set \"step_embeddings\": true in config.json)")
    if kv_extra:
        problems.append("the checkpoint has hybrid target-KV weights (layers.*.self_attn.kv.*) but config "
                        f"context={config.context!r}: load it with context=\"hybrid\" (or set it in config.json)")
    if any(k.startswith("fusion.") for k in unexpected) and config.fusion != "layerwise":
        problems.append("the checkpoint has layer-wise fusion weights (fusion.*) but config fusion='fc': load it with "
                        "fusion='layerwise' and its fusion_layer_ids (or set them in config.json)")
    other = sorted(k for k in missing | unexpected if not k.startswith(("layers.", "retrace.", "steps.", "fusion.",
                                                                          "draft_to_target")))
    other += [f"{k} (checkpoint {list(a)} vs model {list(b)})" for k, (a, b) in sorted(mismatched.items())]
    other += sorted(k for k in missing if k.startswith(("retrace.", "steps.", "fusion.")))
    if other:
        problems.append(
            f"weights that do not fit: {', '.join(other[:8])}{' ...' if len(other) > 8 else ''}; check the shape "
            "fields of config.json (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, "
            "head_dim, retrace, step_embeddings, block_size, fusion_layer_ids) against the checkpoint"
        )
    raise ValueError(
        f"The checkpoint in {source} does not fill this DFlashDrafter: " + "; ".join(problems)
        + (f". Missing: {sorted(missing)[:6]}" if missing else "")
        + (f". Unexpected: {sorted(unexpected)[:6]}" if unexpected else "")
        + ("" if len(missing | unexpected) <= 6 else f" ({len(missing | unexpected)} keys in all)") + "."
    )


def _as_bool_mask(attention_mask, q_len):
    """None / 2D padding mask / 4D mask -> None or a 4D bool mask (b, 1, q, kv), True = visible.

    Anything that is not a tensor (a flex_attention BlockMask) passes through unchanged.
    """
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return attention_mask
    if attention_mask.dim() == 4:
        return attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :].expand(-1, 1, q_len, -1)


install_dispatch()

__all__ = ["DFlashDrafter", "DFlashPreTrainedModel", "DFlashContextCache", "ReTraceMemory", "ReTraceConditioner",
           "context_features"]

# save_pretrained writes `auto_map` and copies this module with its siblings next to the weights.
DFlashConfig.register_for_auto_class()
DFlashDrafter.register_for_auto_class("AutoModel")
