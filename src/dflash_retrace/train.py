"""Train DFlash drafters (stage "dflash") and their ReTrace conditioner (stage "retrace"), optionally with LoRA.

    train_drafter(target, tokenizer, data, out_dir, TrainConfig(stage="dflash")) -> drafter

Built on `accelerate`: `torchrun --nproc_per_node N -m dflash_retrace.cli train ...` (or `accelerate launch -m
dflash_retrace.cli train ...`) gives DDP; mixed precision, gradient accumulation and checkpoint/resume
(`save_state`/`load_state`) come from it. Each process trains on its own micro-batches of whole sequences.

DFlash stage (the DFlash paper's recipe), per sequence: up to `max_anchors` random anchors among response
positions; blocks `[x_p, MASK x K]`; a block sees target features strictly before its anchor and its own
block; slot k predicts x_{p+k}; CE weighted exp(-(k-1)/gamma). The target is frozen and outside the
optimizer (its embedding and LM head are borrowed, never trained); its features are computed online.

ReTrace stage (equations in the README's ReTrace section): from a DFlash drafter, `add_retrace()` (W_v = 0: step 0 is the DFlash
drafter exactly). Real draft-verify rollouts with the project's generator (`record_rounds`) on the
training prompts record each round's anchor and the memory that entered it; training replays every
round as a block anchored there with that memory (detached), DFlash loss on the committed continuation.
Rounds without memory are plain DFlash blocks. `beta` ramps 0 -> 1 over `beta_warmup` updates.

Output folder: the drafter (`save_pretrained`: weights, config with auto_map, payload code) or, with
LoRA, the adapter (+ `base/` when the base drafter exists nowhere else); `summary.json`;
`train_config.json`; `train_log.jsonl`; `checkpoints/step-N` (accelerate state, resumed from the latest
with `resume=True`); for ReTrace, `rollouts/` (one file per training sequence, reused on resume; every
process reads all of them, so multi-node runs need `out_dir` on a shared filesystem).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .modeling_dflash import DFlashDrafter, ReTraceMemory
from .regenerate import add_cli as add_regenerate_cli
from .regenerate import encode_prompt, load_rows, load_target, prompt_messages
from .training_core import (
    cosine_lr, dflash_block_loss, drafter_core, pad_anchors, sample_anchors, target_features, vocab_rows,
)

__all__ = ["Example", "LORA_TARGETS", "STAGE_DEFAULTS", "TrainConfig", "evaluate_slots", "latest_checkpoint",
           "measure_acceptance", "register_cli", "tokenize_rows", "train_drafter"]

STAGE_DEFAULTS = {
    # DFlash recipe (SpecForge / AngelSlim): AdamW 6e-4, cosine, 4% warm-up, 6 epochs.
    "dflash": {"lr": 6e-4, "epochs": 6, "warmup_ratio": 0.04},
    # ReTrace recipe (re-implementation of the paper's appendix): 5e-5, cosine, 5% warm-up, 8 epochs.
    "retrace": {"lr": 5e-5, "epochs": 8, "warmup_ratio": 0.05},
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "fc"]


@dataclass
class TrainConfig:
    """Every knob of `train_drafter`; `None` means the stage's default (STAGE_DEFAULTS)."""

    stage: str = "dflash"  # "dflash" or "retrace" (needs a DFlash drafter: `init` or `drafter=`)
    init: str | None = None  # drafter folder to start from; None: a fresh drafter (dflash stage only)
    # Shape of a fresh drafter.
    # 1 anchor + B-1 proposal slots; None: 16 (as the published drafters) for a fresh drafter, the `init`
    # drafter's own otherwise. Set with `init`, it re-targets that drafter (its weights do not depend on B).
    block_size: int | None = None
    num_layers: int = 1  # drafter decoder layers (published: 5 for Qwen3-4B/8B)
    num_target_features: int | None = None  # target layers fused by `fc` (default: one per drafter layer)
    target_layer_ids: list | None = None  # explicit target layers (overrides num_target_features)
    mask_token_id: int | None = None  # default: the last row of the target's embedding
    # Data.
    max_length: int = 3072  # tokens per sequence (prompt + response), truncated beyond
    max_anchors: int = 512  # blocks per sequence (random anchors; ReTrace: replayed rounds)
    # Softmax of the loss: "full" vocabulary, or "data": the tokens of the training sequences (prompts and
    # responses) plus EOS, which makes the LM head (most of a CPU step) cheaper. Held-out metrics and
    # inference always use the full vocabulary.
    loss_vocab: str = "full"
    # Labels: "data": the sequence's own tokens (right for `regenerate` output); "target": the target's argmax
    # next token at each position, from the forward that computes the features (teacher-forced
    # self-distillation: on text the target did not write, each label is what the target would say there).
    labels: str = "data"
    chat_template: bool = True  # render prompts with the tokenizer's chat template, as generation does
    enable_thinking: bool = False  # for Qwen3-style templates
    eval_size: float = 0.05  # held-out rows: a fraction (< 1) or a count (>= 1), at most 256; 0 disables
    # Optimisation.
    epochs: int | None = None
    max_steps: int | None = None  # optimizer updates; overrides epochs
    batch_size: int = 1  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer update
    lr: float | None = None
    weight_decay: float = 0.01  # AdamW, on matrices only (not norms or biases)
    warmup_ratio: float | None = None
    max_grad_norm: float = 1.0
    gamma: float | None = None  # slot-weight decay; None: 7 for B=16, 4 for B=8 (scaled with B otherwise)
    mixed_precision: str = "no"  # accelerate: "no", "bf16", "fp16" (fp32 master weights either way)
    attention: str = "auto"  # "dense" bool mask; "flex" BlockMask (CUDA); "auto": flex if the drafter uses it
    seed: int = 0
    # ReTrace stage.
    beta_warmup: int = 50  # updates for beta to ramp 0 -> 1
    freeze_backbone: bool = False  # train the ReTrace weights only
    # LoRA (PEFT) on the drafter's attention, MLP and fc.
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    # Checkpoints, logging, evaluation.
    checkpoint_every: int = 500  # updates between `checkpoints/step-N`; 0 disables
    keep_checkpoints: int = 2  # newest checkpoints kept
    resume: bool = False  # continue from the newest checkpoint in out_dir
    log_every: int = 10
    report_to: str | None = None  # accelerate trackers ("tensorboard", "wandb", ...)
    progress: bool = True
    eval_prompts: int = 16  # held-out prompts for the τ estimate
    eval_max_new_tokens: int = 256
    save_dtype: str | None = None  # default: the target's dtype (the drafter runs with it)

    def resolved(self) -> "TrainConfig":
        if self.stage not in STAGE_DEFAULTS:
            raise ValueError(f"stage must be one of {sorted(STAGE_DEFAULTS)}, got {self.stage!r}.")
        if self.labels not in ("data", "target"):
            raise ValueError(f"labels must be 'data' or 'target', got {self.labels!r}.")
        if self.loss_vocab not in ("full", "data"):
            raise ValueError(f"loss_vocab must be 'full' or 'data', got {self.loss_vocab!r}.")
        if self.attention not in ("auto", "dense", "flex"):
            raise ValueError(f"attention must be 'auto', 'dense' or 'flex', got {self.attention!r}.")
        filled = {k: v for k, v in STAGE_DEFAULTS[self.stage].items() if getattr(self, k) is None}
        return dataclasses.replace(self, **filled)


