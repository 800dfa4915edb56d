"""Target feature store: run the frozen target once over the training rows, train the drafter many times.

A DFlash drafter reads hidden states of a few target layers. Computing them online re-runs the whole target on
every training step; the store computes them once (in the target's inference dtype, bf16 by default) and
memory-maps them. Per token it holds:

- the token id and whether it is supervised (a response token),
- the target's own next-token label (`target_labels`: the argmax after the true prefix, from the same forward),
- the hidden states of the stored layers (`hidden_states[i + 1]` for i in `layer_ids`), bf16, concatenated,
- optionally the target's top-k logits (ids int32, values fp16) for distillation.

Layout of `store/`: `manifest.json` (target, layer ids, hidden and vocabulary size, tokenizer, chat-template flag,
one entry per row with its shard, offset, length and the sha256 of its token ids) and per shard
`shard-NNNNN.<field>.npy` (plain `.npy`, read with `numpy.load(mmap_mode="r")`). Shards are written whole and the
manifest replaced atomically after each, so an interrupted build resumes where it stopped (rows already stored are
skipped; a resume with other build options, or whose data changed a stored row, is an error).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..config_cli import comma_ints, option
from ..configuration_dflash import default_target_layer_ids
from ..runtime import eos_token_ids, uses_chat_template
from .data import ids_sha256, load_rows, tokenize_rows
from .objective import target_labels

SCHEMA = "dflash-retrace/features/v1"
FIELDS = ("tokens", "loss_mask", "labels", "features")
TOPK_FIELDS = ("topk_ids", "topk_logits")


@dataclass
class FeaturesConfig:
    """What `dflash-retrace features` stores; the CLI is generated from these fields."""

    layers: list | None = option(None, "target layers to store, comma-separated (default: DFlash's rule for 5 "
                                       "features plus the last layer)", type=comma_ints)
    top_k: int = option(0, "also store the target's top-k logits per token (ids and fp16 values, for distillation)")
    max_length: int = option(3072, "tokens per sequence (prompt + response), truncated beyond")
    chat_template: bool = option(True, "render prompts with the tokenizer's chat template, as generation does")
    enable_thinking: bool = option(False, "pass enable_thinking=True to Qwen3-style templates")
    shard_tokens: int = option(1 << 17, "tokens per shard (the unit of resumption)")
    limit: int | None = option(None, "only the first N rows")
    progress: bool = option(True, "progress bar")


def default_store_layers(num_target_layers: int) -> list:
    """DFlash's rule for five features, plus the last decoder layer."""
    return sorted(set(default_target_layer_ids(num_target_layers, 5)) | {num_target_layers - 1})


def build_features(target, tokenizer, data, out_dir, config: FeaturesConfig | None = None, meta: dict | None = None):
    """Tokenizes `data` (rows as `train` reads them) and writes or resumes the feature store in `out_dir`."""
    cfg = config or FeaturesConfig()
    rows = load_rows(data)[: cfg.limit]
    examples = tokenize_rows(rows, tokenizer, cfg.max_length, cfg.chat_template, cfg.enable_thinking,
                             eos_token_ids(target, tokenizer))
    layers = cfg.layers or default_store_layers(target.config.get_text_config().num_hidden_layers)
    meta = {"data": str(data), "chat_template": cfg.chat_template, "enable_thinking": cfg.enable_thinking,
            "max_length": cfg.max_length, "target_dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
            "tokenizer": getattr(tokenizer, "name_or_path", None), **(meta or {})}
    return build_feature_store(target, examples, out_dir, layers, cfg.top_k, cfg.shard_tokens, meta, cfg.progress)


def _model_name(name) -> str:
    """The repo or folder name of a model given by Hub id, local folder, registry name or Hub cache snapshot,
    lowercased: a local copy of a Hub repo compares equal to its id."""
    path = Path(str(name))
    parts = (path.resolve() if path.exists() else path).parts  # "." or "../x": the folder's own name
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1].lower()
    return parts[-1].lower() if parts else ""


