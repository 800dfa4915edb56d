"""Export and push: a drafter folder made Hub-ready, in our layout or z-lab's (see `dflash_retrace.hub`).

- `ours`: `save_pretrained` of the drafter (safetensors, config.json with `auto_map`, the three payload
  modules), a model card, and the `training_summary.json` / `bench*.json` found next to the weights.
- `zlab`: z-lab's config layout, the same tensor names (ours already match theirs), ReTrace weights dropped.
"""

import json
import os
import re
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import torch
import transformers

from .. import __version__
from ..configuration_dflash import DFlashConfig
from ..modeling_dflash import DFlashDrafter
from ..runtime import load_drafter, zlab_incompatibility
from .card import BENCH_PATTERN, bench_rows, model_card

FORMATS = ("ours", "zlab")
TRAINING_SUMMARIES = ("training_summary.json", "summary.json")  # the first one found
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
    snippet. `overwrite` replaces a non-empty `out_dir`; without it a non-empty `out_dir` is an error.
    Everything is read and checked first and written to a temporary sibling of `out_dir`, which then takes
    `out_dir`'s place: a refused or failed export leaves `out_dir` as it was.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}.")
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    _check_folders(drafter_dir, out_dir, overwrite)
    drafter = load_drafter(drafter_dir)
    summary_path = next((drafter_dir / n for n in TRAINING_SUMMARIES if (drafter_dir / n).is_file()), None)
    summary = _read_json(summary_path) if summary_path else None
    if base_model is None and summary:
        base_model = summary.get("base_model") or summary.get("target")
    if base_model is None:
        warnings.warn(
            "No base model given: the model card will not name the target. Pass --base-model (the target's Hub id).",
            stacklevel=2,
        )
    # A z-lab export of a ReTrace drafter runs plain DFlash: its τ is the bench's `zlab_reference` method.
    method = "zlab_reference" if format == "zlab" and drafter.config.retrace else "speculative"
    bench, bench_notes = bench_rows(drafter_dir, method=method)
    repo_id = repo_id or f"your-org/{out_dir.resolve().name}"
    if format == "zlab":  # every check of the z-lab layout, before anything is written
        state = zlab_state_dict(drafter)
        config = zlab_config(drafter.config, dtype=next(drafter.parameters()).dtype)
    card = model_card(drafter, format=format, base_model=base_model, license=license, repo_id=repo_id,
                      summary=summary, bench=bench, bench_notes=bench_notes)
    copies = {source.name: source.read_bytes()
              for source in [summary_path, *sorted(drafter_dir.glob(BENCH_PATTERN))] if source is not None}

    def write(folder: Path) -> None:
        if format == "ours":
            drafter.save_pretrained(folder)  # weights, config.json with auto_map, the payload modules
        else:
            from huggingface_hub import save_torch_state_dict

            (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            save_torch_state_dict(state, folder)
        (folder / "README.md").write_text(card)
        for name, data in copies.items():
            (folder / name).write_bytes(data)

    _write_in_place(out_dir, write)
    return out_dir


def zlab_state_dict(drafter: DFlashDrafter) -> dict:
    """The drafter's tensors under z-lab's names (identical to ours), without the ReTrace conditioner."""
    reason = zlab_incompatibility(drafter.config)
    if reason is not None:
        raise ValueError(f"{reason} Export with format='ours' (trust_remote_code).")
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


def _check_folders(drafter_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Refuses an `out_dir` whose replacement would delete the drafter, and a non-empty one without `overwrite`."""
    source, out = drafter_dir.resolve(), out_dir.resolve()
    if out == source:
        raise ValueError(f"--out {out_dir} is the drafter folder itself; export to a new folder.")
    if out in source.parents:
        raise ValueError(f"--out {out_dir} contains the drafter folder {drafter_dir}: the export replaces --out "
                         "and would delete the drafter. Export to a folder outside it, e.g. a sibling of "
                         f"{out_dir}.")
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file, not a folder. Choose another --out.")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} is not empty. Choose another --out, or pass --overwrite to replace it.")


def _write_in_place(out_dir: Path, write) -> None:
    """`write(folder)` into a temporary sibling of `out_dir`, then moves it to `out_dir` (the old one, if any, is
    deleted only once the new one is complete)."""
    out_dir = out_dir.resolve()  # `--out .` has no name to make a sibling from
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:12]}"
    staging.mkdir()  # not mkdtemp: the export gets the usual permissions, not 0700
    old = None
    try:
        write(staging)
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(out_dir, old)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and old.exists() and not out_dir.exists():
            os.replace(old, out_dir)  # put the previous export back
        raise
    finally:
        if old is not None and old.exists():
            try:
                shutil.rmtree(old)
            except OSError as err:  # the export is in place; only the previous one's removal failed
                warnings.warn(f"Could not delete the previous export, moved to {old}: {err}. Delete it by hand.",
                              stacklevel=3)


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
