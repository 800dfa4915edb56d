"""The training loop: DFlash drafters (stage "dflash") and their ReTrace conditioner ("retrace"), LoRA optional.

    train_drafter(target, tokenizer, data, out_dir, TrainConfig(stage="dflash")) -> drafter

Built on `accelerate`: `torchrun --nproc_per_node N -m dflash_retrace.cli train ...` (or `accelerate launch -m
dflash_retrace.cli train ...`) gives DDP; mixed precision, gradient accumulation and checkpoint/resume
(`save_state`/`load_state`) come from it. Each process trains on its own micro-batches of whole sequences.

DFlash stage (the DFlash paper's recipe), per sequence: up to `max_anchors` random anchors among response
positions; blocks `[x_p, MASK x K]`; a block sees target features strictly before its anchor and its own
block; slot k predicts x_{p+k}; CE weighted exp(-(k-1)/gamma). The target is frozen and outside the
optimizer (its embedding and LM head are borrowed, never trained); its features are computed online.

ReTrace stage (equations in the README's ReTrace section): from a DFlash drafter, `add_retrace()` (W_v = 0: step 0 is the DFlash
drafter exactly). Real draft-verify rollouts with the project's generator (`rollouts.recording_rounds`) on the
training prompts record each round's anchor and the memory that entered it; training replays every
round as a block anchored there with that memory (detached), DFlash loss on the committed continuation.
Rounds without memory are plain DFlash blocks. `beta` ramps 0 -> 1 over `beta_warmup` updates.

Either stage: `step_embeddings` adds zero-initialised PAD-Rec step-position embeddings (`add_step_embeddings`);
`loss="vat"` weighs slots verification-aware (`objective.vat_weights`); held-out loss stays the DFlash one.

Output folder: the drafter (`save_pretrained`: weights, config with auto_map, payload code) or, with
LoRA, the adapter (+ `base/` when the base drafter exists nowhere else); `summary.json`;
`train_config.json`; `train_data.json` (the data, the rows of both splits hashed, the process count: with
`train_config.json`, what `resume=True` checks); `train_log.jsonl`; `checkpoints/step-N` (accelerate state, resumed
from the latest with `resume=True`); for ReTrace, `rollouts/` (one file per training sequence, reused on resume; every
process reads all of them, so multi-node runs need `out_dir` on a shared filesystem).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..configuration_dflash import DEFAULT_BLOCK_SIZE, check_block_size
from ..generation_dflash import ReTraceMemory
from ..modeling_dflash import DFlashDrafter
from ..runtime import eos_token_ids, load_drafter, warn_slow_bf16
from ..templates import TEMPLATES, load_template_config
from .config import LORA_TARGETS, TrainConfig
from .checkpoints import _check_and_record_run, _save_checkpoint, latest_checkpoint
from .data import collate, epoch_batches, label_counts, load_rows, split_held_out, tokenize_rows
from .held_out import HELD_OUT_SEED, evaluate_slots, held_out_metrics
from .features import StoredRows, held_out_rows, open_stores, stored_features, stored_soft_targets
from .init_layers import add_top_layers, copy_target_layers
from .objective import (cosine_lr, dflash_block_loss, draft_vocabulary, drafter_core, sample_anchors,
                        target_features, vocab_rows)
from .rollouts import RolloutStore, rollouts
from .target_kv import check_store_kv_layers, stored_target_kv

__all__ = ["TrainState", "latest_checkpoint", "train_drafter"]


# ----------------------------------------------------------------------------------- state
class TrainState:
    """Loop position, saved with every checkpoint (`accelerator.register_for_checkpointing`)."""

    def __init__(self):
        self.step = 0  # optimizer updates done
        self.epoch = 0
        self.updates_in_epoch = 0
        self.losses: list = []  # recent update losses (for the summary)
        self.slot_tokens = 0  # supervised (anchor, slot) pairs seen, this process

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch, "updates_in_epoch": self.updates_in_epoch,
                "losses": list(self.losses), "slot_tokens": self.slot_tokens}

    def load_state_dict(self, state):
        self.step, self.epoch = state["step"], state["epoch"]
        self.updates_in_epoch, self.losses = state["updates_in_epoch"], list(state["losses"])
        self.slot_tokens = state.get("slot_tokens", 0)


# ------------------------------------------------------------------------------ drafter setup
def _load_init(init):
    """A trained drafter folder (or adapter), or a config-only template (a `hub_configs/templates` folder or name)."""
    folder = Path(str(init))
    has_weights = folder.is_dir() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")))
    if str(init) in TEMPLATES or (folder.is_dir() and not has_weights):
        return DFlashDrafter(load_template_config(init))  # template: the shape is set, weights start fresh
    return load_drafter(init)  # a saved drafter, or a PEFT adapter merged into its base


def _build_drafter(target, cfg, drafter):
    if drafter is None and cfg.init is not None:
        drafter = _load_init(cfg.init)
    if drafter is None:
        if cfg.stage == "retrace":
            raise ValueError("The ReTrace stage starts from a trained DFlash drafter: pass `init` "
                             "(CLI: --init DRAFTER).")
        drafter = DFlashDrafter.from_target(
            target, num_hidden_layers=cfg.num_layers, block_size=cfg.block_size or DEFAULT_BLOCK_SIZE,
            mask_token_id=cfg.mask_token_id, num_target_features=cfg.num_target_features,
            target_layer_ids=cfg.target_layer_ids, context=cfg.context or "hidden", kv_layer_ids=cfg.kv_layer_ids,
            fusion=cfg.fusion or "fc", fusion_layer_ids=cfg.fusion_layer_ids,
        )
        if cfg.init_layers == "target-top":
            done = copy_target_layers(drafter, target)
            print(f"[train] drafter layers from target layers {done['target_layers']} ({done['copied']} tensors; "
                  f"as initialised: {', '.join(done['kept']) or 'none'})")
    elif cfg.block_size is not None and cfg.block_size != drafter.config.block_size:
        check_block_size(cfg.block_size)
        if drafter.steps is not None:
            raise ValueError(f"The --init drafter has step-position embeddings for block_size="
                             f"{drafter.config.block_size}: it cannot be re-targeted to {cfg.block_size} (drop "
                             "--block-size, or start from its DFlash backbone).")
        print(f"[train] block size {drafter.config.block_size} -> {cfg.block_size} (the weights do not depend on it)")
        drafter.config.block_size = cfg.block_size
    if cfg.kv_layer_ids is not None and cfg.context is None and drafter.config.context == "hidden":
        raise ValueError("--kv-layer-ids is read only by a kv/hybrid drafter and this one attends to hidden states: "
                         "add --context hybrid (or kv), or drop --kv-layer-ids.")
    if cfg.context is not None and (cfg.context, cfg.kv_layer_ids) != (drafter.config.context, None):
        print(f"[train] context {drafter.config.context} -> {cfg.context}" + (" (zero-initialised kv weights added)"
                                                                             if cfg.context == "hybrid" else ""))
        drafter.set_context(cfg.context, cfg.kv_layer_ids)
    _set_fusion(drafter, cfg)
    if cfg.add_layers:
        have = drafter.config.num_hidden_layers
        print(f"[train] {have} -> {add_top_layers(drafter, cfg.add_layers)} decoder layers (the new ones start as the "
              "identity: the --init drafter's function exactly)")
    drafter.check_target(target)
    if cfg.stage == "retrace":
        drafter.add_retrace()
    if cfg.step_embeddings:
        drafter.add_step_embeddings()
    return drafter.float()  # fp32 master weights; mixed precision only autocasts the compute


def _set_fusion(drafter, cfg):
    """`--fusion layerwise` on an --init DFlash drafter adds zero-initialised fusion weights (it starts as that
    drafter exactly); no option keeps the drafter's own fusion. Nothing removes fusion weights."""
    if cfg.fusion == "layerwise":
        drafter.add_fusion(cfg.fusion_layer_ids)
    elif cfg.fusion == "fc" and drafter.fusion is not None:
        raise ValueError("The --init drafter has layer-wise fusion weights; --fusion fc cannot drop them. Omit "
                         "--fusion to keep its fusion, or start from a DFlash drafter.")


