"""Clear errors (with the fix in the message) and the generate() dispatch."""

import warnings

import pytest
import torch

import dflash_retrace
from dflash_retrace import DFlashConfig, DFlashDrafter, dispatch_enabled, no_dispatch
from dflash_retrace.generation_dflash import check_transformers_version
from tiny import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def drafter(target):
    return DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()


PROMPT = torch.tensor([[5, 6, 7, 8]])


def test_batch_size_above_one(target, drafter):
    with pytest.raises(ValueError, match="one sequence at a time.*Call generate\\(\\) once per prompt"):
        target.generate(PROMPT.repeat(2, 1), assistant_model=drafter, max_new_tokens=4)


def test_beam_search(target, drafter):
    with pytest.raises(ValueError, match="Beam search.*Use num_beams=1"):
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=4, num_beams=2)


def test_num_return_sequences(target, drafter):
    with pytest.raises(ValueError, match="num_return_sequences=2.*Use num_return_sequences=1"):
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=4, do_sample=True, num_return_sequences=2)


def _drafter_with(target, **overrides):
    fields = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).config.to_dict()
    fields.update(overrides)
    for key in ("model_type", "transformers_version", "architectures", "auto_map", "dflash_config"):
        fields.pop(key, None)
    return DFlashDrafter(DFlashConfig(**fields)).eval()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=32, intermediate_size=64, head_dim=8), "hidden_size=32 does not match.*hidden_size=64"),
        (dict(vocab_size=100), "vocab_size=100 does not match.*same tokenizer"),
        (dict(num_target_layers=6), "num_target_layers=6, but Qwen3ForCausalLM has 4 decoder layers"),
        (dict(target_layer_ids=[1, 4]), "ids \\[4\\] outside the target's decoder layers 0..3"),
        (dict(mask_token_id=96), "mask_token_id=96 is not a row of the target's input embedding"),
        (dict(mask_token_id=None), "mask_token_id=None is not a row"),
    ],
)
def test_mismatch_errors(target, overrides, message):
    bad = _drafter_with(target, **overrides)
    with pytest.raises(ValueError, match=message):
        bad.check_target(target)
    with pytest.raises(ValueError, match=message):
        target.generate(PROMPT, assistant_model=bad, max_new_tokens=4)


def test_config_errors():
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        DFlashConfig(block_size=1)
    with pytest.raises(ValueError, match="proposal_policy must be 'argmax' or 'sample'"):
        DFlashConfig(proposal_policy="beam")
    with pytest.raises(ValueError, match="default RoPE only.*rope_type='yarn'"):
        DFlashConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="full \\(bidirectional\\) attention"):
        DFlashConfig(layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="needs `target_layer_ids`"):
        DFlashDrafter(DFlashConfig(hidden_size=32, num_attention_heads=4))


def test_transformers_version_check():
    with pytest.raises(ImportError, match="needs transformers >= 5.15.0.*pip install"):
        check_transformers_version("5.10.2")
    with pytest.warns(UserWarning, match="tested with transformers < 5.25.0"):
        check_transformers_version("5.30.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_transformers_version("5.15.0")
        check_transformers_version("5.24.1")


def test_reused_target_cache_is_refused(target, drafter):
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(PROMPT[:, :-1], past_key_values=cache, use_cache=True)
    with pytest.raises(RuntimeError, match="pre-filled target cache"):
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=6, past_key_values=cache)


