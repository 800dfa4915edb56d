"""Layer-wise fusion (`fusion="layerwise"`, DFlare reconstructed): zero-initialised it is the DFlash drafter
exactly; live, it drafts differently and generation stays exact; it saves, loads through remote code, takes
LoRA, trains (online and from a feature store) and refuses what it cannot run (tiny models, fp32)."""

import copy
import json

import pytest
import torch

from dflash_retrace import DFlashConfig, DFlashDrafter
from dflash_retrace.cli import main as cli_main
from dflash_retrace.configuration_dflash import default_fusion_layer_ids
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.data import Example
from dflash_retrace.training.features import build_feature_store, bytes_per_token
from test_remote_code import _run as run_remote
from tiny import continuations, prompts, tiny_target, tiny_tokenizer

NEW = 30


def _drafts(target, drafter, prompt_list, max_new_tokens=NEW):
    """(generated ids as lists, per-round drafts, acceptance lengths) of greedy speculative generation."""
    outs, drafts, lengths = [], [], []
    for p in prompt_list:
        out = target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        outs.append(out[0].tolist())
        stats = getattr(drafter, "get_base_model", lambda: drafter)().last_stats
        drafts.append(stats.drafts)
        lengths.append(stats.acceptance_lengths)
    return outs, drafts, lengths


def _loaded_with_fusion(drafter, folder, **kwargs):
    drafter.save_pretrained(folder)
    return DFlashDrafter.from_pretrained(folder, fusion="layerwise", **kwargs).eval()


def _randomised(drafter, seed=0, std=2.0):
    live = copy.deepcopy(drafter)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for proj in live.fusion.projections:
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=g) * std / proj.weight.shape[1] ** 0.5)
        live.fusion.mix_logits.add_(torch.randn(live.fusion.mix_logits.shape, generator=g))
    return live


@pytest.fixture(scope="module")
def zero_fusion(qwen3_drafter, tmp_path_factory):
    return _loaded_with_fusion(qwen3_drafter, tmp_path_factory.mktemp("dflash"))


# ------------------------------------------------------------------------------ config
def test_default_broad_set_and_feature_order():
    assert default_fusion_layer_ids(36) == [3, 7, 11, 15, 19, 23, 27, 31, 35]  # DFlare: 9 layers, stride 4
    assert default_fusion_layer_ids(30) == [1, 5, 9, 13, 17, 21, 25, 29]  # SmolLM2-135M
    assert default_fusion_layer_ids(4) == [0, 1, 2, 3]
    config = DFlashConfig(num_target_layers=30, num_hidden_layers=3, hidden_size=576, num_attention_heads=9,
                          target_layer_ids=[1, 14, 27], fusion="layerwise")
    assert config.fusion_layer_ids == [1, 5, 9, 13, 17, 21, 25, 29]
    assert config.feature_layer_ids == [1, 14, 27, 5, 9, 13, 17, 21, 25, 29]  # target layers first, no repeat
    assert bytes_per_token(len(config.feature_layer_ids), 576) == 10 * 576 * 2 + 9
    assert DFlashConfig(num_target_layers=30, target_layer_ids=[1, 14, 27]).feature_layer_ids == [1, 14, 27]


@pytest.mark.parametrize("field, value, message", [
    ("fusion", "dense", "fusion must be 'fc' or 'layerwise'"),
    ("fusion_layer_ids", [], "non-empty list of distinct"),
    ("fusion_layer_ids", [1, 1], "non-empty list of distinct"),
    ("fusion_layer_ids", [-1, 2], "non-empty list of distinct"),
    ("fusion_layer_ids", "1,2", "non-empty list of distinct"),
])
def test_config_refuses_bad_values_at_init_and_assignment(field, value, message):
    with pytest.raises(ValueError, match=message):
        DFlashConfig(num_target_layers=4, **{field: value})
    config = DFlashConfig(num_target_layers=4)
    with pytest.raises(ValueError, match=message):
        setattr(config, field, value)


