"""Greedy output with a DFlash drafter equals `target.generate()` without one, token for token (fp32)."""

import pytest
import torch
from transformers import StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from tiny import prompts

B = 8  # block size of the session drafters
LENGTHS = [1, 2, B - 1, B, B + 1, 2 * B + 3, 40]


def _pair(request, family):
    return request.getfixturevalue(f"{family}_target"), request.getfixturevalue(f"{family}_drafter")


def _check(target, drafter, prompt, **kwargs):
    ref = target.generate(prompt, do_sample=False, **kwargs)
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, **kwargs)
    assert torch.equal(ref, out), f"\nplain:  {ref.tolist()}\ndflash: {out.tolist()}\nstats: {drafter.last_stats}"
    stats = drafter.last_stats
    new = out.shape[1] - prompt.shape[1]
    # Every new token is the prefill's or a round's: sum of acceptance lengths (bonus included) + prefill
    # token + single-step rounds without proposals at the budget edge.
    assert sum(stats.acceptance_lengths) <= new - 1 + (new == 0)
    assert all(1 <= a <= B for a in stats.acceptance_lengths)
    return out, stats


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("max_new_tokens", LENGTHS)
def test_greedy_matches_target_across_lengths(request, family, max_new_tokens, train_prompts):
    target, drafter = _pair(request, family)
    # Training prompts (high acceptance, multi-token rounds) and unseen prompts (frequent rejections).
    for prompt in train_prompts[:3] + prompts(3, length=5, seed=1234 + max_new_tokens):
        _check(target, drafter, prompt, max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_matches_target_many_seeds(qwen3_target, qwen3_drafter, seed):
    g = torch.Generator().manual_seed(seed)
    length = int(torch.randint(1, 20, (1,), generator=g))
    prompt = torch.randint(3, 96, (1, length), generator=g)
    new = int(torch.randint(1, 50, (1,), generator=g))
    _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=new)


def test_speculation_really_happens(qwen3_target, qwen3_drafter, train_prompts):
    """With the trained drafter, target forwards are well below new tokens, and last_stats agrees with the count."""
    taus, forwards, new_tokens = [], 0, 0
    for prompt in train_prompts[:6]:
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=40)
        calls, drafter_calls = [], []
        hook = qwen3_target.register_forward_hook(lambda *a: calls.append(1))
        dhook = qwen3_drafter.register_forward_hook(lambda *a: drafter_calls.append(1))
        try:
            out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=40)
        finally:
            hook.remove(), dhook.remove()
        assert torch.equal(out, ref)
        stats = qwen3_drafter.last_stats
        new = out.shape[1] - prompt.shape[1]
        plain_steps = len(calls) - 1 - stats.num_rounds  # single steps without proposals at the budget edge
        assert plain_steps in (0, 1)
        assert len(drafter_calls) == stats.num_rounds
        assert 1 + sum(stats.acceptance_lengths) + plain_steps == new
        forwards += len(calls)
        new_tokens += new
        taus += stats.acceptance_lengths
    tau = sum(taus) / len(taus)
    print(f"tau of the trained test drafter on its training prompts: {tau:.2f}; "
          f"{forwards} target forwards for {new_tokens} new tokens")
    assert tau > 2.0
    assert forwards < 0.6 * new_tokens


def _eos_case(target, prompt, offset):
    """An EOS id that the plain continuation emits `offset` tokens in."""
    ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
    return int(ref[0, prompt.shape[1] + offset])


@pytest.mark.parametrize("offset", [1, 3, 5, 9, 14])
def test_eos_inside_a_block(qwen3_target, qwen3_drafter, train_prompts, offset):
    prompt = train_prompts[0]
    eos = _eos_case(qwen3_target, prompt, offset)
    out, stats = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=30, eos_token_id=eos)
    assert int(out[0, -1]) == eos
    assert (out[0, prompt.shape[1]:] == eos).sum() == 1
    # proposals stop at the first EOS
    assert all(d.count(eos) <= 1 and (eos not in d or d[-1] == eos) for d in stats.drafts)