def test_dispatch_idempotent_and_opt_out(target, drafter, tmp_path):
    from transformers import AutoModel
    from transformers.generation.utils import GenerationMixin

    installed = GenerationMixin._get_candidate_generator
    dflash_retrace.install_dispatch()
    # A second copy of the payload, imported the way trust_remote_code does, installs nothing more ...
    drafter.save_pretrained(tmp_path / "d")
    remote = AutoModel.from_pretrained(tmp_path / "d", trust_remote_code=True).eval()
    assert type(remote).__module__.startswith("transformers_modules")
    assert GenerationMixin._get_candidate_generator is installed
    assert dispatch_enabled()
    # ... and each drafter runs the generator its own code shipped.
    ref = target.generate(PROMPT, max_new_tokens=6, do_sample=False)
    assert torch.equal(target.generate(PROMPT, assistant_model=remote, max_new_tokens=6, do_sample=False), ref)
    assert type(remote.last_stats).__module__.startswith("transformers_modules")
    assert torch.equal(target.generate(PROMPT, assistant_model=drafter, max_new_tokens=6, do_sample=False), ref)
    assert type(drafter.last_stats) is dflash_retrace.DFlashStats

    drafter.last_stats = None
    with no_dispatch():
        assert not dispatch_enabled()
        # Opted out, the drafter is just another assistant to transformers: its AssistedCandidateGenerator reads
        # the assistant's generation_config, which a DFlash drafter (no GenerationMixin) does not have.
        with pytest.raises(AttributeError, match="generation_config"):
            target.generate(PROMPT, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    assert drafter.last_stats is None and dispatch_enabled()


def test_other_assistants_take_the_normal_path(target):
    assistant = tiny_target("qwen3", seed=3, layers=2)
    ref = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    out = target.generate(PROMPT, assistant_model=assistant, max_new_tokens=8, do_sample=False)
    assert torch.equal(ref, out)


def test_uninstall_and_reinstall(target, drafter):
    from transformers.generation.utils import GenerationMixin

    dflash_retrace.uninstall_dispatch()
    try:
        assert not hasattr(GenerationMixin._get_candidate_generator, "_dflash_retrace_dispatch")
        assert not dispatch_enabled()
    finally:
        dflash_retrace.install_dispatch()
    assert dispatch_enabled()
    ref = target.generate(PROMPT, max_new_tokens=6, do_sample=False)
    assert torch.equal(target.generate(PROMPT, assistant_model=drafter, max_new_tokens=6, do_sample=False), ref)


def test_builtin_dflash_path_runs_plain_dflash(target):
    """Stock transformers' speculation_type='dflash' drives our drafter through its own contract."""
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()
    ref = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    out = target.generate(PROMPT, assistant_model=drafter, max_new_tokens=10, do_sample=False,
                          speculation_type="dflash")
    assert torch.equal(ref, out)
    rt = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4, retrace=True).eval()
    with pytest.warns(UserWarning, match="runs as plain DFlash"):
        out = target.generate(PROMPT, assistant_model=rt, max_new_tokens=10, do_sample=False,
                              speculation_type="dflash")
    assert torch.equal(ref, out)



def test_builtin_dflash_path_warns_that_it_ignores_the_draft_vocabulary(target):
    """transformers' built-in generator scores with the target's full head: a draft-vocabulary drafter then drafts
    differently from how it was trained, which the user must be told (output stays lossless)."""
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()
    drafter.set_draft_vocabulary(list(range(0, target.config.vocab_size, 2)))
    ref = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    with pytest.warns(UserWarning, match=r"draft vocabulary \(\d+ tokens.*is not used"):
        out = target.generate(PROMPT, assistant_model=drafter, max_new_tokens=10, do_sample=False,
                              speculation_type="dflash")
    assert torch.equal(ref, out)
    with warnings.catch_warnings():  # our own generator uses the draft vocabulary: no warning there
        warnings.simplefilter("error")
        out = target.generate(PROMPT, assistant_model=drafter, max_new_tokens=10, do_sample=False)
    assert torch.equal(ref, out)



