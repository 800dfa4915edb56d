"""Equivalence with z-lab's reference DFlash (`dflash==0.1.0`): same tokens, same per-round acceptance lengths.

A drafter built with the reference `DFlashDraftModel` (z-lab checkpoint format), saved, then loaded with
`DFlashDrafter.from_pretrained`, runs through `target.generate(assistant_model=...)` and through
`dflash.model.dflash_generate`.
"""

import json

import pytest
import torch

from dflash_retrace import DFlashDrafter

dflash_model = pytest.importorskip("dflash.model", reason="install z-lab's reference: pip install --no-deps dflash==0.1.0")


@pytest.fixture(autouse=True)
def cpu_clock(monkeypatch):
    """The reference times rounds with torch.cuda.synchronize(); on the CPU a plain clock does."""
    import time

    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)


@pytest.fixture(scope="module")
def zlab_dir(qwen3_target, qwen3_drafter, tmp_path_factory):
    """A z-lab-format checkpoint made by the reference class, holding the trained test drafter's weights."""
    from transformers import Qwen3Config

    ours = qwen3_drafter.config
    config = Qwen3Config(
        hidden_size=ours.hidden_size, intermediate_size=ours.intermediate_size, num_hidden_layers=ours.num_hidden_layers,
        num_attention_heads=ours.num_attention_heads, num_key_value_heads=ours.num_key_value_heads,
        head_dim=ours.head_dim, rms_norm_eps=ours.rms_norm_eps, vocab_size=ours.vocab_size,
        max_position_embeddings=ours.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ours.rope_theta},
    )
    config.architectures = ["DFlashDraftModel"]
    config.block_size = ours.block_size
    config.num_target_layers = ours.num_target_layers
    config.dflash_config = {"mask_token_id": ours.mask_token_id, "target_layer_ids": ours.target_layer_ids}
    reference = dflash_model.DFlashDraftModel(config)
    missing, unexpected = reference.load_state_dict(qwen3_drafter.state_dict(), strict=True)
    assert not missing and not unexpected  # identical checkpoint key names
    path = tmp_path_factory.mktemp("zlab")
    reference.save_pretrained(path)
    return path


def test_zlab_checkpoint_loads_unchanged(zlab_dir, qwen3_drafter):
    saved = json.loads((zlab_dir / "config.json").read_text())
    assert saved["model_type"] == "qwen3" and "mask_token_id" in saved["dflash_config"]
    loaded = DFlashDrafter.from_pretrained(zlab_dir)
    assert loaded.config.block_size == qwen3_drafter.config.block_size
    assert loaded.config.target_layer_ids == qwen3_drafter.config.target_layer_ids
    assert loaded.config.mask_token_id == qwen3_drafter.config.mask_token_id
    for key, value in qwen3_drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


@pytest.mark.parametrize("max_new_tokens", [2, 7, 8, 9, 23, 40])
def test_same_tokens_and_acceptance_as_reference_loop(zlab_dir, qwen3_target, train_prompts, max_new_tokens):
    ours = DFlashDrafter.from_pretrained(zlab_dir).eval()
    reference = dflash_model.DFlashDraftModel.from_pretrained(zlab_dir).eval()
    total_rounds, accepted = 0, []
    for prompt in train_prompts[:4] + [torch.tensor([[11, 12, 13, 14, 15]])]:
        out = qwen3_target.generate(prompt, assistant_model=ours, do_sample=False, max_new_tokens=max_new_tokens)
        ref = dflash_model.dflash_generate(reference, qwen3_target, prompt, max_new_tokens, stop_token_ids=None,
                                           temperature=0.0, return_stats=True)
        assert torch.equal(out, ref.output_ids), f"{out.tolist()} vs {ref.output_ids.tolist()}"
        # The reference also counts its last round when it proposed nothing; ours records rounds with proposals.
        ref_lengths = list(ref.acceptance_lengths)
        if ours.last_stats.num_rounds == len(ref_lengths) - 1 and ref_lengths[-1] == 1:
            ref_lengths = ref_lengths[:-1]
        assert ours.last_stats.acceptance_lengths == ref_lengths
        total_rounds += len(ref_lengths)
        accepted += ref_lengths
    if max_new_tokens >= 23:
        assert sum(accepted) / len(accepted) > 1.5  # the comparison covers multi-token rounds


def test_same_as_reference_with_eos(zlab_dir, qwen3_target, train_prompts):
    ours = DFlashDrafter.from_pretrained(zlab_dir).eval()
    reference = dflash_model.DFlashDraftModel.from_pretrained(zlab_dir).eval()
    prompt = train_prompts[0]
    plain = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)
    eos = int(plain[0, prompt.shape[1] + 11])
    out = qwen3_target.generate(prompt, assistant_model=ours, do_sample=False, max_new_tokens=30, eos_token_id=eos)
    ref = dflash_model.dflash_generate(reference, qwen3_target, prompt, 30, stop_token_ids=[eos], return_stats=True)
    assert torch.equal(out, ref.output_ids)
    assert ours.last_stats.acceptance_lengths == list(ref.acceptance_lengths)
