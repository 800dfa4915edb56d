"""The shipped DFlash drafter with the target's full LM head instead of its draft vocabulary (same weights).

z-lab's loop has no draft vocabulary, so `bench --baselines` compares our generator with it on this copy:
`draft_vocab_size` dropped and the `draft_to_target` index removed (the head is the target's own rows either way),
and the context lookup turned off (`lookup_threshold` 0: z-lab's loop has none, so the two loops draft the same).

    python results/ship13/full_head.py hub_configs/smollm2-135m-instruct-dflash OUT_DIR
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from dflash_retrace import DFlashConfig, DFlashDrafter


def main(src: str, out: str) -> None:
    config = DFlashConfig.from_pretrained(src)
    config.draft_vocab_size = None
    config.lookup_threshold = 0.0
    state = load_file(Path(src) / "model.safetensors")
    state.pop("draft_to_target")
    drafter = DFlashDrafter(config)
    drafter.load_state_dict(state, strict=True)
    drafter.to(torch.bfloat16).save_pretrained(out)
    print(f"wrote {out}: {src} with the target's full head")


if __name__ == "__main__":
    main(*sys.argv[1:3])
