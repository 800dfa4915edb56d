"""Regenerate training responses with the target itself (DFlash recipe: the target's outputs are the labels).

`regenerate(target, tokenizer, prompts, out_path)` reads prompt rows (chat `messages` or a `prompt`
string), renders them as generation does (the tokenizer's chat template with the generation prompt),
generates in left-padded batches (greedy by default) and appends one JSON row per prompt to `out_path`:
- `prompt` rows get `response`; `messages` rows get the assistant reply appended to `messages`;
- every row keeps its `id` and records `finish_reason` ("eos" or "length"), the `eos_token_id` the target
  ended with (any of its EOS ids ends a response), `num_response_tokens` and the `generation` settings used.
The output is resumable: ids already in it are skipped once their prompt is checked to be the same (a different
prompt under the same id is an error), and a truncated last line is dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config_cli import option
from ..runtime import encode_prompt, eos_token_ids, prompt_messages, uses_chat_template
from .data import load_rows

__all__ = ["RegenerateConfig", "prompt_sha256", "read_done_ids", "read_done_rows", "regenerate"]


@dataclass
class RegenerateConfig:
    """How `regenerate` generates; the `regenerate` CLI is generated from these fields."""

    batch_size: int = option(8, "prompts per generate() call")
    max_new_tokens: int = option(512, "response budget per prompt")
    do_sample: bool = option(False, "sample instead of greedy decoding")
    temperature: float = option(1.0, "sampling temperature (with --do-sample)")
    top_p: float = option(1.0, "nucleus sampling mass (with --do-sample)")
    top_k: int | None = option(None, "top-k sampling (with --do-sample)")
    seed: int = option(0, "torch seed for sampling (recorded in each row)")
    chat_template: bool = option(True, "render prompts with the tokenizer's chat template (off: raw text, base models)")
    enable_thinking: bool = option(False, "pass enable_thinking=True to Qwen3-style templates")
    limit: int | None = option(None, "only the first N prompts")
    target_name: str | None = option(None, "name recorded in each row's `generation` (default: the target's path)")
    progress: bool = option(True, "progress bar")


def prompt_sha256(row: dict, where: str = "row") -> str:
    """sha256 of what a row asks: its chat turns before the reply (`messages`) or its `prompt` string."""
    messages, prompt = prompt_messages(row, where)
    return hashlib.sha256(json.dumps([messages, prompt], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def read_done_rows(path) -> dict:
    """{id: prompt_sha256} of the rows already written to a regeneration output; drops a truncated or corrupt tail
    (an interrupted write)."""
    path = Path(path)
    if not path.exists():
        return {}
    raw = path.read_bytes()
    done, good_bytes = {}, 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        if line.strip():
            try:
                row = json.loads(line)
                done[str(row["id"])] = prompt_sha256(row, where=f"{path} row {row['id']}")
            except (json.JSONDecodeError, KeyError):
                break
        good_bytes += len(line)
    if good_bytes < len(raw):
        warnings.warn(f"{path}: dropping {len(raw) - good_bytes} bytes of an incomplete last row (interrupted write).")
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return done


def read_done_ids(path) -> set:
    """Ids already written to a regeneration output; drops a truncated or corrupt tail (an interrupted write)."""
    return set(read_done_rows(path))


def _check_same_prompts(items, done: dict, out_path) -> None:
    """Raises if a row already in the output was written for another prompt than the input row of its id."""
    stale = [row_id for row_id, row in items if row_id in done
             and done[row_id] != prompt_sha256(row, where=f"prompt {row_id}")]
    if stale:
        raise ValueError(
            f"{out_path} already holds {len(stale)} row(s) whose id is in the prompts but whose prompt differs (ids "
            f"{stale[:5]}): it was written for other prompts with the same ids (e.g. `corpus` rows of another seed or "
            "mix, both numbered from 0), and resuming would skip these prompts. Write to a new --out, or give the "
            "prompts ids that do not clash."
        )


@torch.no_grad()
def regenerate(target, tokenizer, prompts, out_path, config: RegenerateConfig | None = None, **overrides) -> dict:
    """Writes the target's responses to `prompts` (rows, a path or a dataset) into `out_path` (JSONL, appended).

    `config` (a `RegenerateConfig`), or its fields as keyword arguments (`batch_size=8, max_new_tokens=512, ...`).
    Rows whose `id` (default: the row's index) is already in `out_path` are skipped; one written there for another
    prompt is an error (a ValueError naming the ids). Returns
    `{"generated": n, "skipped": n, "out": path}`.
    """
    cfg = dataclasses.replace(config or RegenerateConfig(), **overrides)
    rows = load_rows(prompts)[:cfg.limit]
    items, seen = [], set()
    for index, row in enumerate(rows):
        row_id = str(row.get("id", index))
        if row_id in seen:
            raise ValueError(f"duplicate id {row_id!r} in the prompts: ids must be unique for resumable output.")
        seen.add(row_id)
        items.append((row_id, row))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = read_done_rows(out_path)
    _check_same_prompts(items, done, out_path)
    todo = [(row_id, row, encode_prompt(tokenizer, row, cfg.chat_template, cfg.enable_thinking,
                                        where=f"prompt {row_id}"))
            for row_id, row in items if row_id not in done]
    todo.sort(key=lambda item: len(item[2]))  # similar lengths per batch: less padding

    settings = {
        "target": cfg.target_name or getattr(target.config, "_name_or_path", None) or type(target).__name__,
        "do_sample": bool(cfg.do_sample),
        "temperature": float(cfg.temperature) if cfg.do_sample else None,
        "top_p": float(cfg.top_p) if cfg.do_sample else None,
        "top_k": cfg.top_k if cfg.do_sample else None,
        "max_new_tokens": int(cfg.max_new_tokens),
        "seed": int(cfg.seed),
        "chat_template": uses_chat_template(tokenizer, cfg.chat_template),
        "dtype": str(next(target.parameters()).dtype).removeprefix("torch."),  # bf16 and fp32 answers differ at near-ties
        "batch_size": int(cfg.batch_size),
    }
    if cfg.do_sample:
        sampling = dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    else:
        sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos_ids = set(eos_token_ids(target))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        pad_id = 0
    device = next(target.parameters()).device
    torch.manual_seed(cfg.seed)

    bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", disable=not cfg.progress)
    with open(out_path, "a", encoding="utf-8") as out:
        for start in range(0, len(todo), cfg.batch_size):
            batch = todo[start : start + cfg.batch_size]
            width = max(len(ids) for _, _, ids in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (_, _, ids) in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[i, width - len(ids) :] = torch.tensor(ids)
                attention_mask[i, width - len(ids) :] = 1
            generated = target.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=cfg.max_new_tokens, pad_token_id=pad_id, **sampling,
            )[:, width:].cpu()
            for (row_id, row, _), tokens in zip(batch, generated.tolist()):
                out.write(json.dumps(_output_row(row_id, row, tokens, eos_ids, tokenizer, settings)) + "\n")
            out.flush()
            bar.update(len(batch))
    bar.close()
    return {"generated": len(todo), "skipped": len(items) - len(todo), "out": str(out_path)}


def _output_row(row_id, row, tokens, eos_ids, tokenizer, settings) -> dict:
    cut = next((k for k, t in enumerate(tokens) if t in eos_ids), None)
    response_ids = tokens if cut is None else tokens[:cut]
    # Special tokens are kept so that tokenizing the text gives back the generated ids.
    response = tokenizer.decode(response_ids, skip_special_tokens=False)
    out = {k: v for k, v in row.items() if k not in ("response", "messages", "prompt")}
    out["id"] = row_id
    messages, prompt = prompt_messages(row)
    if messages is not None:
        out["messages"] = messages + [{"role": "assistant", "content": response}]
    else:
        out["prompt"], out["response"] = prompt, response
    out["finish_reason"] = "length" if cut is None else "eos"
    if cut is not None:  # which end token the target emitted: training appends this one
        out["eos_token_id"] = tokens[cut]
    out["num_response_tokens"] = len(response_ids)
    out["generation"] = settings
    return out
