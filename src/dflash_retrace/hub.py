"""Publishing drafters: Hub-ready folders in our layout and in z-lab's, uploads, and config templates.

```bash
dflash-retrace export DRAFTER_DIR --out repo/ [--base-model Qwen/Qwen3-8B]        # transformers + trust_remote_code
dflash-retrace export DRAFTER_DIR --out repo-zlab/ --format zlab                    # plain DFlash for vLLM/SGLang/z-lab
dflash-retrace push DRAFTER_DIR --repo-id org/name [--private]                      # export, then upload
dflash-retrace templates [--out hub_configs/templates]                              # drafter configs for common targets
```

- `ours`: `save_pretrained` of the drafter (safetensors, config.json with `auto_map`, the three payload
  modules), a model card, and the `training_summary.json` / `bench*.json` found next to the weights.
  The folder loads with `AutoModel.from_pretrained(repo, trust_remote_code=True)` and torch +
  transformers only.
- `zlab`: z-lab's config layout (`model_type: "qwen3"`, `architectures: ["DFlashDraftModel"]`,
  `dflash_config`), the same tensor names (ours already match theirs), ReTrace weights dropped.

What the model card reads, when present in DRAFTER_DIR (and copies into the export):
- the training summary, `training_summary.json` or `summary.json` (what `dflash-retrace train` writes):
  a JSON object; scalars and lists become a table, `command` a code block, and `base_model` / `target`
  the card's `base_model` when none is given;
- `bench*.json`: reports of `dflash-retrace bench` (schema `dflash-retrace/bench/v1`: one row per file,
  from `config` and `summary.methods.speculative`), or plain rows (an object, a list, or `{"rows": [...]}`)
  with `tau_pooled` and optionally `dataset`, `temperature`, `num_prompts`, `max_new_tokens`,
  `tau_prompt_mean`, `speedup`.
"""

import argparse
import json
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from . import __version__
from .configuration_dflash import DFlashConfig, default_target_layer_ids
from .modeling_dflash import DFlashDrafter

FORMATS = ("ours", "zlab")
TRAINING_SUMMARIES = ("training_summary.json", "summary.json")  # the first one found
BENCH_PATTERN = "bench*.json"
BENCH_SCHEMA = "dflash-retrace/bench/v1"
PUBLISHED_BLOCK_SIZE = 16
TEMPLATES_DIR = Path("hub_configs") / "templates"
WEIGHT_PATTERNS = ["*.safetensors", "*.safetensors.index.json"]

# Every tensor name z-lab's DFlashDraftModel knows. Ours are the same; this guards against drift.
_ZLAB_KEY = re.compile(
    r"^(layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)|mlp\.(gate_proj|up_proj|down_proj)"
    r"|input_layernorm|post_attention_layernorm)|fc|hidden_norm|norm)\.(weight|bias)$"
)


# ------------------------------------------------------------------------------------ export
def export_drafter(
    drafter_dir,
    out_dir,
    *,
    format: str = "ours",
    base_model: str | None = None,
    license: str = "apache-2.0",
    repo_id: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Writes a Hub-ready folder for the drafter in `drafter_dir` (a saved drafter or a PEFT adapter of one).

    format: `"ours"` (transformers + trust_remote_code, DFlash and ReTrace) or `"zlab"` (z-lab's layout,
    plain DFlash: ReTrace weights are dropped with a warning). `repo_id` only fills the card's usage
    snippet. `overwrite` deletes `out_dir` first; without it a non-empty `out_dir` is an error.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}.")
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    if out_dir.resolve() == drafter_dir.resolve():
        raise ValueError(f"--out {out_dir} is the drafter folder itself; export to a new folder.")
    drafter = load_drafter(drafter_dir)
    _prepare_out_dir(out_dir, overwrite)
    summary_path = next((drafter_dir / n for n in TRAINING_SUMMARIES if (drafter_dir / n).is_file()), None)
    summary = _read_json(summary_path) if summary_path else None
    if base_model is None and summary:
        base_model = summary.get("base_model") or summary.get("target")
    if base_model is None:
        warnings.warn(
            "No base model given: the model card will not name the target. Pass --base-model (the target's Hub id).",
            stacklevel=2,
        )
    bench = _bench_rows(drafter_dir)
    repo_id = repo_id or f"your-org/{out_dir.resolve().name}"

    if format == "ours":
        drafter.save_pretrained(out_dir)  # weights, config.json with auto_map, the payload modules
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        from huggingface_hub import save_torch_state_dict

        state = zlab_state_dict(drafter)
        config = zlab_config(drafter.config, dtype=next(drafter.parameters()).dtype)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_torch_state_dict(state, out_dir)
    card = model_card(drafter, format=format, base_model=base_model, license=license, repo_id=repo_id,
                      summary=summary, bench=bench)
    (out_dir / "README.md").write_text(card)
    for source in [summary_path, *sorted(drafter_dir.glob(BENCH_PATTERN))]:
        if source is not None:
            shutil.copyfile(source, out_dir / source.name)
    return out_dir


