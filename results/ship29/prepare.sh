#!/usr/bin/env bash
# Builds the next shipped SmolLM2 pair into DEST (default: a scratch folder; DEST=hub_configs replaces the shipped
# weights and configs): the DFlash drafter is run 29 (results/wip_run28/run29) with `draft_vocab_context` on, the
# ReTrace drafter is run 29 plus the ReTrace module its stage trained (results/ship29/retrace29/). LOOKUP sets both
# configs' lookup_threshold (default 0, off: what the scripts of results/ship29 and results/context_lookup compare
# against; the ship uses LOOKUP=0.6, chosen on the held-out splits in results/context_lookup/). Model cards,
# training-data manifests and the README's numbers are not written here: they come from the benches
# (results/ship29/README.md, "What the ship still needs"). Run from the repository root.
set -euo pipefail
DEST=${DEST:-/tmp/ship29}
LOOKUP=${LOOKUP:-0}
RUN29=results/wip_run28/run29
STAGE=results/ship29/retrace29
D=$DEST/smollm2-135m-instruct-dflash
R=$DEST/smollm2-135m-instruct-retrace
mkdir -p "$D" "$R"
python results/context_vocab/with_context.py "$RUN29" "$D"         # weights byte for byte, config with the option on
cp "$RUN29/summary.json" "$D/summary.json"
python results/wip_run20/retrace_module.py build "$D" "$STAGE/retrace_module.safetensors" "$R"
cp "$STAGE/summary.json" "$R/summary.json"
python - "$LOOKUP" "$D" "$R" <<'PY'
import json, sys
from dflash_retrace.hub import write_payload
for folder in sys.argv[2:]:
    write_payload(folder)
    config = json.load(open(f"{folder}/config.json"))
    config["lookup_threshold"] = float(sys.argv[1])
    with open(f"{folder}/config.json", "w") as handle:  # as save_pretrained writes it: sorted keys, final newline
        handle.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    assert config["draft_vocab_context"] is True and config["draft_vocab_size"] == 16384, config
    print(folder, "retrace" if config.get("retrace") else "dflash", "ready, lookup_threshold", config["lookup_threshold"])
PY