def _apply_lora(drafter, cfg):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=LORA_TARGETS,
        # New weights (the ReTrace conditioner in that stage, step embeddings, fusion weights): trained in full and
        # saved with the adapter.
        modules_to_save=[name for name, full in (("retrace", cfg.stage == "retrace"), ("steps", cfg.step_embeddings),
                                                 ("fusion", drafter.fusion is not None)) if full] or None,
    )
    return get_peft_model(drafter, lora)


def _attention_kind(cfg, core, device):
    if cfg.attention == "flex" or (cfg.attention == "auto" and core.config._attn_implementation == "flex_attention"):
        if core.config.context == "hybrid":
            raise ValueError("A hybrid drafter's target-KV attention needs the context part of the block rule, which a "
                             "flex BlockMask does not expose: train it with --attention local (or dense).")
        if device.type != "cuda":
            raise ValueError("attention='flex' needs a CUDA device; use attention='local' (the default) on CPU.")
        core.config._attn_implementation = "flex_attention"
        return "flex"
    return "dense" if cfg.attention == "dense" else "local"



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
    if cfg.mixed_precision == "bf16":
        warn_slow_bf16(accelerator.device, "--mixed-precision bf16", "--mixed-precision no")
    if main:
        _prepare_out_dir(out_dir, cfg)
    accelerator.wait_for_everyone()
    from accelerate.utils import set_seed

    set_seed(cfg.seed)
    target.requires_grad_(False)  # frozen, and never handed to the optimizer or to DDP
    target.eval().to(accelerator.device)
    save_dtype = getattr(torch, cfg.save_dtype) if cfg.save_dtype else next(target.parameters()).dtype
    eos_ids = eos_token_ids(target, tokenizer)  # the same set regenerate cuts at; a row's own end token first
    examples, train_examples, held_out = _examples(cfg, data, tokenizer, eos_ids)
    _check_and_record_run(cfg, data, examples, train_examples, held_out, target, tokenizer, out_dir, accelerator)

    model = _prepare_model(target, cfg, drafter, out_dir, save_dtype, main)
    coverage = _draft_vocabulary(model, target, cfg, train_examples, held_out, eos_ids, main)
    if cfg.features:
        for store in {id(s): s for s in examples.stores + [ref.store for ref in held_out]}.values():
            store.select_layers(drafter_core(model).config.feature_layer_ids)  # a clear error if it lacks them
            if drafter_core(model).config.context != "hidden":
                check_store_kv_layers(store, drafter_core(model).config.kv_layer_ids)
    model.to(accelerator.device).train()
    attention = _attention_kind(cfg, drafter_core(model), accelerator.device)
    dataset, rollout_tau = _stage_dataset(model, target, train_examples, cfg, out_dir, accelerator)
    vocab = None
    if cfg.loss_vocab == "data":  # every token of the training sequences and every EOS ...
        sequences = ([dataset[k]["input_ids"] for k in range(len(dataset))] if cfg.stage == "retrace"
                     else [ex.input_ids for ex in dataset])  # ReTrace: the rolled-out continuations
        if cfg.features and cfg.labels != "data":  # ... and the target's stored labels (online: added each step)
            sequences += [ex.labels[ex.loss_mask] for ex in dataset]
        vocab = vocab_rows(sequences, eos_ids)

    model, state, updates_per_epoch, seconds = _optimise(model, target, dataset, vocab, cfg, accelerator, out_dir,
                                                         attention, held_out)
    model = accelerator.unwrap_model(model).eval()
    drafter_core(model).config.retrace_beta = 1.0  # the inference value, saved with the config
    summary = None
    if main:
        summary = {
            "stage": cfg.stage, "steps": state.step,
            "epochs_run": round(state.epoch + state.updates_in_epoch / updates_per_epoch, 3),
            "train_sequences": len(dataset), "held_out_sequences": len(held_out),
            "final_loss": sum(state.losses) / len(state.losses) if state.losses else None,  # last <= 50 updates
            "train_seconds": seconds, "block_size": drafter_core(model).config.block_size, "lora": cfg.lora,
            "loss_vocab_size": int(vocab.numel()) if vocab is not None else None,
            "features": cfg.features, **coverage,
        }
        if rollout_tau is not None:
            summary["rollout_tau_start"] = rollout_tau  # starting drafter on the training prompts, pooled
        if held_out:
            summary.update(held_out_metrics(model, target, held_out, cfg, attention))
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


