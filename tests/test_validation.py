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