def load_drafter(drafter_dir) -> DFlashDrafter:
    """The drafter saved in `drafter_dir` (ours or z-lab's layout), or a PEFT adapter merged into its base."""
    drafter_dir = Path(drafter_dir)
    adapter = _read_json(drafter_dir / "adapter_config.json")
    if adapter is not None:
        from peft import PeftModel

        base_path = Path(adapter["base_model_name_or_path"])
        if not base_path.exists() and (drafter_dir / "base").is_dir():  # moved with its adapter (train's layout)
            base_path = drafter_dir / "base"
        base = DFlashDrafter.from_pretrained(str(base_path), dtype="auto")
        return PeftModel.from_pretrained(base, drafter_dir).merge_and_unload().eval()
    if not (drafter_dir / "config.json").is_file():
        raise FileNotFoundError(f"{drafter_dir} has no config.json: it is not a saved drafter (nor a PEFT adapter of one).")
    if not any(drafter_dir.glob("*.safetensors")) and not any(drafter_dir.glob("*.bin")):
        raise FileNotFoundError(
            f"{drafter_dir} has a config but no weights (a template?). Train a drafter from it first: "
            f"`dflash-retrace train --init {drafter_dir} ...`, then export the trained folder."
        )
    return DFlashDrafter.from_pretrained(drafter_dir, dtype="auto").eval()


def zlab_state_dict(drafter: DFlashDrafter) -> dict:
    """The drafter's tensors under z-lab's names (identical to ours), without the ReTrace conditioner."""
    state, dropped = {}, []
    for name, tensor in drafter.state_dict().items():
        if name.startswith("retrace."):
            dropped.append(name)
            continue
        if not _ZLAB_KEY.match(name):
            raise ValueError(f"Tensor {name!r} has no counterpart in z-lab's DFlashDraftModel; the z-lab export cannot carry it.")
        state[name] = tensor.detach().contiguous()
    if dropped:
        warnings.warn(
            f"z-lab format has no ReTrace: dropped {len(dropped)} `retrace.*` tensors. The export runs as plain DFlash "
            "(the drafter's backbone); use the default format to keep ReTrace.",
            stacklevel=3,
        )
    return state


def zlab_config(config: DFlashConfig, dtype: torch.dtype = torch.bfloat16) -> dict:
    """config.json in z-lab's layout: a Qwen3 config plus `block_size`, `num_target_layers` and `dflash_config`."""
    dtype_name = str(dtype).removeprefix("torch.")
    out = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)},
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": config.attention_bias,
        "attention_dropout": config.attention_dropout,
        "initializer_range": config.initializer_range,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config.num_hidden_layers,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,  # the key readers older than transformers 4.56 look for
        "transformers_version": transformers.__version__,
    }
    for name in ("bos_token_id", "eos_token_id"):
        if getattr(config, name, None) is not None:
            out[name] = getattr(config, name)
    # z-lab's optional conventions, read from dflash_config or the top level; written only when not neutral.
    if config.input_embedding_scale != 1.0:
        out["input_embedding_scale"] = config.input_embedding_scale
    if config.output_multiplier != 1.0:
        out["output_multiplier"] = config.output_multiplier
    if config.final_logit_softcapping:
        out["final_logit_softcapping"] = config.final_logit_softcapping
    return out


