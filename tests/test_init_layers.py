"""`--init-layers target-top`: a fresh drafter's layers are copies of the target's last layers; exactness kept."""

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.init_layers import copy_target_layers
from tiny import continuations, greedy_tau, prompts, tiny_target


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_copy_takes_the_targets_last_layers_tensor_for_tensor(family):
    target = tiny_target(family, seed=1, layers=5)
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=4)
    fc_before = drafter.fc.weight.clone()
    done = copy_target_layers(drafter, target)
    assert done["target_layers"] == [3, 4]
    for mine, src in zip(drafter.layers, [3, 4]):
        theirs = target.model.layers[src].state_dict()
        for name, tensor in mine.state_dict().items():
            if name in theirs:
                assert torch.equal(tensor, theirs[name]), name
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert torch.equal(drafter.fc.weight, fc_before)  # no counterpart: stays as initialised
    # Llama has no q/k norms: the drafter keeps its own (ones, the identity scale); Qwen3's are copied.
    kept_norms = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"} & set(done["kept"])
    assert kept_norms == (set() if family == "qwen3" else {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
    assert done["copied"] == 2 * (9 + (2 if family == "qwen3" else 0)) + 1


def test_copied_drafter_keeps_greedy_output_exact():
    target = tiny_target("llama", seed=2)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=4)
    copy_target_layers(drafter, target)
    rows = continuations(target, prompts(3, seed=5), 20)
    assert 1.0 <= greedy_tau(target, drafter.eval(), rows, 20) <= 4


def test_train_starts_from_the_copied_layers(tmp_path):
    target = tiny_target("qwen3", seed=0)
    rows = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(continuations(target, prompts(4, seed=3), 24))]
    cfg = dict(block_size=4, num_layers=2, lr=1e-7, max_anchors=8, eval_size=0, progress=False, checkpoint_every=0,
               max_steps=1)
    copied = train_drafter(target, None, rows, tmp_path / "a", TrainConfig(init_layers="target-top", **cfg))
    fresh = train_drafter(target, None, rows, tmp_path / "b", TrainConfig(**cfg))
    top = target.model.layers[-1].self_attn.q_proj.weight
    assert torch.allclose(copied.layers[-1].self_attn.q_proj.weight.float(), top, atol=1e-4)
    assert not torch.allclose(fresh.layers[-1].self_attn.q_proj.weight.float(), top, atol=1e-2)


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="fresh drafter"):
        TrainConfig(init="some/drafter", init_layers="target-top").resolved()
    with pytest.raises(ValueError, match="must be one of"):
        TrainConfig(init_layers="bottom").resolved()
    target = tiny_target("qwen3", seed=0)
    narrow = DFlashDrafter.from_target(target, num_hidden_layers=1, intermediate_size=64)
    with pytest.raises(ValueError, match="width and head layout"):
        copy_target_layers(narrow, target)
    deep = DFlashDrafter.from_target(target, num_hidden_layers=6)
    with pytest.raises(ValueError, match="only 4"):
        copy_target_layers(deep, target)
