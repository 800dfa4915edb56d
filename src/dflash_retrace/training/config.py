"""`TrainConfig`: every knob of `train_drafter`, with its default and help; the `train` CLI is generated from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config_cli import comma_ints, option
from ..configuration_dflash import DEFAULT_BLOCK_SIZE, FUSIONS
from .init_layers import INIT_LAYERS
from .objective import LOSSES

__all__ = ["LORA_TARGETS", "STAGE_DEFAULTS", "TrainConfig"]

STAGE_DEFAULTS = {
    # DFlash recipe (SpecForge / AngelSlim): AdamW 6e-4, cosine, 4 percent warm-up, 6 epochs.
    "dflash": {"lr": 6e-4, "epochs": 6, "warmup_ratio": 0.04},
    # ReTrace recipe (re-implementation of the paper's appendix): 5e-5, cosine, 5 percent warm-up, 8 epochs.
    "retrace": {"lr": 5e-5, "epochs": 8, "warmup_ratio": 0.05},
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "fc"]


def _per_stage(key: str) -> str:
    return "default per stage: " + ", ".join(f"{stage} {values[key]}" for stage, values in STAGE_DEFAULTS.items())


@dataclass
class TrainConfig:
    """Every knob of `train_drafter`; `None` means the stage's default (STAGE_DEFAULTS)."""

    stage: str = option("dflash", "dflash: train a drafter; retrace: add and train its ReTrace conditioner "
                                  "(needs a DFlash drafter: --init)", choices=sorted(STAGE_DEFAULTS))
    init: str | None = option(None, "drafter folder (or template name / folder) to start from; none: a fresh "
                                    "drafter (dflash stage only)")
    # Shape of a fresh drafter.
    block_size: int | None = option(None, f"1 anchor + B-1 proposal slots; default: {DEFAULT_BLOCK_SIZE} for a fresh "
                                          "drafter, the --init drafter's own otherwise; with --init it re-targets "
                                          "that drafter (its weights do not depend on B)")
    num_layers: int = option(1, "fresh drafter: decoder layers (published: 5 for Qwen3-4B/8B)")
    num_target_features: int | None = option(None, "fresh drafter: target layers fused by fc (default: one per "
                                                   "drafter layer)")
    target_layer_ids: list | None = option(None, "fresh drafter: comma-separated target layer ids (overrides "
                                                 "--num-target-features)", type=comma_ints)
    mask_token_id: int | None = option(None, "fresh drafter: MASK token id (default: the last embedding row)")
    init_layers: str = option("random", "fresh drafter: random, or target-top (its decoder layers start as copies "
                                        "of the target's last layers, its final norm as the target's)",
                              choices=list(INIT_LAYERS))
    add_layers: int = option(0, "with --init: decoder layers added on top of that drafter, each starting as a copy of "
                                "its top layer with the residual outputs zeroed (o_proj, down_proj), so training starts "
                                "from the --init drafter exactly and opens the new layers")
    step_embeddings: bool = option(False, "add PAD-Rec step-position embeddings (zero-initialised, so an --init "
                                          "DFlash drafter starts unchanged) and train them with the drafter")
    context: str | None = option(None, "what the drafter's layers attend to (KVShot): hidden (DFlash), kv (the "
                                       "target's KV cache instead), hybrid (both; on an --init DFlash drafter adds "
                                       "zero-initialised weights, so training starts from it exactly); default: "
                                       "hidden for a fresh drafter, the --init drafter's own otherwise",
                                 choices=["hidden", "kv", "hybrid"])
    kv_layer_ids: list | None = option(None, "kv/hybrid: comma-separated target layers whose KV cache each drafter "
                                             "layer reads, one per layer (default: evenly spaced over the target's "
                                             "upper half, ending at its last layer)", type=comma_ints)
    fusion: str | None = option(None, "layerwise: each drafter layer adds its own learned mix of a broad set of "
                                      "target layers to the fc context (DFlare, reconstructed); with --init it adds "
                                      "zero-initialised fusion weights to that DFlash drafter; default: fc for a "
                                      "fresh drafter, the --init drafter's own otherwise",
                                choices=list(FUSIONS))
    fusion_layer_ids: list | None = option(None, "layerwise fusion: comma-separated target layers to mix (default: "
                                                 "every ceil(L/9)-th layer, the last included)", type=comma_ints)
    # Data.
    features: str | None = option(None, "feature store folder (`dflash-retrace features`), or several "
                                        "comma-separated (built with the same options, no row in two): train from "
                                        "them without running the target's layers (its embedding and LM head "
                                        "only); --data is then not read")
    eval_features: str | None = option(None, "a second feature store that is the held-out set (every row, at most "
                                             "256; --eval-size >= 1 caps the count): the --features store(s) are then "
                                             "trained on whole, and a row in both is an error")
    max_length: int = option(3072, "tokens per sequence (prompt + response), truncated beyond (the rows cut are "
                                   "counted and printed)")
    max_anchors: int = option(512, "blocks per sequence (random anchors; ReTrace: replayed rounds)")
    loss_vocab: str = option("full", "softmax of the loss: the full vocabulary, or the tokens of the training "
                                     "sequences plus EOS and the target's labels with --labels target/target-chain "
                                     "(a cheaper LM head, most of a CPU step); held-out metrics "
                                     "and inference always use the full vocabulary", choices=["full", "data"])
    labels: str = option("data", "data: the sequences' own tokens (right for regenerate output); target: the "
                                 "target's argmax next token at each position, from the forward that computes the "
                                 "features (self-distillation on text the target did not write); target-chain: "
                                 "those labels, each block cut where the text leaves the target's greedy chain (so "
                                 "every label is what verification would accept)",
                         choices=["data", "target", "target-chain"])
    draft_vocab_size: int | None = option(None, "a draft vocabulary of this many target tokens (the most frequent "
                                                "of the labels --labels trains on, in the training split, EOS "
                                                "included); the drafter's head and training softmax cover only "
                                                "those. With --init: grows that drafter's own draft vocabulary to "
                                                "this size (its ids kept, the most frequent labels outside it "
                                                "added), or gives a full-vocabulary drafter one; default: the "
                                                "--init drafter's own")
    chat_template: bool = option(True, "render prompts with the tokenizer's chat template, as generation does")
    enable_thinking: bool = option(False, "pass enable_thinking=True to Qwen3-style templates")
    eval_size: float = option(0.05, "held-out rows: a fraction (< 1) or a count (>= 1), at most 256; rows with the "
                                    "same tokens are held out together or not at all; 0 disables")
    # Optimisation.
    epochs: int | None = option(None, "passes over the data; " + _per_stage("epochs"))
    max_steps: int | None = option(None, "optimizer updates (overrides --epochs)")
    batch_size: int = option(1, "sequences per micro-batch per process")
    grad_accum: int = option(1, "micro-batches per optimizer update (each micro-batch's loss is its own weighted "
                                "mean over its slots, and the update averages them: a micro-batch of few "
                                "supervised slots weighs as much as one of many)")
    lr: float | None = option(None, "peak learning rate; " + _per_stage("lr"))
    weight_decay: float = option(0.01, "AdamW weight decay, on matrices only (not norms or biases)")
    new_weights_lr_scale: float = option(1.0, "learning-rate multiplier for the option modules' weights (ReTrace, "
                                              "step embeddings, layer-wise fusion, hybrid KV attention): they start "
                                              "at zero on a trained backbone, so at its low lr they barely move")
    warmup_ratio: float | None = option(None, "warm-up share of the updates; " + _per_stage("warmup_ratio"))
    max_grad_norm: float = option(1.0, "gradient clip")
    gamma: float | None = option(None, "slot-weight decay exp(-(k-1)/gamma) (VAT: exp(-(k-k*)/gamma)); default: 7 "
                                       "for B=16, 4 for B=8, scaled with B otherwise")
    loss: str = option("dflash", "slot weights: dflash (decay from slot 1) or vat (verification-aware: full weight "
                                 "up to each block's first would-be rejection under the drafter's own argmax, decay "
                                 "from there); held-out loss is always the dflash one", choices=list(LOSSES))
    distill: float = option(0.0, "weight w of the target's own distribution in each slot's loss: (1-w)*CE(label) + "
                                 "w*CE(softmax of the target's stored top-k logits, over those inside the draft "
                                 "vocabulary); needs a --features store built with --top-k; 0: labels only; held-out "
                                 "loss stays the label CE")
    mixed_precision: str = option("no", "accelerate autocast (fp32 master weights either way)",
                                  choices=["no", "bf16", "fp16"])
    attention: str = option("auto", "block rule: dense bool mask (any device), local (the same rule computed per "
                                    "block: context + own block only, ~5x fewer scores), or flex_attention BlockMask "
                                    "(CUDA); auto: flex if the drafter uses it, else local",
                            choices=["auto", "dense", "local", "flex"])
    seed: int = option(0, "seed of init, data order and anchors")
    # ReTrace stage.
    beta_warmup: int = option(50, "retrace: updates for beta to ramp 0 -> 1")
    freeze_backbone: bool = option(False, "retrace: train the ReTrace weights only")
    rollout_temperature: float = option(0.0, "retrace: the rollouts' sampling temperature (0: greedy); sampled "
                                             "rounds meet the memory that sampling (T > 0) generation gives")
    rollout_sampled_share: float = option(1.0, "retrace: with --rollout-temperature > 0, the share of rows rolled "
                                               "out sampled (the others greedy), chosen per row from --seed")
    # LoRA (PEFT) on the drafter's attention, MLP and fc.
    lora: bool = option(False, "train a LoRA adapter on attention/MLP/fc instead of all weights")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha")
    lora_dropout: float = option(0.0, "LoRA dropout")
    # Checkpoints, logging, evaluation.
    checkpoint_every: int = option(500, "updates between checkpoints/step-N; 0: none")
    keep_checkpoints: int = option(2, "newest checkpoints kept")
    resume: bool = option(False, "continue from the newest checkpoint in the output folder; the options that set "
                                 "the data, its order, split and schedule, the number of processes and the rows "
                                 "must be the saved run's (train_config.json, train_data.json)")
    log_every: int = option(10, "updates between log lines (held-out estimates add their own, see --eval-every)")
    report_to: str | None = option(None, "accelerate tracker: tensorboard, wandb, ...")
    progress: bool = option(True, "progress bars")
    eval_every: int = option(0, "updates between held-out estimates in train_log.jsonl (slot accuracy and the "
                                "teacher-forced τ on up to 32 held-out rows, against supervised slot-tokens seen; "
                                "plot with examples/plot_training.py); 0: the final summary only")
    eval_prompts: int = option(16, "held-out prompts for the τ estimate")
    eval_max_new_tokens: int = option(256, "tokens per held-out τ prompt")
    save_dtype: str | None = option(None, "saved drafter dtype (default: the target's, which the drafter runs with)")

    def resolved(self) -> "TrainConfig":
        for f in dataclasses.fields(self):  # the CLI checks choices; a config built in Python is checked here
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in (*choices, *([None] if f.default is None else [])):
                raise ValueError(f"{f.name} must be one of {list(choices)}, got {getattr(self, f.name)!r}.")
        if self.fusion_layer_ids is not None and self.fusion != "layerwise":
            raise ValueError("fusion_layer_ids (--fusion-layer-ids) sets the target layers mixed by layer-wise fusion: "
                             "add fusion='layerwise' (--fusion layerwise).")
        if not 0.0 <= self.distill <= 1.0:
            raise ValueError(f"distill (--distill) is a weight in [0, 1], got {self.distill}.")
        if not self.new_weights_lr_scale > 0:
            raise ValueError(f"new_weights_lr_scale (--new-weights-lr-scale) multiplies the lr of the option modules' "
                             f"weights: it must be > 0, got {self.new_weights_lr_scale} (1 trains them at --lr).")
        if self.checkpoint_every and self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints (--keep-checkpoints) must be >= 1 when checkpoints are written (got "
                             f"{self.keep_checkpoints}: each would be deleted as soon as it is saved); to write none, "
                             "set checkpoint_every (--checkpoint-every) to 0.")
        if self.log_every < 1 or self.eval_every < 0:
            raise ValueError(f"log_every (--log-every) must be >= 1 and eval_every (--eval-every) >= 0 (0: no "
                             f"held-out estimates during the run), got {self.log_every} and {self.eval_every}.")
        if self.distill and not self.features:
            raise ValueError("distill (--distill) reads the target's top-k logits from a feature store: add --features "
                             "STORE (built with `dflash-retrace features --top-k K`).")
        if self.init_layers != "random" and (self.init is not None or self.stage != "dflash"):
            raise ValueError("init_layers (--init-layers) initialises a fresh drafter; an --init drafter keeps its "
                             "weights: drop one of them.")
        if self.add_layers and (self.init is None or self.stage != "dflash" or self.lora):
            raise ValueError("add_layers (--add-layers) grows an --init drafter in a full DFlash-stage run: add --init "
                             "DRAFTER, and drop --stage retrace / --lora (grow first, then train those).")
        if self.add_layers < 0:
            raise ValueError(f"add_layers (--add-layers) counts layers to add, got {self.add_layers}.")
        if self.eval_features and not self.features:
            raise ValueError("eval_features (--eval-features) is the held-out store of a --features run: add --features "
                             "STORE, or hold rows out of --data with --eval-size.")
        if self.features and self.stage == "retrace":
            raise ValueError("The ReTrace stage rolls out real draft-verify rounds with the target online: train it "
                             "from --data (rows), without --features.")
        if self.rollout_temperature < 0 or not 0.0 <= self.rollout_sampled_share <= 1.0:
            raise ValueError(f"rollout_temperature (--rollout-temperature) must be >= 0 (0: greedy) and "
                             f"rollout_sampled_share (--rollout-sampled-share) in [0, 1], got "
                             f"{self.rollout_temperature} and {self.rollout_sampled_share}.")
        if self.rollout_temperature and self.stage != "retrace":
            raise ValueError("rollout_temperature (--rollout-temperature) sets the ReTrace stage's rollouts: add "
                             "stage='retrace' (--stage retrace) or drop it.")
        filled = {k: v for k, v in STAGE_DEFAULTS[self.stage].items() if getattr(self, k) is None}
        return dataclasses.replace(self, **filled)