def test_drafter_refuses_inconsistent_fusion_configs(qwen3_target):
    with pytest.raises(ValueError, match="read only with fusion='layerwise'"):
        DFlashDrafter.from_target(qwen3_target, fusion_layer_ids=[1, 3])
    with pytest.raises(ValueError, match="needs fusion_layer_ids, or num_target_layers"):
        DFlashDrafter(DFlashConfig(target_layer_ids=[1], hidden_size=64, num_attention_heads=4, fusion="layerwise"))
    drafter = DFlashDrafter.from_target(qwen3_target, fusion="layerwise", fusion_layer_ids=[1, 7])
    with pytest.raises(ValueError, match=r"fusion_layer_ids \[1, 7\] has ids \[7\] outside"):
        drafter.check_target(qwen3_target)
    with pytest.raises(ValueError, match="reads 192"):  # (1 + 2) layers x 64: a plain DFlash width is refused
        drafter(noise_embeds=torch.zeros(1, 4, 64), context_hidden_states=torch.zeros(1, 3, 5 * 64))


# --------------------------------------------------------------------------- zero-init
def test_zero_initialised_fusion_is_the_dflash_drafter(qwen3_target, qwen3_drafter, zero_fusion, train_prompts):
    fusion = zero_fusion.fusion
    assert not any(p.weight.any() for p in fusion.projections)
    D, T = fusion.mix_logits.shape
    assert (D, T) == (2, 4) and fusion.mix_logits.tolist() == [[2.0, 0, 0, 0], [0, 0, 2.0, 0]]
    # The drafter's own outputs, on the same (wider) features.
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, 7, len(zero_fusion.config.feature_layer_ids) * 64, generator=g)
    noise = torch.randn(1, 8, 64, generator=g)
    width = qwen3_drafter.fc.in_features
    with torch.no_grad():
        a = qwen3_drafter(noise_embeds=noise, context_hidden_states=feats[..., :width]).last_hidden_state
        b = zero_fusion(noise_embeds=noise, context_hidden_states=feats).last_hidden_state
    assert torch.equal(a, b)
    ref = _drafts(qwen3_target, qwen3_drafter, train_prompts[:4])
    assert _drafts(qwen3_target, zero_fusion, train_prompts[:4]) == ref  # outputs, drafts, acceptance lengths


# -------------------------------------------------------------------------------- live
@pytest.fixture(scope="module")
def live_qwen3(zero_fusion):
    return _randomised(zero_fusion)


@pytest.fixture(scope="module")
def live_llama(llama_drafter, tmp_path_factory):
    return _randomised(_loaded_with_fusion(llama_drafter, tmp_path_factory.mktemp("llama")), seed=1)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("max_new_tokens", [1, 5, 17, 40])
def test_live_fusion_greedy_equals_target(request, family, max_new_tokens):
    target = request.getfixturevalue(f"{family}_target")
    live = request.getfixturevalue(f"live_{family}")
    for p in prompts(3, length=5 + max_new_tokens % 4, seed=11):
        ref = target.generate(p, do_sample=False, max_new_tokens=max_new_tokens)
        out = target.generate(p, assistant_model=live, do_sample=False, max_new_tokens=max_new_tokens)
        assert torch.equal(ref, out)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_live_fusion_drafts_differently(request, family, train_prompts):
    target = request.getfixturevalue(f"{family}_target")
    base = request.getfixturevalue(f"{family}_drafter")
    live = request.getfixturevalue(f"live_{family}")
    assert _drafts(target, live, train_prompts[:3])[1] != _drafts(target, base, train_prompts[:3])[1]


def test_only_the_feature_layers_are_requested(qwen3_target, live_qwen3, train_prompts):
    from dflash_retrace.generation_dflash import _HIDDEN_STATE_INDEX_LISTS, DFlashCandidateGenerator

    generator = DFlashCandidateGenerator(live_qwen3, qwen3_target, qwen3_target.generation_config)
    wanted = generator.model_kwargs_overrides["output_hidden_states"]
    assert wanted == ([1, 2, 3, 4] if _HIDDEN_STATE_INDEX_LISTS else True)  # layers 1 (fc) and 0..3 (fusion)


