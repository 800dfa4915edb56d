"""What `train` checks about its data and its run folder: row shapes, truncation, a held-out split disjoint from
training, `--resume` against the saved run, and labels (draft vocabulary, loss vocabulary, held-out metrics) that
follow `--labels` (tiny models, CPU)."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.runtime import eos_token_ids
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training import loop as training_loop
from dflash_retrace.training.data import Example, anchor_generator, split_held_out, tokenize_rows
from dflash_retrace.training.features import build_feature_store
from dflash_retrace.training.held_out import evaluate_slots
from dflash_retrace.training.objective import dflash_block_loss, draft_vocabulary, sample_anchors, target_features
from tiny import VOCAB, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=0)


def random_rows(n, length=30, prompt=6, low=3, high=VOCAB, seed=1):
    """Pre-tokenized rows of text the target did not write (its labels differ from the tokens)."""
    g = torch.Generator().manual_seed(seed)
    return [{"id": f"r{i}", "input_ids": torch.randint(low, high, (length,), generator=g).tolist(),
             "loss_mask": [0] * prompt + [1] * (length - prompt)} for i in range(n)]


def quick(**overrides):
    base = dict(block_size=4, num_layers=1, lr=1e-3, max_anchors=8, eval_size=0, eval_prompts=0, progress=False,
                checkpoint_every=0, max_steps=1)
    base.update(overrides)
    return TrainConfig(**base)


def store_of(target, rows, path):
    examples = [Example(torch.tensor(r["input_ids"]), torch.tensor(r["loss_mask"]).bool(), r["loss_mask"].index(1),
                        r["id"]) for r in rows]
    build_feature_store(target, examples, path, [1, 3], progress=False)
    return str(path)


def target_label_counts(target, rows):
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for r in rows:
        ids, mask = torch.tensor(r["input_ids"]), torch.tensor(r["loss_mask"]).bool()
        _, labels = target_features(target, ids[None], [1], with_labels=True)
        counts += torch.bincount(labels[0][mask], minlength=VOCAB)
    return counts


# ------------------------------------------------------------------------------------ rows
def test_a_loss_mask_of_another_length_than_input_ids_is_refused():
    rows = [{"id": "a", "input_ids": list(range(3, 13)), "loss_mask": [0] * 4 + [1] * 4}]
    with pytest.raises(ValueError, match=r"data row a: `loss_mask` has 8 entries but `input_ids` has 10"):
        tokenize_rows(rows, None)


def test_truncation_is_reported_and_blamed_when_it_leaves_no_response(target, tmp_path, capsys):
    # 40 prompt tokens, 61 response tokens ending with EOS (2).
    rows = [{"id": str(i), "input_ids": list(range(3, 43)) + list(range(3, 63)) + [2],
             "loss_mask": [0] * 40 + [1] * 61} for i in range(4)]
    examples = tokenize_rows(rows + [{"id": "short", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}], None,
                             max_length=64, eos_token_id=[2])
    assert [e.truncated for e in examples] == [True] * 4 + [False] and examples[0].input_ids.numel() == 64
    assert ("[data] 4 of 5 rows are longer than max_length=64 tokens and were cut: 0 lost all their response tokens, "
            "4 their final EOS") in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"4 of the 4 lost their response when cut at --max-length 40\. Raise "
                                         r"--max-length"):
        train_drafter(target, None, rows, tmp_path, quick(max_length=40))
    assert "4 lost all their response tokens" in capsys.readouterr().out


# ------------------------------------------------------------------------------- held-out split
def test_held_out_rows_never_share_their_tokens_with_training():
    rows = random_rows(10)
    examples = tokenize_rows(rows + [{**r, "id": f"dup-{r['id']}"} for r in rows], None)
    for seed in range(20):
        train, held = split_held_out(examples, 5, seed)
        assert len(train) + len(held) == 20 and 0 < len(held) <= 5
        trained = {tuple(e.input_ids.tolist()) for e in train}
        assert not [e.row_id for e in held if tuple(e.input_ids.tolist()) in trained]
    # Without copies the split is the one it always was (runs keep their held-out rows).
    distinct = tokenize_rows(random_rows(40), None)
    order = list(range(40))
    random.Random(3).shuffle(order)
    assert [e.row_id for e in split_held_out(distinct, 0.05, 3)[1]] == [f"r{i}" for i in sorted(order[:2])]


# ------------------------------------------------------------------------------------- resume
def _crashed_run(target, rows, out, config, monkeypatch):
    """A run killed in its third update, with a checkpoint at update 2."""
    calls = {"n": 0}
    real = training_loop.dflash_block_loss

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(training_loop, "dflash_block_loss", crashing)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(target, None, rows, out, config)
    monkeypatch.setattr(training_loop, "dflash_block_loss", real)
    assert training_loop.latest_checkpoint(out).name == "step-2"


def test_resume_refuses_other_batching_or_rows_and_accepts_other_logging(target, tmp_path, monkeypatch, capsys):
    rows = random_rows(12)
    out = tmp_path / "run"
    config = quick(max_steps=6, checkpoint_every=2, eval_size=2)
    _crashed_run(target, rows, out, config, monkeypatch)
    saved = (out / "train_config.json").read_text()
    resume = dataclasses.replace(config, resume=True)
    with pytest.raises(ValueError, match=r"--batch-size 1 -> 2.*--grad-accum 1 -> 2 .*Resume with the same options, "
                                         r"or start a new --out"):
        train_drafter(target, None, rows, out, dataclasses.replace(resume, batch_size=2, grad_accum=2))
    assert (out / "train_config.json").read_text() == saved  # left as it was
    more = rows + random_rows(2, seed=7)  # rows appended to the data: the held-out split moves
    with pytest.raises(ValueError, match=r"the training rows \(10 -> 12;.*the held-out rows"):
        train_drafter(target, None, [{**r, "id": f"r{i}"} for i, r in enumerate(more)], out, resume)
    with pytest.raises(ValueError, match=r"--seed 0 -> 1"):
        train_drafter(target, None, rows, out, dataclasses.replace(resume, seed=1))
    record = json.loads((out / "train_data.json").read_text())
    (out / "train_data.json").write_text(json.dumps({**record, "num_processes": 2}))  # as a 2-process run saves it
    with pytest.raises(ValueError, match=r"processes 2 -> 1"):
        train_drafter(target, None, rows, out, resume)
    (out / "train_data.json").write_text(json.dumps(record))
    done = train_drafter(target, None, rows, out, dataclasses.replace(resume, log_every=1, keep_checkpoints=5))
    assert done.train_summary["steps"] == 6 and "resumed from" in capsys.readouterr().out
    assert json.loads((out / "train_config.json").read_text())["log_every"] == 1


def test_resume_of_a_run_without_its_data_record_warns(target, tmp_path, monkeypatch, capsys):
    rows = random_rows(6)
    out = tmp_path / "run"
    config = quick(max_steps=4, checkpoint_every=2)
    _crashed_run(target, rows, out, config, monkeypatch)
    (out / "train_data.json").unlink()  # as a run of an earlier version left it
    capsys.readouterr()
    train_drafter(target, None, rows, out, dataclasses.replace(config, resume=True))
    assert "resuming without checking that the data" in capsys.readouterr().out
    assert json.loads((out / "train_data.json").read_text())["train_rows"] == 6  # saved for the next resume


# ----------------------------------------------------------------------------- labels followed
def test_held_out_metrics_of_online_rows_use_the_targets_labels(target):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4)
    row = random_rows(1)[0]
    ids, mask = torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"]).bool()
    _, labels = target_features(target, ids[None], drafter.config.feature_layer_ids, with_labels=True)
    anchors = sample_anchors(mask, 64, generator=anchor_generator(0, 1 << 20, 0))
    for kind in ("target", "target-chain"):
        got = evaluate_slots(drafter, target, [Example(ids, mask, 6, "x")], 64, None, 0, "dense", kind)
        with torch.no_grad():
            loss, stats = dflash_block_loss(drafter, target, ids, mask, anchors, label_ids=labels[0],
                                            chain=kind == "target-chain")
        assert got["loss"] == pytest.approx(float(loss), rel=1e-5)
        assert got["full_chain_blocks"] == int(stats["full_blocks"]) and got["blocks"] == int(stats["counted"][1])


def test_the_draft_vocabulary_counts_the_labels_trained_on(target, tmp_path):
    rows = random_rows(6, length=40, high=13)  # tokens 3..12 only; the target's labels are others
    online = train_drafter(target, None, rows, tmp_path / "online", quick(draft_vocab_size=16, labels="target"))
    expected = draft_vocabulary(target_label_counts(target, rows), 16)
    assert torch.equal(online.draft_to_target, expected)
    # From a feature store with --labels data: the stored tokens, not the target's stored labels.
    store = store_of(target, rows, tmp_path / "store")
    stored = train_drafter(target, None, None, tmp_path / "stored", quick(features=store, target_layer_ids=[1, 3],
                                                                          draft_vocab_size=16, labels="data"))
    tokens = torch.zeros(VOCAB, dtype=torch.long)
    for r in rows:
        tokens += torch.bincount(torch.tensor(r["input_ids"])[6:], minlength=VOCAB)
    assert torch.equal(stored.draft_to_target, draft_vocabulary(tokens, 16))


def test_an_init_drafter_grows_its_draft_vocabulary_and_never_loses_an_id(target, tmp_path):
    rows = random_rows(6, length=40, high=13)
    small = train_drafter(target, None, rows, tmp_path / "small", quick(draft_vocab_size=12, labels="target"))
    counts = target_label_counts(target, rows)
    grown = train_drafter(target, None, rows, tmp_path / "grown", quick(init=str(tmp_path / "small"), labels="target",
                                                                         draft_vocab_size=20))
    expected = draft_vocabulary(counts, 20, always=[*eos_token_ids(target), *small.draft_to_target.tolist()])
    assert torch.equal(grown.draft_to_target, expected) and grown.config.draft_vocab_size == 20
    assert set(small.draft_to_target.tolist()) < set(grown.draft_to_target.tolist())
    added = sorted(set(grown.draft_to_target.tolist()) - set(small.draft_to_target.tolist()))
    outside = counts.clone()
    outside[small.draft_to_target] = -1
    assert sorted(counts[added].tolist()) == sorted(outside.sort(descending=True).values[:8].tolist())
    assert DFlashDrafter.from_pretrained(tmp_path / "grown").config.draft_vocab_size == 20
    # The same size is the drafter's own; a smaller one, or a change under LoRA, is refused with the way out.
    same = train_drafter(target, None, rows, tmp_path / "same", quick(init=str(tmp_path / "grown"), draft_vocab_size=20))
    assert torch.equal(same.draft_to_target, grown.draft_to_target)
    with pytest.raises(ValueError, match=r"smaller than the --init drafter's draft vocabulary \(20 ids\).*Drop "):
        train_drafter(target, None, rows, tmp_path / "shrunk", quick(init=str(tmp_path / "grown"), draft_vocab_size=16))
    with pytest.raises(ValueError, match=r"--draft-vocab-size with --lora.*--init BASE --draft-vocab-size N"):
        train_drafter(target, None, rows, tmp_path / "lora", quick(init=str(tmp_path / "grown"), draft_vocab_size=24,
                                                                   lora=True, lora_r=4))


def test_a_store_run_on_target_labels_builds_its_loss_vocabulary_from_them(target, tmp_path):
    rows = random_rows(4, high=13)
    store = store_of(target, rows, tmp_path / "store")
    drafter = train_drafter(target, None, None, tmp_path / "run", quick(features=store, target_layer_ids=[1, 3],
                                                                        labels="target", loss_vocab="data"))
    tokens = {t for r in rows for t in r["input_ids"]}
    labels = set(torch.nonzero(target_label_counts(target, rows)).flatten().tolist())
    assert drafter.train_summary["loss_vocab_size"] == len(tokens | labels)


def test_keep_checkpoints_zero_is_refused_while_checkpoints_are_written():
    from dflash_retrace.training.config import TrainConfig

    with pytest.raises(ValueError, match=r"keep_checkpoints.*>= 1.*checkpoint_every.*to 0"):
        TrainConfig(keep_checkpoints=0).resolved()
    assert TrainConfig(keep_checkpoints=0, checkpoint_every=0).resolved().keep_checkpoints == 0  # no checkpoints


def test_a_run_stopped_while_saving_a_checkpoint_resumes_from_the_one_before(target, tmp_path, monkeypatch):
    """accelerate writes a checkpoint file by file: one stopped half-way must not become the newest step-N."""
    import accelerate

    rows = random_rows(8)
    out = tmp_path / "run"
    config = quick(max_steps=6, checkpoint_every=2, keep_checkpoints=3)
    real = accelerate.Accelerator.save_state
    calls = {"n": 0}

    def dying(self, output_dir=None, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint (update 4): its first file lands, then the process dies
            Path(output_dir).mkdir(parents=True)
            (Path(output_dir) / "model.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt("killed while saving")
        return real(self, output_dir, **kwargs)

    monkeypatch.setattr(accelerate.Accelerator, "save_state", dying)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(target, None, rows, out, config)
    monkeypatch.setattr(accelerate.Accelerator, "save_state", real)
    assert training_loop.latest_checkpoint(out).name == "step-2"
    done = train_drafter(target, None, rows, out, dataclasses.replace(config, resume=True))
    assert done.train_summary["steps"] == 6
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2", "step-4"]  # the partial one redone