@dataclass
class Example:
    """One tokenized training sequence; the response starts at `prompt_length`."""

    input_ids: torch.Tensor  # (T,) long
    loss_mask: torch.Tensor  # (T,) bool, True on response tokens
    prompt_length: int
    row_id: str = ""


# ------------------------------------------------------------------------------------ data
def tokenize_rows(rows, tokenizer, max_length=3072, chat_template=True, enable_thinking=False, eos_token_id=None):
    """Rows -> Examples. A row is chat `messages` (the last turn is the assistant's response), `prompt` +
    `response`, or pre-tokenized `input_ids` + `loss_mask`.

    The prompt is encoded exactly as generation encodes it (`regenerate.encode_prompt`); the response is
    tokenized on its own and followed by `eos_token_id` unless the row says `finish_reason: "length"` (the
    target emitted that EOS, so the drafter learns to propose it).
    """
    examples = []
    for index, row in enumerate(rows):
        row_id = str(row.get("id", index))
        where = f"data row {row_id}"
        if "input_ids" in row:
            ids = torch.as_tensor(row["input_ids"], dtype=torch.long).view(-1)
            if "loss_mask" not in row:
                raise ValueError(f"{where}: pre-tokenized rows need `loss_mask` (1 on response tokens) "
                                 "with `input_ids`.")
            mask = torch.as_tensor(row["loss_mask"]).view(-1).bool()
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
            if eos_token_id is not None and row.get("finish_reason") != "length":
                response_ids = response_ids + [eos_token_id]
            ids = torch.tensor(prompt_ids + response_ids, dtype=torch.long)
            mask = torch.zeros(ids.numel(), dtype=torch.bool)
            mask[len(prompt_ids):] = True
            prompt_length = len(prompt_ids)
        examples.append(Example(ids[:max_length], mask[:max_length], min(prompt_length, max_length), row_id))
    return examples


