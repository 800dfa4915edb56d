"""The math held-out split of run 18 (issue 13): 64 prompts of the tenth mix (all synthetic arithmetic), never trained on.

Neither earlier held-out split has a math prompt, so run 17's GSM8K regression (mix8 is 6% math) was invisible to
selection. The tenth mix is math only (`corpus --mix --mix-shares 0,0,1,0 --seed 9`, every committed answer
excluded, so no run has seen its prompts): sorted by id, 64 rows drawn with seed 18 are held out and the other 910 are
run 18's math rows. `--answers FILE` (the mix's regenerate output) then writes the held-out rows (`--heldout OUT`) and
the training rows (`--train OUT`).

    python results/wip_run18/math_split.py --ids data/smollm2-135m-instruct/held-out-math-ids.json
    python results/wip_run18/math_split.py --ids data/smollm2-135m-instruct/held-out-math-ids.json \
        --answers regen_mix9.jsonl --heldout heldout_math.jsonl --train train_mix9.jsonl
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wip_run17"))
from solve_split import read_gz, split_parser, write_split  # noqa: E402  (the shared split helpers of run 17)


def main():
    p = split_parser(__doc__)
    a = p.parse_args()
    if not os.path.exists(a.ids):
        pool = sorted(r["id"] for r in read_gz("prompt-mix9.jsonl.gz"))
        ids = sorted(random.Random(18).sample(pool, a.size))
        with open(a.ids, "w") as f:
            json.dump({"what": "math held-out split from run 18 on (results/wip_run18/math_split.py): "
                       f"{a.size} prompts of prompt-mix9 (seed 18). Never train on them",
                       "source": "prompt-mix9.jsonl.gz", "ids": ids}, f, indent=1)
        print(f"wrote {a.ids}: {len(ids)} of {len(pool)} math prompts")
    if a.answers:
        write_split(p, a, set(json.load(open(a.ids))["ids"]))


if __name__ == "__main__":
    main()
