"""Feature store, block-local training attention, greedy-chain labels and the draft vocabulary (tiny models)."""

import json

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.training.features import FeatureStore, build_feature_store
from dflash_retrace.training.objective import (BlockLocalMask, block_attention_mask, draft_vocabulary, greedy_chain_mask,
                                               target_features, target_labels)
from tiny import VOCAB, prompts, tiny_target


class _Row:
    def __init__(self, ids, prompt_len, row_id):
        self.input_ids = ids
        self.loss_mask = torch.arange(ids.numel()) >= prompt_len
        self.row_id = row_id


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def _rows(n, length=30):
    return [_Row(p[0], 6, f"r{i}") for i, p in enumerate(prompts(n, length=length, seed=3))]


def test_store_matches_online_features_and_labels(target, tmp_path):
    rows = _rows(5)
    manifest = build_feature_store(target, rows, tmp_path, [0, 2, 3], top_k=4, shard_tokens=64, progress=False)
    assert manifest["num_tokens"] == sum(r.input_ids.numel() for r in rows)
    assert len(manifest["shards"]) > 1  # rows spread over several shards
    store = FeatureStore(tmp_path, layer_ids=[3, 0])  # a subset, in another order
    for i, r in enumerate(rows):
        got = store[i]
        ids = r.input_ids[None]
        feats = target_features(target, ids, [3, 0])[0].to(torch.bfloat16)
        logits = target(input_ids=ids).logits
        assert torch.equal(got.input_ids, r.input_ids)
        assert torch.equal(got.loss_mask, r.loss_mask)
        assert torch.equal(got.labels, target_labels(ids, logits)[0])
        assert torch.equal(got.features, feats)
        assert torch.equal(got.topk_ids[:, 0], logits[0].argmax(-1))


def test_store_resumes_without_recomputing(target, tmp_path):
    rows = _rows(4)
    build_feature_store(target, rows[:2], tmp_path, [1], progress=False)
    calls = []
    hook = target.register_forward_hook(lambda *a: calls.append(1))
    try:
        manifest = build_feature_store(target, rows, tmp_path, [1], progress=False)
    finally:
        hook.remove()
    assert len(calls) == 2  # only the two new rows ran through the target
    assert [r["id"] for r in manifest["rows"]] == ["r0", "r1", "r2", "r3"]
    assert json.loads((tmp_path / "manifest.json").read_text())["num_tokens"] == manifest["num_tokens"]
    with pytest.raises(ValueError, match="layer_ids=\\[1\\]"):
        build_feature_store(target, rows, tmp_path, [0, 1], progress=False)


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _text_rows(n):
    return [{"id": f"r{i}", "prompt": "abcdef" * (i + 1), "response": "ghijab" * 3} for i in range(n)]


@pytest.mark.parametrize("change, differ", [
    ({"meta": {"target": "org/other"}}, r"target='org/target' \(this build: 'org/other'\)"),
    ({"max_length": 12}, r"max_length=64 \(this build: 12\)"),
    ({"chat_template": True}, r"chat_template=False \(this build: True\)"),
    ({"enable_thinking": True}, r"enable_thinking=False \(this build: True\)"),
    ({"dtype": torch.bfloat16}, r"target_dtype='float32' \(this build: 'bfloat16'\)"),
    ({"vocab_size": 100}, r"vocab_size=96 \(this build: 100\)"),
])
def test_store_resume_refuses_another_build(target, tmp_path, change, differ):
    import copy

    from dflash_retrace.training.features import FeaturesConfig, build_features
    from tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    data = _write_rows(tmp_path / "rows.jsonl", _text_rows(2))
    options = dict(layers=[1, 3], chat_template=False, max_length=64, progress=False)
    build_features(target, tok, data, tmp_path / "store", FeaturesConfig(**options), meta={"target": "org/target"})
    more = _write_rows(tmp_path / "more.jsonl", _text_rows(4))  # the same rows and two more, in another file
    change, other = dict(change), copy.deepcopy(target)
    meta = change.pop("meta", {"target": "org/target"})
    if "dtype" in change:
        other.to(change.pop("dtype"))
    if "vocab_size" in change:
        other.resize_token_embeddings(change.pop("vocab_size"), mean_resizing=False)
    with pytest.raises(ValueError, match=differ + r".*Use another --out, or the same options as the store was built"):
        build_features(other, tok, more, tmp_path / "store", FeaturesConfig(**{**options, **change}), meta=meta)
    manifest = build_features(target, tok, more, tmp_path / "store", FeaturesConfig(**options),
                              meta={"target": "org/target"})  # the same build resumes
    assert [r["id"] for r in manifest["rows"]] == ["r0", "r1", "r2", "r3"] and manifest["max_length"] == 64