def _split(examples, eval_size, seed):
    """(train, held_out): a seeded random held-out slice."""
    n = len(examples)
    count = int(eval_size) if eval_size >= 1 else int(n * eval_size)
    count = min(count, 256, max(0, n - 1))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = set(order[:count])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def _generator(seed, epoch, index):
    """A generator that depends only on (seed, epoch, example): anchors replay identically after a resume."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_033 + index)


def _collate(items, block_size, max_anchors, seed, epoch, hidden_size=None):
    """Right-padded batch. items: (index, Example) or (index, rollout dict) for the ReTrace stage."""
    width = max(int(it["input_ids"].numel()) if isinstance(it, dict) else it.input_ids.numel() for _, it in items)
    bsz = len(items)
    input_ids = torch.zeros(bsz, width, dtype=torch.long)
    loss_mask = torch.zeros(bsz, width, dtype=torch.bool)
    anchors, rounds = [], []
    for i, (index, item) in enumerate(items):
        g = _generator(seed, epoch, index)
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


def _epoch_batches(num_examples, epoch, seed, batch_size, rank, world):
    """This process's micro-batches (lists of example indices) for one epoch; equal counts on every process."""
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per_step = batch_size * world
    return [order[s + rank * batch_size : s + (rank + 1) * batch_size]
            for s in range(0, num_examples // per_step * per_step, per_step)]


# ----------------------------------------------------------------------------------- state
class TrainState:
    """Loop position, saved with every checkpoint (`accelerator.register_for_checkpointing`)."""

    def __init__(self):
        self.step = 0  # optimizer updates done
        self.epoch = 0
        self.updates_in_epoch = 0
        self.losses: list = []  # recent update losses (for the summary)

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch, "updates_in_epoch": self.updates_in_epoch,
                "losses": list(self.losses)}

    def load_state_dict(self, state):
        self.step, self.epoch = state["step"], state["epoch"]
        self.updates_in_epoch, self.losses = state["updates_in_epoch"], list(state["losses"])


def latest_checkpoint(out_dir) -> Path | None:
    root = Path(out_dir) / "checkpoints"
    steps = [(int(m.group(1)), p) for p in root.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    return max(steps)[1] if steps else None


def _rotate_checkpoints(out_dir, keep):
    root = Path(out_dir) / "checkpoints"
    steps = sorted((int(p.name.split("-")[1]), p) for p in root.glob("step-*") if p.name.split("-")[1].isdigit())
    for _, path in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------ drafter setup
def _load_init(init):
    """A trained drafter folder, or a config-only template (a `hub_configs/templates` folder or its name)."""
    from pathlib import Path

    from .hub import TEMPLATES, load_template_config

    folder = Path(str(init))
    has_weights = folder.is_dir() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")))
    if str(init) in TEMPLATES or (folder.is_dir() and not has_weights):
        return DFlashDrafter(load_template_config(init))  # template: the shape is set, weights start fresh
    return DFlashDrafter.from_pretrained(init)


def _build_drafter(target, cfg, drafter):
    if drafter is None and cfg.init is not None:
        drafter = _load_init(cfg.init)
    if drafter is None:
        if cfg.stage == "retrace":
            raise ValueError("The ReTrace stage starts from a trained DFlash drafter: pass `init` "
                             "(CLI: --init DRAFTER).")
        drafter = DFlashDrafter.from_target(
            target, num_hidden_layers=cfg.num_layers, block_size=cfg.block_size or 16,
            mask_token_id=cfg.mask_token_id, num_target_features=cfg.num_target_features,
            target_layer_ids=cfg.target_layer_ids,
        )
    elif cfg.block_size is not None and cfg.block_size != drafter.config.block_size:
        if cfg.block_size < 2:
            raise ValueError(f"block_size must be at least 2 (an anchor and one proposal), got {cfg.block_size}.")
        print(f"[train] block size {drafter.config.block_size} -> {cfg.block_size} (the weights do not depend on it)")
        drafter.config.block_size = cfg.block_size
    drafter.check_target(target)
    if cfg.stage == "retrace":
        drafter.add_retrace()
    return drafter.float()  # fp32 master weights; mixed precision only autocasts the compute


def _apply_lora(drafter, cfg):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=LORA_TARGETS,
        # The ReTrace conditioner is new in that stage: trained in full and saved with the adapter.
        modules_to_save=["retrace"] if cfg.stage == "retrace" else None,
    )
    return get_peft_model(drafter, lora)


def _set_beta(model, beta):
    for module in model.modules():  # every copy (PEFT's modules_to_save keeps the original and a trained one)
        if type(module).__name__ == "ReTraceConditioner":
            module.beta = beta


def _attention_kind(cfg, core, device):
    if cfg.attention == "flex" or (cfg.attention == "auto" and core.config._attn_implementation == "flex_attention"):
        if device.type != "cuda":
            raise ValueError("attention='flex' needs a CUDA device; use attention='dense' (the default) on CPU.")
        core.config._attn_implementation = "flex_attention"
        return "flex"
    return "dense"


# ---------------------------------------------------------------------------------- rollouts
@torch.no_grad()
def _rollouts(model, target, examples, indices, out_dir, store_dtype, progress):
    """Greedy draft-verify rollouts of `examples[i]` for i in indices, one file each under out_dir/rollouts.

    A file holds the committed sequence (prompt + the target's continuation), every round's anchor and,
    for rounds that received memory, that memory (slots aligned to the block, padded to B, slot 0 invalid).
    Existing files are kept (resume). Returns the acceptance lengths of all these rollouts' rounds.
    """
    core = drafter_core(model)
    B = core.config.block_size
    root = Path(out_dir) / "rollouts"
    root.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    core.record_rounds = True
    lengths = []
    try:
        for i in tqdm(indices, desc="rollouts", unit="seq", disable=not progress):
            path = root / f"{i:07d}.pt"
            if path.exists():  # rolled out before an interruption
                lengths += torch.load(path, weights_only=True)["acceptance_lengths"]
                continue
            ex = examples[i]
            prompt = ex.input_ids[: ex.prompt_length][None].to(target.device)
            new_tokens = int(ex.input_ids.numel() - ex.prompt_length)
            out = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=model,
                                  max_new_tokens=new_tokens, do_sample=False)
            stats = core.last_stats
            lengths += stats.acceptance_lengths
            ids = out[0].cpu()
            mask = torch.zeros(ids.numel(), dtype=torch.bool)
            mask[ex.prompt_length :] = True
            anchors, memory_index, ms, us, valids = [], [], [], [], []
            for r in stats.rounds:
                p = r["anchor_position"]
                if p < 1 or p + 1 >= ids.numel():  # no context or no label inside the sequence
                    continue
                anchors.append(p)
                mem = r["memory"]
                if mem is None or not bool(mem.valid.any()):
                    memory_index.append(-1)
                    continue
                memory_index.append(len(ms))
                L = mem.valid.shape[1]
                m = torch.zeros(B, mem.drafter_states.shape[-1], dtype=store_dtype)
                u = torch.zeros_like(m)
                v = torch.zeros(B, dtype=torch.bool)
                m[:L], u[:L], v[:L] = mem.drafter_states[0], mem.target_states[0], mem.valid[0]
                ms.append(m), us.append(u), valids.append(v)
            hidden = core.config.hidden_size
            partial = path.with_suffix(".partial")  # renamed when complete: an interrupted write leaves no .pt
            torch.save({
                "input_ids": ids, "loss_mask": mask, "anchors": torch.tensor(anchors, dtype=torch.long),
                "memory_index": torch.tensor(memory_index, dtype=torch.long),
                "m": torch.stack(ms) if ms else torch.zeros(0, B, hidden, dtype=store_dtype),
                "u": torch.stack(us) if us else torch.zeros(0, B, hidden, dtype=store_dtype),
                "valid": torch.stack(valids) if valids else torch.zeros(0, B, dtype=torch.bool),
                "acceptance_lengths": list(stats.acceptance_lengths),
            }, partial)
            partial.replace(path)
    finally:
        core.record_rounds = False
        model.train(was_training)
    return lengths


