"""The code-solve held-out split of run 17 (issue 13): 64 "solve" prompts of the ninth mix, never trained on.

The first held-out split (held-out-ids.json, 64 rows of the first mix) has no function specs to solve, the task
HumanEval asks, so it understated what code-heavy data does there. This split is drawn from prompt-mix8's solve0/1/2
prompts (seed 17), leaving out the 248 rows that run 16's ReTrace stage trained on (results/ship13/retrace11.sh with
SOURCE=regen-mix8-part00), and writes their ids. `--answers FILE` (the mix's regenerate output) then writes the held-out
rows (`--heldout OUT`) and the training rows (`--train OUT`): the rest, less those 248 ReTrace rows too, so that a
ReTrace stage on run 17 can roll out the same 248 unseen answers as run 16's did.

    python results/wip_run17/solve_split.py --ids data/smollm2-135m-instruct/held-out-solve-ids.json
    python results/wip_run17/solve_split.py --ids data/smollm2-135m-instruct/held-out-solve-ids.json \
        --answers regen_mix8.jsonl --heldout heldout_solve.jsonl --train train_mix8.jsonl
"""
import argparse
import gzip
import json
import os
import random

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "smollm2-135m-instruct")


def read_gz(name):
    with gzip.open(os.path.join(DATA, name), "rt") as f:
        return [json.loads(line) for line in f]


def retrace16_ids():
    """The 248 rows of run 16's ReTrace stage: results/ship13/retrace11.sh's shuffle of regen-mix8-part00."""
    rows = read_gz("regen-mix8-part00.jsonl.gz")
    random.Random(11).shuffle(rows)  # the shell shuffles the same rows as lines: the same permutation
    return {r["id"] for r in rows[:248]}


def split_parser(doc):
    """The command line of a held-out split script (this one and results/wip_run18/math_split.py)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--ids", required=True, help="the split's ids (written when missing, read otherwise)")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--answers", help="the mix's answers (jsonl): split them into --heldout and --train")
    p.add_argument("--heldout")
    p.add_argument("--train")
    return p


def write_split(p, a, ids, skip=frozenset()):
    """--answers into --heldout (in the ids' order, so replays see the same sequence) and --train (file order, less
    the held-out ids and `skip`)."""
    if not (a.heldout and a.train):
        p.error("--answers needs --heldout and --train")
    rows = [json.loads(line) for line in open(a.answers)]
    held = {r["id"]: r for r in rows if r["id"] in ids}
    if len(held) != len(ids):
        p.error(f"{len(ids) - len(held)} held-out ids have no answer in {a.answers}: finish regenerate first")
    with open(a.heldout, "w") as f:
        f.writelines(json.dumps(held[i]) + "\n" for i in sorted(ids))
    train = [r for r in rows if r["id"] not in ids and r["id"] not in skip]
    with open(a.train, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train)
    print(f"{len(held)} held-out rows -> {a.heldout}, {len(train)} training rows -> {a.train} "
          f"({len(rows) - len(held) - len(train)} other rows left out)")


def main():
    p = split_parser(__doc__)
    a = p.parse_args()
    if not os.path.exists(a.ids):
        skip = retrace16_ids()
        solve = [r["id"] for r in read_gz("prompt-mix8.jsonl.gz") if r["template"].startswith("solve")]
        pool = sorted(i for i in solve if i not in skip)
        ids = sorted(random.Random(17).sample(pool, a.size))
        with open(a.ids, "w") as f:
            json.dump({"what": "code-solve held-out split from run 17 on (results/wip_run17/solve_split.py): "
                       f"{a.size} solve prompts of prompt-mix8 (seed 17, none of run 16's ReTrace rows). "
                       "Never train on them", "source": "prompt-mix8.jsonl.gz", "ids": ids}, f, indent=1)
        print(f"wrote {a.ids}: {len(ids)} of {len(pool)} solve prompts")
    ids = set(json.load(open(a.ids))["ids"])
    if a.answers:
        write_split(p, a, ids, skip=retrace16_ids())  # the ReTrace-stage rows stay out of training too


if __name__ == "__main__":
    main()
