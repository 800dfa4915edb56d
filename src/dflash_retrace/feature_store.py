"""Target feature store: run the frozen target once over the training rows, train the drafter many times.

A DFlash drafter reads hidden states of a few target layers. Computing them online re-runs the whole target on
every training step; the store computes them once (in the target's inference dtype, bf16 by default) and
memory-maps them. Per token it holds:

- the token id and whether it is supervised (a response token),
- the target's own next-token label (`target_labels`: the argmax after the true prefix, from the same forward),
- the hidden states of the stored layers (`hidden_states[i + 1]` for i in `layer_ids`), bf16, concatenated,
- optionally the target's top-k logits (ids int32, values fp16) for distillation.

Layout of `store/`: `manifest.json` (target, layer ids, hidden size, tokenizer, chat-template flag, one entry
per row with its shard, offset, length and the sha256 of its token ids) and per shard `shard-NNNNN.<field>.npy`
(plain `.npy`, read with `numpy.load(mmap_mode="r")`). Shards are written whole and the manifest replaced
atomically after each, so an interrupted build resumes where it stopped (rows already stored are skipped).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .training_core import target_labels

SCHEMA = "dflash-retrace/features/v1"
FIELDS = ("tokens", "loss_mask", "labels", "features")
TOPK_FIELDS = ("topk_ids", "topk_logits")


def _ids_sha256(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int32).numpy().tobytes()).hexdigest()


def bytes_per_token(num_layers: int, hidden_size: int, top_k: int = 0) -> int:
    """Disk bytes per stored token: bf16 features, int32 token and label, bool mask, top-k ids and fp16 values."""
    return num_layers * hidden_size * 2 + 4 + 4 + 1 + top_k * (4 + 2)


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    tmp = out_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out_dir / "manifest.json")


@torch.no_grad()
def _target_pass(target, ids: torch.Tensor, layer_ids, top_k: int):
    """(features (T, n*H) bf16, labels (T,), top-k ids/logits or None) for one sequence."""
    device = next(target.parameters()).device
    out = target(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1).to(torch.bfloat16).cpu()
    labels = target_labels(ids[None].to(device), out.logits)[0].cpu()
    topk = None
    if top_k:
        values, index = out.logits[0].float().topk(top_k, dim=-1)
        topk = (index.to(torch.int32).cpu(), values.to(torch.float16).cpu())
    return feats, labels, topk


def build_feature_store(target, examples, out_dir, layer_ids, top_k: int = 0, shard_tokens: int = 1 << 17,
                        meta: dict | None = None, progress: bool = True) -> dict:
    """Writes (or resumes) a feature store of `examples` (objects with `input_ids`, `loss_mask`, `row_id`).

    `layer_ids`: target decoder layers to store (a drafter may read any subset of them). `meta`: recorded in
    the manifest (target name, tokenizer, chat-template flag, data file). Returns the manifest.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layer_ids = [int(i) for i in layer_ids]
    hidden = target.config.get_text_config().hidden_size
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest["layer_ids"] != layer_ids or manifest["top_k"] != top_k:
            raise ValueError(
                f"{out_dir} holds a store with layer_ids={manifest['layer_ids']}, top_k={manifest['top_k']}; "
                f"asked for layer_ids={layer_ids}, top_k={top_k}. Use another --out folder, or the same settings "
                "to resume it.")
    else:
        manifest = {"schema": SCHEMA, "layer_ids": layer_ids, "hidden_size": hidden, "top_k": top_k,
                    "feature_dtype": "bfloat16", "num_tokens": 0, "shards": [], "rows": [], **(meta or {})}
    done = {row["id"] for row in manifest["rows"]}
    todo = [e for e in examples if e.row_id not in done]
    per_token = bytes_per_token(len(layer_ids), hidden, top_k)
    new_tokens = sum(int(e.input_ids.numel()) for e in todo)
    print(f"[features] {len(todo)} rows to store ({len(done)} already stored), {new_tokens:,} tokens, "
          f"{per_token:,} bytes/token: {new_tokens * per_token / 2**30:.2f} GiB on disk in {out_dir}", flush=True)
    target.eval()
    buffer: list = []

    def flush():
        if not buffer:
            return
        shard = len(manifest["shards"])
        name = f"shard-{shard:05d}"
        offset = 0
        for e, *_ in buffer:
            n = int(e.input_ids.numel())
            manifest["rows"].append({"id": e.row_id, "shard": shard, "offset": offset, "length": n,
                                     "sha256": _ids_sha256(e.input_ids)})
            offset += n
        arrays = {
            "tokens": torch.cat([e.input_ids for e, *_ in buffer]).to(torch.int32).numpy(),
            "loss_mask": torch.cat([e.loss_mask for e, *_ in buffer]).bool().numpy(),
            "labels": torch.cat([lab for _, _, lab, _ in buffer]).to(torch.int32).numpy(),
            "features": torch.cat([f for _, f, _, _ in buffer]).view(torch.int16).numpy(),
        }
        if top_k:
            arrays["topk_ids"] = torch.cat([t[0] for *_, t in buffer]).numpy()
            arrays["topk_logits"] = torch.cat([t[1] for *_, t in buffer]).numpy()
        for field, array in arrays.items():
            _save_npy(out_dir / f"{name}.{field}.npy", array)
        manifest["shards"].append({"name": name, "num_tokens": offset})
        manifest["num_tokens"] += offset
        _write_manifest(out_dir, manifest)
        buffer.clear()

    start = time.perf_counter()
    pending = 0
    for e in tqdm(todo, desc="features", unit="row", disable=not progress):
        feats, labels, topk = _target_pass(target, e.input_ids, layer_ids, top_k)
        buffer.append((e, feats, labels, topk))
        pending += int(e.input_ids.numel())
        if pending >= shard_tokens:
            flush()
            pending = 0
    flush()
    manifest.setdefault("build_seconds", 0.0)
    manifest["build_seconds"] += time.perf_counter() - start
    _write_manifest(out_dir, manifest)
    return manifest