class _RolloutStore:
    """Lazily loaded rollout files, indexable like the example list."""

    def __init__(self, out_dir, indices):
        self.root = Path(out_dir) / "rollouts"
        self.indices = list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, k):
        return torch.load(self.root / f"{self.indices[k]:07d}.pt", weights_only=True)


# -------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def measure_acceptance(target, drafter, prompts, max_new_tokens=256) -> dict:
    """τ (bonus included) of `drafter` on `prompts` (list of (1, T) id tensors) with the real generator, greedy.

    Returns the pooled mean over all rounds (`tau`), the mean of per-prompt means (`tau_per_prompt`),
    the number of rounds, the tokens generated and the slots that received ReTrace memory.
    """
    core = drafter_core(drafter)
    device = next(target.parameters()).device
    lengths, per_prompt, tokens, conditioned = [], [], 0, 0
    for prompt in prompts:
        prompt = prompt.to(device)
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter,
                              max_new_tokens=max_new_tokens, do_sample=False)
        stats = core.last_stats
        tokens += out.shape[1] - prompt.shape[1]
        conditioned += sum(stats.conditioned_slots)
        if stats.acceptance_lengths:
            lengths += stats.acceptance_lengths
            per_prompt.append(stats.mean_acceptance_length)
    return {
        "tau": sum(lengths) / len(lengths) if lengths else float("nan"),
        "tau_per_prompt": sum(per_prompt) / len(per_prompt) if per_prompt else float("nan"),
        "rounds": len(lengths),
        "tokens": int(tokens),
        "conditioned_slots": int(conditioned),  # block slots that received ReTrace memory
    }


@torch.no_grad()
def evaluate_slots(drafter, target, examples, max_anchors=512, gamma=None, seed=0, attention="dense") -> dict:
    """Held-out DFlash loss and per-slot accuracy (slots 1..K, random anchors, no ReTrace memory)."""
    core = drafter_core(drafter)
    B = core.config.block_size
    correct = torch.zeros(B)
    counted = torch.zeros(B)
    losses = []
    for index, ex in enumerate(examples):
        anchors = sample_anchors(ex.loss_mask, max_anchors, generator=_generator(seed, 1 << 20, index))
        if anchors.numel() == 0:
            continue
        loss, stats = dflash_block_loss(drafter, target, ex.input_ids, ex.loss_mask, anchors, gamma=gamma,
                                        attention=attention)
        losses.append(float(loss))
        correct += stats["correct"].cpu()
        counted += stats["counted"].cpu()
    acc = (correct / counted.clamp_min(1))[1:]
    return {"loss": sum(losses) / len(losses) if losses else float("nan"),
            "slot_accuracy": [round(float(a), 4) for a in acc], "blocks": int(counted[1])}