def test_builtin_dflash_path_warns_that_it_ignores_shorter_rounds(target):
    import copy

    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()
    for name, value in (("max_proposals", 2), ("proposal_threshold", 0.5)):
        changed = copy.deepcopy(drafter)
        setattr(changed.config, name, value)
        with pytest.warns(UserWarning, match=rf"{name}.*not applied"):
            target.generate(PROMPT, assistant_model=changed, max_new_tokens=6, do_sample=False,
                            speculation_type="dflash")
    with pytest.warns(UserWarning, match=r"proposal_policy.*argmax.*not applied"):  # it samples its proposals
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=6, do_sample=True, speculation_type="dflash")
    sampled, full = copy.deepcopy(drafter), copy.deepcopy(drafter)
    sampled.config.proposal_policy = "sample"
    full.config.max_proposals = full.config.block_size - 1  # the same as None
    with warnings.catch_warnings():  # what the built-in path does anyway: nothing to say
        warnings.simplefilter("error")
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=6, do_sample=False, speculation_type="dflash")
        target.generate(PROMPT, assistant_model=sampled, max_new_tokens=6, do_sample=True, speculation_type="dflash")
        target.generate(PROMPT, assistant_model=full, max_new_tokens=6, do_sample=False, speculation_type="dflash")


def test_inputs_embeds_is_refused_with_the_fix(target, drafter):
    embeds = target.get_input_embeddings()(PROMPT)
    target.generate(inputs_embeds=embeds, max_new_tokens=4, do_sample=False)  # plain generate() takes them
    with pytest.raises(ValueError, match="inputs_embeds.*Pass input_ids instead"):
        target.generate(inputs_embeds=embeds, assistant_model=drafter, max_new_tokens=4, do_sample=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_lookup_num_tokens=3), "prompt lookup decoding"),
        (dict(assistant_ensemble_weight=0.5), "ensemble verification"),
        (dict(dola_layers="high"), "DoLa decoding.*drop `dola_layers`"),
    ],
)
def test_other_speculation_methods_are_refused(target, drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        target.generate(PROMPT, assistant_model=drafter, max_new_tokens=4, **kwargs)


def test_config_top_level_edits_survive_save(tmp_path):
    config = DFlashConfig(hidden_size=64, num_attention_heads=4, mask_token_id=151669, target_layer_ids=[1, 2])
    config.mask_token_id = 7  # as the mask-token error message suggests
    config.save_pretrained(tmp_path)
    reloaded = DFlashConfig.from_pretrained(tmp_path)
    assert reloaded.mask_token_id == 7 and reloaded.to_dict()["dflash_config"]["mask_token_id"] == 7
    zlab = DFlashConfig(dflash_config={"mask_token_id": 5, "target_layer_ids": [3]}, block_size=8)
    assert (zlab.mask_token_id, zlab.target_layer_ids, zlab.block_size) == (5, [3], 8)


def test_dispatch_names_still_import_from_generation_dflash_with_a_warning():
    """The dispatch moved to `dispatch_dflash`; the old `generation_dflash` names resolve to it, with a FutureWarning."""
    from dflash_retrace import dispatch_dflash, generation_dflash

    for name in ("install_dispatch", "uninstall_dispatch", "no_dispatch", "dispatch_enabled"):
        with pytest.warns(FutureWarning, match=f"dispatch_dflash.{name}"):
            assert getattr(generation_dflash, name) is getattr(dispatch_dflash, name)
    with pytest.raises(AttributeError):
        generation_dflash.not_a_name  # noqa: B018


def test_sampled_proposals_fall_back_to_argmax_only_for_criteria_that_read_them(target, drafter):
    """Stop strings read the proposals (a cut there would bias sampled proposals): the call drafts by argmax and
    says so. max_time does not read them: sampled proposals stay."""
    import copy

    from tiny import tiny_tokenizer

    sampled = copy.deepcopy(drafter)
    sampled.config.proposal_policy = "sample"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.generate(PROMPT, assistant_model=sampled, max_new_tokens=6, do_sample=True, max_time=60.0)
    with pytest.warns(UserWarning, match="drafts with proposal_policy='argmax' instead"):
        target.generate(PROMPT, assistant_model=sampled, max_new_tokens=6, do_sample=True, stop_strings=["ef"],
                        tokenizer=tiny_tokenizer())
