"""Checkpoints of a training run and what a resumed run must share with the run it continues."""

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

from .data import rows_sha256
from .features import check_stores_for_run


def latest_checkpoint(out_dir) -> Path | None:
    root = Path(out_dir) / "checkpoints"
    steps = [(int(m.group(1)), p) for p in root.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    return max(steps)[1] if steps else None


def _save_checkpoint(accelerator, out_dir, step, keep):
    """checkpoints/step-N, written as step-N.partial and renamed once every process has saved: a run stopped while
    saving leaves no step-N for `latest_checkpoint` to resume from."""
    final = Path(out_dir) / "checkpoints" / f"step-{step}"
    partial = final.with_name(final.name + ".partial")
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # an older run's step-N (resumed runs save steps past their checkpoint)
            shutil.rmtree(final)
        partial.rename(final)
        _rotate_checkpoints(out_dir, keep)
    accelerator.wait_for_everyone()


def _rotate_checkpoints(out_dir, keep):
    root = Path(out_dir) / "checkpoints"
    steps = sorted((int(p.name.split("-")[1]), p) for p in root.glob("step-*") if p.name.split("-")[1].isdigit())
    for _, path in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(path, ignore_errors=True)


# What a resumed run must share with the run it continues (a checkpoint holds only its position in them): the options
# that set the rows, their order and anchors, the held-out split and the schedule. Others (logging, checkpoints,
# evaluation, precision, ...) may change, and so may paths (--data, --features, --eval-features: a moved folder), since
# the rows themselves are compared by hash (train_data.json).
RESUME_KEYS = ("stage", "max_length", "chat_template", "enable_thinking", "labels", "eval_size", "seed", "batch_size",
               "grad_accum", "max_anchors", "block_size", "epochs", "max_steps", "lr", "warmup_ratio", "beta_warmup",
               "rollout_temperature", "rollout_sampled_share", "add_layers")


def _check_and_record_run(cfg, data, examples, train_examples, held_out, target, tokenizer, out_dir, accelerator):
    """Checks the stores against the run and a resumed run against the saved one, then writes train_config.json and
    train_data.json (after every process has read the saved ones)."""
    if cfg.features:  # every store built from this target, rendering prompts as this run does
        check_stores_for_run(examples.stores + [ref.store for ref in held_out], target, tokenizer, cfg)
    record = _data_record(data, train_examples, held_out, accelerator.num_processes)
    if cfg.resume:
        _check_resume(out_dir, cfg, record, accelerator.is_main_process)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (out_dir / "train_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        (out_dir / "train_data.json").write_text(json.dumps(record, indent=2) + "\n")


def _data_record(data, train_examples, held_out, num_processes) -> dict:
    """`train_data.json`: what the run trains on beyond its options: the data path, the rows of each split (ids and
    tokens, in order, hashed) and the process count."""
    return {"data": str(data) if isinstance(data, (str, os.PathLike)) else None, "num_processes": num_processes,
            "train_rows": len(train_examples), "held_out_rows": len(held_out),
            "train_rows_sha256": rows_sha256(train_examples), "held_out_rows_sha256": rows_sha256(held_out)}


def _check_resume(out_dir, cfg, record, main):
    """Refuses to resume a run (a checkpoint or rollouts in `out_dir`) with other `RESUME_KEYS`, data, rows or process
    count than those saved in train_config.json / train_data.json; warns where these were not saved."""
    if latest_checkpoint(out_dir) is None and not (out_dir / "rollouts").exists():
        return  # nothing to continue: the run starts afresh
    saved_config, saved_data = out_dir / "train_config.json", out_dir / "train_data.json"
    saved = json.loads(saved_config.read_text()) if saved_config.exists() else {}
    now = dataclasses.asdict(cfg)
    differ = [f"--{k.replace('_', '-')} {saved[k]!r} -> {now[k]!r}" for k in RESUME_KEYS
              if k in saved and saved[k] != now[k]]
    if saved_data.exists():
        old = json.loads(saved_data.read_text())
        if old["num_processes"] != record["num_processes"]:
            differ.append(f"processes {old['num_processes']} -> {record['num_processes']}")
        for split, name in (("train", "training"), ("held_out", "held-out")):
            if old[f"{split}_rows_sha256"] != record[f"{split}_rows_sha256"]:
                differ.append(f"the {name} rows ({old[f'{split}_rows']} -> {record[f'{split}_rows']}; ids, tokens or "
                              "order differ)")
    elif main:
        print(f"[train] warning: {out_dir} has no train_data.json (saved by newer versions): resuming without checking "
              "that the data, its held-out split and the number of processes are the saved run's")
    if differ:
        raise ValueError(f"Cannot resume the run in {out_dir}: " + "; ".join(differ) + " (saved -> now). Its "
                         "checkpoint continues that run's data order, held-out split and schedule, which these change. "
                         "Resume with the same options, or start a new --out.")