# ------------------------------------------------------------------------------------- train
def train_drafter(target, tokenizer, data, out_dir, config: TrainConfig | None = None, drafter=None,
                  accelerator=None):
    """Trains a drafter for `target` on `data` (rows, a path or a dataset) and saves it in `out_dir`.

    `drafter`: start from this model (trained in place) instead of `config.init` / a fresh one. The target
    is frozen in place (`requires_grad=False`) and moved to the training device. Returns the trained
    drafter (a `PeftModel` with `config.lora`) in the save dtype, ready for `generate(assistant_model=...)`,
    with the summary as `.train_summary`.
    """
    cfg = (config or TrainConfig()).resolved()
    out_dir = Path(out_dir)
    if accelerator is None:
        accelerator = _accelerator(cfg, out_dir, drafter)
    main = accelerator.is_main_process
    show = cfg.progress and main
    if main:
        _prepare_out_dir(out_dir, cfg)
    accelerator.wait_for_everyone()
    from accelerate.utils import set_seed

    set_seed(cfg.seed)

    target.requires_grad_(False)  # frozen, and never handed to the optimizer or to DDP
    target.eval().to(accelerator.device)
    target_dtype = next(target.parameters()).dtype
    save_dtype = getattr(torch, cfg.save_dtype) if cfg.save_dtype else target_dtype
    eos = target.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    examples = tokenize_rows(load_rows(data), tokenizer, cfg.max_length, cfg.chat_template, cfg.enable_thinking, eos)
    train_examples, held_out = _split(examples, cfg.eval_size, cfg.seed)

    drafter = _build_drafter(target, cfg, drafter)
    if cfg.freeze_backbone:
        if drafter.retrace is None:
            raise ValueError("freeze_backbone trains the ReTrace weights only: it needs stage='retrace'.")
        for name, param in drafter.named_parameters():
            param.requires_grad_(name.startswith("retrace."))
    if cfg.lora and main and _lora_base_path(cfg, out_dir) == (out_dir / "base").resolve():
        # A fresh drafter, or one that just gained ReTrace weights: the adapter needs this exact base, which
        # LoRA training leaves untouched, so it is saved now.
        copy.deepcopy(drafter).to(save_dtype).save_pretrained(out_dir / "base")
    model = _apply_lora(drafter, cfg) if cfg.lora else drafter
    model.to(accelerator.device).train()
    core = drafter_core(model)
    B = core.config.block_size
    attention = _attention_kind(cfg, core, accelerator.device)

    rollout_tau = None
    if cfg.stage == "retrace":  # roll out once with the starting drafter (W_v = 0: memory plays no part yet)
        store_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision, torch.float32)
        mine = range(accelerator.process_index, len(train_examples), accelerator.num_processes)
        lengths = _rollouts(model, target, train_examples, mine, out_dir, store_dtype, show)
        from accelerate.utils import gather_object

        lengths = gather_object(lengths)
        rollout_tau = sum(lengths) / len(lengths) if lengths else None
        dataset = _RolloutStore(out_dir, range(len(train_examples)))
    else:
        dataset = [ex for ex in train_examples if sample_anchors(ex.loss_mask, 1).numel()]
        if len(dataset) < len(train_examples) and main:
            print(f"[train] skipping {len(train_examples) - len(dataset)} sequences with fewer than {B} "
                  "response tokens")
    if len(dataset) == 0:
        raise ValueError(f"No training sequence has a response of at least block_size={B} tokens.")
    vocab = None
    if cfg.loss_vocab == "data":  # every label is a token of some training sequence (EOS included)
        sequences = ([dataset[k]["input_ids"] for k in range(len(dataset))] if cfg.stage == "retrace"
                     else [ex.input_ids for ex in dataset])  # ReTrace: the rolled-out continuations
        vocab = vocab_rows(sequences, [] if eos is None else [eos])

    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]  # no decay on norms, biases
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = TrainState()
    accelerator.register_for_checkpointing(state)

    world, rank = accelerator.num_processes, accelerator.process_index
    updates_per_epoch = len(_epoch_batches(len(dataset), 0, cfg.seed, cfg.batch_size, rank, world)) // cfg.grad_accum
    if updates_per_epoch == 0:
        raise ValueError(
            f"{len(dataset)} training sequences make no full update with batch_size={cfg.batch_size} x "
            f"grad_accum={cfg.grad_accum} x {world} processes: lower them or add data."
        )
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * updates_per_epoch
    warmup = int(math.ceil(cfg.warmup_ratio * total))
    if cfg.resume:
        checkpoint = latest_checkpoint(out_dir)
        if checkpoint is not None:
            accelerator.load_state(str(checkpoint))
            if main:
                print(f"[train] resumed from {checkpoint} (update {state.step} of {total})")
        elif main:
            print(f"[train] no checkpoint under {out_dir / 'checkpoints'}: starting from scratch")
    if cfg.report_to:
        accelerator.init_trackers("dflash-retrace", config={k: v for k, v in dataclasses.asdict(cfg).items()
                                                           if isinstance(v, (int, float, str, bool))})

    bar = tqdm(total=total, initial=state.step, desc=f"train {cfg.stage}", unit="step", disable=not show)
    step = _Stepper(model, optimizer, target, accelerator, dataset, cfg, attention, trainable, vocab)
    logged, started = [], time.time()
    while state.step < total:
        batches = _epoch_batches(len(dataset), state.epoch, cfg.seed, cfg.batch_size, rank, world)
        for u in range(state.updates_in_epoch, updates_per_epoch):
            if state.step >= total:
                break
            lr = cfg.lr * cosine_lr(state.step, total, warmup)
            if cfg.stage == "retrace":
                _set_beta(model, min(1.0, state.step / max(1, cfg.beta_warmup)))
            loss = step(batches[u * cfg.grad_accum : (u + 1) * cfg.grad_accum], state.epoch, lr)
            state.step, state.updates_in_epoch = state.step + 1, u + 1
            state.losses = (state.losses + [loss])[-50:]
            logged.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
            if state.step % cfg.log_every == 0 or state.step == total:
                record = {"step": state.step, "epoch": state.epoch, "loss": sum(logged) / len(logged), "lr": lr,
                          "elapsed_s": round(time.time() - started, 2)}
                accelerator.log({k: v for k, v in record.items() if k != "step"}, step=state.step)
                if main:
                    with open(out_dir / "train_log.jsonl", "a") as f:
                        f.write(json.dumps(record) + "\n")
                logged = []
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and state.step < total:
                accelerator.save_state(str(out_dir / "checkpoints" / f"step-{state.step}"))
                if main:
                    _rotate_checkpoints(out_dir, cfg.keep_checkpoints)
        if state.updates_in_epoch >= updates_per_epoch:
            state.epoch, state.updates_in_epoch = state.epoch + 1, 0
    bar.close()
    accelerator.wait_for_everyone()

    model = accelerator.unwrap_model(model).eval()
    _set_beta(model, 1.0)  # inference value (ReTraceConditioner reads it; config keeps it for reloading)
    core.config.retrace_beta = 1.0
    summary = None
    if main:
        summary = {
            "stage": cfg.stage, "steps": state.step,
            "epochs_run": round(state.epoch + state.updates_in_epoch / updates_per_epoch, 3),
            "train_sequences": len(dataset), "held_out_sequences": len(held_out),
            "final_loss": sum(state.losses) / len(state.losses) if state.losses else None,  # last <= 50 updates
            "train_seconds": round(time.time() - started, 2), "block_size": B, "lora": cfg.lora,
            "loss_vocab_size": int(vocab.numel()) if vocab is not None else None,
        }
        if rollout_tau is not None:
            summary["rollout_tau_start"] = rollout_tau  # starting drafter on the training prompts, pooled
        if held_out:
            summary.update(_held_out_metrics(model, target, held_out, cfg, attention))
        model.to(save_dtype)
        _save(model, cfg, out_dir)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    else:
        model.to(save_dtype)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    model.train_summary = summary
    return model


