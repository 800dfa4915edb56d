"""`train --distill`: the target's stored top-k distribution in each slot's loss (tiny models, fp32)."""

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training import TrainConfig, objective, train_drafter
from dflash_retrace.training.data import Example
from dflash_retrace.training.features import FeatureStore, StoredRows, build_feature_store, stored_soft_targets
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors
from tiny import continuations, greedy_tau, prompts, tiny_target

NEW = 40


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=0)


@pytest.fixture(scope="module")
def rows(target):
    return continuations(target, prompts(6, seed=3), NEW)


def _store(target, rows, path, top_k):
    examples = [Example(ids, mask, int(mask.nonzero()[0]), f"r{i}") for i, (ids, mask) in enumerate(rows)]
    build_feature_store(target, examples, path, [0, 1, 2, 3], top_k=top_k, progress=False)
    return path


@pytest.fixture(scope="module")
def store(target, rows, tmp_path_factory):
    return _store(target, rows, tmp_path_factory.mktemp("topk"), top_k=8)


def _items(store_dir, n=2):
    refs = StoredRows(FeatureStore(store_dir, [1, 3]))
    return [(i, refs[i]) for i in range(n)]


def test_soft_targets_are_aligned_with_the_labels(store):
    """Position j's label is the target's argmax after j-1 tokens; its soft target must be that same distribution,
    so its top-1 id is the label."""
    items = _items(store, 3)
    width = max(int(ref.input_ids.numel()) for _, ref in items) + 2  # right padding
    ids, logits = stored_soft_targets(items, width, "cpu")
    for b, (_, ref) in enumerate(items):
        n = ref.input_ids.numel()
        assert torch.equal(ids[b, 1:n, 0], ref.labels[1:n])
        assert torch.isneginf(logits[b, 0]).all() and torch.isneginf(logits[b, n:]).all()
        assert (logits[b, 1:n, 0] >= logits[b, 1:n, 1]).all()


def _loss(drafter, target, items, soft=None, distill=0.0, labels=None):
    _, ref = items[0]
    ids, mask = ref.input_ids, ref.loss_mask
    labels = ref.labels if labels is None else labels
    feats = ref.features[None].float()
    anchors = sample_anchors(mask, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        return dflash_block_loss(drafter, target, ids, mask, anchors, features=feats, label_ids=labels,
                                 soft_targets=soft, distill=distill)[0]


def test_distill_weight_zero_and_a_one_hot_teacher_give_the_label_loss(target, store):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4, target_layer_ids=[1, 3]).eval()
    items = _items(store, 1)
    width = int(items[0][1].input_ids.numel())
    ids, logits = stored_soft_targets(items, width, "cpu")
    plain = _loss(drafter, target, items)
    assert _loss(drafter, target, items, (ids, logits), distill=0.0) == plain
    one_hot = torch.where(torch.arange(ids.shape[-1]) == 0, torch.zeros_like(logits), torch.full_like(logits, -1e9))
    assert _loss(drafter, target, items, (ids, one_hot), distill=1.0) == pytest.approx(float(plain), rel=1e-5)
    # a teacher sure of its second choice: the soft loss is the label loss with those ids as labels
    second = torch.where(torch.arange(ids.shape[-1]) == 1, torch.zeros_like(logits), torch.full_like(logits, -1e9))
    second_labels = ids[0, :, 1].clone()
    second_labels[0] = items[0][1].labels[0]
    expected = _loss(drafter, target, items, labels=second_labels)
    assert _loss(drafter, target, items, (ids, second), distill=1.0) == pytest.approx(float(expected), rel=1e-5)
    assert float(expected) != float(plain)
    soft = _loss(drafter, target, items, (ids, logits), distill=1.0)
    half = _loss(drafter, target, items, (ids, logits), distill=0.5)
    assert half == pytest.approx((float(plain) + float(soft)) / 2, rel=1e-5)


def _config(store_dir, **overrides):
    base = dict(features=str(store_dir), block_size=8, num_layers=2, lr=5e-3, max_anchors=16, eval_size=0,
                progress=False, checkpoint_every=0, max_steps=200, target_layer_ids=[1, 3], draft_vocab_size=48,
                labels="target-chain")
    base.update(overrides)
    return TrainConfig(**base)


def test_train_with_distillation_drafts_and_stays_exact(target, store, rows, tmp_path):
    drafter = train_drafter(target, None, None, tmp_path / "kd", _config(store, distill=0.5))
    plain = train_drafter(target, None, None, tmp_path / "ce", _config(store, max_steps=5))
    kd_short = train_drafter(target, None, None, tmp_path / "kd5", _config(store, max_steps=5, distill=0.5))
    assert kd_short.train_summary["final_loss"] != pytest.approx(plain.train_summary["final_loss"], rel=1e-4)
    assert greedy_tau(target, drafter, rows[:4], NEW) > 2.0


def test_distill_errors(target, rows, tmp_path):
    with pytest.raises(ValueError, match=r"weight in \[0, 1\]"):
        TrainConfig(features="s", distill=1.5).resolved()
    with pytest.raises(ValueError, match="reads the target's top-k logits from a feature store"):
        TrainConfig(distill=0.5).resolved()
    bare = _store(target, rows[:2], tmp_path / "bare", top_k=0)
    with pytest.raises(ValueError, match=r"holds no top-k logits.*--top-k 16"):
        train_drafter(target, None, None, tmp_path / "out", _config(bare, distill=0.5, max_steps=1))


def test_chunked_head_gives_the_same_distilled_loss_and_gradients(target, store, monkeypatch):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4, target_layer_ids=[1, 3])
    items = _items(store, 2)
    width = max(int(ref.input_ids.numel()) for _, ref in items)
    soft = stored_soft_targets(items, width, "cpu")
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.bool)
    labels = torch.zeros(2, width, dtype=torch.long)
    feats = torch.zeros(2, width, 2 * target.config.hidden_size)
    for b, (_, ref) in enumerate(items):
        n = ref.input_ids.numel()
        ids[b, :n], mask[b, :n], labels[b, :n], feats[b, :n] = ref.input_ids, ref.loss_mask, ref.labels, ref.features
    anchors = torch.stack([sample_anchors(mask[b], 6, torch.Generator().manual_seed(b)) for b in range(2)])
    results = []
    for chunk, recompute_above in ((4096, 4096), (7, 3)):  # one chunk; chunks of 7 recomputed in backward
        monkeypatch.setattr(objective, "LOGITS_CHUNK", recompute_above)
        drafter.zero_grad()
        loss, _ = dflash_block_loss(drafter, target, ids, mask, anchors, features=feats, label_ids=labels,
                                    soft_targets=soft, distill=0.7, logits_chunk=chunk)
        loss.backward()
        results.append((float(loss), [p.grad.clone() for p in drafter.parameters() if p.grad is not None]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