def _prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} is not empty. Choose another --out, or pass --overwrite to delete it first.")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


# -------------------------------------------------------------------------------------- push
def push_drafter(
    drafter_dir,
    repo_id: str,
    *,
    private: bool = False,
    format: str = "ours",
    base_model: str | None = None,
    license: str = "apache-2.0",
    commit_message: str | None = None,
    api=None,
):
    """Exports to a temporary folder, then `create_repo` + `upload_folder` with `huggingface_hub.HfApi`.

    `api` is any object with HfApi's `create_repo` and `upload_folder` (tests pass a local stand-in).
    Weight files already in the repo are replaced, not mixed with the new ones. Returns upload_folder's result.
    """
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    with tempfile.TemporaryDirectory(prefix="dflash-export-") as tmp:
        export_drafter(drafter_dir, tmp, format=format, base_model=base_model, license=license, repo_id=repo_id,
                       overwrite=True)
        if commit_message is None:
            commit_message = default_commit_message(tmp, format)
        url = api.create_repo(repo_id, private=private or None, exist_ok=True, repo_type="model")  # None: the org default
        return api.upload_folder(
            repo_id=getattr(url, "repo_id", repo_id),
            folder_path=tmp,
            repo_type="model",
            commit_message=commit_message,
            delete_patterns=WEIGHT_PATTERNS,
        )


def default_commit_message(export_dir, format: str = "ours") -> str:
    """'Upload DFlash + ReTrace drafter (dflash-retrace 0.1.0)', from an exported folder's config."""
    config = _read_json(Path(export_dir) / "config.json") or {}
    kind = "DFlash + ReTrace" if config.get("retrace") else "DFlash"
    layout = "" if format == "ours" else f", {format} format"
    return f"Upload {kind} drafter (dflash-retrace {__version__}{layout})"


# -------------------------------------------------------------------------------- model card
def model_card(drafter, *, format="ours", base_model=None, license="apache-2.0", repo_id="your-org/drafter",
               summary=None, bench=None) -> str:
    """README.md: YAML metadata, usage, the drafter's shape, training summary and measured τ."""
    from huggingface_hub import ModelCardData

    cfg = drafter.config
    retrace = cfg.retrace and format == "ours"
    tags = ["dflash", "speculative-decoding", "block-diffusion", "draft-model", "dflash-retrace"]
    if retrace:
        tags.insert(1, "retrace")
    meta = ModelCardData(
        library_name="transformers" if format == "ours" else None,
        base_model=base_model,
        pipeline_tag="text-generation",
        license=license,
        tags=tags,
    )
    target = base_model or "TARGET_MODEL_ID"
    kind = "DFlash + ReTrace" if retrace else "DFlash"
    params = sum(p.numel() for name, p in drafter.named_parameters() if format == "ours" or not name.startswith("retrace."))
    what = (
        f"A {kind} drafter for [`{target}`](https://huggingface.co/{target}): a block-diffusion draft model that "
        f"proposes {cfg.block_size - 1} tokens per call ({cfg.block_size}-token blocks: the last committed token plus "
        f"{cfg.block_size - 1} mask slots), conditioned on hidden states of the target's layers {list(cfg.target_layer_ids)}."
        if base_model else
        f"A {kind} drafter: a block-diffusion draft model that proposes {cfg.block_size - 1} tokens per call, conditioned "
        f"on hidden states of its target's layers {list(cfg.target_layer_ids)}."
    )
    if retrace:
        what += (" ReTrace feeds the previous round's rejected draft suffix (the drafter's and the target's states) "
                 "into the next block.")
    what += (" The target verifies every proposal inside its own `generate()`: greedy output is token for token the "
             "target's, sampling follows the target's distribution. Only the speed depends on the drafter.")

    lines = ["---", meta.to_yaml().strip(), "---", "", f"# {repo_id.split('/')[-1]}", "", what, ""]
    lines += _usage_ours(target, repo_id) if format == "ours" else _usage_zlab(target, repo_id, cfg)
    lines += ["## Drafter", "", "| | |", "|---|---|"]
    rows = [
        ("format", "dflash-retrace (transformers remote code)" if format == "ours" else "z-lab DFlash (`DFlashDraftModel`)"),
        ("block size", cfg.block_size),
        ("drafter layers", cfg.num_hidden_layers),
        ("hidden size", cfg.hidden_size),
        ("parameters", f"{params / 1e6:.1f}M"),
        ("target layers read (`target_layer_ids`)", list(cfg.target_layer_ids)),
        ("target decoder layers", cfg.num_target_layers),
        ("mask token id", cfg.mask_token_id),
        ("ReTrace", "yes" if retrace else "no"),
        ("dtype", str(next(drafter.parameters()).dtype).removeprefix("torch.")),
    ]
    lines += [f"| {k} | {v} |" for k, v in rows] + [""]
    lines += ["## Training", ""] + _summary_lines(summary) + [""]
    lines += ["## Measured acceptance length τ", ""] + _bench_lines(bench, target, repo_id) + [""]
    lines += [f"Made with dflash-retrace {__version__}.", ""]
    return "\n".join(lines)