class _Stepper:
    """One optimizer update: `grad_accum` micro-batches through `accelerator.accumulate`, clip, AdamW step."""

    def __init__(self, model, optimizer, target, accelerator, dataset, cfg, attention, params, vocab=None):
        self.model, self.optimizer, self.target, self.accelerator = model, optimizer, target, accelerator
        self.dataset, self.cfg, self.attention, self.params, self.vocab = dataset, cfg, attention, params, vocab
        self.core = drafter_core(model)
        self.hidden = self.core.config.hidden_size if cfg.stage == "retrace" else None

    def __call__(self, micro_batches, epoch, lr) -> float:
        cfg, acc, device = self.cfg, self.accelerator, self.accelerator.device
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = 0.0
        for micro in micro_batches:
            with acc.accumulate(self.model):
                items = [(i, self.dataset[i]) for i in micro]
                input_ids, loss_mask, anchors, memory = _collate(items, self.core.config.block_size, cfg.max_anchors,
                                                                 cfg.seed, epoch, self.hidden)
                input_ids, loss_mask = input_ids.to(device), loss_mask.to(device)
                if memory is not None:  # recorded by the rollout: constants, no gradient through verification
                    memory = ReTraceMemory(*(t.to(device) for t in
                                             (memory.drafter_states, memory.target_states, memory.valid)))
                vocab, label_ids = self.vocab, None
                with acc.autocast():
                    if cfg.labels == "target":
                        features, label_ids = target_features(self.target, input_ids,
                                                              self.core.config.target_layer_ids, with_labels=True)
                        if vocab is not None:  # the target may say tokens the data does not have
                            vocab = torch.unique(torch.cat([vocab.to(device), label_ids[loss_mask]]))
                    else:
                        features = target_features(self.target, input_ids, self.core.config.target_layer_ids)
                    loss, _ = dflash_block_loss(self.model, self.target, input_ids, loss_mask, anchors,
                                                gamma=cfg.gamma, features=features, retrace_memory=memory,
                                                attention=self.attention, vocab=vocab, label_ids=label_ids)
                acc.backward(loss)
                if acc.sync_gradients and cfg.max_grad_norm:
                    acc.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()  # accelerate steps only on the last micro-batch of the update
                self.optimizer.zero_grad()
            total += float(acc.reduce(loss.detach(), "mean")) / len(micro_batches)
        return total