@dataclass
class StoredRow:
    """One stored sequence: token ids, supervision mask, the target's labels and context features."""

    input_ids: torch.Tensor  # (T,) long
    loss_mask: torch.Tensor  # (T,) bool
    labels: torch.Tensor  # (T,) long: the target's argmax next token after the true prefix
    features: torch.Tensor  # (T, n*H) bf16: the asked layers, concatenated in the asked order
    row_id: str = ""
    topk_ids: torch.Tensor | None = None
    topk_logits: torch.Tensor | None = None


class FeatureStore:
    """Read side of a store: `store[i]` is a `StoredRow` with the features of `layer_ids` (a subset of the
    stored layers, in any order; default: all of them)."""

    def __init__(self, path, layer_ids=None):
        self.path = Path(path)
        manifest_path = self.path / "manifest.json"
        if not manifest_path.exists():
            raise FileNotFoundError(f"{self.path} is not a feature store (no manifest.json): build one with "
                                    "`dflash-retrace features --target T --data rows.jsonl --out DIR`.")
        self.manifest = json.loads(manifest_path.read_text())
        stored = self.manifest["layer_ids"]
        self.layer_ids = list(stored if layer_ids is None else layer_ids)
        missing = [i for i in self.layer_ids if i not in stored]
        if missing:
            raise ValueError(
                f"The drafter reads target layers {self.layer_ids}, but the feature store {self.path} holds layers "
                f"{stored} (missing {missing}). Build a store with those layers (`dflash-retrace features "
                f"--layers {','.join(map(str, self.layer_ids))}`) or train without --features (online features).")
        H = self.manifest["hidden_size"]
        self._columns = torch.cat([torch.arange(stored.index(i) * H, (stored.index(i) + 1) * H)
                                   for i in self.layer_ids])
        self._all = self.layer_ids == stored
        self._shards: dict = {}
        self.rows = self.manifest["rows"]

    def __len__(self) -> int:
        return len(self.rows)

    def _shard(self, index: int) -> dict:
        if index not in self._shards:
            name = self.manifest["shards"][index]["name"]
            fields = FIELDS + (TOPK_FIELDS if self.manifest["top_k"] else ())
            self._shards[index] = {f: np.load(self.path / f"{name}.{f}.npy", mmap_mode="r") for f in fields}
        return self._shards[index]

    def __getitem__(self, i: int) -> StoredRow:
        row = self.rows[i]
        shard = self._shard(row["shard"])
        s = slice(row["offset"], row["offset"] + row["length"])
        feats = torch.from_numpy(np.array(shard["features"][s])).view(torch.bfloat16)
        if not self._all:
            feats = feats[:, self._columns]
        topk = {}
        if self.manifest["top_k"]:
            topk = {"topk_ids": torch.from_numpy(np.array(shard["topk_ids"][s])).long(),
                    "topk_logits": torch.from_numpy(np.array(shard["topk_logits"][s]))}
        return StoredRow(
            input_ids=torch.from_numpy(np.array(shard["tokens"][s])).long(),
            loss_mask=torch.from_numpy(np.array(shard["loss_mask"][s])),
            labels=torch.from_numpy(np.array(shard["labels"][s])).long(),
            features=feats, row_id=row["id"], **topk,
        )

    def token_counts(self, vocab_size: int, indices=None) -> torch.Tensor:
        """(vocab_size,) counts of the target's labels on supervised positions (for a draft vocabulary)."""
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for i in (range(len(self)) if indices is None else indices):
            row = self.rows[i]
            shard = self._shard(row["shard"])
            s = slice(row["offset"], row["offset"] + row["length"])
            labels = torch.from_numpy(np.array(shard["labels"][s])).long()
            mask = torch.from_numpy(np.array(shard["loss_mask"][s]))
            counts += torch.bincount(labels[mask], minlength=vocab_size)
        return counts
