"""Training data: rows from files or datasets, tokenized sequences (`Example`), held-out split, batches."""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..generation_dflash import ReTraceMemory
from ..prompts import read_jsonl
from ..runtime import encode_prompt, prompt_messages
from .objective import pad_anchors, sample_anchors, target_labels

__all__ = ["Example", "anchor_generator", "collate", "epoch_batches", "ids_sha256", "label_counts", "load_rows",
           "rows_sha256", "split_held_out", "tokenize_rows", "tokens_sha256"]


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


@dataclass
class Example:
    """One tokenized training sequence; the response starts at `prompt_length`."""

    input_ids: torch.Tensor  # (T,) long
    loss_mask: torch.Tensor  # (T,) bool, True on response tokens
    prompt_length: int
    row_id: str = ""
    truncated: bool = False  # cut at `max_length` by `tokenize_rows`


def tokenize_rows(rows, tokenizer, max_length=3072, chat_template=True, enable_thinking=False, eos_token_id=None):
    """Rows -> Examples. A row is chat `messages` (the last turn is the assistant's response), `prompt` +
    `response`, or pre-tokenized `input_ids` + `loss_mask` (one entry per id).

    The prompt is encoded exactly as generation encodes it (`runtime.encode_prompt`); the response is tokenized
    on its own and followed by the EOS the target emitted (the row's `eos_token_id`, which `regenerate` records;
    else `eos_token_id`, an id or a list whose first entry is used: see `runtime.eos_token_ids`) unless the row
    says `finish_reason: "length"`, so the drafter learns to propose the end the target really emits.

    Sequences longer than `max_length` are cut (flagged `truncated`); how many, and how many of them lost all their
    response tokens or their final EOS, is printed.
    """
    eos_ids = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]) - {None}
    if isinstance(eos_token_id, (list, tuple)):
        eos_token_id = eos_token_id[0] if eos_token_id else None
    examples, cut, cut_response, cut_eos, eos_known = [], 0, 0, 0, bool(eos_ids)
    for index, row in enumerate(rows):
        row_id = str(row.get("id", index))
        where = f"data row {row_id}"
        if "input_ids" in row:
            ids = torch.as_tensor(row["input_ids"], dtype=torch.long).view(-1)
            if "loss_mask" not in row:
                raise ValueError(f"{where}: pre-tokenized rows need `loss_mask` (1 on response tokens) "
                                 "with `input_ids`.")
            mask = torch.as_tensor(row["loss_mask"]).view(-1).bool()
            if mask.numel() != ids.numel():
                raise ValueError(f"{where}: `loss_mask` has {mask.numel()} entries but `input_ids` has {ids.numel()}: "
                                 "give one loss_mask entry (1 on response tokens) per token id.")
            supervised = mask.nonzero()
            prompt_length = int(supervised[0]) if supervised.numel() else ids.numel()
        else:
            if tokenizer is None:
                raise ValueError(f"{where}: text rows need a tokenizer (or pre-tokenize into `input_ids`/`loss_mask`).")
            if "messages" in row:
                if not row["messages"] or row["messages"][-1].get("role") != "assistant":
                    raise ValueError(f"{where}: the last of `messages` must be the assistant's response.")
                response = row["messages"][-1]["content"]
            elif "response" in row:
                response = row["response"]
            else:
                prompt_messages(row, where)  # raises the format error if the row has neither field
                raise ValueError(f"{where}: a `prompt` row needs its `response` (run `dflash-retrace regenerate`).")
            prompt_ids = encode_prompt(tokenizer, row, chat_template, enable_thinking, where=where)
            response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
            end = row.get("eos_token_id", eos_token_id)
            if end is not None and row.get("finish_reason") != "length":
                response_ids = response_ids + [int(end)]
            ids = torch.tensor(prompt_ids + response_ids, dtype=torch.long)
            mask = torch.zeros(ids.numel(), dtype=torch.bool)
            mask[len(prompt_ids):] = True
            prompt_length = len(prompt_ids)
        truncated = ids.numel() > max_length
        if truncated:
            cut += 1
            cut_response += bool(mask.any()) and not bool(mask[:max_length].any())
            ends = eos_ids | ({int(row["eos_token_id"])} if row.get("eos_token_id") is not None else set())
            cut_eos, eos_known = cut_eos + (int(ids[-1]) in ends), eos_known or bool(ends)  # the end to learn
        examples.append(Example(ids[:max_length], mask[:max_length], min(prompt_length, max_length), row_id,
                                truncated))
    if cut:
        print(f"[data] {cut} of {len(examples)} rows are longer than max_length={max_length} tokens and were cut: "
              f"{cut_response} lost all their response tokens" + (f", {cut_eos} their final EOS" if eos_known else "")
              + " (raise --max-length to keep them whole)")
    return examples


