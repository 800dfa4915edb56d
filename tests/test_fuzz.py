"""Seeded fuzz: random tiny targets, drafters, prompts, budgets, EOS ids, processors and stopping criteria.

Every case: greedy `generate(assistant_model=drafter)` equals plain `generate()` token for token (fp32, CPU).
Reproduce one run with FUZZ_SEED / FUZZ_CASES (the failure message names the case).
Random drafters seldom guess a token, so most cases restrict the vocabulary to a few ids with `suppress_tokens`
(drafts go through the same processors as the target) to make multi-token acceptance common; the session's
trained drafters add realistic acceptance. Bounded: FUZZ_CASES cases, well under two minutes on one thread.
"""

import os
import random
import time

import torch
import transformers
from transformers import StoppingCriteriaList

from dflash_retrace import DFlashDrafter
from dflash_retrace.generation_dflash import _version_tuple
from tiny import VOCAB, WindowSum, tiny_target, tiny_tokenizer

FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "14"))
FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "500"))
# transformers 5.15 refuses a static cache in assisted decoding (a clear ValueError); 5.24 runs it.
STATIC_CACHE = _version_tuple(transformers.__version__) >= (5, 24, 0)


def _random_target(rng):
    family = rng.choice(["qwen3", "llama"])
    positions = rng.choice([1024, 1024, 48])  # 48: budgets run up to the target's position limit
    target = tiny_target(family, seed=rng.randrange(10_000), layers=rng.randint(2, 4),
                         max_position_embeddings=positions)
    return target, f"{family}/{target.config.num_hidden_layers}L/{positions}pos"


def _random_drafter(rng, target):
    block_size, layers = rng.randint(2, 9), rng.randint(1, 2)
    retrace = rng.random() < 0.5
    torch.manual_seed(rng.randrange(10_000))
    num_target_layers = target.config.num_hidden_layers
    layer_ids = sorted(rng.sample(range(num_target_layers), rng.randint(1, min(3, num_target_layers))))
    # The drafter variants (issue 15), each on in some cases, with live (non-zero) weights below.
    context = rng.choice(["hidden", "hidden", "kv", "hybrid"])
    fusion = "layerwise" if context != "kv" and rng.random() < 0.3 else "fc"
    variants = dict(context=context, fusion=fusion, step_embeddings=rng.random() < 0.3)
    if fusion == "layerwise":
        variants["fusion_layer_ids"] = rng.sample(range(num_target_layers), rng.randint(1, num_target_layers))
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=layers, block_size=block_size, retrace=retrace,
                                        target_layer_ids=layer_ids, **variants).eval()
    with torch.no_grad():  # zero-initialised weights would make each option its DFlash backbone: give them an effect
        for name, param in drafter.named_parameters():
            if name.startswith(("retrace.", "fusion.", "steps.")) or ".self_attn.kv." in name:
                param.normal_(0.0, 0.5)
    # Shorter rounds (a cap, or a threshold around this untrained drafter's flat confidences of ~1/vocab).
    if block_size > 2 and rng.random() < 0.25:
        drafter.config.max_proposals = rng.randint(1, block_size - 2)
    if rng.random() < 0.25:
        drafter.config.proposal_threshold = rng.choice([0.005, 0.01, 0.02, 0.05])
    elif rng.random() < 0.3:  # the context lookup (1.0: from slot 1 wherever the context has a match)
        drafter.config.lookup_threshold = rng.choice([0.02, 0.05, 1.0])
    options = [retrace and "retrace", context != "hidden" and context, fusion != "fc" and fusion,
               variants["step_embeddings"] and "steps", drafter.config.max_proposals and
               f"max{drafter.config.max_proposals}", drafter.config.proposal_threshold and
               f"thr{drafter.config.proposal_threshold}", drafter.config.lookup_threshold and
               f"lookup{drafter.config.lookup_threshold}"]
    return drafter, f"B{block_size}/{layers}L" + "".join(f"/{o}" for o in options if o)