def _differing(recorded: dict, wanted: dict) -> dict:
    """{key: (recorded, wanted)} for the keys whose values both dicts know (present, not None or "") and that
    differ; model names (`target`, `tokenizer`) compare by `_model_name`."""
    def same(k, a, b):
        return _model_name(a) == _model_name(b) if k in ("target", "tokenizer") else a == b

    return {k: (recorded[k], b) for k, b in wanted.items()
            if recorded.get(k) not in (None, "") and b not in (None, "") and not same(k, recorded[k], b)}


def _check_stored_rows(manifest: dict, examples, out_dir) -> None:
    """Raises if a row of `examples` that the store already holds (by id) has other token ids than it had."""
    stored = {row["id"]: row["sha256"] for row in manifest["rows"]}
    changed = [e.row_id for e in examples if e.row_id in stored and ids_sha256(e.input_ids) != stored[e.row_id]]
    if changed:
        raise ValueError(
            f"{len(changed)} row(s) of the data have other tokens than the rows stored under the same id in {out_dir} "
            f"(ids {changed[:5]}): the data changed since the store was built (rows inserted, removed or edited; rows "
            "without an `id` are named by their index). Rebuild into a new --out.")


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
    build = {"layer_ids": layer_ids, "hidden_size": hidden, "vocab_size": target.config.get_text_config().vocab_size,
             "top_k": top_k, **(meta or {})}
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        # Every recorded build option but the data file's name (the rows themselves are compared below).
        differ = _differing(manifest, {k: v for k, v in build.items() if k != "data"})
        if differ:
            raise ValueError(
                f"{out_dir} holds a store built with "
                + ", ".join(f"{k}={a!r} (this build: {b!r})" for k, (a, b) in differ.items())
                + ": resuming would mix rows built two ways. Use another --out, or the same options as the store was "
                "built with to resume it.")
        _check_stored_rows(manifest, examples, out_dir)
    else:
        manifest = {"schema": SCHEMA, **build, "feature_dtype": "bfloat16", "num_tokens": 0, "shards": [], "rows": []}
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
                                     "sha256": ids_sha256(e.input_ids)})
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
        self.rows = self.manifest["rows"]
        self._shards: dict = {}
        self.select_layers(layer_ids)

    def select_layers(self, layer_ids=None) -> "FeatureStore":
        """Rows give the features of `layer_ids` (stored layers, any order; None: all); a clear error otherwise."""
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
        return self

    def __len__(self) -> int:
        return len(self.rows)

    def _shard(self, index: int) -> dict:
        if index not in self._shards:
            name = self.manifest["shards"][index]["name"]
            fields = FIELDS + (TOPK_FIELDS if self.manifest["top_k"] else ())
            self._shards[index] = {f: np.load(self.path / f"{name}.{f}.npy", mmap_mode="r") for f in fields}
        return self._shards[index]

    def field(self, i: int, name: str) -> np.ndarray:
        """One stored field of row i (a copy): tokens, loss_mask, labels, features, topk_ids, topk_logits."""
        row = self.rows[i]
        return np.array(self._shard(row["shard"])[name][row["offset"] : row["offset"] + row["length"]])

    def __getitem__(self, i: int) -> StoredRow:
        feats = torch.from_numpy(self.field(i, "features")).view(torch.bfloat16)
        if not self._all:
            feats = feats[:, self._columns]
        topk = {}
        if self.manifest["top_k"]:
            topk = {"topk_ids": torch.from_numpy(self.field(i, "topk_ids")).long(),
                    "topk_logits": torch.from_numpy(self.field(i, "topk_logits"))}
        return StoredRow(input_ids=torch.from_numpy(self.field(i, "tokens")).long(),
                         loss_mask=torch.from_numpy(self.field(i, "loss_mask")),
                         labels=torch.from_numpy(self.field(i, "labels")).long(),
                         features=feats, row_id=self.rows[i]["id"], **topk)


