"""`train --features`: a drafter trained from a feature store without running the target's layers, with a draft
vocabulary and greedy-chain labels; it drafts and generation stays exact (tiny models, fp32)."""

import json

import pytest
import torch

from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.data import Example
from dflash_retrace.training.features import build_feature_store
from tiny import continuations, greedy_tau, prompts, tiny_target

NEW = 40


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=0)


@pytest.fixture(scope="module")
def store(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("store")
    rows = continuations(target, prompts(8, seed=3), NEW)
    examples = [Example(ids, mask, int(mask.nonzero()[0]), f"r{i}") for i, (ids, mask) in enumerate(rows)]
    build_feature_store(target, examples, out, [0, 1, 2, 3], progress=False)
    return out, rows


def _config(store_dir, **overrides):
    base = dict(features=str(store_dir), block_size=8, num_layers=2, lr=5e-3, max_anchors=16, eval_size=0,
                progress=False, checkpoint_every=0, max_steps=300, target_layer_ids=[1, 3], draft_vocab_size=48,
                labels="target-chain")
    base.update(overrides)
    return TrainConfig(**base)


def test_train_from_store_never_runs_the_target_layers(target, store, tmp_path):
    store_dir, rows = store
    calls = []
    hooks = [layer.register_forward_hook(lambda *a: calls.append(1)) for layer in target.model.layers]
    try:
        drafter = train_drafter(target, None, None, tmp_path, _config(store_dir))
    finally:
        for h in hooks:
            h.remove()
    assert calls == []  # only the embedding and the LM head of the target were used
    assert drafter.config.draft_vocab_size == 48 and drafter.draft_to_target.numel() == 48
    assert greedy_tau(target, drafter, rows[:4], NEW) > 2.0  # it learned to draft from stored features alone
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["draft_vocab_size"] == 48


def test_summary_reports_draft_vocabulary_coverage(target, store, tmp_path):
    store_dir, _ = store
    drafter = train_drafter(target, None, None, tmp_path, _config(store_dir, max_steps=5, eval_size=2,
                                                                 eval_prompts=1, eval_max_new_tokens=8))
    summary = drafter.train_summary
    assert summary["features"] == str(store_dir) and summary["draft_vocab_size"] == 48
    assert 0.5 < summary["held_out_draft_vocab_coverage"] <= 1.0


def test_store_without_the_drafter_layers_is_a_clear_error(target, store, tmp_path):
    _, rows = store
    ids, mask = rows[0]
    build_feature_store(target, [Example(ids, mask, int(mask.nonzero()[0]), "r0")], tmp_path / "s", [1, 3],
                        progress=False)
    with pytest.raises(ValueError, match=r"holds layers \[1, 3\] \(missing \[2\]\)"):
        train_drafter(target, None, None, tmp_path / "out", _config(tmp_path / "s", target_layer_ids=[1, 2],
                                                                   max_steps=1))


def test_retrace_stage_refuses_features(store):
    with pytest.raises(ValueError, match="without --features"):
        _config(store[0], stage="retrace").resolved()


def test_periodic_held_out_estimates_and_slot_tokens_are_logged(target, store, tmp_path):
    store_dir, _ = store
    train_drafter(target, None, None, tmp_path, _config(store_dir, max_steps=40, eval_size=2, eval_every=20,
                                                       log_every=10, eval_prompts=1, eval_max_new_tokens=8))
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    slots = [r["slot_tokens"] for r in log]
    assert slots == sorted(slots) and slots[0] > 0
    estimates = [r for r in log if "held_out_tau_estimate" in r]
    assert [r["step"] for r in estimates] == [20, 40]
    later = estimates[-1]
    assert later["held_out_tau_estimate"] >= 1.0 and len(later["held_out_slot_accuracy"]) == 7


def test_held_out_estimates_follow_eval_every_even_off_the_log_grid(target, store, tmp_path):
    # eval_every 15 with log_every 10: an estimate at updates 15 and 30 (they used to come only at multiples of both,
    # so a run with --eval-every 325 --log-every 20 logged none until its end)
    store_dir, _ = store
    train_drafter(target, None, None, tmp_path, _config(store_dir, max_steps=32, eval_size=2, eval_every=15,
                                                       log_every=10, eval_prompts=1, eval_max_new_tokens=8))
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "held_out_tau_estimate" in r] == [15, 30]
    assert [r["step"] for r in log] == [10, 15, 20, 30, 32]


def test_log_and_eval_intervals_are_checked():
    with pytest.raises(ValueError, match=r"log_every.*>= 1"):
        TrainConfig(log_every=0).resolved()
    with pytest.raises(ValueError, match=r"eval_every.*>= 0"):
        TrainConfig(eval_every=-5).resolved()


def _held_store(target, rows, path, names, layers=(0, 1, 2, 3)):
    examples = [Example(ids, mask, int(mask.nonzero()[0]), name) for (ids, mask), name in zip(rows, names)]
    build_feature_store(target, examples, path, list(layers), progress=False)
    return path


