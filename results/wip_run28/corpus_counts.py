"""Counts of the target's answer tokens (its greedy labels, EOS included) over every committed answer file
(data/smollm2-135m-instruct/regen-*.jsonl.gz: the answers of all the mixes, prose and code), the held-out rows of
held-out*-ids.json left out; writes corpus_counts.npy for expand.py. Run from the repository root.
    python results/wip_run28/corpus_counts.py
"""
import glob, gzip, json
import numpy as np
from transformers import AutoTokenizer

DATA = "data/smollm2-135m-instruct"
tok = AutoTokenizer.from_pretrained("/root/.cache/dflash-retrace/models/smollm2-135m-instruct")
held, held_lines = set(), {}  # held-out prompt ids; {answer file: (first, last) line, 1-based} for the first split
for path in glob.glob(f"{DATA}/held-out*-ids.json"):
    spec = json.load(open(path))
    if "lines" in spec:
        held_lines[spec["source"]] = tuple(spec["lines"])
    else:
        held |= set(spec["ids"])
counts, rows, skipped = np.zeros(49152, np.int64), 0, 0
for path in sorted(glob.glob(f"{DATA}/regen-*.jsonl.gz")):
    texts = []
    first, last = held_lines.get(path.rsplit("/", 1)[-1], (0, -1))
    for number, line in enumerate(gzip.open(path, "rt"), start=1):
        row = json.loads(line)
        if row.get("id") in held or first <= number <= last:
            skipped += 1
            continue
        texts.append(row["response"] if "response" in row else row["messages"][-1]["content"])
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        counts += np.bincount(np.asarray(ids + [tok.convert_tokens_to_ids("<|im_end|>")]), minlength=49152)
    rows += len(texts)
print(f"{rows} answers ({skipped} held-out rows left out), {counts.sum():,} tokens, {(counts > 0).sum():,} distinct")
np.save("corpus_counts.npy", counts)