class StoredRef:
    """A stored row by reference: ids, mask and labels read when asked, features only by `features`."""

    def __init__(self, store: FeatureStore, index: int):
        self.store, self.index = store, index
        self.row_id = store.rows[index]["id"]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.from_numpy(self.store.field(self.index, "tokens")).long()

    @property
    def loss_mask(self) -> torch.Tensor:
        return torch.from_numpy(self.store.field(self.index, "loss_mask"))

    @property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(self.store.field(self.index, "labels")).long()

    @property
    def features(self) -> torch.Tensor:
        return self.store[self.index].features

    @property
    def prompt_length(self) -> int:
        supervised = self.loss_mask.nonzero()
        return int(supervised[0]) if supervised.numel() else int(self.store.rows[self.index]["length"])


class StoredRows:
    """The rows of one or more stores, in order, as a sequence of `StoredRef`s (what the training loop splits and
    batches). Several stores must be built alike and share no row (`open_stores` checks both)."""

    def __init__(self, stores):
        self.stores = [stores] if isinstance(stores, FeatureStore) else list(stores)
        self._ends = np.cumsum([len(s) for s in self.stores]).tolist()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: int) -> StoredRef:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        k = int(np.searchsorted(self._ends, i, side="right"))
        return StoredRef(self.stores[k], i - (self._ends[k - 1] if k else 0))


def stored_features(items, width: int, device) -> tuple:
    """(features (b, width, n*H), labels (b, width)) of a micro-batch of `(index, StoredRef)`, right-padded."""
    rows = [ref.store[ref.index] for _, ref in items]
    features = torch.zeros(len(rows), width, rows[0].features.shape[-1], dtype=rows[0].features.dtype)
    labels = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        features[i, : row.features.shape[0]] = row.features
        labels[i, : row.labels.numel()] = row.labels
    return features.to(device), labels.to(device)


_BUILD_KEYS = ("target", "layer_ids", "hidden_size", "vocab_size", "tokenizer", "chat_template", "enable_thinking",
               "target_dtype")


def _check_built_alike(train_store: FeatureStore, other: FeatureStore, role: str, keys=_BUILD_KEYS) -> None:
    """Raises if the two manifests record different values for some key of `keys` (one unrecorded: unknown)."""
    differ = _differing(train_store.manifest, {k: other.manifest.get(k) for k in keys})
    if differ:
        raise ValueError(f"The {role} {other.path} was not built like the training store {train_store.path}: "
                         + ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in differ.items())
                         + ". Build it with the same `dflash-retrace features` options.")


def _shared_rows(stores, other: FeatureStore) -> list:
    """Ids of the rows of `other` that some store of `stores` also holds (same id or same token ids)."""
    hashes = {row["sha256"] for s in stores for row in s.rows}
    ids = {row["id"] for s in stores for row in s.rows}
    return [row["id"] for row in other.rows if row["sha256"] in hashes or row["id"] in ids]


def open_stores(spec: str) -> list:
    """The feature stores of `spec`, one folder or several comma-separated (trained on as one, in order): built
    alike (same target, tokenizer, rendering, layers and top-k) and sharing no row, else a clear error."""
    stores = [FeatureStore(path.strip()) for path in str(spec).split(",") if path.strip()]
    if not stores:
        raise ValueError(f"No feature store folder in {spec!r}: give one, or several comma-separated.")
    for k, store in enumerate(stores[1:], start=1):
        _check_built_alike(stores[0], store, "feature store", _BUILD_KEYS + ("top_k",))
        shared = _shared_rows(stores[:k], store)
        if shared:
            raise ValueError(f"{len(shared)} row(s) of the feature store {store.path} are also in an earlier store of "
                             f"{spec!r} (ids {shared[:5]}): each row would be trained on twice. Drop that store, or "
                             "rebuild it without those rows.")
    return stores


