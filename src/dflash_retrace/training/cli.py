"""The training commands: `regenerate`, `train`, `features` and `corpus`, their options generated from their config
dataclasses."""

import argparse
import json

from ..config_cli import add_config_arguments, config_from_args
from ..runtime import DTYPE_HELP, load_target
from .config import TrainConfig
from .corpus import CorpusConfig, build_corpus
from .features import FeaturesConfig, build_features
from .loop import train_drafter
from .regenerate import RegenerateConfig, regenerate

TARGET_HELP = "registry name (see `fetch`), local folder or Hub id"


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "regenerate", help="write the target's own responses to a prompt set (training data for a drafter)",
        description="Batched target generation (left padding), resumable: ids already in --out are skipped.",
    )
    p.add_argument("--target", required=True, help=TARGET_HELP)
    p.add_argument("--prompts", required=True, help="JSONL (or datasets folder / Hub id) with `messages` or `prompt` rows")
    p.add_argument("--out", required=True, help="output JSONL (appended; existing ids are skipped)")
    p.add_argument("--dtype", default="auto", help=f"target dtype: {DTYPE_HELP}")
    p.add_argument("--device", default="auto", help="target device: auto (cuda if available, else cpu), cpu, cuda, ...")
    add_config_arguments(p, RegenerateConfig, skip=("target_name", "progress"))
    p.set_defaults(func=_run_regenerate)

    p = subparsers.add_parser(
        "train", help="train a DFlash drafter (--stage dflash) or its ReTrace conditioner (--stage retrace)",
        description="Train a drafter for --target on --data (chat `messages` or `prompt`/`response` rows, loss on "
                    "the response). Multi-GPU: torchrun --nproc_per_node N -m dflash_retrace.cli train ... (or "
                    "accelerate launch). Writes the drafter (or LoRA adapter), summary.json and checkpoints/step-N.",
    )
    _model_io(p, "JSONL (or datasets folder / Hub id), e.g. the output of `regenerate` (not needed with --features)",
              "output folder", "auto", data_required=False)
    add_config_arguments(p, TrainConfig)
    p.set_defaults(func=_run_train)

    p = subparsers.add_parser(
        "features", help="run the frozen target once over training rows and store its features for `train --features`",
        description="Per token: the hidden states of the chosen target layers (bf16), the target's own next-token "
                    "label and optionally its top-k logits, in memory-mapped shards with a manifest. Resumable.",
    )
    _model_io(p, "JSONL rows as `train` reads them (e.g. the output of `regenerate`)",
              "store folder (an existing store is resumed)", "bfloat16")
    add_config_arguments(p, FeaturesConfig)
    p.set_defaults(func=_run_features)

    p = subparsers.add_parser(
        "corpus", help="build training prompts (or source-text rows) from text disjoint from the evaluation sets",
        description="Python stdlib functions and SOTU / Brown / Shakespeare excerpts, fetched with their ordinary "
                    "clients; rows sharing a 13-word window with HumanEval / MT-Bench / GSM8K are dropped.",
    )
    add_config_arguments(p, CorpusConfig)
    p.set_defaults(func=lambda args: print(json.dumps(build_corpus(config_from_args(CorpusConfig, args)))))


def _run_regenerate(args: argparse.Namespace) -> int:
    target, tokenizer = load_target(args.target, args.device, args.dtype)
    config = config_from_args(RegenerateConfig, args, target_name=args.target)
    print(json.dumps(regenerate(target, tokenizer, args.prompts, args.out, config)))
    return 0


def _model_io(parser, data_help: str, out_help: str, dtype: str, data_required: bool = True) -> None:
    """--target, --data, --out and --dtype of the commands that run a target over training rows."""
    parser.add_argument("--target", required=True, help=TARGET_HELP)
    parser.add_argument("--data", required=data_required, default=None, help=data_help)
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--dtype", default=dtype, help=f"target dtype (default {dtype}): {DTYPE_HELP}")


def _run_features(args: argparse.Namespace) -> int:
    target, tokenizer = load_target(args.target, "auto", args.dtype)
    manifest = build_features(target, tokenizer, args.data, args.out, config_from_args(FeaturesConfig, args),
                              meta={"target": args.target})
    print(json.dumps({"out": args.out, "rows": len(manifest["rows"]), "tokens": manifest["num_tokens"],
                      "layer_ids": manifest["layer_ids"]}))
    return 0


def _run_train(args: argparse.Namespace) -> int:
    if args.data is None and args.features is None:
        raise SystemExit("dflash-retrace train: give --data (rows) or --features (a feature store).")
    from accelerate import PartialState

    device = PartialState().device  # each process loads the target onto its own device
    target, tokenizer = load_target(args.target, device, args.dtype)
    train_drafter(target, tokenizer, args.data, args.out, config_from_args(TrainConfig, args))
    return 0
