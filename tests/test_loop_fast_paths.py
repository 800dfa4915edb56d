"""The per-round shortcuts of `generate(assistant_model=drafter)` (see examples/loop_overhead.py) change no token:
greedy proposals without full-vocabulary logits, the verify forward without an all-ones attention mask, and the loop
under inference mode, whose outputs come back as ordinary tensors (fp32, tiny models)."""

import contextlib

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.generation_dflash import DFlashCandidateGenerator
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors
from tiny import VOCAB, continuations, prompts, tiny_target


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_greedy_proposals_are_the_full_logits_argmax_with_ties_to_the_lowest_id(qwen3_target, draft_vocab):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4).eval()
    head = torch.nn.Linear(64, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(qwen3_target.lm_head.weight)
        head.weight[50] = head.weight[7]  # tokens 7 and 50 always tie; 7 is the lower id
        head.weight[[7, 50]] *= 40.0  # and win the argmax for most states
    if draft_vocab:  # a draft order that lists 50 before 7: the tie must still go to 7, as over the full logits
        drafter.set_draft_vocabulary([50, 3, 90, 7, 11, 64, 5])
    hidden = torch.randn(1, 32, 64)
    with torch.no_grad():
        full = drafter.compute_logits(hidden, head)
        ids, confidence = drafter.greedy_proposals(hidden, head, with_confidence=True)
    expected = full.argmax(dim=-1)
    assert torch.equal(ids, expected)
    assert (ids == 7).sum() > 8 and not (ids == 50).any()  # the tie was exercised
    assert torch.allclose(confidence, full[0].softmax(-1).gather(-1, expected[0, :, None])[:, 0], atol=1e-6)
    assert drafter.greedy_proposals(hidden, head)[1] is None


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_draft_logits_of_strided_slices_match_row_by_row(qwen3_target, draft_vocab):
    """The generator hands the head a slice of the block's states ([:, 1:]); `compute_draft_logits` runs it as 2-D
    rows (a bf16 linear over such a 3-D slice is slow on CPUs) and must give back (b, k, V) in the same order, also
    for a batch whose slice is not contiguous."""
    torch.manual_seed(1)
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4).eval()
    if draft_vocab:
        drafter.set_draft_vocabulary([50, 3, 90, 7, 11, 64, 5])
    head = qwen3_target.lm_head
    block = torch.randn(3, 8, 64)
    states = block[:, 1:]
    assert not states.is_contiguous()
    with torch.no_grad():
        logits = drafter.compute_draft_logits(states, head)
        rows = torch.stack([torch.stack([drafter.compute_draft_logits(states[b, k].clone()[None], head)[0]
                                         for k in range(7)]) for b in range(3)])
    assert logits.shape == (3, 7, 7 if draft_vocab else VOCAB)
    assert torch.allclose(logits, rows, atol=1e-5)


@pytest.mark.parametrize("fusion", ["fc", "layerwise"])
def test_a_block_without_context_runs(qwen3_target, fusion):
    """The fused context goes through `fc` as 2-D rows; with no context positions (None or length 0) that is an
    empty (0, n*H) matrix, which must come back as (b, 0, H), not fail to reshape."""
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4, fusion=fusion).eval()
    noise = drafter.embed_block(qwen3_target.get_input_embeddings(), torch.tensor([[5, 1, 1, 1]]))
    width = len(drafter.config.feature_layer_ids) * drafter.config.hidden_size
    with torch.no_grad():
        none = drafter(noise_embeds=noise, context_hidden_states=None, position_ids=torch.arange(4)[None])
        empty = drafter(noise_embeds=noise, context_hidden_states=torch.zeros(1, 0, width),
                        position_ids=torch.arange(4)[None])
    assert none.last_hidden_state.shape == (1, 4, drafter.config.hidden_size)
    assert torch.equal(none.last_hidden_state, empty.last_hidden_state)


def test_greedy_rounds_hand_no_logits_to_transformers(qwen3_target, qwen3_drafter, monkeypatch):
    """Greedy without processors: no candidate logits (transformers reads them only to sample); with a processor
    the logits the proposals came from still go back."""
    returned = []
    original = DFlashCandidateGenerator.get_candidates

    def spy(self, *args, **kwargs):
        ids, logits = original(self, *args, **kwargs)
        if ids.shape[1] > args[0].shape[1]:
            returned.append(logits)
        return ids, logits

    monkeypatch.setattr(DFlashCandidateGenerator, "get_candidates", spy)
    prompt = prompts(1, seed=3)[0]
    qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=24)
    assert returned and all(logits is None for logits in returned)
    returned.clear()
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=24, repetition_penalty=1.3)
    out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=24,
                                repetition_penalty=1.3)
    assert torch.equal(ref, out)
    assert returned and all(logits is not None and logits.shape[-1] == VOCAB for logits in returned)


def test_a_padded_prompt_keeps_its_mask(qwen3_target, qwen3_drafter):
    """Only an all-ones mask is dropped from the verify forward: a left-padded prompt keeps its own and its output
    still equals plain generate() with the same mask."""
    prompt = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompts(1, seed=4)[0]], dim=1)
    mask = torch.ones_like(prompt)
    mask[:, :3] = 0
    ref = qwen3_target.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=30)
    with recorded_masks(qwen3_target) as masks:
        out = qwen3_target.generate(prompt, attention_mask=mask, assistant_model=qwen3_drafter, do_sample=False,
                                    max_new_tokens=30)
    assert torch.equal(ref, out)
    assert masks and all(m is not None and not bool(m.all()) for m in masks)
    # Unpadded: no mask reaches the verify forwards (transformers >= 5.24 drops it itself; below, the generator does).
    with recorded_masks(qwen3_target) as masks:
        qwen3_target.generate(prompt[:, 3:], attention_mask=mask[:, 3:], assistant_model=qwen3_drafter,
                              do_sample=False, max_new_tokens=30)
    assert masks and all(m is None for m in masks)