# ----------------------------------------------------------------- save, remote code, LoRA
def test_save_reload_in_a_fresh_process(qwen3_target, live_qwen3, train_prompts, tmp_path):
    qwen3_target.save_pretrained(tmp_path / "target")
    live_qwen3.save_pretrained(tmp_path / "drafter")
    saved = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert saved["fusion"] == "layerwise" and saved["fusion_layer_ids"] == [0, 1, 2, 3]
    reloaded = DFlashDrafter.from_pretrained(tmp_path / "drafter").eval()
    prompt_list = [p[0].tolist() for p in train_prompts[:3]]
    result = run_remote(tmp_path / "target", tmp_path / "drafter", prompt_list)
    assert result["modules"] == [] and result["class"].startswith("transformers_modules")
    for prompt, out, lengths in zip(train_prompts[:3], result["outputs"], result["acceptance"]):
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)
        assert out == ref[0].tolist()
        outs, drafts, mine = _drafts(qwen3_target, live_qwen3, [prompt])
        assert lengths == mine[0]
        assert _drafts(qwen3_target, reloaded, [prompt])[1] == drafts


def test_lora_on_a_fusion_drafter(qwen3_target, live_qwen3, train_prompts):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc"], lora_dropout=0.0,
                             modules_to_save=["fusion"])
    wrapped = peft.get_peft_model(copy.deepcopy(live_qwen3), config).eval()
    outs, drafts, _ = _drafts(qwen3_target, wrapped, train_prompts[:2])
    for p, out in zip(train_prompts[:2], outs):
        assert out == qwen3_target.generate(p, do_sample=False, max_new_tokens=NEW)[0].tolist()
    assert drafts == _drafts(qwen3_target, live_qwen3, train_prompts[:2])[1]  # LoRA B = 0: the base's drafts
    with torch.no_grad():  # a live adapter changes the drafts, and generation stays exact
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    outs, live_drafts, _ = _drafts(qwen3_target, wrapped, train_prompts[:2])
    assert live_drafts != drafts
    for p, out in zip(train_prompts[:2], outs):
        assert out == qwen3_target.generate(p, do_sample=False, max_new_tokens=NEW)[0].tolist()


# ------------------------------------------------------------------------- built-in path
def test_builtin_dflash_path_refuses_a_layerwise_drafter(qwen3_target, live_qwen3, train_prompts):
    with pytest.raises(ValueError, match=r"speculation_type='dflash'\) does not pass: use `generate\(assistant_model="
                                         r"drafter\)` without speculation_type"):
        qwen3_target.generate(train_prompts[0], assistant_model=live_qwen3, do_sample=False, max_new_tokens=8,
                              speculation_type="dflash")


# ------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def rows(qwen3_target):
    return continuations(qwen3_target, prompts(6, seed=3), 40)


def _quick(**overrides):
    base = dict(block_size=8, num_layers=2, lr=5e-3, max_anchors=16, eval_size=0, progress=False,
                checkpoint_every=0, max_steps=40, fusion="layerwise", target_layer_ids=[1, 3])
    base.update(overrides)
    return TrainConfig(**base)


def _exact(target, drafter, rows_, n=3):
    for ids, mask in rows_[:n]:
        prompt = ids[~mask][None]
        ref = target.generate(prompt, do_sample=False, max_new_tokens=NEW)
        assert torch.equal(target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=NEW), ref)


def test_train_layerwise_online_and_from_a_store(qwen3_target, rows, tmp_path):
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(rows)]
    online = train_drafter(qwen3_target, None, data, tmp_path / "online", _quick(fusion_layer_ids=[0, 2]))
    assert online.config.fusion_layer_ids == [0, 2] and online.config.feature_layer_ids == [1, 3, 0, 2]
    assert any(p.weight.any() for p in online.fusion.projections)  # the fusion weights were trained
    loaded = DFlashDrafter.from_pretrained(tmp_path / "online").eval()
    _exact(qwen3_target, loaded, rows)

    examples = [Example(ids, mask, int(mask.nonzero()[0]), f"r{i}") for i, (ids, mask) in enumerate(rows)]
    build_feature_store(qwen3_target, examples, tmp_path / "store", [0, 1, 3], progress=False)
    with pytest.raises(ValueError, match=r"missing \[2\].*dflash-retrace features --layers 1,3,0,2"):
        train_drafter(qwen3_target, None, None, tmp_path / "bad", _quick(features=str(tmp_path / "store"),
                                                                         fusion_layer_ids=[0, 2]))
    stored = train_drafter(qwen3_target, None, None, tmp_path / "stored", _quick(features=str(tmp_path / "store"),
                                                                                 fusion_layer_ids=[0]))
    assert stored.config.feature_layer_ids == [1, 3, 0]
    _exact(qwen3_target, DFlashDrafter.from_pretrained(tmp_path / "stored").eval(), rows)


