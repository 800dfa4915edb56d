"""KVShot target-KV reuse (`context="kv"|"hybrid"`): lossless, reads exactly the committed target cache, trains
with the inference attention rule, saves, loads and adapts like any drafter (tiny models, fp32)."""

import copy
import inspect
import json

import pytest
import torch
import transformers.generation.utils

from dflash_retrace import DFlashDrafter
from dflash_retrace import generation_dflash
from dflash_retrace.cli import build_parser
from dflash_retrace.generation_dflash import DFlashContextCache
from dflash_retrace.kv_dflash import default_kv_layer_ids, read_target_kv
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.data import Example
from dflash_retrace.training.features import StoredRows, build_feature_store, open_stores
from dflash_retrace.training.objective import block_hidden_states, target_features
from dflash_retrace.training.target_kv import forward_cache, recompute_layer_kv, stored_target_kv
from test_remote_code import _run
from tiny import continuations, prompts, tiny_target

B = 8
# transformers refuses assisted generation with a static cache before 5.24 (5.15: "not supported with Static cache").
STATIC_ASSISTED = "not supported with Static cache" not in inspect.getsource(transformers.generation.utils)
CACHES = [{}] + ([{"cache_implementation": "static"}] if STATIC_ASSISTED else [])


def _live(drafter, context, seed=11):
    """`drafter` switched to `context`, with non-zero hybrid weights (the target K/V really change the drafts)."""
    live = copy.deepcopy(drafter).set_context(context).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in live.layers:
            if layer.self_attn.kv is not None:
                w = layer.self_attn.kv.o_proj.weight
                w.copy_(torch.randn(w.shape, generator=g) * 3.0)
    return live


@pytest.fixture(scope="module")
def drafters(qwen3_target, llama_target, qwen3_drafter, llama_drafter):
    return {"qwen3": (qwen3_target, qwen3_drafter), "llama": (llama_target, llama_drafter)}


def _drafts(target, drafter, prompt, n=30, **kw):
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=n, **kw)
    return out, drafter.last_stats


# ----------------------------------------------------------------------------- (1) zero-init hybrid
def test_hybrid_from_a_dflash_checkpoint_drafts_exactly_as_it(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path, context="hybrid").eval()  # kv.* missing: zero-initialised
    in_place = copy.deepcopy(qwen3_drafter).set_context("hybrid").eval()
    assert all(not layer.self_attn.kv.o_proj.weight.any() for layer in loaded.layers)
    assert loaded.config.kv_layer_ids == default_kv_layer_ids(4, 2) == [2, 3]
    for prompt in train_prompts[:4] + prompts(2, seed=5):
        _, plain = _drafts(qwen3_target, qwen3_drafter, prompt)
        for hybrid in (loaded, in_place):
            _, stats = _drafts(qwen3_target, hybrid, prompt)
            assert stats.drafts == plain.drafts and stats.acceptance_lengths == plain.acceptance_lengths


# ------------------------------------------------------------------ (2) live weights stay lossless
@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("context", ["kv", "hybrid"])
def test_live_kv_drafter_greedy_equals_target(drafters, train_prompts, family, context):
    target, dflash = drafters[family]
    live = _live(dflash, context)
    differ = False
    for prompt in train_prompts[:2] + prompts(2, seed=21, length=9):
        for n in (2, B + 1, 30):
            for cache in CACHES:
                ref = target.generate(prompt, do_sample=False, max_new_tokens=n, **cache)
                out, stats = _drafts(target, live, prompt, n, **cache)
                assert torch.equal(ref, out), (n, cache)
                _, plain = _drafts(target, dflash, prompt, n, **cache)
                differ |= stats.drafts != plain.drafts
    assert differ  # the option is live: the target's K/V change the drafts


# ------------------------------------------------- (3) the K/V handed over are the committed prefix's
@pytest.mark.parametrize("cache", [{}, pytest.param({"cache_implementation": "static"}, marks=pytest.mark.skipif(
    not STATIC_ASSISTED, reason="this transformers refuses assisted generation with a static cache"))])