def _examples(cfg, data, tokenizer, eos_ids) -> tuple:
    """(all examples, training split, held-out split): tokenized rows, or a feature store's rows (`cfg.features`:
    features and the target's labels computed once by `dflash-retrace features`)."""
    if cfg.features:
        examples = StoredRows(open_stores(cfg.features))
    else:
        examples = tokenize_rows(load_rows(data), tokenizer, cfg.max_length, cfg.chat_template, cfg.enable_thinking,
                                 eos_ids)
    if cfg.eval_features:  # a held-out store: a split fixed once, whatever the training store grows into
        return examples, list(examples), held_out_rows(examples.stores, cfg.eval_features, cfg.eval_size)
    return (examples, *split_held_out(examples, cfg.eval_size, cfg.seed))


def _draft_vocabulary(model, target, cfg, train_examples, held_out, eos_ids, main: bool = True) -> dict:
    """Gives the drafter the draft vocabulary `cfg.draft_vocab_size` asks for: a fresh (or full-vocabulary --init)
    drafter the most frequent labels of the training split, of the kind trained on (`cfg.labels`); an --init drafter
    with a smaller one that vocabulary grown by the most frequent labels outside it. Returns its coverage of the
    held-out labels (share it can propose)."""
    core = drafter_core(model)
    current, size = core.draft_to_target, cfg.draft_vocab_size
    if size is not None and (current is None or size != current.numel()):
        if cfg.lora:
            raise ValueError("--draft-vocab-size with --lora: the adapter trains on its base drafter's head and cannot "
                             "change its vocabulary. Set the vocabulary in a full run first (train --init BASE "
                             "--draft-vocab-size N --out NEW), then train the adapter on NEW.")
        if current is not None and size < current.numel():
            raise ValueError(f"--draft-vocab-size {size} is smaller than the --init drafter's draft vocabulary "
                             f"({current.numel()} ids): a draft vocabulary only grows here (every id the drafter was "
                             f"trained to propose stays). Drop --draft-vocab-size to keep its {current.numel()}, or "
                             "ask for more.")
        vocab_rows_count = target.get_output_embeddings().weight.shape[0]
        if cfg.labels != "data" and not cfg.features and main:
            print(f"[train] draft vocabulary: labelling the {len(train_examples)} training rows with the target "
                  "(one forward each)")
        counts = label_counts(train_examples, vocab_rows_count, cfg.labels, target)
        ids = draft_vocabulary(counts, size, always=[*eos_ids, *([] if current is None else current.tolist())])
        if main and current is not None:
            before, after = (float(counts[v].sum() / counts.sum().clamp_min(1)) for v in (current.cpu(), ids))
            print(f"[train] draft vocabulary grown from {current.numel():,} to {ids.numel():,} ids (the --init "
                  f"drafter's own kept): it covers {after:.2%} of the training labels, against {before:.2%}")
        core.set_draft_vocabulary(ids)
    if core.draft_to_target is None or not held_out:
        return {}
    counts = label_counts(held_out, target.get_output_embeddings().weight.shape[0], cfg.labels, target)
    share = float(counts[core.draft_to_target.cpu()].sum() / counts.sum().clamp_min(1))
    return {"draft_vocab_size": int(core.draft_to_target.numel()), "held_out_draft_vocab_coverage": round(share, 5)}


