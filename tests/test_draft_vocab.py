"""Draft vocabulary (FR-Spec / EAGLE-3 style): the drafter proposes from a subset of the target's tokens, its logits
are placed in the full vocabulary with -inf elsewhere, and generation stays exact (fp32, tiny models)."""

import collections
import copy

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training.objective import dflash_block_loss, draft_vocabulary
from test_remote_code import _run as run_in_fresh_process
from tiny import EOS, VOCAB, continuations, prompts, tiny_target, train_drafter

DRAFT = 40  # of the tiny targets' 96 tokens
CONTEXT_PROMPT = torch.tensor([[11, 12, 13, 60, 61, 62, 70]])  # outside the 20 ids of `context_pair`


def _vocab_of(rows, size=DRAFT):
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for ids, mask in rows:
        counts += torch.bincount(ids[mask], minlength=VOCAB)
    return draft_vocabulary(counts, size, always=[EOS])


@pytest.fixture(scope="module")
def vocab_pair(qwen3_target, train_prompts):
    rows = continuations(qwen3_target, train_prompts, new_tokens=40)
    ids = _vocab_of(rows)
    fresh = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=2, block_size=8).set_draft_vocabulary(ids)
    drafter = train_drafter(qwen3_target, rows, steps=400, block_size=8, layers=2, lr=5e-3, drafter=fresh)
    assert drafter.config.draft_vocab_context is True  # the default; these tests check the saved vocabulary alone
    drafter.config.draft_vocab_context = False
    return qwen3_target, drafter, ids


def test_logits_are_full_vocabulary_with_minus_inf_outside(vocab_pair):
    target, drafter, ids = vocab_pair
    hidden = torch.randn(3, 64)
    full = drafter.compute_logits(hidden, target.lm_head)
    draft = drafter.compute_draft_logits(hidden, target.lm_head)
    assert full.shape == (3, VOCAB) and draft.shape == (3, ids.numel())
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(full[:, outside]).all()
    torch.testing.assert_close(full[:, ids], draft)
    torch.testing.assert_close(draft, target.lm_head(hidden)[:, ids])  # the target's own head rows


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 8, 9, 40])
def test_greedy_equals_plain_generate(vocab_pair, train_prompts, max_new_tokens):
    target, drafter, ids = vocab_pair
    proposed = set()
    for prompt in train_prompts[:3] + prompts(3, length=5, seed=77 + max_new_tokens):
        ref = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
        out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(ref, out), f"plain {ref.tolist()}\ndraft {out.tolist()}"
        for draft in drafter.last_stats.drafts:
            proposed |= set(torch.as_tensor(draft).flatten().tolist())
    assert proposed <= set(ids.tolist())  # proposals are target ids inside the draft vocabulary


def test_the_draft_vocabulary_drafter_drafts(vocab_pair, train_prompts):
    target, drafter, _ = vocab_pair
    lengths = []
    for prompt in train_prompts[:6]:
        target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=40)
        lengths += drafter.last_stats.acceptance_lengths
    assert sum(lengths) / len(lengths) > 2.0


def test_save_load_and_remote_code_keep_the_vocabulary(vocab_pair, train_prompts, tmp_path):
    target, drafter, ids = vocab_pair
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    loaded = DFlashDrafter.from_pretrained(tmp_path / "drafter").eval()
    assert loaded.config.draft_vocab_size == ids.numel()
    assert torch.equal(loaded.draft_to_target, ids)
    prompt_list = [p[0].tolist() for p in train_prompts[:2]]
    result = run_in_fresh_process(tmp_path / "target", tmp_path / "drafter", prompt_list)
    for prompt, out, lengths in zip(train_prompts[:2], result["outputs"], result["acceptance"]):
        ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
        assert out == ref[0].tolist()
        target.generate(prompt, assistant_model=loaded, do_sample=False, max_new_tokens=30)
        assert lengths == loaded.last_stats.acceptance_lengths


def test_peft_wrapped_draft_vocabulary_drafter(vocab_pair, train_prompts):
    from peft import LoraConfig, get_peft_model

    target, drafter, ids = vocab_pair
    wrapped = get_peft_model(copy.deepcopy(drafter), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert torch.equal(wrapped.get_base_model().draft_to_target, ids)
    for prompt in train_prompts[:2]:
        ref = target.generate(prompt, do_sample=False, max_new_tokens=20)
        out = target.generate(prompt, assistant_model=wrapped, do_sample=False, max_new_tokens=20)
        assert torch.equal(ref, out)


def test_zlab_export_refuses_a_draft_vocabulary(vocab_pair, tmp_path):
    from dflash_retrace.hub.export import zlab_state_dict

    with pytest.raises(ValueError, match="draft vocabulary of 40 tokens.*format='ours'"):
        zlab_state_dict(vocab_pair[1])


def test_labels_outside_the_vocabulary_are_misses_not_losses(qwen3_target):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4)
    drafter.set_draft_vocabulary(torch.arange(0, 50))
    ids = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
    mask = torch.ones(8, dtype=torch.bool)
    anchors = torch.tensor([1, 3])
    loss_in, stats_in = dflash_block_loss(drafter, qwen3_target, ids, mask, anchors)
    outside = ids.clone()
    outside[3] = 90  # a label (slot 2 of the first block, slot 0 of the second) the drafter cannot propose
    loss_out, stats_out = dflash_block_loss(drafter, qwen3_target, outside, mask, anchors)
    assert torch.isfinite(loss_out)
    assert stats_out["counted"].sum() == stats_in["counted"].sum()  # still counted ...
    assert stats_out["correct"][2] == 0  # ... as a miss


