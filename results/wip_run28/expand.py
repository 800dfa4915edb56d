"""Run 26 with a larger draft vocabulary: its 8,192 ids plus the most frequent training labels not in it (counts from
the training stores: COUNTS, default label_counts.npy as vocab_cov.py writes it), up to SIZE; SIZE=full drops the
draft vocabulary.
    python expand.py SRC OUT SIZE [COUNTS]"""
import sys, numpy as np, torch
from dflash_retrace.modeling_dflash import DFlashDrafter
src, out, size = sys.argv[1], sys.argv[2], sys.argv[3]
m = DFlashDrafter.from_pretrained(src, dtype=torch.bfloat16)
old = m.draft_to_target.clone()
if size == 'full':
    ids = torch.arange(m.config.vocab_size)
else:
    counts = torch.from_numpy(np.load(sys.argv[4] if len(sys.argv) > 4 else 'label_counts.npy'))
    have = set(old.tolist())
    extra = [int(i) for i in torch.argsort(counts, descending=True, stable=True) if int(i) not in have]
    ids = torch.tensor(sorted(have | set(extra[: int(size) - len(have)])))
m.set_draft_vocabulary(ids)
m.save_pretrained(out)
print(out, m.config.draft_vocab_size, 'old kept:', bool(torch.isin(old, m.draft_to_target).all()))
