"""Options and checkpoints that cannot work fail loudly, wherever they are set (construction, loading, afterwards)."""

import pytest
import torch

from dflash_retrace import DFlashConfig, DFlashDrafter
from tiny import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=5)


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=4, num_target_features=3)
    out = tmp_path_factory.mktemp("drafter")
    drafter.save_pretrained(out)
    return out


# ------------------------------------------------------------------------------ enumerated options
@pytest.mark.parametrize("field, bad", [("proposal_policy", "Sample"), ("proposal_policy", None),
                                        ("block_size", 1), ("hidden_act", "swish-ish")])
def test_bad_option_is_refused_everywhere(saved, field, bad):
    with pytest.raises(ValueError, match=field):
        DFlashConfig(target_layer_ids=[1], mask_token_id=0, **{field: bad})
    with pytest.raises(ValueError, match=field):
        DFlashDrafter.from_pretrained(saved, **{field: bad})
    drafter = DFlashDrafter.from_pretrained(saved)
    with pytest.raises(ValueError, match=field):
        setattr(drafter.config, field, bad)


def test_proposal_policy_error_names_the_choices(saved):
    drafter = DFlashDrafter.from_pretrained(saved)
    with pytest.raises(ValueError, match="'argmax' or 'sample', got 'Sample'"):
        drafter.config.proposal_policy = "Sample"
    assert drafter.config.proposal_policy == "argmax"  # unchanged by the refused assignment
    drafter.config.proposal_policy = "sample"  # the documented values still work
    assert DFlashDrafter.from_pretrained(saved, proposal_policy="sample").config.proposal_policy == "sample"


# ------------------------------------------------------------------- checkpoints that do not fill the model
def _edited(saved, tmp_path, edit):
    import json
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _drop_target_layer_ids(config):
    config.pop("target_layer_ids")
    config.pop("dflash_config")


def _set_target_layer_ids(config, ids):
    config["target_layer_ids"] = config["dflash_config"]["target_layer_ids"] = ids


@pytest.mark.parametrize("edit, expected", [
    (lambda c: c.pop("num_hidden_layers"), r"num_hidden_layers=1.*checkpoint has 2 decoder layers.*layers\.1\."),
    (lambda c: c.__setitem__("num_hidden_layers", 3),
     r"num_hidden_layers=3.*checkpoint has 2 decoder layers.*layers\.2\."),
    (lambda c: _set_target_layer_ids(c, [1, 2]), r"fc\.weight.*3 target features.*target_layer_ids=\[1, 2\]"),
    (_drop_target_layer_ids, r"fc\.weight.*3 target features.*target_layer_ids=\[1, 1\] \(2 features.*derived"),
    (lambda c: c.__setitem__("hidden_size", 32), r"hidden_size"),
], ids=["no num_hidden_layers", "too many layers", "short target_layer_ids", "no target_layer_ids", "hidden_size"])
def test_checkpoint_that_does_not_fill_the_model_is_an_error(saved, tmp_path, edit, expected):
    folder = _edited(saved, tmp_path, edit)
    with pytest.raises(ValueError, match=expected):
        DFlashDrafter.from_pretrained(folder)


def test_retrace_weights_added_or_required(saved, tmp_path):
    """retrace=True on a DFlash checkpoint adds zero-initialised ReTrace weights; ReTrace weights need retrace=True."""
    drafter, info = DFlashDrafter.from_pretrained(saved, retrace=True, output_loading_info=True)
    assert drafter.retrace is not None and not drafter.retrace.value.weight.any()
    assert info["missing_keys"] and all(k.startswith("retrace.") for k in info["missing_keys"])
    drafter.save_pretrained(tmp_path / "rt")
    with pytest.raises(ValueError, match=r"retrace\..*retrace=True"):
        DFlashDrafter.from_pretrained(tmp_path / "rt", retrace=False)
    assert DFlashDrafter.from_pretrained(tmp_path / "rt").retrace is not None


def test_exact_checkpoint_loads_the_same_weights(saved):
    from safetensors.torch import load_file

    drafter = DFlashDrafter.from_pretrained(saved)
    state = load_file(saved / "model.safetensors")
    assert set(state) == set(drafter.state_dict())
    assert all(torch.equal(state[k], v) for k, v in drafter.state_dict().items())


def test_partial_retrace_weights_are_an_error(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    drafter = DFlashDrafter.from_pretrained(saved, retrace=True)
    drafter.save_pretrained(tmp_path / "rt")
    state = load_file(tmp_path / "rt" / "model.safetensors")
    state.pop("retrace.gate.weight")
    save_file(state, tmp_path / "rt" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"retrace\.gate\.weight"):
        DFlashDrafter.from_pretrained(tmp_path / "rt")


def test_default_target_layer_ids_out_of_range_is_an_error():
    """DFlash's rule needs enough target layers: for 2 layers and 2 features it gives [1, -1]."""
    shallow = tiny_target("qwen3", seed=5, layers=2)
    with pytest.raises(ValueError, match=r"target_layer_ids \[1, -1\].*2-layer target.*pass target_layer_ids"):
        DFlashDrafter.from_target(shallow, num_hidden_layers=2)
    explicit = DFlashDrafter.from_target(shallow, num_hidden_layers=2, target_layer_ids=[0, 1])
    assert explicit.config.target_layer_ids == [0, 1]