def _usage_ours(target, repo_id):
    return [
        "## Usage", "",
        "```python",
        "from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{target}")',
        f'target = AutoModelForCausalLM.from_pretrained("{target}", dtype="auto", device_map="auto")',
        f'drafter = AutoModel.from_pretrained("{repo_id}", trust_remote_code=True, dtype="auto", device_map="auto")',
        "",
        'messages = [{"role": "user", "content": "Write a haiku about speculative decoding."}]',
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\",",
        "                                       return_dict=True).to(target.device)",
        "out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=256)",
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "print(drafter.last_stats)  # acceptance length per round (tokens per target forward, bonus included)",
        "```",
        "",
        "Needs torch and transformers >= 5.15 only: the drafter's code travels with its weights. Batch size 1 "
        "(one prompt per `generate()` call), greedy or sampling. Loading the drafter makes `generate(assistant_model=...)` "
        "recognise it; to run without that hook, pass `custom_generate=` the dflash-retrace custom_generate repo "
        "(same tokens).",
        "",
    ]


def _usage_zlab(target, repo_id, cfg):
    return [
        "## Usage", "",
        "This folder uses z-lab's DFlash layout (`DFlashDraftModel`), for engines and code that serve z-lab DFlash "
        "checkpoints (SGLang `--speculative-algorithm DFLASH`, vLLM, the `dflash` package). With the `dflash` package:",
        "",
        "```python",
        "from dflash.model import DFlashDraftModel, dflash_generate",
        f'drafter = DFlashDraftModel.from_pretrained("{repo_id}", dtype="auto").to(target.device)',
        "out = dflash_generate(drafter, target, input_ids, max_new_tokens=256, stop_token_ids=[tokenizer.eos_token_id])",
        "```",
        "",
        f"With dflash-retrace: `DFlashDrafter.from_pretrained(\"{repo_id}\")` reads this layout too. Plain DFlash only: "
        "ReTrace weights, if the drafter had any, are not part of this export.",
        "",
    ]


