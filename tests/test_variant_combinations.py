"""The drafter variants together: layer-wise fusion (DFlare), step embeddings (PAD-Rec), target-KV reuse (KVShot,
hybrid) and ReTrace on one drafter. Zero-initialised, all at once, it is its DFlash backbone exactly; with every new
weight live it drafts differently and greedy output still equals plain `generate()` (fp32, tiny targets); it saves,
reloads through remote code in a fresh process with identical drafts, and trains with every option and VAT."""

import copy

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training import TrainConfig, train_drafter
from test_remote_code import _run as run_remote
from tiny import VOCAB, continuations, prompts

ALL = dict(fusion="layerwise", step_embeddings=True, context="hybrid", retrace=True)
NEW = 30


def _generate(target, drafter, prompt_list, max_new_tokens=NEW):
    """(output ids, per-round drafts, acceptance lengths) of greedy speculative generation per prompt."""
    outs, drafts, lengths = [], [], []
    for p in prompt_list:
        outs.append(target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens))
        drafts.append(drafter.last_stats.drafts)
        lengths.append(drafter.last_stats.acceptance_lengths)
    return outs, drafts, lengths


def _all_options(drafter, folder):
    drafter.save_pretrained(folder)
    return DFlashDrafter.from_pretrained(folder, **ALL).eval()


def _live(drafter, seed=5):
    """Every weight the options added, randomised (so each option changes the drafts)."""
    live = copy.deepcopy(drafter)
    g = torch.Generator().manual_seed(seed)
    new = [p for name, p in live.named_parameters()
           if name.startswith(("fusion.", "steps.", "retrace.")) or ".self_attn.kv." in name]
    assert new
    with torch.no_grad():
        for p in new:
            scale = 1.0 if p.dim() < 2 else 2.0 / p.shape[-1] ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return live


@pytest.fixture(scope="module")
def zero_all(qwen3_drafter, tmp_path_factory):
    return _all_options(qwen3_drafter, tmp_path_factory.mktemp("dflash"))


@pytest.fixture(scope="module")
def live_qwen3(zero_all):
    return _live(zero_all)


@pytest.fixture(scope="module")
def live_llama(llama_drafter, tmp_path_factory):
    return _live(_all_options(llama_drafter, tmp_path_factory.mktemp("dflash-llama")))


def test_every_option_zero_initialised_is_the_dflash_drafter(qwen3_target, qwen3_drafter, zero_all, train_prompts):
    assert zero_all.fusion is not None and zero_all.steps is not None and zero_all.retrace is not None
    assert all(layer.self_attn.kv is not None for layer in zero_all.layers)
    ref = _generate(qwen3_target, qwen3_drafter, train_prompts[:4])
    got = _generate(qwen3_target, zero_all, train_prompts[:4])
    for a, b in zip(ref[0], got[0]):
        assert torch.equal(a, b)
    assert got[1] == ref[1] and got[2] == ref[2]  # the same drafts in every round, the same acceptance
    assert sum(zero_all.last_stats.conditioned_slots) > 0  # ReTrace memory did reach the blocks (at zero weight)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 9, 40])
def test_every_option_live_greedy_equals_target(request, family, max_new_tokens):
    target = request.getfixturevalue(f"{family}_target")
    drafter = request.getfixturevalue(f"live_{family}")
    for p in prompts(4, seed=21):
        ref = target.generate(p, do_sample=False, max_new_tokens=max_new_tokens)
        out = target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("max_new_tokens", [2, 9, 40])
def test_every_option_with_a_context_grown_draft_vocabulary(qwen3_target, live_qwen3, max_new_tokens):
    """All options live (ReTrace memory included) on a draft vocabulary of the even ids, with the context's odd ids
    joining it (draft_vocab_context): greedy output still equals plain generate()."""
    drafter = copy.deepcopy(live_qwen3).set_draft_vocabulary(list(range(0, VOCAB, 2)))
    drafter.config.draft_vocab_context = True
    odd = 0
    for p in prompts(4, seed=33):
        ref = qwen3_target.generate(p, do_sample=False, max_new_tokens=max_new_tokens)
        out = qwen3_target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(out, ref)
        odd += sum(t % 2 for draft in drafter.last_stats.drafts for t in draft)
        stats = drafter.last_stats
        assert (stats.draft_vocab_added > 0) == (stats.num_rounds > 0)  # a drafted round reads the prompt's odd ids
    assert odd > 0 or max_new_tokens < 9  # context tokens were proposed (a 2-token budget has no room for a round)