def test_eos_proposed_mid_block_is_cut(qwen3_target, qwen3_drafter, train_prompts):
    """Pick an EOS that the drafter proposes in the middle of a block: the draft must end there."""
    prompt = train_prompts[1]
    qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=30)
    first = next(d for d in qwen3_drafter.last_stats.drafts if len(d) >= 4)
    eos = first[2]
    out, stats = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=30, eos_token_id=eos)
    assert all(eos not in d or d.index(eos) == len(d) - 1 for d in stats.drafts)


def test_eos_as_first_token(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[2]
    eos = _eos_case(qwen3_target, prompt, 0)
    out, stats = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=20, eos_token_id=eos)
    assert out.shape[1] == prompt.shape[1] + 1 and stats.num_rounds == 0


@pytest.mark.parametrize("min_new", [5, 17])
def test_min_new_tokens(qwen3_target, qwen3_drafter, train_prompts, min_new):
    prompt = train_prompts[3]
    eos = _eos_case(qwen3_target, prompt, 2)
    out, _ = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=30, min_new_tokens=min_new, eos_token_id=eos)
    assert out.shape[1] - prompt.shape[1] >= min_new


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty(qwen3_target, qwen3_drafter, train_prompts, penalty):
    for prompt in train_prompts[:3]:
        _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=30, repetition_penalty=penalty)


def test_no_repeat_ngram_and_bad_words(llama_target, llama_drafter, train_prompts):
    for prompt in train_prompts[:2]:
        _check(llama_target, llama_drafter, prompt, max_new_tokens=25, no_repeat_ngram_size=3)


class _Collect(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_exactly_the_output(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[4]
    streamer = _Collect()
    out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=30,
                                streamer=streamer)
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)
    assert torch.equal(out, ref) and streamer.ended
    flat = [t for chunk in streamer.chunks for t in chunk]
    assert flat == out[0].tolist()  # the prompt first, then multi-token chunks
    assert any(len(c) > 1 for c in streamer.chunks[1:])  # speculation shows as multi-token chunks


def test_custom_stopping_criteria(qwen3_target, qwen3_drafter, train_prompts):
    class StopAt(StoppingCriteria):
        def __init__(self, n):
            self.n = n

        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)

    prompt = train_prompts[5]
    # Fires inside a round: the draft is cut before it, so speculative decoding stops exactly where plain does.
    out, _ = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=30,
                    stopping_criteria=[StopAt(prompt.shape[1] + 10)])
    assert out.shape[1] == prompt.shape[1] + 10


def test_return_dict_and_scores(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[0]
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=12, return_dict_in_generate=True,
                                output_scores=True)
    out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=12,
                                return_dict_in_generate=True, output_scores=True)
    assert torch.equal(ref.sequences, out.sequences)
    assert len(out.scores) == len(ref.scores)
    for a, b in zip(ref.scores, out.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_user_hidden_states_still_returned(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[0]
    out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=10,
                                return_dict_in_generate=True, output_hidden_states=True)
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=10)
    assert torch.equal(out.sequences, ref)
    assert all(h is not None for step in out.hidden_states for h in step)


def test_drafter_in_another_dtype(qwen3_target, qwen3_drafter, train_prompts):
    """A float64 drafter beside an fp32 target: drafts differ at most slightly, output is the target's."""
    import copy

    drafter64 = copy.deepcopy(qwen3_drafter).to(torch.float64)
    for prompt in train_prompts[:2]:
        _, stats = _check(qwen3_target, drafter64, prompt, max_new_tokens=25)
        assert stats.mean_acceptance_length > 1.0


def test_repeated_generate_calls_reset_state(qwen3_target, qwen3_drafter, train_prompts):
    prompt = train_prompts[0]
    first, s1 = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=25)
    _check(qwen3_target, qwen3_drafter, train_prompts[1], max_new_tokens=25)
    again, s2 = _check(qwen3_target, qwen3_drafter, prompt, max_new_tokens=25)
    assert torch.equal(first, again)
    assert s1.acceptance_lengths == s2.acceptance_lengths and s1 is not s2
