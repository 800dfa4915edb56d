"""Writes the training-data manifest of the shipped SmolLM2 drafters (issue 13: run 29 and its ReTrace stage).

Every file a run of the lineage trained on is committed under data/smollm2-135m-instruct/ (the regenerated answers)
or rebuilt by the commands of its README (the source-text rows); this records their sha256, row counts, the
prompt-mix manifests with their 13-word overlap checks against the evaluation sets, and which run used what.

    python results/ship13/make_manifest.py OUT.json
"""

import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "smollm2-135m-instruct"


def main(out: str) -> None:
    files = {}
    for path in sorted(DATA.glob("*.jsonl.gz")):
        raw = path.read_bytes()
        files[path.name] = {"sha256": hashlib.sha256(raw).hexdigest(),
                            "rows": sum(1 for _ in gzip.decompress(raw).splitlines())}
    manifests = {p.name: json.loads(p.read_text()) for p in sorted(DATA.glob("*.manifest.json"))}
    manifest = {
        # slot-tokens: runs 1-24 ~140.5M (checkpoints/smollm2-135m-instruct-dflash-b8-wip/README.md), then the
        # last slot_tokens of each train_log.jsonl: run 26 6,011,124, 28-v16k 6,060,553, run 29 4,959,822
        "description": "Training data of the shipped SmolLM2-135M-Instruct drafters (dflash-retrace issue 13): the "
                       "DFlash drafter is the work-in-progress lineage's run 29 (runs 1-24, 26, 28-v16k and 29, "
                       "~157.5M supervised slot-tokens; runs 8, 15, 16, 18, 19, 20, 21 and 24 were shipped before "
                       "it), the ReTrace drafter its ReTrace stage",
        "data_folder": "data/smollm2-135m-instruct (README.md there has every command)",
        "files": files,
        "held_out": json.loads((DATA / "held-out-ids.json").read_text()),
        "held_out_solve": json.loads((DATA / "held-out-solve-ids.json").read_text()),
        "held_out_math": json.loads((DATA / "held-out-math-ids.json").read_text()),
        "runs": {
            "1-3": "store: 1,068 source-text rows (text-rows.manifest.json recipe) + the first 1,088 answers of "
                   "regen-mix-part00",
            "4": "store2: regen-mix-part00 rows 1,089-1,663 + regen-mix-part01 rows 1-576",
            "6": "store2 + store3a (regen-mix-part01 641-1,626 + regen-mix-part02 1-1,408, first 1,197)",
            "7": "store2, store3a, store3b, store4 (regen-mix-part02 1,409-1,679 + regen-mix-part03): the whole first "
                 "prompt mix but the held-out split (5,461 answers)",
            "8": "store3b, store4, store5 (regen-mix1-part00, the second prompt mix): 6,915 answers",
            "11": "regen-mix2-part00 (the third prompt mix): 3,609 answers",
            "12": "regen-mix1-part00 + regen-mix2-part00 (the second and third mixes): 7,411 answers",
            "13": "regen-mix1-part00 + regen-mix2-part00 + regen-mix3-part00 (the second to fourth mixes): 11,769 "
                  "answers",
            "14": "regen-mix4-part00 (the fifth mix) + the first mix (regen-mix-part00..03) but the held-out split: "
                  "10,289 answers",
            "15": "regen-mix5-part00 (the sixth mix) + regen-mix3-part00 (the fourth): 8,529 answers",
            "16": "regen-mix6-part00 (the seventh mix) + regen-mix7-part00..02 (the code-heavy eighth): 9,567 "
                  "answers",
            "17": "regen-mix8-part00..03 (the code-heavy ninth mix) but its 64 held-out solve rows and the 248 "
                  "rows run 16's ReTrace stage rolled out: 2,951 answers, 2.03 epochs",
            "18": "run 17's 2,951 answers + regen-mix9-part00 (the tenth mix, math only) but its 64 held-out math "
                  "rows: 3,861 answers, 1.04 epochs",
            "19": "regen-mix10-part00 (the eleventh mix) but the 608 rows of the ReTrace stage: 5,726 answers + "
                  "run 18's 3,861 again: 9,587 answers, 1.0 epoch",
            "20": "regen-mix11-part00 (the twelfth mix): 3,230 answers + run 19's 5,726 mix-10 answers and the 910 "
                  "math answers of mix9 again: 9,866 answers, 0.97 epochs",
            "21": "regen-mix12-part00 (the thirteenth mix): 4,666 answers + run 20's 3,230 mix-11 answers and the 910 "
                  "math answers of mix9 again: 8,806 answers, 1.0 epoch",
            "22": "run 21's 8,806 answers again (a second pass, seed 19): 1.0 epoch",
            "23": "regen-mix13-part00 (the fourteenth mix): 3,313 answers + the 910 math answers of mix9 again: "
                  "4,223 answers, 1.0 epoch",
            "24": "regen-mix14-part00 (the fifteenth mix): 4,169 answers + the 910 math answers of mix9 again: "
                  "5,079 answers, 1.0 epoch",
            "26": "from run 24: regen-mix15-part00 + regen-mix15-part01 (the sixteenth mix, stores s15a, s15b): "
                  "4,921 answers + the 910 math answers of mix9 again (sm9): 5,831 answers, 1,457 updates, 1.0 epoch",
            "28-v16k": "from run 26 with its draft vocabulary grown from 8,192 to 16,384 ids: regen-mix16-part00 + "
                       "regen-mix16-part01 (the seventeenth mix, stores s16a, s16b): 4,948 answers + the 910 math "
                       "answers of mix9 again (sm9k): 5,858 answers, 1,464 updates, 1.0 epoch",
            "29": "from 28-v16k at peak lr 1e-4: run 26's rows again (s15a, s15b, sm9: regen-mix15-part00 + "
                  "regen-mix15-part01 + the 910 math answers of mix9): 5,831 answers, 1,200 updates, 0.82 epochs",
            "side branches": "runs 25 (a depth A/B on run 24's rows), 27 (run 26 on the seventeenth mix, labels and "
                             "distillation arms) and run 28's lr1 arm were not kept: none is in run 29's ancestry",
            "retrace": "608 answers of regen-mix10-part00 (the eleventh prompt mix, never trained on by any run; "
                       "shuffled with seed 11, the first 608), prompts rolled out greedily with run 29 with "
                       "draft_vocab_context on, rollouts and training in fp32, 300 updates of 2 sequences, backbone "
                       "frozen (python results/context_vocab/with_context.py results/wip_run28/run29 /tmp/run29ctx; "
                       "OUT=/work/run29/retrace29f32 bash results/wip_run28/retrace29.sh --dtype float32 "
                       "--mixed-precision no, which runs SOURCE=regen-mix10-part00 ROWS=608 "
                       "results/ship13/retrace11.sh --freeze-backbone --max-steps 300; results/ship29/README.md); "
                       "the stages of runs 18 to 21 and 24 used the same 608 rows rolled out with their own "
                       "backbones (bf16); the ReTrace drafters shipped with runs 8, 15 and 16 used 248 answers of "
                       "regen-mix2-part00, regen-mix6-part00 and regen-mix8-part00",
        },
        "eval_overlap_check": "every prompt (and text-row response) sharing a 13-word window with a HumanEval (164), "
                              "MT-Bench (80) or GSM8K-test (1,319) prompt was dropped when the rows were built; "
                              "counts in each manifest's eval_overlap_check",
        "manifests": manifests,
    }
    Path(out).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out}: {len(files)} data files, {sum(f['rows'] for f in files.values())} rows")


if __name__ == "__main__":
    main(sys.argv[1])