def test_every_option_live_drafts_differently(qwen3_target, qwen3_drafter, live_qwen3, train_prompts):
    assert _generate(qwen3_target, live_qwen3, train_prompts[:3])[1] != \
        _generate(qwen3_target, qwen3_drafter, train_prompts[:3])[1]


def test_every_option_survives_a_fresh_process(qwen3_target, live_qwen3, train_prompts, tmp_path):
    qwen3_target.save_pretrained(tmp_path / "target")
    live_qwen3.save_pretrained(tmp_path / "drafter")
    prompt_list = [p[0].tolist() for p in train_prompts[:3]]
    result = run_remote(tmp_path / "target", tmp_path / "drafter", prompt_list)
    assert result["modules"] == [] and result["class"].startswith("transformers_modules")
    outs, _, lengths = _generate(qwen3_target, live_qwen3, train_prompts[:3])
    assert result["outputs"] == [o[0].tolist() for o in outs]
    assert result["acceptance"] == lengths  # identical drafts: the same acceptance in every round


def test_layerwise_fusion_with_kv_only_context_is_refused(qwen3_drafter, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="fusion weights would never be used"):
        DFlashDrafter.from_pretrained(tmp_path, fusion="layerwise", context="kv")
    fused = DFlashDrafter.from_pretrained(tmp_path, fusion="layerwise")
    with pytest.raises(ValueError, match="context='hybrid'"):
        fused.set_context("kv")
    kv = DFlashDrafter.from_pretrained(tmp_path, context="kv")
    with pytest.raises(ValueError, match="fusion='fc'"):
        kv.add_fusion()


def test_training_with_every_option_and_vat(qwen3_target, qwen3_drafter, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    rows = continuations(qwen3_target, prompts(6, seed=3), 40)
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(rows)]
    cfg = TrainConfig(init=str(tmp_path / "dflash"), lr=5e-3, max_anchors=16, eval_size=0, progress=False,
                      checkpoint_every=0, max_steps=30, fusion="layerwise", step_embeddings=True, context="hybrid",
                      loss="vat")
    trained = train_drafter(qwen3_target, None, data, tmp_path / "out", cfg)
    assert trained.steps.table.any() and any(p.weight.any() for p in trained.fusion.projections)
    assert all(layer.self_attn.kv.o_proj.weight.any() for layer in trained.layers)  # each option was trained
    loaded = DFlashDrafter.from_pretrained(tmp_path / "out").eval()
    assert (loaded.config.fusion, loaded.config.step_embeddings, loaded.config.context) == ("layerwise", True,
                                                                                            "hybrid")
    for ids, mask in rows[:3]:
        prompt = ids[~mask][None]
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=NEW)
        assert torch.equal(qwen3_target.generate(prompt, assistant_model=loaded, do_sample=False,
                                                 max_new_tokens=NEW), ref)


@pytest.mark.parametrize("options, message", [
    (dict(fusion="layerwise"), "fusion='layerwise'"), (dict(step_embeddings=True), "step_embeddings=True"),
    (dict(context="hybrid"), "KV cache"),
])
def test_zlab_export_refuses_every_variant(qwen3_drafter, tmp_path, options, message):
    from dflash_retrace.hub.export import zlab_state_dict

    qwen3_drafter.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{message}.*format='ours'"):
        zlab_state_dict(DFlashDrafter.from_pretrained(tmp_path, **options))
    assert zlab_state_dict(DFlashDrafter.from_pretrained(tmp_path))  # plain DFlash exports


def test_model_card_names_the_variants(qwen3_drafter, zero_all):
    from dflash_retrace.hub.card import model_card

    card = model_card(zero_all)
    row = next(line for line in card.splitlines() if line.startswith("| variants |"))
    for words in ("layer-wise fusion (DFlare)", "step-position embeddings (PAD-Rec)", "target-KV context 'hybrid'"):
        assert words in row
    assert "| variants | none |" in model_card(qwen3_drafter)


def test_kv_layer_ids_without_a_kv_context_is_refused(qwen3_target, qwen3_drafter, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    rows = continuations(qwen3_target, prompts(2, seed=3), 20)
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(rows)]
    cfg = TrainConfig(init=str(tmp_path / "dflash"), max_steps=1, eval_size=0, progress=False, checkpoint_every=0,
                      kv_layer_ids=[2, 3])
    with pytest.raises(ValueError, match="--kv-layer-ids is read only by a kv/hybrid drafter.*--context hybrid"):
        train_drafter(qwen3_target, None, data, tmp_path / "out", cfg)
