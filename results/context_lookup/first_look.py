"""The first look at context lookup (a throwaway, kept as it ran): replays drafting policies on plain greedy outputs,
each policy with its own rounds: DFlash, a lookup alone, the better of the two per round, and splices at several
thresholds. Run once on HumanEval's first 32 prompts (an evaluation set), then on the held-out splits; the threshold
was chosen with `heldout.sh` (the library's replay) only.

    REFS=refs.jsonl python results/context_lookup/first_look.py DRAFTER DATASET N OUT.json dflash,lookup,oracle,splice0.5
"""
import json, sys, time
from types import SimpleNamespace
import copy
import torch
from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import load_target, eos_token_ids
from dflash_retrace.prompts import load_prompts
from dflash_retrace.runtime import encode_messages
from dflash_retrace.evaluation.replay import References, target_forward

K = 7


def lookup(ctx, orders=(3, 2)):
    for n in orders:
        if len(ctx) <= n:
            continue
        pat = ctx[-n:]
        for i in range(len(ctx) - n - 1, -1, -1):
            if ctx[i:i + n] == pat:
                return ctx[i + n:i + n + K]
    return []


def accept(drafts, tokens, seq_len, end):
    m = 0
    while m < len(drafts) and seq_len + m < end and drafts[m] == tokens[seq_len + m]:
        m += 1
    return m


def simulate(target, drafter, input_ids, new_ids, forward, policy, max_new_tokens):
    prompt_len = input_ids.shape[1]
    full = torch.cat([input_ids, torch.tensor([new_ids])], dim=-1)
    tokens, end = full[0].tolist(), full.shape[1]
    gc = copy.deepcopy(target.generation_config)
    gc.max_length = prompt_len + max_new_tokens; gc.do_sample = False; gc.output_hidden_states = False
    eos = eos_token_ids(target)
    gc._eos_token_tensor = torch.tensor(eos) if eos else None
    gen = drafter.make_candidate_generator(target, gc, None, {})
    conf = {}
    gen.proposal_threshold = 1e-12
    gen._confident_prefix = lambda c: (conf.__setitem__("c", c.tolist()), c.shape[0])[1]
    seq_len, lengths, rows = prompt_len + 1, [], []
    while seq_len < end:
        start = gen.context_length
        outputs = SimpleNamespace(hidden_states=tuple(h[:, start:seq_len] for h in forward.hidden_states))
        cand, _ = gen.get_candidates(full[:, :seq_len], model_kwargs={}, model_outputs=outputs, n_last_matches=0)
        dfl = cand[0, seq_len:].tolist()
        look = lookup(tokens[:seq_len])[:len(dfl)] if dfl else []
        c = conf.get("c", [])
        m_d, m_l = accept(dfl, tokens, seq_len, end), accept(look, tokens, seq_len, end)
        if policy == "dflash":
            m = m_d
        elif policy == "lookup":
            m = m_l
        elif policy == "oracle":
            m = max(m_d, m_l)
        elif policy.startswith("agree"):  # lookup when it agrees with DFlash's slot 1 and is longer than DFlash's confident run
            thr = float(policy[5:])
            conf_run = next((j for j, p in enumerate(c) if p < thr), len(c))
            use = look and look[0] == dfl[0] and len(look) > conf_run
            m = m_l if use else m_d
        elif policy.startswith("splice"):  # DFlash up to its first unsure slot, then lookup's continuation
            thr = float(policy[6:])
            j = next((j for j, p in enumerate(c) if p < thr), len(c))
            spl = dfl[:j]
            if j < len(dfl):
                cont = lookup(tokens[:seq_len] + spl)
                spl = spl + (cont if cont else dfl[j:])
                spl = spl[:len(dfl)]
            m = accept(spl, tokens, seq_len, end)
        rows.append((m_d, m_l))
        gen.update_candidate_strategy(full[:, :seq_len], None, m)
        lengths.append(m + 1)
        seq_len += m + 1
    return lengths, rows


def main():
    drafter_dir, dataset, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    policies = sys.argv[5].split(",")
    torch.set_num_threads(1)
    target, tok = load_target("smollm2-135m-instruct", dtype=torch.float32)[:2]
    drafter = DFlashDrafter.from_pretrained(drafter_dir).float().eval()
    import os
    refs = References(os.environ.get("REFS", "results/replay_full/references_smollm2-135m-instruct_fp32_64.jsonl"), "smollm2-135m-instruct", torch.float32)
    items = load_prompts(dataset, max_samples=n, seed=None)
    res = {p: [] for p in policies}
    t0 = time.time()
    for k, item in enumerate(items):
        messages = []
        per = {p: [] for p in policies}
        for turn in item["turns"]:
            messages.append({"role": "user", "content": turn})
            ids = torch.tensor([encode_messages(tok, messages, False)])
            new = refs.get(target, ids, 64)
            full = torch.cat([ids, torch.tensor([new])], dim=-1)
            fw = target_forward(target, full, False)
            for p in policies:
                per[p] += simulate(target, drafter, ids, new, fw, p, 64)[0]
            messages.append({"role": "assistant", "content": tok.decode(new, skip_special_tokens=True)})
        for p in policies:
            res[p].append(per[p])
        if k % 8 == 7:
            print(k + 1, {p: round(sum(map(sum, v)) / sum(map(len, v)), 3) for p, v in res.items()}, f"{time.time()-t0:.0f}s", flush=True)
    print("final", {p: round(sum(map(sum, v)) / sum(map(len, v)), 3) for p, v in res.items()})
    json.dump({"drafter": drafter_dir, "dataset": dataset, "n": n, "per_prompt": res}, open(out, "w"))


if __name__ == "__main__":
    with torch.no_grad():
        main()
