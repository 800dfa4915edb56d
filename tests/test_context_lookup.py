"""Context lookup (`lookup_threshold`, `lookup_dflash`): from the drafter's first unsure slot a round proposes the
context's own continuation. Greedy output equals plain generate() (fp32, tiny targets, budgets, EOS), sampling
follows the target, the lookup's q is a point mass on its proposal, replay records what generate() records."""

import copy

import pytest
import torch

from dflash_retrace.generation_dflash import DFlashCandidateGenerator
from dflash_retrace.lookup_dflash import ContextLookup
from test_draft_vocab import _check_sampling_follows_the_target
from test_replay import _check_same_rounds
from tiny import prompts

REPEATS = torch.tensor([[11, 12, 13, 14, 15, 11, 12, 13, 14, 15, 11, 12]])  # the context repeats itself


def test_continuation_takes_the_latest_earlier_occurrence_longest_ngram_first():
    lookup = ContextLookup()
    lookup.update(torch.tensor([[5, 6, 7, 1, 9, 6, 7, 2, 3, 8, 6, 7]]))
    assert lookup.continuation([], 3) == [2, 3, 8]  # "6 7": its latest earlier occurrence is followed by 2 3 8
    assert lookup.continuation([], 1) == [2]
    assert lookup.continuation([1], 4) == [9, 6, 7, 2]  # "7 1" (context + kept) occurred once, at the start
    assert lookup.continuation([4], 3) == []  # "7 4" never occurred
    assert lookup.continuation([], 0) == []
    longest = ContextLookup()
    longest.update(torch.tensor([[1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3]]))
    assert longest.continuation([], 2) == [4, 9]  # "1 2 3" beats the later "2 3" (followed by 5)
    inside = ContextLookup()
    inside.update(torch.tensor([[7, 8, 9]]))
    assert inside.continuation([7, 8], 3) == [9, 7, 8]  # an occurrence ending at the committed end counts
    assert inside.continuation([1, 2, 1, 2], 2) == [1, 2]  # ... and one inside the kept proposals


def test_incremental_updates_index_as_one_update():
    tokens = torch.randint(0, 6, (1, 60), generator=torch.Generator().manual_seed(0))
    whole, parts = ContextLookup(), ContextLookup()
    whole.update(tokens)
    for end in (1, 2, 9, 10, 33, 60):
        parts.update(tokens[:, :end])
    assert whole.latest == parts.latest and whole.tokens == parts.tokens
    for kept in ([], [1], [2, 3], [4, 4, 4]):
        assert whole.continuation(kept, 5) == parts.continuation(kept, 5)


def _naive_continuation(tokens, orders, kept, count):
    """The rule as stated, on one list: the latest earlier occurrence of the last n tokens, longest n first."""
    sequence = tokens + kept
    for n in sorted(orders, reverse=True):
        if len(sequence) > n:
            found = next((e for e in range(len(sequence) - 1, n - 1, -1) if sequence[e - n:e] == sequence[-n:]), None)
            if found is not None:
                return sequence[found:found + count]
    return []


@pytest.mark.parametrize("orders", [(3, 2), (4, 3, 2), (2,), (3, 2, 1)])
def test_continuation_equals_the_rule_on_random_contexts(orders):
    """The index and the short window over the context's end give what one search over context + kept gives."""
    g = torch.Generator().manual_seed(sum(orders))
    for case in range(300):
        vocab = 2 + case % 5  # few ids: many repeats
        tokens = torch.randint(0, vocab, (1, int(torch.randint(0, 30, (1,), generator=g))), generator=g)
        kept = torch.randint(0, vocab, (int(torch.randint(0, 8, (1,), generator=g)),), generator=g).tolist()
        lookup = ContextLookup(orders)
        for end in sorted({int(torch.randint(0, tokens.shape[1] + 1, (1,), generator=g)), tokens.shape[1]}):
            lookup.update(tokens[:, :end])
        for count in (1, 3, 7):
            assert lookup.continuation(kept, count) == _naive_continuation(tokens[0].tolist(), orders, kept, count), (
                tokens.tolist(), kept, count)


def _lookup_prompts():
    return [REPEATS, REPEATS[:, :7]] + prompts(4, length=9, seed=21)


@pytest.mark.parametrize("threshold", [0.3, 0.7, 1.0])
def test_greedy_equals_plain_generate(qwen3_target, qwen3_drafter, train_prompts, threshold):
    drafter = copy.deepcopy(qwen3_drafter)
    drafter.config.lookup_threshold = threshold
    looked = accepted = 0
    for new in (1, 2, 8, 9, 40):
        for prompt in train_prompts[:3] + _lookup_prompts():
            ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=new)
            out = qwen3_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=new)
            assert torch.equal(ref, out), f"plain {ref.tolist()}\nlookup {out.tolist()}"
            stats = drafter.last_stats
            assert len(stats.lookup_proposals) == stats.num_rounds
            for a, k, n in zip(stats.acceptance_lengths, stats.num_proposals, stats.lookup_proposals):
                assert 0 <= n <= k
                looked += n
                accepted += max(0, a - 1 - (k - n))
    assert looked > 0 and accepted > 0  # the lookup proposed, and the target took some of it


