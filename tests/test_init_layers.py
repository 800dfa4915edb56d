"""`--init-layers target-top`: a fresh drafter's layers are copies of the target's last layers; `--add-layers`: an --init
drafter grows by layers that start as the identity; exactness kept either way."""

import copy

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.init_layers import add_top_layers, copy_target_layers
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


def _proposal_states(drafter, seed=0):
    """Last hidden states of a block query on random context features (fp32), the drafter's function."""
    g = torch.Generator().manual_seed(seed)
    cfg = drafter.config
    T, q = 12, 2 * cfg.block_size
    feats = torch.randn(1, T, cfg.hidden_size * len(cfg.target_layer_ids), generator=g)
    noise = torch.randn(1, q, cfg.hidden_size, generator=g)
    pos = torch.arange(T + q)[None]
    with torch.no_grad():
        return drafter.eval()(noise_embeds=noise, context_hidden_states=feats, position_ids=pos).last_hidden_state


def test_added_layers_start_as_the_identity():
    target = tiny_target("qwen3", seed=3)
    torch.manual_seed(4)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=4)
    for p in drafter.parameters():  # a trained-looking drafter: no zero residual outputs to begin with
        torch.nn.init.normal_(p, std=0.2)
    before = _proposal_states(drafter)
    grown = copy.deepcopy(drafter)
    assert add_top_layers(grown, 2) == 4 and grown.config.num_hidden_layers == 4 and len(grown.layers) == 4
    assert torch.equal(_proposal_states(grown), before)  # exactly: the new layers add zeros to the residual
    new, top = grown.layers[3].state_dict(), drafter.layers[1].state_dict()
    for name, tensor in new.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert not tensor.any(), name
        else:
            assert torch.equal(tensor, top[name]), name
    # Not an identity once its residual outputs move: the layer is live, not dead weight.
    with torch.no_grad():
        grown.layers[3].mlp.down_proj.weight.normal_(std=0.2)
    assert not torch.allclose(_proposal_states(grown), before)


def test_training_with_added_layers_saves_and_reloads_the_grown_drafter(tmp_path):
    target = tiny_target("llama", seed=5)
    rows = [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(continuations(target, prompts(4, seed=6), 24))]
    torch.manual_seed(7)
    base = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4)
    base.save_pretrained(tmp_path / "base")
    cfg = TrainConfig(init=str(tmp_path / "base"), add_layers=1, lr=1e-3, max_anchors=8, eval_size=0, progress=False,
                      checkpoint_every=0, max_steps=3)
    trained = train_drafter(target, None, rows, tmp_path / "grown", cfg)
    reloaded = DFlashDrafter.from_pretrained(tmp_path / "grown").float()
    assert reloaded.config.num_hidden_layers == 2
    assert reloaded.layers[1].mlp.down_proj.weight.any()  # trained open
    assert torch.equal(reloaded.layers[1].mlp.down_proj.weight, trained.layers[1].mlp.down_proj.weight.float())
    assert 1.0 <= greedy_tau(target, reloaded.eval(), [(torch.tensor(r["input_ids"]), torch.tensor(r["loss_mask"]).bool())
                                                       for r in rows[:2]], 16) <= 4


def test_add_layers_errors_name_the_fix():
    with pytest.raises(ValueError, match="add --init"):
        TrainConfig(add_layers=1).resolved()
    with pytest.raises(ValueError, match="drop --stage retrace"):
        TrainConfig(init="d", add_layers=1, stage="retrace").resolved()
    with pytest.raises(ValueError, match="counts layers"):
        TrainConfig(init="d", add_layers=-1).resolved()
    target = tiny_target("qwen3", seed=0)
    with_retrace = DFlashDrafter.from_target(target, num_hidden_layers=1).add_retrace()
    with pytest.raises(ValueError, match="ReTrace conditioner"):
        add_top_layers(with_retrace, 1)
    hybrid = DFlashDrafter.from_target(target, num_hidden_layers=1).set_context("hybrid")
    with pytest.raises(ValueError, match="per-layer target KV"):
        add_top_layers(hybrid, 1)
