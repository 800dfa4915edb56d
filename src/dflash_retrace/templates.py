"""Drafter templates: the shapes of common targets and the drafter config each one gets.

Shared data: `dflash-retrace templates` writes them as folders (`hub_configs/templates/`), `train --init NAME`
starts from one, and `gpu-check` builds its Qwen3-8B-shaped models from the `qwen3-8b` entry.
"""

from dataclasses import dataclass

from .configuration_dflash import DEFAULT_BLOCK_SIZE, DFlashConfig

__all__ = ["TEMPLATES", "TargetShape", "load_template_config", "template_config"]


@dataclass(frozen=True)
class TargetShape:
    """What a drafter template takes from its target (values from the target's config.json)."""

    model_id: str
    license: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    bos_token_id: int
    eos_token_id: int | list
    drafter_layers: int  # also the number of target features (one per drafter layer, as published)
    mask_token_id: int
    mask_note: str


_QWEN3_MASK = ("151669: the extra token DFlash's Qwen3 drafters use (`<|MASK|>` once added to the tokenizer); its row "
               "exists in the 151936-row embedding and plain Qwen3 text never produces it.")
TEMPLATES = {
    "qwen3-4b": TargetShape(
        "Qwen/Qwen3-4B", "apache-2.0", 36, 2560, 9728, 32, 8, 128, 151936, 1e-6, 1_000_000.0, 40960,
        151643, 151645, 5, 151669, _QWEN3_MASK),
    "qwen3-8b": TargetShape(
        "Qwen/Qwen3-8B", "apache-2.0", 36, 4096, 12288, 32, 8, 128, 151936, 1e-6, 1_000_000.0, 40960,
        151643, 151645, 5, 151669, _QWEN3_MASK),
    "llama-3.1-8b-instruct": TargetShape(
        "meta-llama/Llama-3.1-8B-Instruct", "llama3.1", 32, 4096, 14336, 32, 8, 128, 128256, 1e-5, 500_000.0, 131072,
        128000, [128001, 128008, 128009], 5, 128002,
        "128002 `<|reserved_special_token_0|>`: reserved, never produced by the tokenizer or the chat template, and "
        "its row exists in the embedding. The drafter uses default RoPE (theta 500000) of its own: Llama-3.1's "
        "`llama3` RoPE scaling belongs to the target, whose features the drafter reads."),
    "smollm2-135m-instruct": TargetShape(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0", 30, 576, 1536, 9, 3, 64, 49152, 1e-5, 100_000.0, 8192,
        1, 2, 3, 16,
        "16 `<empty_output>`: a StarCoder-style notebook-metadata special token that chat text never contains, with "
        "a trained (non-zero) embedding row. The last row (49151, `ectable`) is ordinary text, so it would not do."),
}


def template_config(name: str) -> DFlashConfig:
    """Drafter config for a known target: its shapes, DFlash's default `target_layer_ids` (one feature per drafter
    layer, derived by the config), the default block size."""
    if name not in TEMPLATES:
        raise KeyError(f"No template {name!r}; known: {sorted(TEMPLATES)}.")
    t = TEMPLATES[name]
    return DFlashConfig(
        block_size=DEFAULT_BLOCK_SIZE,
        mask_token_id=t.mask_token_id,
        num_target_layers=t.num_hidden_layers,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.drafter_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        rms_norm_eps=t.rms_norm_eps,
        rope_theta=t.rope_theta,
        max_position_embeddings=t.max_position_embeddings,
        vocab_size=t.vocab_size,
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
    )


def load_template_config(name_or_dir) -> DFlashConfig:
    """A template by name (`qwen3-8b`) or any folder with a drafter config.json (weights or not)."""
    if str(name_or_dir) in TEMPLATES:
        return template_config(str(name_or_dir))
    return DFlashConfig.from_pretrained(name_or_dir)
