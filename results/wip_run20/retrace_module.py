"""Run 20's ReTrace stage (`retrace20`, greedy rollouts, frozen backbone) as its added weights only, and back.

The stage trains the ReTrace module alone (`--freeze-backbone`), so its drafter is run 20 (the WIP checkpoint) plus
five tensors (`retrace.*`, 3.3 MB) and `"retrace": true` in the config. From the repository root:

    python results/wip_run20/retrace_module.py save /work/rt20/retrace20 results/wip_run20/retrace20/retrace_module.safetensors
    python results/wip_run20/retrace_module.py build checkpoints/smollm2-135m-instruct-dflash-b8-wip \\
        results/wip_run20/retrace20/retrace_module.safetensors retrace20      # the stage's drafter folder again
    python results/wip_run20/retrace_module.py check retrace20 /work/rt20/retrace20   # same tensors and config
"""

import json
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def save(stage, out):
    tensors = {k: v for k, v in load_file(Path(stage) / "model.safetensors").items() if k.startswith("retrace.")}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out)
    print(f"{out}: {sorted(tensors)}")


def build(backbone, module, out):
    backbone, out = Path(backbone), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in backbone.iterdir():  # the payload code and config; the backbone's own records stay behind
        if f.suffix == ".py" or f.name in ("config.json", "generation_config.json"):
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["retrace"] = True
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = load_file(backbone / "model.safetensors")
    added = load_file(module)
    if any(k in tensors for k in added):
        raise SystemExit(f"{backbone} has ReTrace weights already")
    save_file({**tensors, **added}, out / "model.safetensors", metadata={"format": "pt"})
    print(f"{out}: {len(tensors)} backbone tensors + {len(added)} ReTrace tensors")


def check(a, b):
    ta, tb = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    same = ta.keys() == tb.keys() and all(ta[k].dtype == tb[k].dtype and ta[k].equal(tb[k]) for k in ta)
    ca, cb = (json.loads((Path(p) / "config.json").read_text()) for p in (a, b))
    print(f"tensors {'identical' if same else 'DIFFER'}; config {'identical' if ca == cb else 'DIFFERS'}")
    return 0 if same and ca == cb else 1


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    sys.exit({"save": save, "build": build, "check": check}[command](*args) or 0)
