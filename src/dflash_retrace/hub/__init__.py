"""Publishing drafters: Hub-ready folders in our layout and in z-lab's, uploads, and config templates.

```bash
dflash-retrace export DRAFTER_DIR --out repo/ [--base-model Qwen/Qwen3-8B]        # transformers + trust_remote_code
dflash-retrace export DRAFTER_DIR --out repo-zlab/ --format zlab                    # plain DFlash for vLLM/SGLang/z-lab
dflash-retrace push DRAFTER_DIR --repo-id org/name [--private]                      # export, then upload
dflash-retrace templates [--out hub_configs/templates]                              # drafter configs for common targets
dflash-retrace payload hub_configs/smollm2-135m-instruct-*                        # refresh shipped payload copies
```

Modules: `export` (export, push, z-lab layout), `card` (the model card), `template_folders` (the template
folders), `payload` (`write_payload`: the payload copies next to shipped weights).

- `ours`: `save_pretrained` of the drafter (safetensors, config.json with `auto_map`, the three payload
  modules), a model card, and the `training_summary.json` / `bench*.json` found next to the weights.
  The folder loads with `AutoModel.from_pretrained(repo, trust_remote_code=True)` and torch +
  transformers only.
- `zlab`: z-lab's config layout (`model_type: "qwen3"`, `architectures: ["DFlashDraftModel"]`,
  `dflash_config`), the same tensor names (ours already match theirs), ReTrace weights dropped.

What the model card reads, when present in DRAFTER_DIR (and copies into the export):
- the training summary, `training_summary.json` or `summary.json` (what `dflash-retrace train` writes):
  a JSON object; scalars and lists become a table, `command` a code block, and `base_model` / `target`
  the card's `base_model` when none is given;
- `bench*.json`: reports of `dflash-retrace bench` (schema `dflash-retrace/bench/v1`: one row per file,
  from `config` and `summary.methods.speculative`; for a z-lab export of a ReTrace drafter, which runs plain
  DFlash, from `summary.methods.zlab_reference`, and a file without it gives no row, with a note), or plain
  rows (an object, a list, or `{"rows": [...]}`) with `tau_pooled` and optionally `dataset`, `temperature`,
  `num_prompts`, `max_new_tokens`, `tau_prompt_mean`, `speedup` (not used for a z-lab export of a ReTrace drafter: they name no method).

`export` reads and checks everything first and writes to a temporary sibling of `--out` that then takes its
place: a refused or failed export leaves `--out` as it was, and an `--out` holding the drafter is refused.
"""

import argparse
from pathlib import Path

from ..runtime import load_drafter
from ..templates import TEMPLATES, load_template_config, template_config
from .card import model_card
from .export import _ZLAB_KEY  # noqa: F401 - the z-lab tensor-name pattern, for tests
from .export import FORMATS, default_commit_message, export_drafter, push_drafter, zlab_config, zlab_state_dict
from .payload import PAYLOAD_FILES, write_payload
from .template_folders import TEMPLATES_DIR, template_files, templates_index, write_templates

__all__ = [
    "PAYLOAD_FILES",
    "TEMPLATES",
    "default_commit_message",
    "export_drafter",
    "load_drafter",
    "load_template_config",
    "model_card",
    "push_drafter",
    "register_cli",
    "template_config",
    "template_files",
    "templates_index",
    "write_payload",
    "write_templates",
    "zlab_config",
    "zlab_state_dict",
]


def register_cli(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("drafter_dir", metavar="DRAFTER_DIR", help="Saved drafter (or PEFT adapter of one) to publish.")
    common.add_argument("--format", choices=FORMATS, default="ours",
                        help="ours: transformers + trust_remote_code, keeps ReTrace (default). "
                             "zlab: z-lab's DFlash layout for vLLM/SGLang/dflash, drops ReTrace.")
    common.add_argument("--base-model", help="Hub id of the target, for the model card (default: from "
                                             "summary.json or training_summary.json).")
    common.add_argument("--license", default="apache-2.0", help="Model card license; use the target's if it "
                                                                "has its own (e.g. llama3.1).")

    export = subparsers.add_parser("export", parents=[common], help="write a Hub-ready folder for a drafter (ours or z-lab layout)")
    export.add_argument("--out", required=True, help="Folder to write (must be empty or absent).")
    export.add_argument("--repo-id", help="Repo id shown in the model card's usage snippet.")
    export.add_argument("--overwrite", action="store_true",
                        help="Replace --out if it is not empty (the old folder is deleted once the new export is "
                             "complete; a folder holding DRAFTER_DIR is refused).")
    export.set_defaults(func=_cmd_export)

    push = subparsers.add_parser("push", parents=[common], help="export a drafter and upload it to the Hugging Face Hub")
    push.add_argument("--repo-id", required=True, help="Hub repo to create or update, e.g. org/Qwen3-8B-DFlash-ReTrace.")
    push.add_argument("--private", action="store_true", help="Create the repo as private.")
    push.add_argument("--commit-message", help="Default: 'Upload <kind> drafter (dflash-retrace <version>)'.")
    push.set_defaults(func=_cmd_push)

    templates = subparsers.add_parser("templates", help="write drafter config templates for common targets")
    templates.add_argument("--out", default=str(TEMPLATES_DIR), help=f"Root folder (default: {TEMPLATES_DIR}).")
    templates.set_defaults(func=_cmd_templates)

    payload = subparsers.add_parser("payload", help="write the payload modules into drafter folders (the copies "
                                                    "that travel next to the weights)")
    payload.add_argument("folders", nargs="+", metavar="FOLDER", help="e.g. hub_configs/smollm2-135m-instruct-*")
    payload.set_defaults(func=_cmd_payload)


def _cmd_export(args) -> int:
    out = export_drafter(args.drafter_dir, args.out, format=args.format, base_model=args.base_model,
                         license=args.license, repo_id=args.repo_id, overwrite=args.overwrite)
    print(f"Wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def _cmd_push(args) -> int:
    info = push_drafter(args.drafter_dir, args.repo_id, private=args.private, format=args.format,
                        base_model=args.base_model, license=args.license, commit_message=args.commit_message)
    print(f"Uploaded to {getattr(info, 'commit_url', None) or args.repo_id}")
    return 0


def _cmd_templates(args) -> int:
    for path in write_templates(args.out):
        print(path)
    return 0


def _cmd_payload(args) -> int:
    for folder in args.folders:  # all checked before anything is written
        if not (Path(folder) / "config.json").is_file():
            what = "does not exist" if not Path(folder).exists() else "holds no config.json"
            raise FileNotFoundError(f"payload: {folder} {what}; pass a saved drafter folder (one with config.json), "
                                    "e.g. `dflash-retrace payload hub_configs/smollm2-135m-instruct-dflash`.")
    for folder in args.folders:
        for path in write_payload(folder):
            print(path)
    return 0