def _generate_kwargs(rng, prompt_length, max_positions, continuation, tokenizer):
    kwargs = {}
    if max_positions < 1024 and rng.random() < 0.5:
        kwargs["max_new_tokens"] = max_positions - prompt_length  # up to the last position
    else:
        kwargs["max_new_tokens"] = rng.choice([1, 2, 3, rng.randint(4, 12), rng.randint(13, 40)])
    if rng.random() < 0.7:  # a few allowed ids make random drafts acceptable
        allowed = set(rng.sample(range(3, VOCAB), rng.randint(2, 5))) | set(continuation[:2])
        kwargs["suppress_tokens"] = [t for t in range(VOCAB) if t not in allowed]
    if rng.random() < 0.3:
        kwargs["repetition_penalty"] = rng.choice([0.7, 1.2, 1.5])
    if rng.random() < 0.25:
        kwargs["no_repeat_ngram_size"] = rng.randint(2, 4)
    if rng.random() < 0.2:
        kwargs["bad_words_ids"] = [[rng.randrange(3, VOCAB)], [rng.randrange(3, VOCAB), rng.randrange(3, VOCAB)]]
    if rng.random() < 0.4 and continuation:  # EOS ids the plain continuation emits, or random ones
        picks = [rng.choice(continuation) for _ in range(rng.randint(1, 2))]
        kwargs["eos_token_id"] = picks[0] if len(picks) == 1 and rng.random() < 0.5 else picks
        if rng.random() < 0.5:
            kwargs["min_new_tokens"] = rng.randint(1, kwargs["max_new_tokens"])
    if rng.random() < 0.1 and STATIC_CACHE:
        kwargs["cache_implementation"] = "static"
    criteria = rng.random()
    if criteria < 0.2 and continuation:
        pieces = tokenizer.convert_ids_to_tokens(continuation[rng.randrange(len(continuation))])
        kwargs.update(stop_strings=[pieces[rng.randrange(2):][:rng.randint(1, 2)]], tokenizer=tokenizer)
    elif criteria < 0.35:
        kwargs["stopping_criteria"] = StoppingCriteriaList([WindowSum(prompt_length, rng.choice([5, 7, 11]))])
    elif criteria < 0.4:
        kwargs["max_time"] = 600.0
    return kwargs


def _case(rng, tokenizer, trained):
    if trained and rng.random() < 0.25:
        target, drafter = rng.choice(trained)
        name = "trained"
    else:
        target, name = _random_target(rng)
        drafter, drafter_name = _random_drafter(rng, target)
        name += " " + drafter_name
    max_positions = target.config.max_position_embeddings
    g = torch.Generator().manual_seed(rng.randrange(10_000))
    prompt = torch.randint(3, VOCAB, (1, rng.randint(1, 12)), generator=g)
    free = target.generate(prompt, do_sample=False, max_new_tokens=12)[0, prompt.shape[1]:].tolist()
    kwargs = _generate_kwargs(rng, prompt.shape[1], max_positions, free, tokenizer)
    return target, drafter, prompt, kwargs, name


def test_fuzz_greedy_equals_plain_generate(qwen3_target, qwen3_drafter, llama_target, llama_drafter):
    rng = random.Random(FUZZ_SEED)
    tokenizer = tiny_tokenizer()
    trained = [(qwen3_target, qwen3_drafter), (llama_target, llama_drafter)]
    start, rounds, multi = time.perf_counter(), 0, 0
    for i in range(FUZZ_CASES):
        target, drafter, prompt, kwargs, name = _case(rng, tokenizer, trained)
        plain = target.generate(prompt, do_sample=False, **kwargs)
        fast = target.generate(prompt, assistant_model=drafter, do_sample=False, **kwargs)
        shown = {k: (v if k not in ("suppress_tokens", "tokenizer") else "...") for k, v in kwargs.items()}
        assert fast[0].tolist() == plain[0].tolist(), (
            f"case {i} (FUZZ_SEED={FUZZ_SEED}): {name}, prompt {prompt[0].tolist()}, {shown}\n"
            f"plain:  {plain[0].tolist()}\ndflash: {fast[0].tolist()}\nstats: {drafter.last_stats}"
        )
        rounds += drafter.last_stats.num_rounds
        multi += sum(a > 1 for a in drafter.last_stats.acceptance_lengths)
    seconds = time.perf_counter() - start
    print(f"fuzz: {FUZZ_CASES} cases (seed {FUZZ_SEED}) in {seconds:.1f}s, {rounds} rounds, "
          f"{multi} of them accepted at least one proposal")
    assert multi > rounds // 10, "too few rounds accepted a proposal for the fuzz to test acceptance"
