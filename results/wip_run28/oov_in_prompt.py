"""Of the rounds of v16k (run 28) that ended at a token outside its 16,384 ids on the held-out splits, how many
ended at a token of the prompt itself (its chat-template tokens). Run from the repository root; the refs*.jsonl and
heldout*.jsonl files of results/wip_run23/README.md in /work/run23.
    python results/wip_run28/oov_in_prompt.py
"""
import json, numpy as np
from transformers import AutoTokenizer
from safetensors.torch import load_file
tok = AutoTokenizer.from_pretrained('/root/.cache/dflash-retrace/models/smollm2-135m-instruct')
v = set(load_file('results/wip_run28/v16k/model.safetensors')['draft_to_target'].tolist())
for split, rep in (('_solve', 'replay_heldout_solve64_run28_vs_run26.json'), ('', 'replay_heldout64_run28_vs_run26.json')):
    R = json.load(open(f'results/wip_run28/{rep}'))
    refs = [json.loads(l)['new_ids'] for l in open(f'/work/run23/refs{split}.jsonl')]
    rows = [json.loads(l) for l in open(f'/work/run23/heldout{split}.jsonl')]
    ended = in_prompt = rounds = 0
    for p, ids, row in zip(R['prompts'], refs, rows):
        assert p['new_tokens'][0] == len(ids)
        msgs = row.get('messages') or [{'role': 'user', 'content': row['prompt']}]
        prompt = set(tok(tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True))['input_ids'])
        d = p['drafters']['v16k']; pos = 1
        for L, k in zip(d['acceptance_lengths'], d['num_proposals']):
            rounds += 1
            t = ids[pos + L - 1]
            if L - 1 < k and t not in v:
                ended += 1; in_prompt += t in prompt
            pos += L
    print(split or '_first', 'rounds', rounds, 'ended outside 16k', ended, 'of which the token is in the prompt', in_prompt)