def test_cli_adds_fusion_to_a_dflash_drafter(qwen3_target, qwen3_drafter, rows, tmp_path):
    qwen3_target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()})
                            + "\n" for i, (ids, mask) in enumerate(rows)))
    common = ["train", "--target", str(tmp_path / "target"), "--data", str(data), "--dtype", "float32",
              "--init", str(tmp_path / "dflash"), "--eval-size", "0", "--no-progress", "--checkpoint-every", "0",
              "--max-anchors", "16"]
    # Zero updates: the saved drafter is the DFlash drafter plus zero-initialised fusion weights.
    assert cli_main(common + ["--out", str(tmp_path / "step0"), "--fusion", "layerwise", "--max-steps", "0"]) == 0
    step0 = DFlashDrafter.from_pretrained(tmp_path / "step0").eval()
    assert step0.config.fusion_layer_ids == [0, 1, 2, 3] and not step0.fusion.projections[0].weight.any()
    assert _drafts(qwen3_target, step0, [r[0][~r[1]][None] for r in rows[:2]]) == \
        _drafts(qwen3_target, qwen3_drafter, [r[0][~r[1]][None] for r in rows[:2]])
    assert cli_main(common + ["--out", str(tmp_path / "trained"), "--fusion", "layerwise",
                              "--fusion-layer-ids", "2,3", "--max-steps", "20", "--lr", "1e-3"]) == 0
    trained = DFlashDrafter.from_pretrained(tmp_path / "trained").eval()
    assert trained.config.fusion_layer_ids == [2, 3] and trained.fusion.projections[0].weight.any()
    _exact(qwen3_target, trained, rows)


def test_training_refuses_what_it_cannot_do(qwen3_target, rows, tmp_path):
    data = [{"id": "0", "input_ids": rows[0][0].tolist(), "loss_mask": rows[0][1].long().tolist()}]
    with pytest.raises(ValueError, match=r"add fusion=.layerwise. \(--fusion layerwise\)"):
        train_drafter(qwen3_target, None, data, tmp_path / "a", _quick(fusion=None, fusion_layer_ids=[0]))
    with pytest.raises(ValueError, match="fusion must be one of"):
        TrainConfig(fusion="dense").resolved()


def test_each_target_layer_is_rms_normalised_before_mixing(live_qwen3):
    """Target layers' scales differ by orders of magnitude: the fusion term ignores each layer's scale."""
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(1, 5, len(live_qwen3.config.feature_layer_ids), 64, generator=g)
    context = torch.randn(1, 5, 64, generator=g)
    scaled = feats * torch.tensor([1.0, 300.0, 0.1, 7.0, 1e3])[:, None]  # one scale per stored layer
    with torch.no_grad():
        a = live_qwen3.fusion(feats.flatten(2), context)
        b = live_qwen3.fusion(scaled.flatten(2), context)
    assert all(torch.allclose(x, y, rtol=1e-3, atol=1e-3) for x, y in zip(a, b))
    assert not torch.allclose(a[0], a[1])  # each drafter layer gets its own context


def test_lora_training_adds_fusion_and_saves_its_base(qwen3_target, qwen3_drafter, rows, tmp_path):
    from peft import PeftModel

    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    data = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(rows)]
    peft_model = train_drafter(qwen3_target, None, data, tmp_path / "lora", _quick(
        init=str(tmp_path / "dflash"), target_layer_ids=None, lora=True, lora_r=4, max_steps=6, lr=1e-2))
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["fusion"]  # the new fusion weights train in full
    assert config["base_model_name_or_path"] == str((tmp_path / "lora" / "base").resolve())
    base = DFlashDrafter.from_pretrained(tmp_path / "lora" / "base")
    assert base.fusion is not None and not base.fusion.projections[0].weight.any()  # the zero-initialised start
    prompt_list = [ids[~mask][None] for ids, mask in rows[:2]]
    _, drafts, _ = _drafts(qwen3_target, peft_model, prompt_list)
    loaded = PeftModel.from_pretrained(base, tmp_path / "lora")
    assert _drafts(qwen3_target, loaded, prompt_list)[1] == drafts
    merged = loaded.merge_and_unload()
    assert merged.fusion.projections[0].weight.any()
    _exact(qwen3_target, merged, rows)