def test_greedy_with_eos_and_llama(llama_target, llama_drafter, train_prompts):
    drafter = copy.deepcopy(llama_drafter)
    drafter.config.lookup_threshold = 0.8
    for prompt in train_prompts[3:6] + _lookup_prompts():
        ref = llama_target.generate(prompt, do_sample=False, max_new_tokens=30)
        eos = ref[0, prompt.shape[1] + 6].item()  # a token the output reaches: generation ends there
        ref = llama_target.generate(prompt, do_sample=False, max_new_tokens=30, eos_token_id=eos)
        out = llama_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=30,
                                    eos_token_id=eos)
        assert torch.equal(ref, out), f"plain {ref.tolist()}\nlookup {out.tolist()}"


@pytest.mark.parametrize("policy", ["argmax", "sample"])
@pytest.mark.parametrize("threshold", [0.5, 1.0])
def test_sampling_follows_the_target(qwen3_target, qwen3_drafter, policy, threshold):
    drafter = copy.deepcopy(qwen3_drafter)
    drafter.config.proposal_policy, drafter.config.lookup_threshold = policy, threshold
    _check_sampling_follows_the_target(qwen3_target, drafter, REPEATS)


@pytest.mark.parametrize("policy", ["argmax", "sample"])
def test_the_lookups_q_is_a_point_mass_on_its_proposal(qwen3_target, qwen3_drafter, policy, monkeypatch):
    """Under sampling, every slot the lookup proposed hands transformers a point mass on that proposal, and every
    slot before it the drafter's own q (a point mass on its argmax under "argmax", a spread one under "sample")."""
    drafter = copy.deepcopy(qwen3_drafter)
    drafter.config.proposal_policy, drafter.config.lookup_threshold = policy, 0.9
    seen = []
    original = DFlashCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if logits is not None:
            seen.append((candidates[0, input_ids.shape[1]:].tolist(), logits[0], self.splice_at))
        return candidates, logits

    monkeypatch.setattr(DFlashCandidateGenerator, "get_candidates", spy)
    for seed in range(6):
        torch.manual_seed(seed)
        qwen3_target.generate(REPEATS, assistant_model=drafter, do_sample=True, max_new_tokens=24)
    spliced = spread = 0
    for proposals, logits, at in seen:
        for k, token in enumerate(proposals):
            finite = torch.isfinite(logits[k]).nonzero()[:, 0].tolist()
            assert token in finite
            if at is not None and k >= at:
                assert finite == [token], f"slot {k} of a lookup round: q is not a point mass on {token}"
                spliced += 1
            spread += len(finite) > 1
    assert spliced > 0
    assert (spread > 0) == (policy == "sample")


@pytest.mark.parametrize("sample", [False, True])
def test_recorded_drafts_are_the_verified_candidates(qwen3_target, qwen3_drafter, sample, monkeypatch):
    """The round's host copy of its drafts (which the EOS cut reads, and `DFlashStats.drafts` records) is what goes to
    verification, spliced slots included."""
    drafter = copy.deepcopy(qwen3_drafter)
    drafter.config.lookup_threshold = 0.9
    verified = []
    original = DFlashCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        rounds = len(self.stats.drafts)
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if len(self.stats.drafts) > rounds:  # a drafting round (the call that only prefills records none)
            verified.append(candidates[0, input_ids.shape[1]:].tolist())
        return candidates, logits

    monkeypatch.setattr(DFlashCandidateGenerator, "get_candidates", spy)
    looked = 0
    # sampled answers rarely repeat the context: the self-repeating prompt, several seeds
    cases = [(seed, REPEATS) for seed in range(6)] if sample else list(enumerate(_lookup_prompts()))
    for seed, prompt in cases:
        torch.manual_seed(seed)
        verified.clear()
        qwen3_target.generate(prompt, assistant_model=drafter, do_sample=sample, max_new_tokens=30)
        assert drafter.last_stats.drafts == verified
        looked += sum(drafter.last_stats.lookup_proposals)
    assert looked > 0


def test_replay_equals_generate_with_lookup(qwen3_target, qwen3_drafter, train_prompts):
    drafter = copy.deepcopy(qwen3_drafter)
    drafter.config.lookup_threshold = 0.7
    looked = 0
    for prompt in train_prompts[:3] + _lookup_prompts():
        for new in (9, 37):
            got = _check_same_rounds(qwen3_target, drafter, prompt, new)
            assert got["lookup_proposals"] == drafter.last_stats.lookup_proposals
            looked += sum(got["lookup_proposals"])
    assert looked > 0


def test_bad_thresholds_and_the_combination_are_refused(qwen3_target, qwen3_drafter):
    drafter = copy.deepcopy(qwen3_drafter)
    for bad in (-0.1, 1.5, "high", True):
        with pytest.raises(ValueError, match="lookup_threshold must be a number in"):
            drafter.config.lookup_threshold = bad
    drafter.config.lookup_threshold, drafter.config.proposal_threshold = 0.5, 0.5
    with pytest.raises(ValueError, match="set one of them to 0"):
        qwen3_target.generate(REPEATS, assistant_model=drafter, do_sample=False, max_new_tokens=8)
