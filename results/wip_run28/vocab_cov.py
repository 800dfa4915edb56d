"""Draft-vocabulary coverage of the held-out references (the target's own greedy 64 tokens), per split, and how many
rounds could be lost to out-of-vocabulary tokens; plus label counts over the training stores (written to
label_counts.npy). Run from the repository root; HELDOUT_DIR holds refs*.jsonl (the held-out replays' cached outputs).
    HELDOUT_DIR=/work/run23 python results/wip_run28/vocab_cov.py STORE [STORE ...]"""
import json, os, sys, numpy as np
from safetensors.torch import load_file
w = load_file('results/wip_run26/run26/model.safetensors')
d2t = w['draft_to_target'].long().numpy()
inv = np.zeros(49152, bool); inv[d2t] = True
print('draft vocab', d2t.size)
stores = sys.argv[1:]
counts = np.zeros(49152, np.int64)
for s in stores:
    m = json.load(open(f'{s}/manifest.json'))
    for sh in m['shards']:
        lab = np.load(f"{s}/{sh['name']}.labels.npy", mmap_mode='r')
        mask = np.load(f"{s}/{sh['name']}.loss_mask.npy", mmap_mode='r').astype(bool)
        l = np.asarray(lab)[mask]; l = l[l >= 0]
        counts += np.bincount(l, minlength=49152)
tot = counts.sum(); print('train labels', tot, 'coverage by current vocab', counts[inv].sum() / tot)
order = np.argsort(-counts, kind='stable')
for k in (8192, 12288, 16384, 24576, 32768):
    print(f'  top-{k} of these stores: coverage {counts[order[:k]].sum()/tot:.4f}; union with current: '
          f'{counts[inv | np.isin(np.arange(49152), order[:k])].sum()/tot:.4f}')
np.save('label_counts.npy', counts)
for split in ('refs.jsonl', 'refs_solve.jsonl', 'refs_math.jsonl'):
    ids = [r['new_ids'] for r in map(json.loads, open(os.path.join(os.environ.get('HELDOUT_DIR', '/work/run23'), split)))]
    flat = np.concatenate([np.array(x) for x in ids])
    print(split, 'tokens', flat.size, 'in draft vocab', inv[flat].mean().round(4),
          'in top-16384 of stores', np.isin(flat, order[:16384]).mean().round(4),
          'rows with an OOV token', sum((~inv[np.array(x)]).any() for x in ids))