def _prepare_model(target, cfg, drafter, out_dir, save_dtype, main):
    """The drafter to train (fresh, `init` or given; ReTrace weights added for that stage), frozen as asked, with
    LoRA if asked (the adapter's base saved first when it exists nowhere else)."""
    drafter = _build_drafter(target, cfg, drafter)
    if cfg.freeze_backbone:
        if drafter.retrace is None:
            raise ValueError("freeze_backbone trains the ReTrace weights only: it needs stage='retrace'.")
        for name, param in drafter.named_parameters():
            param.requires_grad_(name.startswith("retrace."))
    if cfg.lora and main and _lora_base_path(cfg, out_dir) == (out_dir / "base").resolve():
        # A fresh drafter, or one that just gained ReTrace / step / fusion weights: the adapter needs this exact base, which
        # LoRA training leaves untouched, so it is saved now.
        copy.deepcopy(drafter).to(save_dtype).save_pretrained(out_dir / "base")
    return _apply_lora(drafter, cfg) if cfg.lora else drafter


def _stage_dataset(model, target, train_examples, cfg, out_dir, accelerator):
    """(dataset, rollout τ): the examples (DFlash stage), or the recorded rollouts (ReTrace stage)."""
    rollout_tau = None
    if cfg.stage == "retrace":  # roll out once with the starting drafter (W_v = 0: memory plays no part yet)
        store_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision, torch.float32)
        mine = range(accelerator.process_index, len(train_examples), accelerator.num_processes)
        show = cfg.progress and accelerator.is_main_process
        lengths = rollouts(model, target, train_examples, mine, out_dir, store_dtype, show,
                           temperature=cfg.rollout_temperature, sampled_share=cfg.rollout_sampled_share, seed=cfg.seed)
        from accelerate.utils import gather_object

        lengths = gather_object(lengths)
        rollout_tau = sum(lengths) / len(lengths) if lengths else None
        dataset = RolloutStore(out_dir, range(len(train_examples)))
    else:
        usable = [bool(sample_anchors(ex.loss_mask, 1).numel()) for ex in train_examples]
        dataset = [ex for ex, ok in zip(train_examples, usable) if ok]
        cut = sum(bool(getattr(ex, "truncated", False)) for ex, ok in zip(train_examples, usable) if not ok)
        if len(dataset) < len(train_examples) and accelerator.is_main_process:
            print(f"[train] skipping {len(train_examples) - len(dataset)} sequences with fewer than 2 response tokens "
                  "(no block to anchor)" + (f", {cut} of them cut by --max-length {cfg.max_length}" if cut else ""))
        if not dataset and cut:
            raise ValueError(f"No training sequence has 2 response tokens or more: {cut} of the {len(train_examples)} "
                             f"lost their response when cut at --max-length {cfg.max_length}. Raise --max-length.")
    if len(dataset) == 0:
        raise ValueError("No training sequence has 2 response tokens or more (an anchor and a label to draft): "
                         "check the rows' responses / loss_mask.")
    return dataset, rollout_tau