def test_eval_features_is_the_held_out_set_and_the_store_is_trained_whole(target, store, tmp_path):
    from dflash_retrace.training import evaluate_slots
    from dflash_retrace.training.features import FeatureStore, StoredRef

    store_dir, _ = store
    held_rows = continuations(target, prompts(3, seed=11), NEW)
    held = _held_store(target, held_rows, tmp_path / "held", ["h0", "h1", "h2"])
    cfg = _config(store_dir, max_steps=5, eval_features=str(held), eval_prompts=1, eval_max_new_tokens=8)
    drafter = train_drafter(target, None, None, tmp_path / "out", cfg)
    summary = drafter.train_summary
    assert summary["train_sequences"] == 8 and summary["held_out_sequences"] == 3
    cfg = cfg.resolved()
    refs = [StoredRef(FeatureStore(held, [1, 3]), i) for i in range(3)]
    again = evaluate_slots(drafter, target, refs, cfg.max_anchors, cfg.gamma, cfg.seed, "local", cfg.labels)
    assert again["loss"] == pytest.approx(summary["held_out_loss"], rel=1e-5)
    capped = train_drafter(target, None, None, tmp_path / "capped", _config(
        store_dir, max_steps=1, eval_features=str(held), eval_size=2, eval_prompts=1, eval_max_new_tokens=8))
    assert capped.train_summary["held_out_sequences"] == 2


def test_eval_features_sharing_a_row_or_built_otherwise_is_an_error(target, store, tmp_path):
    store_dir, rows = store
    shared = _held_store(target, rows[5:6], tmp_path / "shared", ["other-name"])  # same tokens, another id
    with pytest.raises(ValueError, match=r"1 held-out row\(s\) .* are also in the training store"):
        train_drafter(target, None, None, tmp_path / "a", _config(store_dir, max_steps=1, eval_features=str(shared)))
    layers = _held_store(target, continuations(target, prompts(1, seed=12), NEW), tmp_path / "layers", ["x"], [1, 3])
    with pytest.raises(ValueError, match=r"was not built like the training store.*layer_ids"):
        train_drafter(target, None, None, tmp_path / "b", _config(store_dir, max_steps=1, eval_features=str(layers)))
    with pytest.raises(ValueError, match="add --features"):
        TrainConfig(eval_features=str(layers)).resolved()


def test_several_stores_train_as_the_one_store_holding_their_rows(target, store, tmp_path):
    _, rows = store
    names = [f"r{i}" for i in range(8)]  # the module store's rows, split into two stores in the same order
    first = _held_store(target, rows[:3], tmp_path / "first", names[:3])
    second = _held_store(target, rows[3:], tmp_path / "second", names[3:])
    whole = _held_store(target, rows, tmp_path / "whole", names)
    split = train_drafter(target, None, None, tmp_path / "split", _config(f"{first},{second}", max_steps=6))
    one = train_drafter(target, None, None, tmp_path / "one", _config(whole, max_steps=6))
    assert split.train_summary["train_sequences"] == 8
    for (name, a), b in zip(split.state_dict().items(), one.state_dict().values()):
        assert torch.equal(a, b), name


def test_several_stores_built_otherwise_or_sharing_a_row_are_an_error(target, store, tmp_path):
    store_dir, rows = store
    again = _held_store(target, rows[2:3], tmp_path / "again", ["renamed"])  # a row of store_dir under another id
    with pytest.raises(ValueError, match=r"1 row\(s\) of the feature store .* are also in an earlier store"):
        train_drafter(target, None, None, tmp_path / "a", _config(f"{store_dir},{again}", max_steps=1))
    other = _held_store(target, continuations(target, prompts(1, seed=13), NEW), tmp_path / "other", ["y"], [1, 3])
    with pytest.raises(ValueError, match=r"feature store .*other was not built like the training store.*layer_ids"):
        train_drafter(target, None, None, tmp_path / "b", _config(f"{store_dir},{other}", max_steps=1))


