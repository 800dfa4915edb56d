"""Shorter rounds (`max_proposals`, `proposal_threshold`): the output stays exactly the target's own (fp32), the
rounds really are shorter, and bad values are refused with the fix in the message."""

import copy

import pytest
import torch

from dflash_retrace import DFlashConfig
from tiny import prompts

B = 8


@pytest.fixture()
def drafter(qwen3_drafter):
    return copy.deepcopy(qwen3_drafter)  # the settings below must not leak into the shared fixture


def _greedy(target, drafter, prompt, new):
    ref = target.generate(prompt, do_sample=False, max_new_tokens=new)
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=new)
    assert torch.equal(ref, out), f"\nplain:  {ref.tolist()}\ndflash: {out.tolist()}\nstats: {drafter.last_stats}"
    stats = drafter.last_stats
    assert 1 + sum(stats.acceptance_lengths) <= out.shape[1] - prompt.shape[1] + 1
    return stats


@pytest.mark.parametrize("max_proposals", [1, 2, 5, B - 1])
@pytest.mark.parametrize("new", [3, B + 1, 40])
def test_max_proposals_is_exact_and_caps_rounds(qwen3_target, drafter, train_prompts, max_proposals, new):
    drafter.config.max_proposals = max_proposals
    for prompt in train_prompts[:3] + prompts(3, length=5, seed=77 + new):
        stats = _greedy(qwen3_target, drafter, prompt, new)
        assert all(0 <= k <= max_proposals for k in stats.num_proposals), stats.num_proposals
        assert all(a <= k + 1 for a, k in zip(stats.acceptance_lengths, stats.num_proposals))
        if new == 40 and prompt is train_prompts[0]:
            assert max_proposals in stats.num_proposals  # the cap is reached, not only respected


@pytest.mark.parametrize("threshold", [0.2, 0.6, 0.95])
@pytest.mark.parametrize("seed", range(4))
def test_proposal_threshold_is_exact(qwen3_target, drafter, threshold, seed):
    drafter.config.proposal_threshold = threshold
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 96, (1, int(torch.randint(2, 12, (1,), generator=g))), generator=g)
    _greedy(qwen3_target, drafter, prompt, int(torch.randint(5, 45, (1,), generator=g)))


def test_proposal_threshold_cuts_where_the_drafter_is_unsure(qwen3_target, drafter, train_prompts, monkeypatch):
    """Rounds get shorter as the threshold rises (0, the median slot confidence of this drafter, 0.999)."""
    from dflash_retrace.generation_dflash import DFlashCandidateGenerator

    seen, original = [], DFlashCandidateGenerator._confident_prefix

    def spy(self, confidence):
        seen.extend(confidence.tolist())
        return original(self, confidence)

    monkeypatch.setattr(DFlashCandidateGenerator, "_confident_prefix", spy)
    rows = train_prompts[:2] + prompts(2, length=5, seed=5)
    drafter.config.proposal_threshold = 1e-9  # cuts nothing, records every slot's confidence
    for prompt in rows:
        _greedy(qwen3_target, drafter, prompt, 40)
    median = sorted(seen)[len(seen) // 2]  # the tiny drafter is unsure everywhere (its argmax has p ~ 0.03-0.1)
    lengths = {}
    for threshold in (0.0, median, 0.999):
        drafter.config.proposal_threshold = threshold
        proposals = [k for prompt in rows for k in _greedy(qwen3_target, drafter, prompt, 40).num_proposals]
        lengths[threshold] = sum(proposals) / len(proposals)
    assert lengths[0.0] > lengths[median] > lengths[0.999] == 0.0, lengths

    # The rule itself, on a hand-made round (threshold 0.5): the round stops before the first slot whose proposal
    # has a drafter probability below the threshold, slot 1 included (then nothing is proposed).
    gen = DFlashCandidateGenerator.__new__(DFlashCandidateGenerator)
    gen.proposal_threshold = 0.5
    assert original(gen, torch.tensor([0.9, 0.3, 0.8])) == 1  # slot 2 has 0.3 < 0.5
    assert original(gen, torch.tensor([0.9, 0.7, 0.8])) == 3  # all kept
    assert original(gen, torch.tensor([0.1, 0.7, 0.8])) == 0  # slot 1 (0.1) is unsure: a plain step


def test_rounds_with_nothing_to_verify_are_counted(qwen3_target, drafter, train_prompts):
    """A round whose first proposal is cut is a plain target step, counted as a round of length 1 with 0 proposals:
    every drafter call is a round and every new token after the prefill belongs to one."""
    drafter.config.proposal_threshold = 0.999  # the tiny drafter is never that sure: every round proposes nothing
    for prompt in train_prompts[:2]:
        calls, drafter_calls = [], []
        hook = qwen3_target.register_forward_hook(lambda *a: calls.append(1))
        dhook = drafter.register_forward_hook(lambda *a: drafter_calls.append(1))
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=20)
        calls.clear()
        try:
            out = qwen3_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=20)
        finally:
            hook.remove(), dhook.remove()
        assert torch.equal(out, ref)
        stats = drafter.last_stats
        assert set(stats.num_proposals) == {0} and set(stats.acceptance_lengths) == {1}
        assert len(drafter_calls) == stats.num_rounds == len(calls) - 2  # prefill, then one forward per round
        assert 1 + sum(stats.acceptance_lengths) + 1 == 20  # prefill token, rounds, the last step without room
        assert stats.mean_acceptance_length == 1.0


def test_shorter_rounds_survive_save_and_load(tmp_path, drafter):
    drafter.config.max_proposals, drafter.config.proposal_threshold = 3, 0.25
    drafter.save_pretrained(tmp_path)
    config = DFlashConfig.from_pretrained(tmp_path)
    assert (config.max_proposals, config.proposal_threshold) == (3, 0.25)
    assert DFlashConfig.from_pretrained(tmp_path, max_proposals=None).max_proposals is None


@pytest.mark.parametrize("name, value, hint", [
    ("max_proposals", 0, "int >= 1"), ("max_proposals", 2.5, "int >= 1"), ("max_proposals", True, "int >= 1"),
    ("proposal_threshold", 1.0, "[0, 1)"), ("proposal_threshold", -0.1, "[0, 1)"),
    ("proposal_threshold", "0.3", "[0, 1)"),
])
def test_bad_values_are_refused(drafter, name, value, hint):
    with pytest.raises(ValueError, match=hint.replace("[", r"\[").replace(")", r"\)")):
        setattr(drafter.config, name, value)


def test_max_proposals_beyond_the_block_is_an_error(qwen3_target, drafter, train_prompts):
    drafter.config.max_proposals = B
    with pytest.raises(ValueError, match=f"exceeds the block's {B - 1} proposal slots"):
        qwen3_target.generate(train_prompts[0], assistant_model=drafter, do_sample=False, max_new_tokens=5)
