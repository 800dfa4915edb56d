"""Regenerate training responses with the target itself (DFlash recipe: the target's outputs are the labels).

`regenerate(target, tokenizer, prompts, out_path)` reads prompt rows (chat `messages` or a `prompt`
string), renders them as generation does (the tokenizer's chat template with the generation prompt),
generates in left-padded batches (greedy by default) and appends one JSON row per prompt to `out_path`:
- `prompt` rows get `response`; `messages` rows get the assistant reply appended to `messages`;
- every row keeps its `id` and records `finish_reason` ("eos" or "length"), `num_response_tokens`
  and the `generation` settings used.
The output is resumable: ids already in it are skipped, and a truncated last line is dropped.

Also the data helpers shared with training (`load_rows`, `encode_prompt`, `load_target`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .datasets import apply_chat_template, read_jsonl

__all__ = ["encode_prompt", "load_rows", "load_target", "prompt_messages", "read_done_ids", "regenerate"]


# ----------------------------------------------------------------------------------------- data
def load_rows(data, split: str = "train") -> list[dict]:
    """Rows as dicts from a `.jsonl`/`.jsonl.gz`/`.json` file, a `datasets.save_to_disk` folder, a Hub dataset id,
    a `datasets.Dataset` or any iterable of dicts."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if path.is_file() and path.suffix == ".json":
            rows = json.loads(path.read_text(encoding="utf-8"))
            return rows if isinstance(rows, list) else rows[split]
        if path.is_file():
            return read_jsonl(path)
        try:
            import datasets
        except ImportError:
            raise FileNotFoundError(
                f"{data} is not a file, and reading a `datasets` folder or Hub dataset needs `pip install datasets`."
            ) from None
        loaded = datasets.load_from_disk(str(path)) if path.is_dir() else datasets.load_dataset(str(data), split=split)
        if isinstance(loaded, datasets.DatasetDict):
            loaded = loaded[split]
        return [dict(row) for row in loaded]
    return [dict(row) for row in data]


def prompt_messages(row: dict, where: str = "row") -> tuple:
    """(messages, prompt): the chat turns to answer (trailing assistant turn dropped), or the `prompt` string."""
    if "messages" in row:
        messages = list(row["messages"])
        if messages and messages[-1].get("role") == "assistant":
            messages = messages[:-1]
        if not messages:
            raise ValueError(f"{where}: `messages` has no turn before the assistant reply.")
        return messages, None
    if "prompt" in row:
        return None, str(row["prompt"])
    raise ValueError(f"{where}: a row needs `messages` (chat) or `prompt`, got fields {sorted(row)}.")


def uses_chat_template(tokenizer, chat_template: bool) -> bool:
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, row: dict, chat_template: bool = True, enable_thinking: bool = False,
                  where: str = "row") -> list:
    """Token ids of a row's prompt exactly as generation sees them.

    With a chat template: `messages` (or `[{"role": "user", "content": prompt}]`) rendered with the
    generation prompt, tokenized without extra special tokens (the template has them). Without one
    (`chat_template=False` or a tokenizer that has none): the `prompt` text (or the turns joined by
    blank lines) with the tokenizer's usual special tokens.
    """
    messages, prompt = prompt_messages(row, where)
    if uses_chat_template(tokenizer, chat_template):
        messages = messages or [{"role": "user", "content": prompt}]
        text = apply_chat_template(tokenizer, messages, enable_thinking=enable_thinking)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = prompt if prompt is not None else "\n\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]


def read_done_ids(path) -> set:
    """Ids already written to a regeneration output; drops a truncated or corrupt tail (an interrupted write)."""
    path = Path(path)
    if not path.exists():
        return set()
    raw = path.read_bytes()
    done, good_bytes = set(), 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        if line.strip():
            try:
                done.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError):
                break
        good_bytes += len(line)
    if good_bytes < len(raw):
        warnings.warn(f"{path}: dropping {len(raw) - good_bytes} bytes of an incomplete last row (interrupted write).")
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return done