def ids_sha256(ids: torch.Tensor) -> str:
    """sha256 of token ids as int32 bytes: what a feature store's manifest records per row."""
    return hashlib.sha256(ids.to(torch.int32).numpy().tobytes()).hexdigest()


def tokens_sha256(example) -> str:
    """`ids_sha256` of an example's tokens (a stored row's is read from its store's manifest)."""
    if hasattr(example, "store"):  # a features.StoredRef
        return example.store.rows[example.index]["sha256"]
    return ids_sha256(example.input_ids)


def rows_sha256(examples) -> str:
    """sha256 of the ids and token ids of `examples`, in order: which rows a run trains on, and in which order."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.row_id, tokens_sha256(ex)]).encode() + b"\n")
    return h.hexdigest()


def split_held_out(examples, eval_size, seed):
    """(train, held_out): a seeded random held-out slice. Rows with the same token ids fall on the same side (a
    held-out row's copy in the training split would make the held-out figures optimistic)."""
    n = len(examples)
    count = int(eval_size) if eval_size >= 1 else int(n * eval_size)
    count = min(count, 256, max(0, n - 1))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    keys = [tokens_sha256(e) for e in examples] if count else []
    copies = {}
    for i, key in enumerate(keys):
        copies.setdefault(key, []).append(i)
    held = set()
    for i in order[: n if count else 0]:
        group = copies[keys[i]]
        if i not in held and len(held) + len(group) <= count:  # a group too big for what is left stays in training
            held.update(group)
        if len(held) == count:
            break
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def label_counts(examples, vocab_size: int, labels: str = "data", target=None) -> torch.Tensor:
    """(vocab_size,) counts of the labels trained on at supervised positions: the tokens themselves (`labels`
    "data"), else the target's labels (`target_labels`: a stored row's own, else from a forward of `target`)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ex in examples:
        if labels == "data":
            supervised = ex.input_ids
        elif hasattr(ex, "store"):  # a features.StoredRef
            supervised = ex.labels
        else:
            ids = ex.input_ids[None].to(next(target.parameters()).device)
            with torch.no_grad():
                supervised = target_labels(ids, target(input_ids=ids).logits)[0].cpu()
        counts += torch.bincount(supervised[ex.loss_mask.bool()], minlength=vocab_size)[:vocab_size]
    return counts


def anchor_generator(seed, epoch, index):
    """A generator that depends only on (seed, epoch, example): anchors replay identically after a resume."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_033 + index)


def collate(items, block_size, max_anchors, seed, epoch, hidden_size=None):
    """Right-padded batch. items: (index, Example) or (index, rollout dict) for the ReTrace stage."""
    width = max(int(it["input_ids"].numel()) if isinstance(it, dict) else it.input_ids.numel() for _, it in items)
    bsz = len(items)
    input_ids = torch.zeros(bsz, width, dtype=torch.long)
    loss_mask = torch.zeros(bsz, width, dtype=torch.bool)
    anchors, rounds = [], []
    for i, (index, item) in enumerate(items):
        g = anchor_generator(seed, epoch, index)
        if isinstance(item, dict):  # ReTrace rollout
            ids, mask = item["input_ids"], item["loss_mask"]
            chosen = torch.arange(item["anchors"].numel())
            if chosen.numel() > max_anchors:
                chosen = torch.randperm(chosen.numel(), generator=g)[:max_anchors].sort().values
            anchors.append(item["anchors"][chosen])
            rounds.append((item, chosen))
        else:
            ids, mask = item.input_ids, item.loss_mask
            anchors.append(sample_anchors(mask, max_anchors, generator=g))
        input_ids[i, : ids.numel()] = ids
        loss_mask[i, : ids.numel()] = mask
    anchors = pad_anchors(anchors)
    memory = None
    if hidden_size is not None:  # ReTrace: memory aligned to the query stream, zeros/invalid where absent
        q = anchors.shape[1] * block_size
        m = torch.zeros(bsz, q, hidden_size)
        u = torch.zeros(bsz, q, hidden_size)
        valid = torch.zeros(bsz, q, dtype=torch.bool)
        for i, (item, chosen) in enumerate(rounds):
            memory_rows = item["memory_index"][chosen]  # (n,) row of the stored memory, -1: the round had none
            for j, row in enumerate(memory_rows.tolist()):
                if row >= 0:
                    sl = slice(j * block_size, (j + 1) * block_size)
                    m[i, sl], u[i, sl] = item["m"][row].float(), item["u"][row].float()
                    valid[i, sl] = item["valid"][row]
        memory = ReTraceMemory(drafter_states=m, target_states=u, valid=valid)
    return input_ids, loss_mask, anchors, memory


def epoch_batches(num_examples, epoch, seed, batch_size, rank, world):
    """This process's micro-batches (lists of example indices) for one epoch; equal counts on every process."""
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per_step = batch_size * world
    return [order[s + rank * batch_size : s + (rank + 1) * batch_size]
            for s in range(0, num_examples // per_step * per_step, per_step)]