def _summary_lines(summary):
    if not summary:
        return ["No training summary was found next to the weights."]
    lines = ["| | |", "|---|---|"]
    for key, value in summary.items():
        if key == "command":
            continue
        if isinstance(value, dict):
            lines += [f"| {key}.{k} | {_fmt(v)} |" for k, v in value.items() if not isinstance(v, dict)]
        else:
            lines.append(f"| {key} | {_fmt(value)} |")
    if summary.get("command"):
        command = summary["command"]
        lines += ["", "```bash", command if isinstance(command, str) else " ".join(command), "```"]
    return lines


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _bench_rows(drafter_dir: Path) -> list:
    rows = []
    for path in sorted(drafter_dir.glob(BENCH_PATTERN)):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == BENCH_SCHEMA:
            config, spec = data["config"], data["summary"]["methods"].get("speculative", {})
            data = [{"dataset": config.get("dataset"), "temperature": config.get("temperature"),
                     "num_prompts": spec.get("num_ok", config.get("num_prompts")),
                     "max_new_tokens": config.get("max_new_tokens"), "tau_pooled": spec.get("tau_pooled"),
                     "tau_prompt_mean": spec.get("tau_prompt_mean"), "speedup": spec.get("speedup")}]
        elif isinstance(data, dict):
            data = data.get("rows") or [data]
        found = [r for r in data if isinstance(r, dict) and r.get("tau_pooled") is not None]
        if not found:
            warnings.warn(f"{path} has no row with a `tau_pooled`: left out of the model card.", stacklevel=3)
        rows += found
    return rows


def _bench_lines(rows, target, repo_id):
    if not rows:
        return [
            "Not measured yet. Measure with "
            f"`dflash-retrace bench --target {target} --drafter {repo_id} --dataset humaneval --temperature 0`.",
        ]
    lines = [
        "τ: tokens committed per target verification forward, bonus token included (pooled over rounds; "
        "per-prompt mean where given).",
        "",
        "| dataset | temperature | prompts | max new tokens | τ (pooled) | τ (mean of prompts) | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.get(k) for k in ("dataset", "temperature", "num_prompts", "max_new_tokens", "tau_pooled",
                                    "tau_prompt_mean", "speedup")]
        lines.append("| " + " | ".join("-" if c is None else _fmt(c) for c in cells) + " |")
    return lines