def test_store_resume_refuses_rows_that_changed_under_their_id(target, tmp_path):
    from dflash_retrace.training.features import FeaturesConfig, build_features
    from tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = FeaturesConfig(layers=[1, 3], chat_template=False, progress=False)
    rows = [{"prompt": p, "response": "ghijab" * 3} for p in ("abab", "cdcd", "efef")]  # no ids: their index
    data = _write_rows(tmp_path / "rows.jsonl", rows[1:])
    build_features(target, tok, data, tmp_path / "store", cfg)
    _write_rows(data, rows)  # a row inserted first: every stored index now names another row
    with pytest.raises(ValueError, match=r"2 row\(s\) .*\(ids \['0', '1'\]\).*the data changed since the store was "
                                         r"built.*new --out"):
        build_features(target, tok, data, tmp_path / "store", cfg)


def test_store_missing_layers_is_a_clear_error(target, tmp_path):
    build_feature_store(target, _rows(1), tmp_path, [0, 2], progress=False)
    with pytest.raises(ValueError, match=r"holds layers \[0, 2\] \(missing \[3\]\).*--layers 0,3"):
        FeatureStore(tmp_path, layer_ids=[0, 3])
    with pytest.raises(FileNotFoundError, match="not a feature store"):
        FeatureStore(tmp_path / "nothing")


@pytest.mark.parametrize("group", [None, 1, 2, "compiling"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_block_local_mask_equals_dense_rule(target, block_size, group, monkeypatch):
    """A batch of two rows with different padding; also with the blocks attended in groups of one or two (the CPU's
    small-buffer path, forced here by a tiny budget; groups of two leave a ragged last group of one), and under
    `torch.compile` (told by `is_compiling`), where the same tiny budget still gives one group (no shape guards)."""
    from dflash_retrace.training import objective

    if group == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)

    groups = []
    attend_blocks = objective._attend_blocks
    monkeypatch.setattr(objective, "_attend_blocks", lambda *a: groups.append(a[0].shape[1]) or attend_blocks(*a))
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=block_size, target_layer_ids=[0, 2])
    T = 23
    anchors = torch.tensor([[2, 5, 11, 20, -1], [3, 7, -1, -1, -1]])
    if group is not None:  # fp32 scores of one block of both rows: 4 bytes x 2 rows x heads x B x (T + B)
        per_block = 4 * 2 * drafter.config.num_attention_heads * block_size * (T + block_size)
        monkeypatch.setattr(objective, "CPU_LOGITS_BYTES", (1 if group == "compiling" else group) * per_block)
    n = anchors.shape[1] * block_size
    noise = torch.randn(2, n, 64, requires_grad=True)
    context = torch.randn(2, T, 128)
    own = anchors.clamp_min(0)[:, :, None] + torch.arange(block_size)
    pos = torch.cat([torch.arange(T).expand(2, -1), own.reshape(2, -1)], dim=1)
    dense = drafter(noise_embeds=noise, context_hidden_states=context, position_ids=pos,
                    attention_mask=block_attention_mask(T, anchors, block_size)).last_hidden_state
    local = drafter(noise_embeds=noise, context_hidden_states=context, position_ids=pos,
                    attention_mask=BlockLocalMask(anchors, block_size)).last_hidden_state
    torch.testing.assert_close(local, dense, rtol=1e-5, atol=1e-5)
    g_dense, = torch.autograd.grad(dense.square().sum(), noise)
    g_local, = torch.autograd.grad(local.square().sum(), noise)
    torch.testing.assert_close(g_local, g_dense, rtol=1e-4, atol=1e-5)
    # per drafter layer: one group of five blocks, five of one, or two of two and a ragged one
    assert groups == {None: [5], 1: [1] * 5, 2: [2, 2, 1], "compiling": [5]}[group] * 2


def test_greedy_chain_mask_cuts_blocks_at_the_first_disagreement():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    labels = torch.tensor([[5, 6, 7, 0, 9, 10, 11]])  # the target disagrees with the text at position 3
    got = greedy_chain_mask(ids, labels, torch.tensor([[1, 3, -1]]), 4).view(3, 4)
    # anchor 1: slots at 2, 3, 4; slot 3 (position 4) follows the disagreement at position 3
    assert got[0].tolist() == [True, True, True, False]
    # anchor 3: slots at 4, 5, 6 follow agreeing positions (the anchor itself needs no agreement)
    assert got[1].tolist() == [True, True, True, True]


def test_draft_vocabulary_takes_the_most_frequent_and_always_ids():
    counts = torch.zeros(VOCAB, dtype=torch.long)
    counts[[10, 20, 30, 40]] = torch.tensor([5, 50, 7, 1])
    ids = draft_vocabulary(counts, 3, always=[2])
    assert ids.tolist() == [2, 20, 30]
