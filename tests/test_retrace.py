"""ReTrace: each block is conditioned on the previous round's rejected suffix. Still lossless."""

import copy

import pytest
import torch
from transformers import AutoModel, GenerationConfig

from dflash_retrace import DFlashDrafter
from dflash_retrace.generation_dflash import DFlashCandidateGenerator
from dflash_retrace.training.rollouts import recording_rounds
from tiny import prompts

B = 8


@pytest.fixture(scope="module")
def zero_retrace(qwen3_drafter):
    return copy.deepcopy(qwen3_drafter).add_retrace().eval()


@pytest.fixture(scope="module")
def live_retrace(qwen3_drafter):
    """Non-zero ReTrace weights: the memory really changes the drafts."""
    drafter = copy.deepcopy(qwen3_drafter).add_retrace().eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in drafter.retrace.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return drafter


def test_retrace_weights_under_prefix(zero_retrace):
    keys = [k for k in zero_retrace.state_dict() if k.startswith("retrace.")]
    assert sorted(keys) == ["retrace.correction.weight", "retrace.gate.bias", "retrace.gate.weight",
                            "retrace.value.bias", "retrace.value.weight"]
    assert not zero_retrace.retrace.value.weight.any() and not zero_retrace.retrace.value.bias.any()


def test_zero_initialised_retrace_equals_dflash_per_round(qwen3_target, qwen3_drafter, zero_retrace, train_prompts):
    conditioned = 0
    for prompt in train_prompts[:4] + prompts(3, seed=77):
        a = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=40)
        plain = qwen3_drafter.last_stats
        b = qwen3_target.generate(prompt, assistant_model=zero_retrace, do_sample=False, max_new_tokens=40)
        rt = zero_retrace.last_stats
        assert torch.equal(a, b)
        assert rt.drafts == plain.drafts
        assert rt.acceptance_lengths == plain.acceptance_lengths
        assert all(c == 0 for c in plain.conditioned_slots)
        conditioned += sum(rt.conditioned_slots)
    assert conditioned > 0  # memory was fed, it just has no effect at W_v = 0


@pytest.mark.parametrize("max_new_tokens", [1, 2, B - 1, B, B + 1, 40])
def test_live_retrace_greedy_equals_target(qwen3_target, live_retrace, train_prompts, max_new_tokens):
    for prompt in train_prompts[:3] + prompts(3, seed=99):
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
        out = qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(ref, out)


@pytest.mark.parametrize("offset", [2, 6, 11])
def test_live_retrace_with_eos_min_tokens_and_penalty(qwen3_target, live_retrace, train_prompts, offset):
    prompt = train_prompts[offset % 4]
    plain = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)
    eos = int(plain[0, prompt.shape[1] + offset])
    for kwargs in (dict(eos_token_id=eos), dict(eos_token_id=eos, min_new_tokens=offset + 3),
                   dict(repetition_penalty=1.2)):
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30, **kwargs)
        out = qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=30, **kwargs)
        assert torch.equal(ref, out), kwargs


def test_live_retrace_changes_acceptance(qwen3_target, qwen3_drafter, live_retrace, train_prompts):
    differs = False
    conditioned = []
    for prompt in train_prompts[:6]:
        qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=40)
        qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=40)
        differs |= qwen3_drafter.last_stats.acceptance_lengths != live_retrace.last_stats.acceptance_lengths
        conditioned += live_retrace.last_stats.conditioned_slots
    assert differs
    assert conditioned[0] == 0 and max(conditioned) > 0  # first round has no memory


def test_forward_counts(qwen3_target, live_retrace, train_prompts):
    """No extra forward: target forwards = prefill + rounds (+ one plain step at the budget edge); drafter = rounds."""
    for prompt in train_prompts[:3]:
        calls, drafter_calls = [], []
        h1 = qwen3_target.register_forward_hook(lambda *a: calls.append(1))
        h2 = live_retrace.register_forward_hook(lambda *a: drafter_calls.append(1))
        try:
            qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=40)
        finally:
            h1.remove(), h2.remove()
        rounds = live_retrace.last_stats.num_rounds
        assert len(calls) - 1 - rounds in (0, 1)
        assert len(drafter_calls) == rounds


def test_only_needed_hidden_states_requested(qwen3_target, live_retrace, qwen3_drafter):
    generator = DFlashCandidateGenerator(live_retrace, qwen3_target, GenerationConfig(max_length=50))
    L = qwen3_target.config.num_hidden_layers
    wanted = sorted({i + 1 for i in live_retrace.config.target_layer_ids} | {L})
    assert generator.model_kwargs_overrides["output_hidden_states"] in (wanted, True)
    plain = DFlashCandidateGenerator(qwen3_drafter, qwen3_target, GenerationConfig(max_length=50))
    assert L not in (plain.model_kwargs_overrides["output_hidden_states"] if plain.model_kwargs_overrides[
        "output_hidden_states"] is not True else [])


# ------------------------------------------------------------------ alignment on hand-built rounds
K = B - 1
H = 64


def _generator(target, drafter):
    gen = DFlashCandidateGenerator(drafter, target, GenerationConfig(max_length=100))
    return gen


def _round(gen, num_proposals):
    """Pretend a round proposed `num_proposals` tokens: m_j = j (slot index) in every feature."""
    m = torch.arange(1, num_proposals + 1, dtype=torch.float32)[None, :, None].expand(1, num_proposals, H)
    gen.memory_source = (m.clone(), num_proposals)
    L = gen.num_target_layers
    # u at verification index t (position p + t) = 100 + t; it scored old slot t + 1
    u = (100 + torch.arange(num_proposals + 1, dtype=torch.float32))[None, :, None].expand(1, num_proposals + 1, H)
    hidden = [None] * (L + 1)
    hidden[L] = u
    return hidden