def test_handed_kv_equal_a_full_forward_over_the_committed_prefix(drafters, train_prompts, monkeypatch, cache):
    target, dflash = drafters["qwen3"]
    live = _live(dflash, "kv")
    seen = []

    def recording(target_cache, layer_ids, length, device, dtype):
        out = read_target_kv(target_cache, layer_ids, length, device, dtype)
        seen.append((length, [(k.clone(), v.clone()) for k, v in out]))
        return out

    monkeypatch.setattr(generation_dflash, "read_target_kv", recording)
    out = target.generate(train_prompts[0], assistant_model=live, do_sample=False, max_new_tokens=30, **cache)
    assert len(seen) == live.last_stats.num_rounds > 3
    for length, kv in seen:
        full = forward_cache(target(out[:, :length], use_cache=True))
        for layer_id, (k, v) in zip(live.config.kv_layer_ids, kv):
            assert k.shape[2] == length
            torch.testing.assert_close(k, full.layers[layer_id].keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v, full.layers[layer_id].values, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------- (4) training rule == inference forward
@pytest.mark.parametrize("context", ["kv", "hybrid"])
@pytest.mark.parametrize("attention", ["dense", "local"])
def test_training_blocks_equal_generator_forwards(drafters, context, attention):
    target, dflash = drafters["llama"]
    live = _live(dflash, context)
    ids = prompts(1, length=40, seed=8)[0][0]
    anchors = torch.tensor([5, 17, 30])
    trained, *_ = block_hidden_states(live, target, ids, torch.ones_like(ids, dtype=torch.bool), anchors,
                                      attention=attention)
    emb = target.get_input_embeddings()
    for n, p in enumerate(anchors.tolist()):
        prefix = ids[None, :p]
        feats, kv = target_features(target, prefix, live.config.target_layer_ids, kv_layer_ids=live.config.kv_layer_ids)
        block = torch.full((1, B), live.config.mask_token_id)
        block[0, 0] = ids[p]
        out = live(noise_embeds=live.embed_block(emb, block), context_hidden_states=feats,
                   position_ids=torch.arange(p + B)[None], cache=DFlashContextCache(), target_kv=kv)
        torch.testing.assert_close(trained[0, n * B : (n + 1) * B], out.last_hidden_state[0], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ store: recomputed K/V, clear errors
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_recomputed_layer_kv_equal_the_full_forward_cache(family):
    target = tiny_target(family, seed=2)
    ids = prompts(2, length=17, seed=4)
    ids = torch.cat(ids)
    out = target(ids, use_cache=True, output_hidden_states=True)
    for layer_id in range(target.config.num_hidden_layers):
        k, v = recompute_layer_kv(target, layer_id, out.hidden_states[layer_id])
        torch.testing.assert_close(k, forward_cache(out).layers[layer_id].keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, forward_cache(out).layers[layer_id].values, rtol=1e-5, atol=1e-6)


def test_stored_kv_of_a_micro_batch_reads_each_row_from_its_own_store(qwen3_target, tmp_path):
    rows = continuations(qwen3_target, prompts(4, seed=3), 12)
    examples = [Example(ids, m, int(m.nonzero()[0]), f"r{i}") for i, (ids, m) in enumerate(rows)]
    build_feature_store(qwen3_target, examples[:2], tmp_path / "a", [0, 1, 2, 3], progress=False)
    build_feature_store(qwen3_target, examples[2:], tmp_path / "b", [0, 1, 2, 3], progress=False)
    data = StoredRows(open_stores(f"{tmp_path / 'a'},{tmp_path / 'b'}"))
    items = [(0, data[0]), (2, data[2])]  # row 0 of store a, row 0 of store b
    width = rows[0][0].numel()
    stored = stored_target_kv(qwen3_target, items, width, [2, 3])
    out = qwen3_target(torch.stack([rows[0][0], rows[2][0]]), use_cache=True)
    for (k, v), layer_id in zip(stored, [2, 3]):  # equal to bf16 rounding of the stored layer inputs
        torch.testing.assert_close(k, forward_cache(out).layers[layer_id].keys, rtol=0.02, atol=0.05)
        torch.testing.assert_close(v, forward_cache(out).layers[layer_id].values, rtol=0.02, atol=0.05)


# ----------------------------------------------------------------- (5) remote code, (6) PEFT
@pytest.mark.parametrize("context", ["kv", "hybrid"])
def test_saved_kv_drafter_runs_through_trust_remote_code(qwen3_target, qwen3_drafter, train_prompts, tmp_path, context):
    live = _live(qwen3_drafter, context)
    qwen3_target.save_pretrained(tmp_path / "target")
    live.save_pretrained(tmp_path / "drafter")
    saved = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert saved["context"] == context and saved["kv_layer_ids"] == [2, 3]
    result = _run(tmp_path / "target", tmp_path / "drafter", [p[0].tolist() for p in train_prompts[:2]])
    assert result["modules"] == [] and result["class"].startswith("transformers_modules")
    for prompt, out, lengths in zip(train_prompts[:2], result["outputs"], result["acceptance"]):
        assert out == qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)[0].tolist()
        _drafts(qwen3_target, live, prompt)
        assert lengths == live.last_stats.acceptance_lengths


def test_peft_lora_on_a_hybrid_drafter(qwen3_target, qwen3_drafter, train_prompts):
    peft = pytest.importorskip("peft")
    live = _live(qwen3_drafter, "hybrid")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "fc"], lora_dropout=0.0)
    wrapped = peft.get_peft_model(copy.deepcopy(live), config).eval()
    assert any("self_attn.kv.o_proj.lora_A" in name for name, _ in wrapped.named_parameters())
    prompt = train_prompts[1]
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, qwen3_target.generate(prompt, assistant_model=wrapped, do_sample=False, max_new_tokens=24))
    _drafts(qwen3_target, live, prompt, 24)
    assert wrapped.get_base_model().last_stats.drafts == live.last_stats.drafts  # LoRA B = 0


# ------------------------------------------------------------------------- (7) train --context
@pytest.fixture(scope="module")
def rows(qwen3_target):
    return continuations(qwen3_target, prompts(6, seed=3), 32)


