"""Configuration of a DFlash (+ReTrace) drafter.

Part of the Hub payload: imports only torch, transformers and sibling modules, so that
`save_pretrained` can copy it next to the weights and `trust_remote_code` can load it.

Reads two layouts:
- ours (`model_type: "dflash_retrace"`, every field at the top level), and
- z-lab's (`model_type: "qwen3"`, `architectures: ["DFlashDraftModel"]`, `block_size` at the top
  level, `mask_token_id` / `target_layer_ids` nested in `dflash_config`).
Either way the fields transformers' built-in DFlash path reads (`block_size`, `mask_token_id`,
`target_layer_ids`) end up at the top level.
"""

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from .kv_dflash import CONTEXT_MODES

PROPOSAL_POLICIES = ("argmax", "sample")
FUSIONS = ("fc", "layerwise")  # fc: DFlash (one fused context); layerwise: DFlare (one context per drafter layer)
MAX_FUSION_LAYERS = 9  # DFlare's broad set: 9 target layers (stride 4 of a 36-layer Qwen3)

DEFAULT_BLOCK_SIZE = 16  # the published DFlash drafters' block size


def check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or not hasattr(block_size, "__index__") or block_size < 2:  # any integer type
        raise ValueError(
            f"block_size must be >= 2 (an int: one anchor and at least one proposal slot), got {block_size!r}."
        )
    return int(block_size)


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list:
    """DFlash's rule: `[L//2]` for one feature, else `round(1 + i*(L-4)/(n-1))` (L=36, n=5 -> [1, 9, 17, 25, 33])."""
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}.")
    if num_features == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    ids = [round(1 + i * span / (num_features - 1)) for i in range(num_features)]
    if not all(0 <= i < num_target_layers for i in ids):
        raise ValueError(
            f"DFlash's default rule gives target_layer_ids {ids} for {num_features} features of a {num_target_layers}-"
            f"layer target, outside its layers 0..{num_target_layers - 1}: pass target_layer_ids explicitly "
            f"(e.g. {list(range(min(num_features, num_target_layers)))}) or use fewer target features."
        )
    return ids


def default_fusion_layer_ids(num_target_layers: int) -> list:
    """DFlare's broad set, reconstructed: every s-th target layer counted back from the last, s = ceil(L / 9), so
    at most 9 layers (L=36 -> stride 4, [3, 7, ..., 35]; L=30 -> stride 4, [1, 5, ..., 29]; L=4 -> all four).
    A feature store holds 2*H bytes per layer per token, so the set is kept small rather than all L layers."""
    stride = -(-num_target_layers // MAX_FUSION_LAYERS)
    return list(range(num_target_layers - 1, -1, -stride))[::-1]


def check_option(name: str, value) -> None:
    """Raises for a value of an enumerated or bounded field that no drafter can run with."""
    if name == "proposal_policy" and value not in PROPOSAL_POLICIES:
        raise ValueError(
            f"proposal_policy must be {' or '.join(map(repr, PROPOSAL_POLICIES))}, got {value!r}: 'argmax' proposes "
            "each slot's most likely token (exact under rejection sampling), 'sample' draws each slot."
        )
    if name == "block_size":
        check_block_size(value)
    if name == "draft_vocab_context" and not isinstance(value, bool):
        raise ValueError(
            f"draft_vocab_context must be True or False, got {value!r}: True lets a generate() call propose the "
            "tokens of its context (prompt and committed tokens) that the draft vocabulary lacks."
        )
    if name == "step_embeddings" and not isinstance(value, bool):
        raise ValueError(
            f"step_embeddings must be True or False, got {value!r}: True adds PAD-Rec step-position embeddings "
            "(`steps.*` weights) to the proposal slots."
        )
    if name == "context" and value not in CONTEXT_MODES:
        raise ValueError(
            f"context must be {' or '.join(map(repr, CONTEXT_MODES))}, got {value!r}: 'hidden' attends to the fused "
            "target hidden states (DFlash), 'kv' to the target's KV cache instead, 'hybrid' to both (KVShot).")
    if name == "kv_layer_ids" and value is not None and (
        isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")
        or not all(hasattr(i, "__index__") and not isinstance(i, bool) and i >= 0 for i in value)
    ):
        raise ValueError(f"kv_layer_ids must be a list of target decoder layer ids (ints >= 0) or None for the "
                         f"default, got {value!r}: e.g. kv_layer_ids=[2, 3] for a 2-layer drafter.")
    if name == "fusion" and value not in FUSIONS:
        raise ValueError(
            f"fusion must be {' or '.join(map(repr, FUSIONS))}, got {value!r}: 'fc' feeds every drafter layer the one "
            "fused context of target_layer_ids (DFlash), 'layerwise' gives each drafter layer its own mix of "
            "fusion_layer_ids (DFlare)."
        )
    if name == "fusion_layer_ids" and value is not None:
        ids = list(value) if isinstance(value, (list, tuple)) else None
        bad = not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)
        if bad or len(set(ids)) < len(ids):
            raise ValueError(
                f"fusion_layer_ids must be a non-empty list of distinct target decoder layer ids (ints >= 0), got "
                f"{value!r}: e.g. [1, 5, 9, 13] (or None: every ceil(L/9)-th target layer, the last included)."
            )
    if name == "max_proposals" and value is not None and (
        isinstance(value, bool) or not hasattr(value, "__index__") or value < 1
    ):
        raise ValueError(
            f"max_proposals must be an int >= 1 (at most block_size - 1) or None for every slot of the block, got "
            f"{value!r}: e.g. max_proposals=3 verifies at most 3 proposals per round."
        )
    if name == "proposal_threshold" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"proposal_threshold must be a number in [0, 1), got {value!r}: a round stops proposing before the first "
            "slot whose proposal has a drafter probability below it; 0 proposes every slot."
        )
    if name == "lookup_threshold" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0
    ):
        raise ValueError(
            f"lookup_threshold must be a number in [0, 1], got {value!r}: from the first slot whose drafter top "
            "probability is below it, a round proposes the context's own continuation (see lookup_dflash); 0 is off."
        )
    if name == "hidden_act" and value not in ACT2FN:
        raise ValueError(f"hidden_act={value!r} is not an activation transformers knows (e.g. 'silu', 'gelu').")


