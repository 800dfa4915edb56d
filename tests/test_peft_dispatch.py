"""A PeftModel wrapping a drafter works directly as `assistant_model`."""

import pytest
import torch

peft = pytest.importorskip("peft")


def test_peft_wrapped_drafter_dispatches(qwen3_target, qwen3_drafter, train_prompts):
    import copy

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc"], lora_dropout=0.0)
    wrapped = peft.get_peft_model(copy.deepcopy(qwen3_drafter), config).eval()
    prompt = train_prompts[0]
    ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=24)
    out = qwen3_target.generate(prompt, assistant_model=wrapped, do_sample=False, max_new_tokens=24)
    assert torch.equal(ref, out)
    stats = wrapped.get_base_model().last_stats
    assert stats is not None and stats.num_rounds > 0
    # LoRA B is zero-initialised: the adapter model drafts exactly like its base drafter.
    qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=24)
    assert stats.drafts == qwen3_drafter.last_stats.drafts