def _quick(**overrides):
    return TrainConfig(**{**dict(block_size=B, lr=3e-3, max_anchors=8, eval_size=0, progress=False,
                                 checkpoint_every=0, max_steps=6), **overrides})


def test_train_context_hybrid_online_and_from_a_store(qwen3_target, qwen3_drafter, rows, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    args = build_parser().parse_args(["train", "--target", "t", "--data", "d", "--out", "o", "--context", "hybrid",
                                      "--kv-layer-ids", "3,2", "--init", str(tmp_path / "dflash")])
    assert (args.context, args.kv_layer_ids) == ("hybrid", [3, 2])
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": m.long().tolist()} for i, (ids, m) in enumerate(rows)]
    examples = [Example(ids, m, int(m.nonzero()[0]), str(i)) for i, (ids, m) in enumerate(rows)]
    build_feature_store(qwen3_target, examples, tmp_path / "store", [1, 2, 3], progress=False)
    runs = {"online": dict(), "store": dict(features=str(tmp_path / "store"))}
    for name, extra in runs.items():
        cfg = _quick(init=str(tmp_path / "dflash"), context="hybrid", kv_layer_ids=[3, 2], **extra)
        drafter = train_drafter(qwen3_target, None, data, tmp_path / name, cfg)
        assert drafter.config.context == "hybrid" and drafter.config.kv_layer_ids == [3, 2]
        assert all(layer.self_attn.kv.o_proj.weight.any() for layer in drafter.layers)  # trained away from zero
        reloaded = DFlashDrafter.from_pretrained(tmp_path / name).eval()
        prompt = rows[0][0][~rows[0][1]][None]
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=20)
        assert torch.equal(ref, qwen3_target.generate(prompt, assistant_model=reloaded, do_sample=False,
                                                      max_new_tokens=20))
    with pytest.raises(ValueError, match=r"features --layers 0,1,2,3"):  # layer 1 reads stored layer 0's output
        train_drafter(qwen3_target, None, None, tmp_path / "bad",
                      _quick(features=str(tmp_path / "store"), num_layers=2, context="kv", kv_layer_ids=[1, 3]))


def test_fresh_kv_drafter_trains_online(qwen3_target, rows, tmp_path):
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": m.long().tolist()} for i, (ids, m) in enumerate(rows)]
    drafter = train_drafter(qwen3_target, None, data, tmp_path, _quick(num_layers=1, context="kv"))
    assert drafter.config.context == "kv" and drafter.config.kv_layer_ids == [3]
    prompt = rows[1][0][~rows[1][1]][None]
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=20)
    assert torch.equal(ref, qwen3_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=20))


# ------------------------------------------------------------------------------ (8) clear errors
def test_builtin_dflash_path_refuses_kv_drafters(qwen3_target, qwen3_drafter, train_prompts):
    live = _live(qwen3_drafter, "hybrid")
    with pytest.raises(ValueError, match="no target KV cache"):
        qwen3_target.generate(train_prompts[0], assistant_model=live, speculation_type="dflash", max_new_tokens=8)


def test_unreadable_cache_and_missing_target_kv_raise(qwen3_drafter):
    live = _live(qwen3_drafter, "kv")
    with pytest.raises(ValueError, match="cannot read"):
        read_target_kv(object(), [0], 3, "cpu", torch.float32)
    noise = torch.zeros(1, B, live.config.hidden_size)
    with pytest.raises(ValueError, match="speculation_type"):
        live(noise_embeds=noise, position_ids=torch.arange(B)[None])
    live.config.context = "hybrid"  # without set_context: no kv weights
    with pytest.raises(ValueError, match="set_context"):
        live(noise_embeds=noise, position_ids=torch.arange(B)[None], target_kv=[None, None])


def test_check_target_and_config_errors(qwen3_target, qwen3_drafter):
    with pytest.raises(ValueError, match="context must be"):
        copy.deepcopy(qwen3_drafter).config.context = "both"
    with pytest.raises(ValueError, match="kv_layer_ids must be"):
        copy.deepcopy(qwen3_drafter).config.kv_layer_ids = "2,3"
    with pytest.raises(ValueError, match="one target layer per drafter layer"):
        copy.deepcopy(qwen3_drafter).set_context("kv", [3])
    wide = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, context="kv", head_dim=32)
    with pytest.raises(ValueError, match="head_dim and num_key_value_heads"):
        wide.check_target(qwen3_target)
    spun = DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, context="hybrid", rope_theta=500.0)
    with pytest.raises(ValueError, match="rope_theta"):
        spun.check_target(qwen3_target)
    DFlashDrafter.from_target(qwen3_target, num_hidden_layers=1, rope_theta=500.0).check_target(qwen3_target)  # hidden
    sliding = copy.deepcopy(qwen3_target)
    sliding.config.layer_types = ["full_attention"] * 3 + ["sliding_attention"]
    with pytest.raises(ValueError, match="not full attention"):
        _live(qwen3_drafter, "kv").check_target(sliding)