NEW_WEIGHT_MODULES = ("retrace", "steps", "fusion", "kv")  # the zero-initialised option modules a drafter can gain


def is_new_weight(name: str) -> bool:
    """Whether a parameter belongs to an option module (ReTrace, PAD-Rec steps, DFlare fusion, hybrid KV attention):
    the weights that start at zero on a trained backbone, which `new_weights_lr_scale` trains faster."""
    return any(part in NEW_WEIGHT_MODULES for part in name.split(".")[:-1])


def _param_groups(model, cfg) -> list:
    """AdamW groups: decay on matrices only (not norms, biases), and the option modules' weights at
    `lr * new_weights_lr_scale` (each group's `lr_scale`, which the stepper applies to the scheduled lr)."""
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        scale = cfg.new_weights_lr_scale if is_new_weight(name) else 1.0
        key = (param.dim() >= 2, scale)
        groups.setdefault(key, {"params": [], "weight_decay": cfg.weight_decay if key[0] else 0.0,
                                "lr_scale": scale})["params"].append(param)
    # Fixed order (backbone matrices, backbone vectors, then the option modules'), so a checkpoint's optimizer state
    # resumes into the same groups whatever order the modules register their parameters in.
    return [groups[key] for key in sorted(groups, key=lambda k: (k[1] != 1.0, not k[0]))]