def test_eval_held_out_example_reproduces_the_trainers_held_out_figures(target, store, tmp_path):
    """examples/eval_held_out.py scores any drafter on a held-out store exactly as `train --eval-features` does."""
    import importlib.util
    from pathlib import Path

    from tiny import tiny_tokenizer

    store_dir, _ = store
    held = _held_store(target, continuations(target, prompts(3, seed=21), NEW), tmp_path / "held", ["a", "b", "c"])
    # A training seed other than the example's: the held-out anchors do not depend on it (HELD_OUT_SEED).
    cfg = _config(store_dir, max_steps=5, eval_features=str(held), eval_prompts=2, eval_max_new_tokens=8, seed=3)
    train_drafter(target, None, None, tmp_path / "out", cfg)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    path = Path(__file__).resolve().parents[1] / "examples" / "eval_held_out.py"
    spec = importlib.util.spec_from_file_location("eval_held_out", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(["--target", str(tmp_path / "target"), "--store", str(held), "--drafter",
                          f"run={tmp_path / 'out'}", "--prompts", "2", "--max-new-tokens", "8", "--max-anchors", "16",
                          "--output", str(tmp_path / "h.json")])
    got = report["drafters"]["run"]
    assert got["held_out_loss"] == pytest.approx(summary["held_out_loss"], rel=1e-5)
    assert got["held_out_tau_estimate"] == pytest.approx(summary["held_out_tau_estimate"], rel=1e-6)
    assert got["held_out_tau"] == summary["held_out_tau"]
    assert json.loads((tmp_path / "h.json").read_text())["rows"] == 3
    quick = module.main(["--target", str(tmp_path / "target"), "--store", str(held), "--drafter",
                         f"run={tmp_path / 'out'}", "--prompts", "0", "--max-anchors", "16"])["drafters"]["run"]
    assert quick["held_out_tau"] is None and quick["held_out_rounds"] == 0  # no generation asked: none measured
    assert quick["held_out_tau_estimate"] == got["held_out_tau_estimate"]


def test_plot_training_chains_continued_runs(tmp_path):
    """examples/plot_training.py --chain puts a continued run's tokens after its parent's last count."""
    import importlib.util
    from pathlib import Path

    for name, rows in {"a": [(10, 100, 1.5), (20, 200, 1.7)], "b": [(10, 50, 1.8), (20, 120, None)]}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train_log.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 1.0, "slot_tokens": t,
                        **({} if tau is None else {"held_out_tau_estimate": tau})}) + "\n" for s, t, tau in rows))
    path = Path(__file__).resolve().parents[1] / "examples" / "plot_training.py"
    spec = importlib.util.spec_from_file_location("plot_training", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    chained = module.load_runs(runs, chain=True)
    assert [[r["slot_tokens"] for r in log] for _, log in chained] == [[100, 200], [250, 320]]
    assert [[r["slot_tokens"] for r in log] for _, log in module.load_runs(runs)] == [[100, 200], [50, 120]]


def _built_store(target, tokenizer, path, name, chat_template, first=0):
    """A store built as `dflash-retrace features --target NAME` builds it, from four text rows."""
    from dflash_retrace.training.features import FeaturesConfig, build_features

    data = path.with_suffix(".jsonl")
    data.write_text("".join(json.dumps({"id": f"{path.name}{i}", "prompt": "abcdef" * (i + 1),
                                        "response": "ghijab" * 4}) + "\n" for i in range(first, first + 4)))
    build_features(target, tokenizer, data, path, FeaturesConfig(layers=[1, 3], chat_template=chat_template,
                                                                 progress=False), meta={"target": name})
    return path


def test_store_of_another_target_or_prompt_rendering_is_an_error(target, tmp_path):
    import copy

    from tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.name_or_path = "org/target-A"
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    store = _built_store(target, tok, tmp_path / "a", "org/target-A", chat_template=False)
    run = copy.deepcopy(target)
    run.name_or_path = "/models/target-A"  # a local copy of the store's target
    cfg = dict(max_steps=1, draft_vocab_size=None, chat_template=False)
    train_drafter(run, tok, None, tmp_path / "ok", _config(store, **cfg))
    with pytest.raises(ValueError, match=r"store .*a was not built for this run: chat_template False \(this run: "
                                         r"True\).*dflash-retrace features --target /models/target-A .*--out"):
        train_drafter(run, tok, None, tmp_path / "b", _config(store, **{**cfg, "chat_template": True}))
    run.name_or_path = "org/target-B"
    with pytest.raises(ValueError, match=r"target 'org/target-A' \(this run: 'org/target-B'\)"):
        train_drafter(run, tok, None, tmp_path / "c", _config(store, **cfg))
    other_vocab = copy.deepcopy(target)
    other_vocab.resize_token_embeddings(100, mean_resizing=False)
    wide = _held_store(other_vocab, continuations(target, prompts(1, seed=14), 8), tmp_path / "wide", ["w"])
    with pytest.raises(ValueError, match=r"vocab_size 100 \(this run: 96\)"):
        train_drafter(target, None, None, tmp_path / "d", _config(wide, **cfg))


def test_stores_of_two_targets_are_not_trained_as_one(target, tmp_path):
    from dflash_retrace.training.features import open_stores
    from tiny import tiny_tokenizer

    a = _built_store(target, tiny_tokenizer(), tmp_path / "a", "org/target-A", chat_template=False)
    b = _built_store(target, tiny_tokenizer(), tmp_path / "b", "org/target-B", chat_template=False, first=4)
    with pytest.raises(ValueError, match=r"feature store .*b was not built like .*target 'org/target-A' vs "
                                         r"'org/target-B'"):
        open_stores(f"{a},{b}")
    open_stores(f"{a},{_built_store(target, tiny_tokenizer(), tmp_path / 'c', '/local/target-a', False, 8)}")