def _accelerator(cfg, out_dir, drafter):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedDataParallelKwargs

    # A fresh AcceleratorState, so that a second call in one process may change mixed precision (the process
    # group, PartialState, is kept).
    AcceleratorState._reset_state()
    has_retrace = drafter is not None and drafter_core(drafter).retrace is not None
    return Accelerator(
        mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum, log_with=cfg.report_to,
        project_dir=str(out_dir),
        # A ReTrace drafter trained in the DFlash stage gets no memory: its ReTrace weights see no gradient.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.stage == "dflash" and has_retrace)],
    )


def _prepare_out_dir(out_dir, cfg):
    """Writes train_config.json; without `resume`, clears what an earlier run left (checkpoints, rollouts, log)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.resume:
        stale = [p for p in (out_dir / "checkpoints", out_dir / "rollouts", out_dir / "train_log.jsonl") if p.exists()]
        if stale:
            print(f"[train] starting afresh in {out_dir}: removing {', '.join(p.name for p in stale)} of an earlier "
                  "run (pass resume=True / --resume to continue it)")
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (out_dir / "train_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")


def _held_out_metrics(model, target, held_out, cfg, attention) -> dict:
    ev = evaluate_slots(model, target, held_out, cfg.max_anchors, cfg.gamma, cfg.seed, attention)
    chosen = held_out[: cfg.eval_prompts]
    prompts = [ex.input_ids[: ex.prompt_length][None] for ex in chosen]
    budget = min(cfg.eval_max_new_tokens, max(int(ex.input_ids.numel() - ex.prompt_length) for ex in chosen))
    acc = measure_acceptance(target, model, prompts, max(1, budget))
    return {
        "held_out_loss": ev["loss"],
        "held_out_slot_accuracy": ev["slot_accuracy"],  # slots 1..K, random anchors, no memory
        "held_out_tau": acc["tau"],  # real generator, greedy, pooled over rounds, bonus included
        "held_out_tau_per_prompt": acc["tau_per_prompt"],
        "held_out_rounds": acc["rounds"],
    }


def _lora_base_path(cfg, out_dir) -> Path:
    """Where the adapter's base drafter lives: `init` if LoRA trains on it as is, else `out_dir/base`."""
    if cfg.init is not None and cfg.stage == "dflash":
        return Path(cfg.init).resolve()
    return (Path(out_dir) / "base").resolve()


def _save(model, cfg, out_dir):
    if cfg.lora:
        model.peft_config["default"].base_model_name_or_path = str(_lora_base_path(cfg, out_dir))
    model.save_pretrained(out_dir)


# ------------------------------------------------------------------------------------------- CLI
_DEFAULTS = "6e-4 dflash, 5e-5 retrace"  # keep in step with STAGE_DEFAULTS