def check_variant_combination(fusion: str, context: str) -> None:
    """Raises for drafter variants that cannot work together (checked when a drafter is built or changed)."""
    if fusion == "layerwise" and context == "kv":
        raise ValueError(
            "fusion='layerwise' feeds each drafter layer's attention its own mix of target layers, but context='kv' "
            "replaces that attention's context with the target's KV cache, so the fusion weights would never be "
            "used: choose context='hybrid' (both) or 'hidden', or fusion='fc'."
        )


class DFlashConfig(PretrainedConfig):
    r"""
    Args:
        block_size (`int`, defaults to 16):
            Tokens per drafter call: one anchor + `block_size - 1` proposal slots. Must match training.
        mask_token_id (`int`):
            Id whose row of the *target's* input embedding fills the proposal slots.
        target_layer_ids (`list[int]`):
            Target decoder layers whose outputs (`hidden_states[i + 1]`) form the context features.
        num_target_layers (`int`):
            Decoder layers of the target the drafter was built for (checked at generate time).
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim, rms_norm_eps, rope_theta, max_position_embeddings, attention_bias, hidden_act:
            Shape of the drafter's Qwen3-style decoder layers; `hidden_size` equals the target's.
        vocab_size (`int`):
            The target's vocabulary size (the drafter borrows its embedding and LM head).
        retrace (`bool`, defaults to `False`):
            Adds the ReTrace conditioner (`retrace.*` weights), which feeds the previous round's
            rejected suffix into the next block.
        step_embeddings (`bool`, defaults to `False`):
            Adds PAD-Rec step-position embeddings (`steps.*` weights; see `steps_dflash`): a zero-initialised
            embedding per proposal slot, scaled by a gate read from the context at the last committed position.
        retrace_beta (`float`, defaults to 1.0):
            Scale of the ReTrace correction term at inference.
        proposal_policy (`str`, defaults to `"argmax"`):
            How proposals are drawn when the target samples: `"argmax"` (a point-mass proposal, exact
            under rejection sampling) or `"sample"` (each slot drawn from its own distribution).
            Greedy decoding always uses argmax.
        max_proposals (`int`, optional):
            At most this many proposals per round (1..`block_size - 1`; default: all `block_size - 1`). The
            drafter still runs the whole block; only the first `max_proposals` go to the target, which costs less
            to verify where a verify's cost grows with its length (CPUs, fp32). Output is unchanged (lossless).
        proposal_threshold (`float`, defaults to 0.0):
            Adaptive block length: a round proposes slots 1, 2, ... and stops before the first slot whose proposal
            has a probability below this value under the drafter's own distribution (before the target's
            temperature / top-k / top-p); a round whose first proposal is already unsure proposes nothing and the
            target takes a plain step. 0 proposes every slot. Verification is unchanged, so greedy and sampled
            output stay exact.
        lookup_threshold (`float`, defaults to 0.0):
            Context lookup (see `lookup_dflash`): from the first slot whose drafter distribution has its top
            probability below this value, a round proposes the tokens that followed the latest earlier occurrence of
            the block's last 3 (else 2) tokens in the context (prompt, output so far, the proposals kept), where
            there is one; elsewhere the drafter's proposals. 0 is off. Cannot be combined with
            `proposal_threshold`. Verification is unchanged, so greedy and sampled output stay exact.
        context (`str`, defaults to `"hidden"`):
            What the drafter's layers attend to (KVShot, see `kv_dflash`): `"hidden"` the fused target hidden
            states (DFlash), `"kv"` the target's KV cache of `kv_layer_ids` instead, `"hybrid"` both (the KV part
            through zero-initialised `layers.*.self_attn.kv.*` weights).
        kv_layer_ids (`list[int]`, optional):
            Target decoder layer whose KV cache each drafter layer reads (one per drafter layer; kv/hybrid only).
            Default: evenly spaced over the target's upper half, ending at its last layer.
        input_embedding_scale (`float`, defaults to 1.0):
            Multiplies the raw target embedding rows fed to the block (z-lab convention).
        output_multiplier (`float`, defaults to 1.0), final_logit_softcapping (`float`, optional):
            Applied to drafter logits after the target's LM head (z-lab convention).
        fusion (`str`, defaults to `"fc"`):
            `"fc"`: DFlash, every drafter layer reads one fused context (`fc` + `hidden_norm` of the
            `target_layer_ids` features). `"layerwise"`: DFlare-style (our reconstruction, see
            `fusion_dflash`), each drafter layer adds its own learned mix of `fusion_layer_ids` to that context
            (`fusion.*` weights, zero-initialised: starts as the DFlash drafter exactly).
        fusion_layer_ids (`list[int]`, optional):
            The broad set of target layers mixed per drafter layer (`fusion="layerwise"` only). Default: every
            ceil(L/9)-th target layer counted back from the last (at most 9). See `feature_layer_ids`.
        draft_vocab_size (`int`, optional):
            Size of the draft vocabulary (FR-Spec / EAGLE-3): the drafter's head is the rows
            `draft_to_target` (a saved index) of the target's LM head, and its logits are placed in the full
            vocabulary with -inf elsewhere, so verification is unchanged. `None`: the full vocabulary.
        draft_vocab_context (`bool`, defaults to `True`):
            With a draft vocabulary: each `generate()` call also proposes from every token of its context (the
            prompt and each token committed since) outside `draft_to_target`, as more rows of the target's head
            (no weights; see `vocab_dflash`). Exact either way; without a draft vocabulary it changes nothing.
            `False`: only the saved vocabulary (drafters saved before the option get `True` when loaded unless
            their config.json says otherwise).
    """

    model_type = "dflash_retrace"

    def __init__(
        self,
        block_size: int | None = None,
        mask_token_id: int | None = None,
        target_layer_ids: list | None = None,
        num_target_layers: int | None = None,
        hidden_size: int = 4096,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1_000_000.0,
        max_position_embeddings: int = 40960,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        hidden_act: str = "silu",
        vocab_size: int = 151936,
        initializer_range: float = 0.02,
        retrace: bool = False,
        retrace_beta: float = 1.0,
        step_embeddings: bool = False,
        proposal_policy: str = "argmax",
        max_proposals: int | None = None,
        proposal_threshold: float = 0.0,
        lookup_threshold: float = 0.0,
        input_embedding_scale: float | None = None,
        output_multiplier: float | None = None,
        final_logit_softcapping: float | None = None,
        draft_vocab_size: int | None = None,
        draft_vocab_context: bool = True,
        context: str = "hidden",
        kv_layer_ids: list | None = None,
        fusion: str = "fc",
        fusion_layer_ids: list | None = None,
        dflash_config: dict | None = None,
        **kwargs,
    ):
        # z-lab's layout nests these in `dflash_config`; a top-level value (our layout, or a user's edit) wins.
        nested = dict(dflash_config or {})

        def pick(value, name, default=None):
            return value if value is not None else nested.get(name, default)

        mask_token_id = pick(mask_token_id, "mask_token_id")
        target_layer_ids = pick(target_layer_ids, "target_layer_ids")
        block_size = pick(block_size, "block_size", DEFAULT_BLOCK_SIZE)
        input_embedding_scale = pick(input_embedding_scale, "input_embedding_scale", 1.0)
        output_multiplier = pick(output_multiplier, "output_multiplier", 1.0)
        final_logit_softcapping = pick(final_logit_softcapping, "final_logit_softcapping")

        rope_theta = _pop_qwen3_layout(kwargs, rope_theta)

        self.block_size = block_size  # checked, as every option, by __setattr__
        self.mask_token_id = mask_token_id
        self.num_target_layers = num_target_layers
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.hidden_act = hidden_act
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.retrace, self.retrace_beta = bool(retrace), float(retrace_beta)
        self.step_embeddings = step_embeddings
        self.proposal_policy, self.max_proposals = proposal_policy, max_proposals  # each checked by __setattr__
        self.proposal_threshold, self.lookup_threshold = proposal_threshold, lookup_threshold
        self.input_embedding_scale = float(input_embedding_scale)
        self.output_multiplier = float(output_multiplier)
        self.final_logit_softcapping = final_logit_softcapping
        self._set_readers(target_layer_ids, (draft_vocab_size, draft_vocab_context), context, kv_layer_ids, fusion, fusion_layer_ids)
        super().__init__(**kwargs)

    def _set_readers(self, target_layer_ids, draft_vocab, context, kv_layer_ids, fusion, fusion_layer_ids):
        """What the drafter reads and proposes over: target layers (DFlash's default rule when None), the draft
        vocabulary (`draft_vocab`: its size and `draft_vocab_context`) and the variant fields (KVShot context,
        DFlare fusion); every assignment is checked by __setattr__."""
        draft_vocab_size, self.draft_vocab_context = draft_vocab
        if draft_vocab_size is not None and not 0 < int(draft_vocab_size) <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..vocab_size ({self.vocab_size}), got {draft_vocab_size}.")
        self.draft_vocab_size = None if draft_vocab_size is None else int(draft_vocab_size)
        if target_layer_ids is None and self.num_target_layers is not None:
            target_layer_ids = default_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else None
        self.context = context
        self.kv_layer_ids = [int(i) for i in kv_layer_ids] if kv_layer_ids is not None else None
        self.fusion, self.fusion_layer_ids = fusion, None if fusion_layer_ids is None else list(fusion_layer_ids)
        if fusion == "layerwise" and fusion_layer_ids is None and self.num_target_layers is not None:
            self.fusion_layer_ids = default_fusion_layer_ids(self.num_target_layers)

    @property
    def feature_layer_ids(self) -> list:
        """The one ordered list of target layers the drafter reads: `target_layer_ids`, then (layerwise fusion)
        the `fusion_layer_ids` not already in it. Context features are `hidden_states[i + 1]` of these, concatenated."""
        ids = list(self.target_layer_ids or [])
        if self.fusion != "layerwise":
            return ids
        return ids + [i for i in self.fusion_layer_ids or [] if i not in ids]

    def __setattr__(self, key, value):
        # Every assignment is checked: in __init__, by from_pretrained(..., proposal_policy=...) (which sets
        # attributes after construction) and by `drafter.config.proposal_policy = ...` after loading.
        check_option(key, value)
        super().__setattr__(key, value)

    def to_dict(self) -> dict:
        out = super().to_dict()
        # Written from the live values so a z-lab reader of our config.json finds what it expects.
        out["dflash_config"] = {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}
        return out

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        if config_dict.get("dflash_config") is not None and config_dict.get("model_type") != cls.model_type:
            config_dict = {**config_dict, "model_type": cls.model_type}  # z-lab layout: read as ours
        return config_dict, kwargs


