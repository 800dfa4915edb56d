"""The other ways a drafter meets generate(): transformers' built-in DFlash path, the opt-out, calls with no rounds."""

import pytest
import torch

import dflash_retrace
from dflash_retrace import DFlashDrafter
from tiny import prompts, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=7)


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    return DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()


def _plain(target, prompt, **kwargs):
    return target.generate(prompt, do_sample=False, max_new_tokens=12, **kwargs)


# ------------------------------------------------------------------ transformers' built-in DFlash path
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_builtin_path_with_a_drafter_in_another_dtype(target, drafter, dtype):
    """A drafter loaded at its saved dtype (bf16) beside an fp32 target: the built-in contract runs and is lossless."""
    prompt = prompts(1, seed=3)[0]
    other = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).to(dtype).eval()
    out = target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=other,
                          speculation_type="dflash")
    assert out[0].tolist() == _plain(target, prompt)[0].tolist()


def test_builtin_path_clears_last_stats(target, drafter):
    prompt = prompts(1, seed=4)[0]
    target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    assert drafter.last_stats is not None and drafter.last_stats.num_rounds > 0
    target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter, speculation_type="dflash")
    assert drafter.last_stats is None, "the built-in path left the previous call's statistics"


# ---------------------------------------------------------------------------------------- opt-out
def test_opt_out_says_what_to_do(target, drafter):
    prompt = prompts(1, seed=5)[0]
    expected = r"dispatch.*install_dispatch\(\).*speculation_type=.dflash."
    with dflash_retrace.no_dispatch():
        with pytest.raises(AttributeError, match=expected):
            target.generate(prompt, do_sample=False, max_new_tokens=5, assistant_model=drafter)
        # the documented way to run the drafter without the dispatch still works
        out = target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                              speculation_type="dflash")
        assert out[0].tolist() == _plain(target, prompt)[0].tolist()
    dflash_retrace.uninstall_dispatch()
    try:
        with pytest.raises(AttributeError, match=expected):
            target.generate(prompt, do_sample=False, max_new_tokens=5, assistant_model=drafter)
    finally:
        dflash_retrace.install_dispatch()
    assert not hasattr(drafter, "generation_config")  # still an ordinary missing attribute for hasattr()


# ------------------------------------------------------------------------------------- no rounds
@pytest.mark.parametrize("max_new_tokens", [1, 2])
def test_no_rounds_reports_none(target, drafter, max_new_tokens):
    """The first new token comes from the prefill and a budget of 1 leaves no room to propose: no rounds, τ None."""
    prompt = prompts(1, seed=6)[0]
    out = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens, assistant_model=drafter)
    assert out.shape[1] == prompt.shape[1] + max_new_tokens
    stats = drafter.last_stats
    assert stats.num_rounds == 0 and stats.mean_acceptance_length is None
    assert "no rounds" in repr(stats)