@pytest.mark.parametrize("accepted", [0, 1, K - 3, K - 2])
def test_alignment_shift(qwen3_target, live_retrace, accepted):
    gen = _generator(qwen3_target, live_retrace)
    memory, conditioned = gen._memory(accepted, _round(gen, K))
    valid = memory.valid[0].tolist()
    assert valid[0] is False  # the anchor is never conditioned
    for i in range(1, B):
        src = i + accepted + 1  # old slot feeding new slot i
        assert valid[i] == (src <= K)
        if valid[i]:
            assert memory.drafter_states[0, i, 0] == src  # m of old slot src
            assert memory.target_states[0, i, 0] == 100 + src - 1  # u that scored old slot src
    assert memory.num_conditioned == conditioned == K - accepted - 1
    assert gen.memory_source is None  # consumed: one round only


@pytest.mark.parametrize("accepted", [K - 1, K])
def test_no_rejected_suffix_leaves_no_memory(qwen3_target, live_retrace, accepted):
    """a = K: full acceptance; a = K - 1: only d_K was rejected and the bonus replaced it."""
    gen = _generator(qwen3_target, live_retrace)
    assert gen._memory(accepted, _round(gen, K)) == (None, 0)


def test_eos_shortened_round(qwen3_target, live_retrace):
    """A draft cut at EOS after 3 proposals: only old slots 1..3 can feed the next block."""
    gen = _generator(qwen3_target, live_retrace)
    memory, conditioned = gen._memory(0, _round(gen, 3))
    assert conditioned == 2
    assert memory.valid[0].tolist() == [False, True, True] + [False] * (B - 3)
    assert memory.drafter_states[0, 1, 0] == 2 and memory.drafter_states[0, 2, 0] == 3


def test_no_memory_without_a_source(qwen3_target, live_retrace):
    gen = _generator(qwen3_target, live_retrace)
    assert gen._memory(0, [None] * 5) == (None, 0)


def test_budget_capped_round_clears_memory(qwen3_target, live_retrace, train_prompts):
    """A capped round (fewer than K proposals fit the budget) produces no memory for the next one."""
    prompt = train_prompts[0]
    for new in (B + 3, 2 * B + 1, 13):
        qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=new)
        stats = live_retrace.last_stats
        # Fewer than K proposals: capped by the budget (the tiny target has no EOS, so no round was cut at one).
        capped = [i for i, n in enumerate(stats.num_proposals[:-1]) if n < K]
        assert capped, (new, stats.num_proposals)  # the budgets are chosen so that a capped round happens
        assert all(stats.conditioned_slots[i + 1] == 0 for i in capped), (new, stats)


def test_new_generate_call_starts_without_memory(qwen3_target, live_retrace, train_prompts):
    for prompt in train_prompts[:3]:
        qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=30)
        assert live_retrace.last_stats.conditioned_slots[0] == 0


def test_memory_dtype_is_drafter_dtype(qwen3_target, live_retrace, train_prompts):
    drafter = copy.deepcopy(live_retrace).to(torch.float64)
    prompt = train_prompts[1]
    with recording_rounds(drafter) as rounds:  # the ReTrace training's recorder
        out = qwen3_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=30)
    assert torch.equal(out, qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30))
    assert [p for p, _ in rounds] == [prompt.shape[1] - 1 + sum(drafter.last_stats.acceptance_lengths[:i]) + 1
                                      for i in range(len(rounds))]  # anchors: the last committed token
    memories = [m for _, m in rounds if m is not None]
    assert memories and all(m.drafter_states.dtype == torch.float64 == m.target_states.dtype for m in memories)
    # bytes kept per round: m and u for K slots
    per_round = 2 * K * drafter.config.hidden_size * 8
    print(f"ReTrace memory per round at H={drafter.config.hidden_size}, K={K}, fp64: {per_round} bytes")


# ------------------------------------------------------------------ persistence
def test_save_reload_keeps_retrace(qwen3_target, live_retrace, train_prompts, tmp_path):
    live_retrace.save_pretrained(tmp_path)
    reloaded = DFlashDrafter.from_pretrained(tmp_path).eval()
    remote = AutoModel.from_pretrained(tmp_path, trust_remote_code=True).eval()
    for model in (reloaded, remote):
        assert model.config.retrace and model.retrace is not None
        for key, value in live_retrace.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), key
    for prompt in train_prompts[:3]:
        qwen3_target.generate(prompt, assistant_model=live_retrace, do_sample=False, max_new_tokens=30)
        expected = live_retrace.last_stats
        for model in (reloaded, remote):
            qwen3_target.generate(prompt, assistant_model=model, do_sample=False, max_new_tokens=30)
            assert model.last_stats.drafts == expected.drafts
            assert model.last_stats.conditioned_slots == expected.conditioned_slots


def test_from_pretrained_dflash_checkpoint_with_retrace(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    """`from_pretrained(dflash_checkpoint, retrace=True)` adds zero-initialised ReTrace weights."""
    qwen3_drafter.save_pretrained(tmp_path)
    drafter = DFlashDrafter.from_pretrained(tmp_path, retrace=True).eval()
    assert drafter.retrace is not None and not drafter.retrace.value.weight.any()
    prompt = train_prompts[0]
    qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=30)
    qwen3_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=30)
    assert drafter.last_stats.drafts == qwen3_drafter.last_stats.drafts