# --------------------------------------------------------------------------------- templates
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
    """Drafter config for a known target: its shapes, DFlash's default `target_layer_ids`, block size 16."""
    if name not in TEMPLATES:
        raise KeyError(f"No template {name!r}; known: {sorted(TEMPLATES)}.")
    t = TEMPLATES[name]
    return DFlashConfig(
        block_size=PUBLISHED_BLOCK_SIZE,
        mask_token_id=t.mask_token_id,
        target_layer_ids=default_target_layer_ids(t.num_hidden_layers, t.drafter_layers),
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


def template_files(name: str) -> dict:
    """{file name: text} of one template folder."""
    config = template_config(name).to_diff_dict()
    config.pop("transformers_version", None)  # keeps the committed files stable across upgrades
    config["architectures"] = ["DFlashDrafter"]
    config["auto_map"] = {"AutoConfig": "configuration_dflash.DFlashConfig", "AutoModel": "modeling_dflash.DFlashDrafter"}
    t = TEMPLATES[name]
    readme = "\n".join([
        f"# Drafter template: {t.model_id}",
        "",
        f"A DFlash drafter config (no weights) for [`{t.model_id}`](https://huggingface.co/{t.model_id}) "
        f"({t.num_hidden_layers} layers, hidden size {t.hidden_size}).",
        "",
        f"- block size {PUBLISHED_BLOCK_SIZE} (published DFlash drafters), {t.drafter_layers} drafter layers at the target's width",
        f"- `target_layer_ids` {config['target_layer_ids']}: DFlash's default rule for {t.drafter_layers} features "
        f"of {t.num_hidden_layers} layers",
        f"- mask token {t.mask_note}",
        "",
        "Train from it (the config sets the shape; weights start from scratch):",
        "",
        "```bash",
        f"dflash-retrace train --target {t.model_id} --data data.jsonl --init hub_configs/templates/{name} --out drafter/ --stage dflash",
        "```",
        "",
        "From Python: `DFlashDrafter(DFlashConfig.from_pretrained(\"hub_configs/templates/" + name + "\"))`. "
        "`DFlashDrafter.from_pretrained` needs weights and does not apply here.",
        "",
        "Generated by `dflash-retrace templates`; edit `dflash_retrace/hub.py`, not this file.",
        "",
    ])
    return {"config.json": json.dumps(config, indent=2, sort_keys=True) + "\n", "README.md": readme}


def templates_index() -> str:
    rows = [f"| [`{name}`]({name}/) | `{t.model_id}` | {t.drafter_layers} | {PUBLISHED_BLOCK_SIZE} | "
            f"{default_target_layer_ids(t.num_hidden_layers, t.drafter_layers)} | {t.mask_token_id} |"
            for name, t in TEMPLATES.items()]
    return "\n".join([
        "# Drafter templates",
        "",
        "Drafter configs (no weights) with each target's shapes, from which `dflash-retrace train --init` starts.",
        "",
        "| template | target | drafter layers | block size | target_layer_ids | mask token id |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Regenerate with `dflash-retrace templates --out hub_configs/templates` (a test checks these files match).",
        "",
    ])


def write_templates(root=TEMPLATES_DIR) -> list:
    """Writes every template folder and the index README under `root`; returns the paths written."""
    root = Path(root)
    written = []
    for name in TEMPLATES:
        for file_name, text in template_files(name).items():
            path = root / name / file_name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    (root / "README.md").write_text(templates_index())
    return written + [root / "README.md"]


# --------------------------------------------------------------------------------------- CLI
def register_cli(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("drafter_dir", metavar="DRAFTER_DIR", help="Saved drafter (or PEFT adapter of one) to publish.")
    common.add_argument("--format", choices=FORMATS, default="ours",
                        help="ours: transformers + trust_remote_code, keeps ReTrace (default). "
                             "zlab: z-lab's DFlash layout for vLLM/SGLang/dflash, drops ReTrace.")
    common.add_argument("--base-model", help="Hub id of the target, for the model card (default: from "
                                             "training_summary.json).")
    common.add_argument("--license", default="apache-2.0", help="Model card license; use the target's if it "
                                                                "has its own (e.g. llama3.1).")

    export = subparsers.add_parser("export", parents=[common], help="write a Hub-ready folder for a drafter (ours or z-lab layout)")
    export.add_argument("--out", required=True, help="Folder to write (must be empty or absent).")
    export.add_argument("--repo-id", help="Repo id shown in the model card's usage snippet.")
    export.add_argument("--overwrite", action="store_true", help="Delete --out first if it is not empty.")
    export.set_defaults(func=_cmd_export)

    push = subparsers.add_parser("push", parents=[common], help="export a drafter and upload it to the Hugging Face Hub")
    push.add_argument("--repo-id", required=True, help="Hub repo to create or update, e.g. org/Qwen3-8B-DFlash-ReTrace.")
    push.add_argument("--private", action="store_true", help="Create the repo as private.")
    push.add_argument("--commit-message", help="Default: 'Upload <kind> drafter (dflash-retrace <version>)'.")
    push.set_defaults(func=_cmd_push)

    templates = subparsers.add_parser("templates", help="write drafter config templates for common targets")
    templates.add_argument("--out", default=str(TEMPLATES_DIR), help=f"Root folder (default: {TEMPLATES_DIR}).")
    templates.set_defaults(func=_cmd_templates)


def _cmd_export(args) -> int:
    out = export_drafter(args.drafter_dir, args.out, format=args.format, base_model=args.base_model,
                         license=args.license, repo_id=args.repo_id, overwrite=args.overwrite)
    print(f"Wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def _cmd_push(args) -> int:
    info = push_drafter(args.drafter_dir, args.repo_id, private=args.private, format=args.format,
                        base_model=args.base_model, license=args.license, commit_message=args.commit_message)
    print(f"Uploaded to {getattr(info, 'commit_url', None) or args.repo_id}")
    return 0


def _cmd_templates(args) -> int:
    for path in write_templates(args.out):
        print(path)
    return 0


__all__ = [
    "export_drafter",
    "push_drafter",
    "load_drafter",
    "zlab_config",
    "zlab_state_dict",
    "model_card",
    "TEMPLATES",
    "template_config",
    "load_template_config",
    "write_templates",
]
