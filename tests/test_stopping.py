"""Every stopping criterion transformers ships ends speculative generation exactly where plain `generate()` ends.

transformers' assisted loop appends a round's accepted tokens and the bonus, then asks the stopping criteria
about the whole sequence once. `StopStringCriteria` (like most criteria) only looks at the end of the sequence,
so a stop string completed inside an accepted block went unnoticed and generation ran on. The candidate
generator cuts each draft before the first token at which a criterion fires, so no round can run past a stop.
"""

from pathlib import Path

import pytest
import torch
from transformers import (
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from tiny import WindowSum, tiny_tokenizer

MAX_NEW = 30
CUSTOM_GENERATE = Path(__file__).resolve().parents[1] / "hub_configs" / "custom_generate"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _plain_and_fast(target, drafter, prompt, **kwargs):
    plain = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)
    fast = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)
    return plain, fast


def _stop_string(tokenizer, continuation, token_index):
    """A stop string that ends inside token `token_index` of the plain continuation (spanning the previous one)."""
    text = [tokenizer.convert_ids_to_tokens(int(t)) for t in continuation]
    return text[token_index - 1][1:] + text[token_index][:1]


@pytest.mark.parametrize("offset", [2, 3, 5, 8, 12, 17])
@pytest.mark.parametrize("explicit", [False, True], ids=["stop_strings", "StopStringCriteria"])
def test_stop_string_inside_a_block(qwen3_target, qwen3_drafter, train_prompts, tokenizer, offset, explicit):
    prompt = train_prompts[0]
    free = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt.shape[1]:]
    stop = _stop_string(tokenizer, free, offset)
    if explicit:
        kwargs = {"stopping_criteria": StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])}
    else:
        kwargs = {"stop_strings": [stop], "tokenizer": tokenizer}
    plain, fast = _plain_and_fast(qwen3_target, qwen3_drafter, prompt, **kwargs)
    assert plain.shape[1] - prompt.shape[1] <= offset + 1, "the stop string must end plain generation early"
    assert fast[0].tolist() == plain[0].tolist(), f"stop {stop!r}; stats {qwen3_drafter.last_stats}"


def test_stop_strings_inside_accepted_blocks_across_prompts(qwen3_target, qwen3_drafter, train_prompts, tokenizer):
    """Stop strings at every offset of several continuations: many land inside multi-token rounds."""
    inside = 0
    for prompt in train_prompts[:4]:
        free = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt.shape[1]:]
        qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=MAX_NEW)
        ends, total = set(), 1  # positions (in new tokens) where an unconstrained round ends
        for length in qwen3_drafter.last_stats.acceptance_lengths:
            total += length
            ends.add(total)
        for offset in range(1, 20, 3):
            stop = _stop_string(tokenizer, free, offset)
            plain, fast = _plain_and_fast(qwen3_target, qwen3_drafter, prompt, stop_strings=[stop],
                                          tokenizer=tokenizer)
            assert fast[0].tolist() == plain[0].tolist(), f"stop {stop!r}"
            inside += (plain.shape[1] - prompt.shape[1]) not in ends
    assert inside >= 5, "too few stops fell inside a round to test anything"


def test_eos_list(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[1]
    free = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt.shape[1]:].tolist()
    eos = [free[9], free[4]]
    plain, fast = _plain_and_fast(qwen3_target, qwen3_drafter, prompt, eos_token_id=eos)
    assert plain.shape[1] - prompt.shape[1] == free.index(free[4]) + 1
    assert fast[0].tolist() == plain[0].tolist()


@pytest.mark.parametrize("max_length_offset", [1, 2, 7, 13])
def test_max_length(qwen3_target, qwen3_drafter, train_prompts, max_length_offset):
    prompt = train_prompts[2]
    length = prompt.shape[1] + max_length_offset
    plain = qwen3_target.generate(prompt, do_sample=False, max_length=length)
    fast = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_length=length)
    assert plain.shape[1] == length and fast[0].tolist() == plain[0].tolist()


@pytest.mark.parametrize("modulus", [5, 7, 11, 13])
def test_custom_criterion(qwen3_target, qwen3_drafter, train_prompts, modulus):
    for prompt in train_prompts[:3]:
        criteria = StoppingCriteriaList([WindowSum(prompt.shape[1], modulus)])
        plain, fast = _plain_and_fast(qwen3_target, qwen3_drafter, prompt, stopping_criteria=criteria)
        assert fast[0].tolist() == plain[0].tolist(), f"modulus {modulus}"


def test_max_time_ends_generation(qwen3_target, qwen3_drafter, train_prompts):
    """Time is not reproducible, so: a generous limit changes nothing, an exhausted one ends on a prefix of it."""
    prompt = train_prompts[3]
    plain = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)
    fast = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=MAX_NEW,
                                 max_time=600.0)
    assert fast[0].tolist() == plain[0].tolist()
    clock = StoppingCriteriaList([MaxTimeCriteria(max_time=0.0)])
    short = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=MAX_NEW,
                                  stopping_criteria=clock)
    assert prompt.shape[1] < short.shape[1] < plain.shape[1]
    assert short[0].tolist() == plain[0, : short.shape[1]].tolist()


def test_sampled_output_stops_at_the_first_stop(qwen3_target, qwen3_drafter, train_prompts, tokenizer):
    """Sampling: the output contains no stop before its last token (generation ends at the first one).

    A low temperature keeps the samples near the trained drafter's continuations, so rounds accept several tokens.
    """
    prompt = train_prompts[0]
    free = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt.shape[1]:]
    stops = [_stop_string(tokenizer, free, k) for k in (3, 6, 9)]
    criterion = StopStringCriteria(tokenizer, stops)
    for seed in range(8):
        torch.manual_seed(seed)
        out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=True, temperature=0.02,
                                    max_new_tokens=MAX_NEW, stop_strings=stops, tokenizer=tokenizer)
        fired = [bool(criterion(out[:, :n], None)[0]) for n in range(prompt.shape[1] + 1, out.shape[1] + 1)]
        assert not any(fired[:-1]), f"seed {seed}: a stop string ended inside the output, generation ran on"


def test_stop_string_with_custom_generate(qwen3_target, qwen3_drafter, train_prompts, tokenizer):
    """The custom_generate repo hands the call's stopping criteria to the drafter's generator too."""
    prompt = train_prompts[0]
    free = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt.shape[1]:]
    for offset in (2, 3, 12):
        kwargs = dict(do_sample=False, max_new_tokens=MAX_NEW, stop_strings=[_stop_string(tokenizer, free, offset)],
                      tokenizer=tokenizer)
        plain = qwen3_target.generate(prompt, **kwargs)
        out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, custom_generate=str(CUSTOM_GENERATE),
                                    trust_remote_code=True, **kwargs)
        assert out[0].tolist() == plain[0].tolist(), offset
    assert not {"_get_candidate_generator", "_get_stopping_criteria"} & set(qwen3_target.__dict__)


class _EndsWith(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_criterion_that_fires_on_the_prompt(qwen3_target, qwen3_drafter, train_prompts):
    """Plain decoding never asks the criteria about the bare prompt (transformers 5.15's assisted loop did)."""
    prompt = train_prompts[1]
    criteria = StoppingCriteriaList([_EndsWith(int(prompt[0, -1]))])
    plain, fast = _plain_and_fast(qwen3_target, qwen3_drafter, prompt, stopping_criteria=criteria)
    assert plain.shape[1] > prompt.shape[1] + 1
    assert fast[0].tolist() == plain[0].tolist()
