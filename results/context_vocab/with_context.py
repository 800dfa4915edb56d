"""Copies a drafter folder's weights and config to OUT with `draft_vocab_context` set (default true), so that a
replay or bench can compare a drafter with and without its context tokens in one run:
    python results/context_vocab/with_context.py results/wip_run28/run29 /tmp/run29ctx [false]
"""
import json
import shutil
import sys
from pathlib import Path

src, out = Path(sys.argv[1]), Path(sys.argv[2])
value = len(sys.argv) < 4 or sys.argv[3].lower() == "true"
out.mkdir(parents=True, exist_ok=True)
shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
config = json.loads((src / "config.json").read_text())
config["draft_vocab_context"] = value
(out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
print(f"{out}: draft_vocab_context={value}, draft_vocab_size={config.get('draft_vocab_size')}")