def test_set_draft_vocabulary_checks_ids(qwen3_target):
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4)
    with pytest.raises(ValueError, match="no id twice"):
        drafter.set_draft_vocabulary([1, 1])
    with pytest.raises(ValueError, match=r"0\.\.95"):
        drafter.set_draft_vocabulary([1, 96])


@pytest.mark.parametrize("policy", ["argmax", "sample"])
def test_sampling_follows_the_target(vocab_pair, policy):
    """Speculative sampling with -inf outside the draft vocabulary: marginals match the target's (noise floor), with
    argmax proposals (q a point mass) and with sampled ones (q the drafter's distribution over the vocabulary)."""
    target, drafter, _ = vocab_pair
    drafter = copy.deepcopy(drafter)
    drafter.config.proposal_policy = policy
    _check_sampling_follows_the_target(target, drafter, torch.tensor([[11, 12, 13, 14, 15]]))


def _check_sampling_follows_the_target(target, drafter, prompt, n=240, new=3):
    """Per-position marginals of n sampled continuations: assisted against plain, within the plain-vs-plain noise
    floor (total variation distance between two plain runs of other seeds)."""
    def marginals(seed0, **kwargs):
        counts = [collections.Counter() for _ in range(new)]
        for i in range(n):
            torch.manual_seed(seed0 + i)
            out = target.generate(prompt, do_sample=True, max_new_tokens=new, min_new_tokens=new, **kwargs)
            for k, token in enumerate(out[0, prompt.shape[1]:].tolist()):
                counts[k][token] += 1
        return counts

    def tv(a, b):
        return sum(0.5 * sum(abs(x[t] - y[t]) / n for t in set(x) | set(y)) for x, y in zip(a, b)) / new

    a, b = marginals(0, temperature=1.0), marginals(10_000, temperature=1.0)
    floor = tv(a, b)
    assert tv(a, marginals(20_000, temperature=1.0, assistant_model=drafter)) < 1.5 * floor + 0.03


# ------------------------------------------------------------------ draft_vocab_context: the context's tokens join
@pytest.fixture(scope="module")
def context_pair(vocab_pair):
    """The trained drafter with half of its vocabulary (its 20 most frequent ids), and draft_vocab_context on: the
    prompts' tokens outside those 20 become proposable."""
    target, drafter, ids = vocab_pair
    narrow = copy.deepcopy(drafter).set_draft_vocabulary(ids[:20])
    narrow.config.draft_vocab_context = True
    return target, narrow


def test_context_tokens_outside_the_vocabulary_are_proposed_and_greedy_stays_exact(context_pair, train_prompts):
    target, drafter = context_pair
    saved = set(drafter.draft_to_target.tolist())
    from_context = added = 0
    for max_new_tokens in (1, 2, 8, 9, 40):
        for prompt in train_prompts[:4] + prompts(3, length=7, seed=5 + max_new_tokens):
            ref = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
            out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
            assert torch.equal(ref, out), f"plain {ref.tolist()}\ndraft {out.tolist()}"
            stats, committed = drafter.last_stats, prompt.shape[1] + 1  # the prefill commits one token
            for draft, length in zip(stats.drafts, stats.acceptance_lengths):
                context = set(out[0, :committed].tolist())
                assert set(draft) <= saved | context  # nothing outside the vocabulary and the round's context
                from_context += sum(t not in saved for t in draft)
                committed += length
            added += stats.draft_vocab_added
    assert from_context > 0 and added > 0  # the option did something