def register_cli(subparsers) -> None:
    add_regenerate_cli(subparsers)
    d = TrainConfig()
    p = subparsers.add_parser(
        "train", help="train a DFlash drafter (--stage dflash) or its ReTrace conditioner (--stage retrace)",
        description="Train a drafter for --target on --data (chat `messages` or `prompt`/`response` rows, loss on "
                    "the response). Multi-GPU: torchrun --nproc_per_node N -m dflash_retrace.cli train ... (or "
                    "accelerate launch). Writes the drafter (or LoRA adapter), summary.json and checkpoints/step-N.",
    )
    add = p.add_argument
    add("--target", required=True, help="registry name (see `fetch`), local folder or Hub id")
    add("--data", required=True, help="JSONL (or datasets folder / Hub id), e.g. the output of `regenerate`")
    add("--out", required=True, help="output folder")
    add("--stage", choices=sorted(STAGE_DEFAULTS), default=d.stage, help="dflash (default) or retrace")
    add("--init", default=None, help="drafter folder to start from (required for --stage retrace)")
    add("--lora", action="store_true", help="train a LoRA adapter on attention/MLP/fc instead of all weights")
    add("--lora-r", type=int, default=d.lora_r, help=f"LoRA rank (default: {d.lora_r})")
    add("--lora-alpha", type=int, default=d.lora_alpha, help=f"LoRA alpha (default: {d.lora_alpha})")
    add("--lora-dropout", type=float, default=d.lora_dropout, help=f"LoRA dropout (default: {d.lora_dropout})")
    add("--block-size", type=int, default=None,
        help="block size (default: 16 for a fresh drafter, the --init drafter's own otherwise; with --init it "
             "re-targets that drafter)")
    add("--num-layers", type=int, default=d.num_layers, help=f"fresh drafter: layers (default: {d.num_layers})")
    add("--num-target-features", type=int, default=None,
        help="fresh drafter: target layers fused by fc (default: one per drafter layer)")
    add("--target-layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=None,
        help="fresh drafter: comma-separated target layer ids (overrides --num-target-features)")
    add("--mask-token-id", type=int, default=None, help="fresh drafter: MASK token id (default: last embedding row)")
    add("--max-length", type=int, default=d.max_length, help=f"tokens per sequence (default: {d.max_length})")
    add("--max-anchors", type=int, default=d.max_anchors, help=f"blocks per sequence (default: {d.max_anchors})")
    add("--loss-vocab", choices=["full", "data"], default=d.loss_vocab,
        help="softmax of the loss over the full vocabulary (default) or the tokens of the training data, "
             "a cheaper LM head (held-out metrics use the full one)")
    add("--labels", choices=["data", "target"], default=d.labels,
        help="data: the sequences' own tokens (default; right for regenerate output); target: the target's argmax "
             "next token at each position, from the same forward as the features (self-distillation on any text)")
    add("--epochs", type=int, default=None, help="passes over the data (default: 6 dflash, 8 retrace)")
    add("--max-steps", type=int, default=None, help="optimizer updates (overrides --epochs)")
    add("--batch-size", type=int, default=d.batch_size,
        help=f"sequences per micro-batch per process (default: {d.batch_size})")
    add("--grad-accum", type=int, default=d.grad_accum, help=f"micro-batches per update (default: {d.grad_accum})")
    add("--lr", type=float, default=None, help=f"peak learning rate (default: {_DEFAULTS})")
    add("--weight-decay", type=float, default=d.weight_decay, help=f"AdamW weight decay (default: {d.weight_decay})")
    add("--warmup-ratio", type=float, default=None, help="warm-up share of the updates (default: 0.04 / 0.05)")
    add("--max-grad-norm", type=float, default=d.max_grad_norm, help=f"gradient clip (default: {d.max_grad_norm})")
    add("--gamma", type=float, default=None, help="slot-weight decay (default: 7 for B=16, 4 for B=8)")
    add("--mixed-precision", choices=["no", "bf16", "fp16"], default=d.mixed_precision, help="autocast (default: no)")
    add("--attention", choices=["auto", "dense", "flex"], default=d.attention,
        help="block mask: dense bool (any device) or flex_attention BlockMask (CUDA) (default: auto)")
    add("--seed", type=int, default=d.seed, help=f"seed of init, data order and anchors (default: {d.seed})")
    add("--beta-warmup", type=int, default=d.beta_warmup,
        help=f"retrace: updates for beta 0 -> 1 (default: {d.beta_warmup})")
    add("--freeze-backbone", action="store_true", help="retrace: train the ReTrace weights only")
    add("--checkpoint-every", type=int, default=d.checkpoint_every,
        help=f"updates between checkpoints (default: {d.checkpoint_every}; 0: none)")
    add("--keep-checkpoints", type=int, default=d.keep_checkpoints,
        help=f"newest checkpoints kept (default: {d.keep_checkpoints})")
    add("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    add("--log-every", type=int, default=d.log_every, help=f"updates between log lines (default: {d.log_every})")
    add("--report-to", default=None, help="accelerate tracker: tensorboard, wandb, ... (default: none)")
    add("--eval-size", type=float, default=d.eval_size,
        help=f"held-out rows: a fraction or a count (default: {d.eval_size})")
    add("--eval-prompts", type=int, default=d.eval_prompts, help=f"held-out prompts for τ (default: {d.eval_prompts})")
    add("--eval-max-new-tokens", type=int, default=d.eval_max_new_tokens,
        help=f"tokens per τ prompt (default: {d.eval_max_new_tokens})")
    add("--no-chat-template", action="store_true", help="prompts are raw text (base models)")
    add("--enable-thinking", action="store_true", help="pass enable_thinking=True to Qwen3-style templates")
    add("--dtype", default="auto", help="target dtype: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    add("--save-dtype", default=None, help="saved drafter dtype (default: the target's)")
    add("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run_train_cli)


def _run_train_cli(args) -> int:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(chat_template=not args.no_chat_template, progress=not args.no_progress)
    from accelerate import PartialState

    device = PartialState().device  # each process loads the target onto its own device
    target, tokenizer = load_target(args.target, args.dtype, str(device))
    train_drafter(target, tokenizer, args.data, args.out, TrainConfig(**values))
    return 0