@contextlib.contextmanager
def recorded_masks(model):
    """The `attention_mask` of every forward of `model` within the block (None where none was passed). A forward
    pre-hook: replacing `forward` would change its signature, which generate() inspects."""
    masks = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")),
                                             with_kwargs=True)
    try:
        yield masks
    finally:
        handle.remove()


def test_outputs_are_ordinary_tensors(qwen3_target, qwen3_drafter):
    """The loop runs under inference mode; nothing it returns is an inference tensor, so callers can write into the
    output and use it in autograd (here: embed the generated ids and backpropagate)."""
    prompt = prompts(1, seed=5)[0]
    out = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=20)
    assert not out.is_inference()
    out[0, -1] = 0  # an in-place write (raises on an inference tensor)
    rich = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=20,
                                 return_dict_in_generate=True, output_scores=True, output_logits=True)
    tensors = [rich.sequences, *rich.scores, *rich.logits]
    assert not any(t.is_inference() for t in tensors)
    weight = torch.nn.Parameter(torch.randn(VOCAB, 4))
    torch.nn.functional.embedding(rich.sequences, weight).sum().backward()
    assert weight.grad is not None


def test_a_draft_vocabulary_drafter_trains_after_generating(qwen3_target, train_prompts):
    """The draft vocabulary's head rows are cached per mode: rows gathered under generate()'s inference mode are not
    reused by a training step (which would raise 'Inference tensors cannot be saved for backward')."""
    rows = continuations(qwen3_target, train_prompts[:2], new_tokens=24)
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4)
    drafter.set_draft_vocabulary(list(range(VOCAB - 30, VOCAB)) + [2])
    drafter.eval()
    qwen3_target.generate(prompts(1, seed=6)[0], assistant_model=drafter, do_sample=False, max_new_tokens=12)
    drafter.train()
    for p in qwen3_target.parameters():
        p.requires_grad_(False)
    ids, mask = rows[0]
    loss, _ = dflash_block_loss(drafter, qwen3_target, ids, mask, sample_anchors(mask, 4))
    loss.backward()
    assert drafter.fc.weight.grad is not None and torch.isfinite(drafter.fc.weight.grad).all()


def test_the_returned_cache_extends_in_a_plain_generate(qwen3_target, qwen3_drafter):
    """The cache that generate(assistant_model=...) returns was filled under inference mode (README: a dynamic cache
    extends as usual): a plain generate() that continues from it gives the tokens of one that starts afresh."""
    prompt = prompts(1, seed=7)[0]
    first = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=15,
                                  return_dict_in_generate=True)
    assert first.past_key_values is not None
    continued = qwen3_target.generate(first.sequences, past_key_values=first.past_key_values, do_sample=False,
                                      max_new_tokens=10)
    fresh = qwen3_target.generate(first.sequences, do_sample=False, max_new_tokens=10)
    assert torch.equal(continued, fresh)


def _flash_like(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """flash-attn's semantics on the CPU: a 2D mask cuts the keys to its length (how flash kernels skip a static
    cache's unfilled slots); without one, causal attention aligned to the last key."""
    if attention_mask is not None:
        key, value = key[:, :, : attention_mask.shape[-1]], value[:, :, : attention_mask.shape[-1]]
    q_len, k_len = query.shape[2], key.shape[2]
    allowed = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def test_flash_attention_over_a_static_cache_keeps_the_mask():
    """A flash kernel over a static cache needs the all-ones mask (its length marks the filled slots): the loop keeps
    it there, and the output equals plain generate() (dropping it attended to empty slots: other tokens)."""
    from transformers import AttentionInterface

    AttentionInterface.register("flash_attention_2", _flash_like)  # a CPU stand-in under flash-attn's name
    target = tiny_target("qwen3")
    target.config._attn_implementation = "flash_attention_2"
    for module in target.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = "flash_attention_2"
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()
    prompt = prompts(1, seed=3)[0]
    settings = dict(do_sample=False, max_new_tokens=24, cache_implementation="static")
    plain = target.generate(prompt, **settings)
    with recorded_masks(target) as masks:
        try:
            out = target.generate(prompt, assistant_model=drafter, **settings)
        except ValueError as err:  # transformers before 5.24: no static cache in assisted generation at all
            if "not supported with Static cache" not in str(err):
                raise
            pytest.skip(f"this transformers refuses static caches in assisted generation ({err})")
    assert torch.equal(out, plain)
    assert masks and all(m is not None for m in masks)


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_drafter_moved_under_inference_mode_generates(qwen3_target, do_sample):
    """Moving a drafter (`.to(device)`) inside `torch.inference_mode()` makes its buffers inference tensors, which
    have no version counter: the cached draft-vocabulary order and head rows must not need one."""
    drafter = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, block_size=4).eval()
    drafter.set_draft_vocabulary(list(range(40, VOCAB)))
    with torch.inference_mode():
        drafter._apply(lambda t: t.clone())  # what .to(another device) does to every parameter and buffer
    assert drafter.draft_to_target.is_inference()
    prompt = prompts(1, seed=3)[0]
    torch.manual_seed(0)
    out = qwen3_target.generate(prompt, assistant_model=drafter, do_sample=do_sample, max_new_tokens=12)
    if not do_sample:
        assert torch.equal(out, qwen3_target.generate(prompt, do_sample=False, max_new_tokens=12))
    assert drafter.last_stats.num_rounds > 0
