"""The model card (README.md) of an exported drafter: metadata, usage, shape, training summary and measured τ.

It reads, when present next to the weights, the training summary (`training_summary.json` or `summary.json`)
and `bench*.json` reports (see `dflash_retrace.hub.export`).
"""

import json
import warnings
from pathlib import Path

from .. import __version__

BENCH_PATTERN = "bench*.json"
BENCH_SCHEMA = "dflash-retrace/bench/v1"


def model_card(drafter, *, format="ours", base_model=None, license="apache-2.0", repo_id="your-org/drafter",
               summary=None, bench=None, bench_notes=()) -> str:
    """README.md: YAML metadata, usage, the drafter's shape, training summary and measured τ.

    `bench`: rows as `bench_rows` returns them; `bench_notes`: its notes (which method the rows are, what was
    left out), printed under the τ table."""
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
        ("variants", ", ".join(v for v, on in (
            (f"layer-wise fusion (DFlare) of layers {cfg.fusion_layer_ids}", cfg.fusion == "layerwise"),
            ("step-position embeddings (PAD-Rec)", cfg.step_embeddings),
            (f"target-KV context {cfg.context!r} (KVShot) of layers {cfg.kv_layer_ids}", cfg.context != "hidden"),
            (f"draft vocabulary of {cfg.draft_vocab_size} tokens", cfg.draft_vocab_size is not None),
        ) if on) or "none"),
        ("dtype", str(next(drafter.parameters()).dtype).removeprefix("torch.")),
    ]
    lines += [f"| {k} | {v} |" for k, v in rows] + [""]
    lines += ["## Training", ""] + _summary_lines(summary) + [""]
    lines += ["## Measured acceptance length τ", ""] + _bench_lines(bench, target, repo_id) + [""]
    lines += [f"Note: {note}" for note in bench_notes] + ([""] if bench_notes else [])
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


def bench_rows(drafter_dir: Path, method: str = "speculative") -> tuple:
    """(rows, notes): the τ rows of the `bench*.json` files in `drafter_dir`, and notes for the card.

    `method`: the bench method whose figures describe the export: `speculative` (this library's loop with the
    drafter as saved) or `zlab_reference` (z-lab's loop, plain DFlash: a z-lab export of a ReTrace drafter). A
    bench report without that method, or a plain-rows file (which names no method) when `method` is not
    `speculative`, gives no row; the notes and a warning say so.
    """
    rows, notes, paths = [], [], sorted(drafter_dir.glob(BENCH_PATTERN))
    if method != "speculative" and paths:
        notes.append(f"this export runs plain DFlash (no ReTrace): τ and speedup are the bench's `{method}` figures "
                     "(z-lab's loop on the same weights), not its headline `speculative` ones (with ReTrace). The "
                     "bench*.json files copied here measured the drafter with ReTrace as their headline.")
    for path in paths:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == BENCH_SCHEMA:
            config, spec = data["config"], data["summary"]["methods"].get(method)
            if spec is None:
                notes.append(f"`{path.name}` has no `{method}` figures, so it is left out of the table (rerun "
                             "`dflash-retrace bench` with `--baselines` to measure them).")
                warnings.warn(f"{path} has no `{method}` method: left out of the model card ({notes[-1]})",
                              stacklevel=3)
                continue
            data = [{"dataset": config.get("dataset"), "temperature": config.get("temperature"),
                     "num_prompts": spec.get("num_ok", config.get("num_prompts")),
                     "max_new_tokens": config.get("max_new_tokens"), "tau_pooled": spec.get("tau_pooled"),
                     "tau_prompt_mean": spec.get("tau_prompt_mean"), "speedup": spec.get("speedup")}]
        elif method != "speculative":
            notes.append(f"`{path.name}` holds plain rows that do not say which method they measured, so it is left "
                         f"out of the table (this export needs `{method}` figures).")
            warnings.warn(f"{path}: {notes[-1]}", stacklevel=3)
            continue
        elif isinstance(data, dict):
            data = data.get("rows") or [data]
        found = [r for r in data if isinstance(r, dict) and r.get("tau_pooled") is not None]
        if not found:
            warnings.warn(f"{path} has no row with a `tau_pooled`: left out of the model card.", stacklevel=3)
        rows += found
    return rows, notes


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
