"""A drafter folder with `lookup_threshold` set: every file of SRC linked into DEST (the same weights), its config
copied with the value changed.

    python results/context_lookup/with_lookup.py SRC DEST 0.6
"""
import json
import shutil
import sys
from pathlib import Path

src, dest, threshold = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), float(sys.argv[3])
shutil.rmtree(dest, ignore_errors=True)
dest.mkdir(parents=True)
for path in src.iterdir():
    if path.name != "config.json":
        (dest / path.name).symlink_to(path.resolve())
config = json.loads((src / "config.json").read_text())
config["lookup_threshold"] = threshold
(dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
print(f"{dest}: {src.name} with lookup_threshold={threshold}")