def _pop_qwen3_layout(kwargs: dict, rope_theta: float) -> float:
    """Removes the Qwen3 fields a DFlash drafter does not use from `kwargs`, refusing values it cannot honour;
    returns the RoPE theta."""
    # transformers 5 configs carry RoPE in `rope_parameters`; older ones in `rope_theta` / `rope_scaling`.
    rope_parameters = kwargs.pop("rope_parameters", None) or {}
    rope_scaling = kwargs.pop("rope_scaling", None) or {}
    rope_type = rope_parameters.get("rope_type", rope_scaling.get("rope_type", rope_scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(
            f"DFlash drafters support the default RoPE only, this config asks for rope_type={rope_type!r}. "
            "Drop `rope_scaling` / set `rope_parameters={'rope_type': 'default', 'rope_theta': ...}` in config.json."
        )
    layer_types = kwargs.pop("layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"DFlash drafters use full (bidirectional) attention in every layer; got layer_types={layer_types}. "
            "Set `use_sliding_window: false` and remove `layer_types` from config.json."
        )
    for unused in ("use_sliding_window", "sliding_window", "max_window_layers", "use_cache"):
        kwargs.pop(unused, None)
    return float(rope_parameters.get("rope_theta", rope_theta))


__all__ = [
    "CONTEXT_MODES", "DEFAULT_BLOCK_SIZE", "DFlashConfig", "FUSIONS", "PROPOSAL_POLICIES", "check_block_size",
    "check_option", "check_variant_combination", "default_fusion_layer_ids", "default_target_layer_ids",
]
