"""Writes a training checkpoint's weights alone, bf16, next to the drafter config they belong to (the committed,
resumable form of a run that cannot keep its 104 MB optimizer state in git).

    python results/wip_run19/weights_only.py CONFIG_FOLDER run19/checkpoints/step-N OUT_FOLDER
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from dflash_retrace import DFlashConfig, DFlashDrafter


def main(config_folder: str, step_dir: str, out: str) -> None:
    drafter = DFlashDrafter(DFlashConfig.from_pretrained(config_folder))
    drafter.load_state_dict(load_file(Path(step_dir) / "model.safetensors"), strict=True)
    drafter.to(torch.bfloat16).save_pretrained(out)
    for payload in Path(out).glob("*_dflash.py"):  # weights only, as the WIP checkpoint: `dflash-retrace payload` adds them
        payload.unlink()
    step = int(Path(step_dir).name.split("-")[-1])
    (Path(out) / "progress.json").write_text(json.dumps({"step": step, "from": str(step_dir)}) + "\n")
    print(f"wrote {out}: {step_dir} (update {step}), bf16 weights only")


if __name__ == "__main__":
    main(*sys.argv[1:4])