def load_target(name: str, dtype: str = "auto", device: str | None = None):
    """(target, tokenizer) from a registry name (see `assets`), a local folder or a Hub id.

    dtype "auto": bfloat16 on CUDA, float32 elsewhere.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .assets import resolve_model

    path = resolve_model(name)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "bfloat16" if str(device).startswith("cuda") else "float32"
    target = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return target, tokenizer


def _eos_ids(target, tokenizer) -> set:
    eos = target.generation_config.eos_token_id
    if eos is None:
        return set()
    return set(eos if isinstance(eos, (list, tuple)) else [eos])


# ----------------------------------------------------------------------------------- regenerate
@torch.no_grad()
def regenerate(
    target,
    tokenizer,
    prompts,
    out_path,
    batch_size: int = 8,
    max_new_tokens: int = 512,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    chat_template: bool = True,
    enable_thinking: bool = False,
    limit: int | None = None,
    target_name: str | None = None,
    progress: bool = True,
) -> dict:
    """Writes the target's responses to `prompts` (rows, a path or a dataset) into `out_path` (JSONL, appended).

    Rows whose `id` (default: the row's index) is already in `out_path` are skipped. Returns
    `{"generated": n, "skipped": n, "out": path}`.
    """
    rows = load_rows(prompts)[:limit]
    items, seen = [], set()
    for index, row in enumerate(rows):
        row_id = str(row.get("id", index))
        if row_id in seen:
            raise ValueError(f"duplicate id {row_id!r} in the prompts: ids must be unique for resumable output.")
        seen.add(row_id)
        items.append((row_id, row))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = read_done_ids(out_path)
    todo = [(row_id, row, encode_prompt(tokenizer, row, chat_template, enable_thinking, where=f"prompt {row_id}"))
            for row_id, row in items if row_id not in done]
    todo.sort(key=lambda item: len(item[2]))  # similar lengths per batch: less padding

    settings = {
        "target": target_name or getattr(target.config, "_name_or_path", None) or type(target).__name__,
        "do_sample": bool(do_sample),
        "temperature": float(temperature) if do_sample else None,
        "top_p": float(top_p) if do_sample else None,
        "top_k": top_k if do_sample else None,
        "max_new_tokens": int(max_new_tokens),
        "seed": int(seed),
        "chat_template": uses_chat_template(tokenizer, chat_template),
    }
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k) if do_sample else dict(
        do_sample=False, temperature=None, top_p=None, top_k=None)
    eos_ids = _eos_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        pad_id = 0
    device = next(target.parameters()).device
    torch.manual_seed(seed)

    bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", disable=not progress)
    with open(out_path, "a", encoding="utf-8") as out:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            width = max(len(ids) for _, _, ids in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (_, _, ids) in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[i, width - len(ids) :] = torch.tensor(ids)
                attention_mask[i, width - len(ids) :] = 1
            generated = target.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens, pad_token_id=pad_id, **sampling,
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
    out["num_response_tokens"] = len(response_ids)
    out["generation"] = settings
    return out


# ------------------------------------------------------------------------------------------ CLI
def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "regenerate", help="write the target's own responses to a prompt set (training data for a drafter)",
        description="Batched target generation (left padding), resumable: ids already in --out are skipped.",
    )
    parser.add_argument("--target", required=True, help="registry name (see `fetch`), local folder or Hub id")
    parser.add_argument("--prompts", required=True,
                        help="JSONL (or datasets folder / Hub id) with `messages` or `prompt` rows")
    parser.add_argument("--out", required=True, help="output JSONL (appended; existing ids are skipped)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generate() call (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="response budget per prompt (default: 512)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --do-sample)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (with --do-sample)")
    parser.add_argument("--top-k", type=int, default=None, help="top-k sampling (with --do-sample)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for sampling (recorded in each row)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--no-chat-template", action="store_true", help="use `prompt` as raw text (base models)")
    parser.add_argument("--enable-thinking", action="store_true",
                        help="pass enable_thinking=True to Qwen3-style templates")
    parser.add_argument("--dtype", default="auto",
                        help="target dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--device", default=None, help="target device (default: cuda if available, else cpu)")
    parser.set_defaults(func=_run_cli)


def _run_cli(args) -> int:
    target, tokenizer = load_target(args.target, args.dtype, args.device)
    result = regenerate(
        target, tokenizer, args.prompts, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        chat_template=not args.no_chat_template, enable_thinking=args.enable_thinking, limit=args.limit,
        target_name=args.target,
    )
    print(json.dumps(result))
    return 0