def _optimise(model, target, dataset, vocab, cfg, accelerator, out_dir, attention, held_out=()):
    """AdamW with a cosine schedule until `max_steps` / `epochs`; checkpoints, resume and logging.
    Returns (prepared model, TrainState, updates per epoch, seconds)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel: one pass over the weights instead of a dozen ops per tensor (3.2x the for-loop's speed on one
    # CPU core, results/training_profile/adamw_bench.txt)
    fused = accelerator.device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(_param_groups(model, cfg), lr=cfg.lr, fused=fused)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    main, world, rank = accelerator.is_main_process, accelerator.num_processes, accelerator.process_index
    updates_per_epoch = len(epoch_batches(len(dataset), 0, cfg.seed, cfg.batch_size, rank, world)) // cfg.grad_accum
    if updates_per_epoch == 0:
        raise ValueError(
            f"{len(dataset)} training sequences make no full update with batch_size={cfg.batch_size} x "
            f"grad_accum={cfg.grad_accum} x {world} processes: lower them or add data."
        )
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * updates_per_epoch
    warmup = int(math.ceil(cfg.warmup_ratio * total))
    _resume(accelerator, cfg, out_dir, state, total)
    if cfg.report_to:
        accelerator.init_trackers("dflash-retrace", config={k: v for k, v in dataclasses.asdict(cfg).items()
                                                           if isinstance(v, (int, float, str, bool))})
    core = drafter_core(model)
    bar = tqdm(total=total, initial=state.step, desc=f"train {cfg.stage}", unit="step",
               disable=not (cfg.progress and main))
    step = _Stepper(model, optimizer, target, accelerator, dataset, cfg, attention, trainable, vocab)
    logged, started = [], time.time()
    while state.step < total:
        batches = epoch_batches(len(dataset), state.epoch, cfg.seed, cfg.batch_size, rank, world)
        for u in range(state.updates_in_epoch, min(updates_per_epoch, state.updates_in_epoch + total - state.step)):
            lr = cfg.lr * cosine_lr(state.step, total, warmup)
            if cfg.stage == "retrace":  # beta lives in the config; the conditioner reads it every forward
                core.config.retrace_beta = min(1.0, state.step / max(1, cfg.beta_warmup))
            loss, slots = step(batches[u * cfg.grad_accum : (u + 1) * cfg.grad_accum], state.epoch, lr)
            state.slot_tokens += slots
            state.step, state.updates_in_epoch = state.step + 1, u + 1
            state.losses = (state.losses + [loss])[-50:]
            logged.append(loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
            evaluate = bool(cfg.eval_every and state.step % cfg.eval_every == 0)
            if state.step % cfg.log_every == 0 or state.step == total or evaluate:
                record = {"step": state.step, "epoch": state.epoch, "loss": sum(logged) / len(logged), "lr": lr,
                          "elapsed_s": round(time.time() - started, 2), "slot_tokens": state.slot_tokens * world}
                if evaluate and held_out and main:
                    ev = evaluate_slots(model, target, held_out[:32], cfg.max_anchors, cfg.gamma, HELD_OUT_SEED,
                                        attention, cfg.labels)
                    record.update(held_out_slot_accuracy=ev["slot_accuracy"], held_out_tau_estimate=ev["tau_estimate"])
                accelerator.log({k: v for k, v in record.items() if k != "step"}, step=state.step)
                if main:
                    with open(out_dir / "train_log.jsonl", "a") as f:
                        f.write(json.dumps(record) + "\n")
                logged = []
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and state.step < total:
                _save_checkpoint(accelerator, out_dir, state.step, cfg.keep_checkpoints)
        if state.updates_in_epoch >= updates_per_epoch:
            state.epoch, state.updates_in_epoch = state.epoch + 1, 0
    bar.close()
    accelerator.wait_for_everyone()
    return model, state, updates_per_epoch, round(time.time() - started, 2)


def _resume(accelerator, cfg, out_dir, state, total):
    if not cfg.resume:
        return
    checkpoint = latest_checkpoint(out_dir)
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        if accelerator.is_main_process:
            print(f"[train] resumed from {checkpoint} (update {state.step} of {total})")
    elif accelerator.is_main_process:
        print(f"[train] no checkpoint under {out_dir / 'checkpoints'}: starting from scratch")


class _Stepper:
    """One optimizer update: `grad_accum` micro-batches through `accelerator.accumulate`, clip, AdamW step."""

    def __init__(self, model, optimizer, target, accelerator, dataset, cfg, attention, params, vocab=None):
        self.model, self.optimizer, self.target, self.accelerator = model, optimizer, target, accelerator
        self.dataset, self.cfg, self.attention, self.params, self.vocab = dataset, cfg, attention, params, vocab
        self.core = drafter_core(model)
        self.hidden = self.core.config.hidden_size if cfg.stage == "retrace" else None
        self.kv_layer_ids = self.core.config.kv_layer_ids if self.core.config.context != "hidden" else None

    def __call__(self, micro_batches, epoch, lr) -> float:
        cfg, acc, device = self.cfg, self.accelerator, self.accelerator.device
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        total, slots = 0.0, 0
        for micro in micro_batches:
            with acc.accumulate(self.model):
                items = [(i, self.dataset[i]) for i in micro]
                input_ids, loss_mask, anchors, memory = collate(items, self.core.config.block_size, cfg.max_anchors,
                                                                cfg.seed, epoch, self.hidden)
                input_ids, loss_mask = input_ids.to(device), loss_mask.to(device)
                if memory is not None:  # recorded by the rollout: constants, no gradient through verification
                    memory = ReTraceMemory(*(t.to(device) for t in
                                             (memory.drafter_states, memory.target_states, memory.valid)))
                vocab, label_ids, kv, soft = self.vocab, None, None, None
                with acc.autocast():
                    if cfg.features:
                        features, label_ids = stored_features(items, input_ids.shape[1], device)
                        if cfg.distill:
                            soft = stored_soft_targets(items, input_ids.shape[1], device)
                        label_ids = None if cfg.labels == "data" else label_ids
                        if self.kv_layer_ids is not None:
                            kv = stored_target_kv(self.target, items, input_ids.shape[1], self.kv_layer_ids)
                    elif cfg.labels != "data":
                        features, label_ids, *kv = target_features(
                            self.target, input_ids, self.core.config.feature_layer_ids, with_labels=True,
                            kv_layer_ids=self.kv_layer_ids)
                        kv = kv[0] if kv else None
                        if vocab is not None:  # the target may say tokens the data does not have
                            vocab = torch.unique(torch.cat([vocab.to(device), label_ids[loss_mask]]))
                    else:  # (block_hidden_states computes features and K/V in one forward)
                        features = None if self.kv_layer_ids is not None else target_features(
                            self.target, input_ids, self.core.config.feature_layer_ids)
                    loss, stats = dflash_block_loss(self.model, self.target, input_ids, loss_mask, anchors,
                                                gamma=cfg.gamma, features=features, retrace_memory=memory,
                                                attention=self.attention, vocab=vocab, label_ids=label_ids,
                                                chain=cfg.labels == "target-chain", loss=cfg.loss,
                                                target_kv=kv, soft_targets=soft, distill=cfg.distill)
                acc.backward(loss)
                if acc.sync_gradients and cfg.max_grad_norm:
                    acc.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()  # accelerate steps only on the last micro-batch of the update
                self.optimizer.zero_grad()
            total += float(acc.reduce(loss.detach(), "mean")) / len(micro_batches)
            slots += int(stats["counted"].sum())
        return total, slots


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
    """Creates `out_dir`; without `resume`, clears what an earlier run left (checkpoints, rollouts, log)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not cfg.resume:
        stale = [p for p in (out_dir / "checkpoints", out_dir / "rollouts", out_dir / "train_log.jsonl") if p.exists()]
        if stale:
            print(f"[train] starting afresh in {out_dir}: removing {', '.join(p.name for p in stale)} of an earlier "
                  "run (pass resume=True / --resume to continue it)")
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _lora_base_path(cfg, out_dir) -> Path:
    """Where the adapter's base drafter lives: `init` if LoRA trains on it as is, else `out_dir/base`."""
    changed = cfg.stage != "dflash" or cfg.step_embeddings or cfg.fusion == "layerwise" or cfg.context is not None
    if cfg.init is not None and not changed:  # LoRA on the --init drafter as it is
        return Path(cfg.init).resolve()
    return (Path(out_dir) / "base").resolve()


def _save(model, cfg, out_dir):
    if cfg.lora:
        model.peft_config["default"].base_model_name_or_path = str(_lora_base_path(cfg, out_dir))
    model.save_pretrained(out_dir)