def test_context_rows_are_released_when_generate_returns(context_pair, train_prompts, monkeypatch):
    """The head rows of a call's context tokens belong to that call: held while it drafts, dropped when it returns
    (or raises), while the saved vocabulary's rows stay cached for the next call."""
    target, drafter = context_pair
    held = []
    original = type(drafter)._extra_logits

    def spy(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        held.append(self._extra_rows is not None)
        return logits

    monkeypatch.setattr(type(drafter), "_extra_logits", spy)
    target.generate(train_prompts[0], assistant_model=drafter, do_sample=False, max_new_tokens=20)
    assert held and all(held) and drafter.last_stats.draft_vocab_added > 0  # the call used context rows
    assert drafter._extra_rows is None and drafter._head_rows is not None

    def fail(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(type(drafter), "_extra_logits", fail)
    with pytest.raises(RuntimeError, match="stop here"):
        target.generate(train_prompts[0], assistant_model=drafter, do_sample=False, max_new_tokens=20)
    assert drafter._extra_rows is None


def test_context_vocabulary_off_proposes_only_the_saved_vocabulary(context_pair, train_prompts):
    target, drafter = context_pair
    off = copy.deepcopy(drafter)
    off.config.draft_vocab_context = False
    saved = set(off.draft_to_target.tolist())
    for prompt in train_prompts[:4]:
        target.generate(prompt, assistant_model=off, do_sample=False, max_new_tokens=30)
        assert all(set(d) <= saved for d in off.last_stats.drafts) and off.last_stats.draft_vocab_added == 0


@pytest.mark.parametrize("kwargs", [dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=3)])
def test_context_vocabulary_with_logits_processors_stays_exact(context_pair, train_prompts, kwargs):
    target, drafter = context_pair
    for prompt in train_prompts[:3]:
        ref = target.generate(prompt, do_sample=False, max_new_tokens=30, **kwargs)
        out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=30, **kwargs)
        assert torch.equal(ref, out)


def test_greedy_proposals_with_extra_ids_match_the_full_logits(context_pair):
    """The fast greedy path (no full-vocabulary logits) picks what the full logits' argmax picks, ties included
    (lowest target id), and its confidence is the full softmax's probability of that token. Both kinds of exact tie
    are built into the head: a saved row equal to a higher extra row (the saved id wins) and an extra row equal to a
    higher saved row (the extra id wins)."""
    target, drafter = context_pair
    head = copy.deepcopy(target.lm_head)
    saved = sorted(drafter.draft_to_target.tolist())
    outside = [t for t in range(VOCAB) if t not in saved]
    extra = sorted(outside[:12])
    low_extra = extra[0]  # ties B: it against a higher saved id
    saved_b = next(t for t in saved if t > low_extra)
    saved_a = next(t for t in saved if t != saved_b)  # ties A: it against a higher extra id
    extra_a = next(t for t in extra if t > saved_a and t != low_extra)
    with torch.no_grad():
        head.weight[extra_a] = head.weight[saved_a]
        head.weight[saved_b] = head.weight[low_extra]
    hidden = torch.cat([torch.randn(1, 40, 64), 3 * head.weight[[saved_a, low_extra, extra[3]]][None]], dim=1)
    ids, confidence = drafter.greedy_proposals(hidden, head, with_confidence=True, extra_ids=torch.tensor(extra))
    full = drafter.compute_logits(hidden, head, torch.tensor(extra))
    assert torch.equal(ids, full.argmax(-1))
    torch.testing.assert_close(confidence, full[0].softmax(-1).gather(-1, ids[0, :, None])[:, 0])
    assert set(ids[0].tolist()) & set(extra)  # the extras do win some slots
    assert torch.isneginf(full[..., sorted(set(outside) - set(extra))]).all()
    for slot, (winner, loser) in ((40, (saved_a, extra_a)), (41, (low_extra, saved_b))):  # the built ties decide
        top2 = full[0, slot].topk(2)
        assert top2.values[0] == top2.values[1] and set(top2.indices.tolist()) == {winner, loser}
        assert ids[0, slot] == winner


@pytest.mark.parametrize("policy", ["argmax", "sample"])
def test_sampling_with_a_context_vocabulary_follows_the_target(context_pair, policy):
    target, drafter = context_pair
    drafter = copy.deepcopy(drafter)
    drafter.config.proposal_policy = policy
    _check_sampling_follows_the_target(target, drafter, CONTEXT_PROMPT)
    assert drafter.last_stats.draft_vocab_added > 0


