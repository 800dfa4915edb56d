"""Training drafters: data, the DFlash objective, ReTrace rollouts, the loop, regeneration and the prompt corpus.

    train_drafter(target, tokenizer, data, out_dir, TrainConfig(stage="dflash")) -> drafter

Modules: `config` (`TrainConfig`, from which the `train` CLI is generated), `data` (rows, tokenization,
batches), `objective` (anchors, block masks, the decay-weighted loss; takes precomputed target features),
`rollouts` (ReTrace-stage rollouts with the real generator), `loop` (`train_drafter`), `held_out` (held-out loss,
per-slot accuracy and τ), `regenerate` (the target writes the responses), `corpus` (training prompts disjoint from
the evaluation sets), `cli` (the `regenerate`, `train` and `corpus` commands).
"""

from .cli import register_cli
from .config import LORA_TARGETS, STAGE_DEFAULTS, TrainConfig
from .data import Example, load_rows, tokenize_rows
from .held_out import evaluate_slots, measure_acceptance
from .loop import latest_checkpoint, train_drafter
from .regenerate import RegenerateConfig, read_done_ids, regenerate

__all__ = ["Example", "LORA_TARGETS", "RegenerateConfig", "STAGE_DEFAULTS", "TrainConfig", "evaluate_slots",
           "latest_checkpoint", "load_rows", "measure_acceptance", "read_done_ids", "regenerate", "register_cli",
           "tokenize_rows", "train_drafter"]