def check_stores_for_run(stores, target, tokenizer, config) -> None:
    """Raises if a store was built from another target than `target` (its name, hidden size, vocabulary, tokenizer)
    or renders prompts otherwise than `config` (`chat_template`, `enable_thinking`, as the tokenizer applies them:
    without a chat template, both render raw text). What a manifest does not record is not compared."""
    text_config = target.config.get_text_config()
    name = getattr(target, "name_or_path", None) or None
    templated = config.chat_template if tokenizer is None else uses_chat_template(tokenizer, config.chat_template)
    run = {"target": name, "hidden_size": text_config.hidden_size, "vocab_size": text_config.vocab_size,
           "tokenizer": getattr(tokenizer, "name_or_path", None) or None, "chat_template": templated,
           "enable_thinking": config.enable_thinking if templated else None}
    for store in {id(s): s for s in stores}.values():
        recorded = dict(store.manifest)
        if tokenizer is not None and recorded.get("chat_template") is not None:
            recorded["chat_template"] = uses_chat_template(tokenizer, recorded["chat_template"])
        if not recorded.get("chat_template"):
            recorded["enable_thinking"] = None  # no effect without a chat template
        differ = _differing(recorded, run)
        if differ:
            flags = " --no-chat-template" * (not config.chat_template) + " --enable-thinking" * config.enable_thinking
            raise ValueError(
                f"The feature store {store.path} was not built for this run: "
                + ", ".join(f"{k} {a!r} (this run: {b!r})" for k, (a, b) in differ.items())
                + ". Train with the target and prompt options it was built with (its manifest.json), or rebuild it "
                f"for this run: `dflash-retrace features --target {name or 'TARGET'} --data ROWS --out NEW_STORE"
                f"{flags}`.")


def held_out_rows(train_stores: list, path, eval_size: float = 0) -> list:
    """The rows of the store at `path` as a held-out set for a run on `train_stores` (`open_stores`; every row, at
    most 256; `eval_size` >= 1 caps the count). It must come from the same target, tokenizer,
    prompt rendering and layers, and share no row with them: a held-out row the run also trains on would make
    every held-out figure optimistic."""
    held = FeatureStore(path)
    _check_built_alike(train_stores[0], held, "held-out store")
    shared = _shared_rows(train_stores, held)
    if shared:
        raise ValueError(f"{len(shared)} held-out row(s) of {held.path} are also in the training store(s) "
                         f"{', '.join(str(s.path) for s in train_stores)} (ids {shared[:5]}): a held-out split must "
                         "be disjoint from the rows trained on. Rebuild one of the stores without them.")
    count = min(len(held), 256, int(eval_size) if eval_size >= 1 else len(held))
    return [StoredRef(held, i) for i in range(count)]


def stored_soft_targets(items, width: int, device) -> tuple:
    """The target's stored top-k (ids (b, width, k), logits (b, width, k) float) of a micro-batch, aligned to label
    positions as `labels` are: position j gets the top-k the target gave after j-1 tokens (the store keeps them
    at j-1). Position 0 and padding get logits -inf (no soft target)."""
    store = items[0][1].store
    if not store.manifest["top_k"]:
        raise ValueError(f"The feature store {store.path} holds no top-k logits, which distillation (--distill) reads: "
                         "rebuild it with `dflash-retrace features --top-k 16` (or train with --distill 0).")
    k = store.manifest["top_k"]
    ids = torch.zeros(len(items), width, k, dtype=torch.long)
    logits = torch.full((len(items), width, k), float("-inf"))
    for i, (_, ref) in enumerate(items):
        row_ids = torch.from_numpy(ref.store.field(ref.index, "topk_ids")).long()
        n = row_ids.shape[0]
        ids[i, 1:n] = row_ids[: n - 1]
        logits[i, 1:n] = torch.from_numpy(ref.store.field(ref.index, "topk_logits")[: n - 1]).float()
    return ids.to(device), logits.to(device)