def test_sampled_proposals_come_from_the_q_handed_back(context_pair, train_prompts, monkeypatch):
    """proposal_policy="sample" with a context vocabulary: in every round the logits handed to transformers'
    rejection sampling are finite exactly on the saved vocabulary and the round's context (the support q was drawn
    from), each proposal has a finite logit there, and some proposals are context tokens outside the saved ids."""
    from dflash_retrace.generation_dflash import DFlashCandidateGenerator

    target, drafter = context_pair
    drafter = copy.deepcopy(drafter)
    drafter.config.proposal_policy = "sample"
    saved = set(drafter.draft_to_target.tolist())
    rounds = []
    original = DFlashCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        ids, logits = original(self, input_ids, *args, **kwargs)
        if ids.shape[1] > input_ids.shape[1]:
            rounds.append((input_ids[0].tolist(), ids[0, input_ids.shape[1]:].tolist(), logits))
        return ids, logits

    monkeypatch.setattr(DFlashCandidateGenerator, "get_candidates", spy)
    for seed, prompt in enumerate(train_prompts[:3] + [CONTEXT_PROMPT]):
        torch.manual_seed(seed)
        target.generate(prompt, assistant_model=drafter, do_sample=True, temperature=0.8, top_k=0,
                        max_new_tokens=30)
    from_context = 0
    for context, drafts, logits in rounds:
        assert logits is not None and logits.shape[:2] == (1, len(drafts))
        support = saved | set(context)
        for k, token in enumerate(drafts):
            finite = set(torch.isfinite(logits[0, k]).nonzero()[:, 0].tolist())
            assert finite == support, f"slot {k}: q's support {sorted(finite ^ support)} differs from the vocabulary"
            assert token in finite
            from_context += token not in saved
    assert rounds and from_context > 0


def test_draft_vocab_context_saves_loads_and_runs_as_remote_code(context_pair, train_prompts, tmp_path):
    target, drafter = context_pair
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    assert DFlashDrafter.from_pretrained(tmp_path / "drafter").config.draft_vocab_context is True
    prompt_list = [p[0].tolist() for p in train_prompts[:2]]
    result = run_in_fresh_process(tmp_path / "target", tmp_path / "drafter", prompt_list)
    for prompt, out, lengths in zip(train_prompts[:2], result["outputs"], result["acceptance"]):
        assert out == target.generate(prompt, do_sample=False, max_new_tokens=30)[0].tolist()
        target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=30)
        assert lengths == drafter.last_stats.acceptance_lengths
    with pytest.raises(ValueError, match="draft_vocab_context must be True or False"):
        drafter.config.draft_vocab_context = "yes"


def test_context_vocabulary_adds_every_new_context_token_once():
    from dflash_retrace.vocab_dflash import ContextVocabulary

    vocab = ContextVocabulary(torch.tensor([5, 1, 9]), num_rows=12)
    assert vocab.update(torch.tensor([[1, 5, 9]])) is None and not vocab.proposable(3)
    assert vocab.update(torch.tensor([[1, 5, 9, 7, 3, 7]])).tolist() == [3, 7]
    assert vocab.update(torch.tensor([[1, 5, 9, 7, 3, 7, 11, 1, 4]])).tolist() == [3, 4, 7, 11]  # the newest too
    assert vocab.proposable(11) and vocab.proposable(5) and not vocab.proposable(2) and not vocab.proposable(12)


def test_context_vocabulary_skips_the_prompts_masked_positions():
    from dflash_retrace.vocab_dflash import ContextVocabulary

    padded = torch.tensor([[0, 0, 5, 3, 0]])  # two pad positions, then context (0 is a real token at the end)
    vocab = ContextVocabulary(torch.tensor([5, 1, 9]), num_rows=12, prompt_mask=torch.tensor([[0, 0, 1, 1, 1]]))
    assert vocab.update(padded[:, :4]).tolist() == [3]  # the pad id 0 is not context
    assert vocab.update(padded).tolist() == [0, 3]  # the same id unmasked is
    plain = ContextVocabulary(torch.tensor([5, 1, 9]), num_rows=12, prompt_mask=torch.ones(1, 4, dtype=torch.long))
    assert plain.update(padded[:, :4]).tolist() == [0, 3]


def test_a_left_padded_prompts_pad_id_is_never_proposed(context_pair, train_prompts, monkeypatch):
    from dflash_retrace.vocab_dflash import ContextVocabulary

    target, drafter = context_pair
    saved = set(drafter.draft_to_target.tolist())
    mask = torch.ones(1, 4 + train_prompts[0].shape[1], dtype=torch.long)
    mask[:, :4] = 0
    for pad in range(target.config.vocab_size - 1, 0, -1):  # an id outside the vocabulary, the prompt and the output
        prompt = torch.cat([torch.full((1, 4), pad), train_prompts[0]], dim=1)
        ref = target.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=30)
        if pad not in saved and pad not in ref[0, 4:].tolist():
            break
    vocabularies = []
    original = ContextVocabulary.extend

    def spy(self, tokens, device=None):
        ids = original(self, tokens, device)
        vocabularies.append((self, self.seen))
        return ids

    monkeypatch.setattr(ContextVocabulary, "extend", spy)
    out = target.generate(prompt, attention_mask=mask, assistant_model=drafter, do_sample=False, max_new_tokens=30)
    assert torch.equal(ref, out)
    vocab, read = vocabularies[-1]
    context = set(out[0, 4:read].tolist())  # what the call had read: the unpadded prompt and the committed tokens
    assert vocab.added == sorted(context - saved) and vocab.added
    assert not vocab.proposable(pad) and all(pad not in draft for draft in drafter.last_stats.drafts)
