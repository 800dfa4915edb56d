"""Training: the DFlash objective's attention rule, the trainer (τ goes up), resume, ReTrace stage, LoRA."""

import dataclasses
import json

import pytest
import torch
from transformers import AutoModel

from dflash_retrace import DFlashDrafter
from dflash_retrace.training import LORA_TARGETS, TrainConfig, latest_checkpoint, measure_acceptance, train_drafter
from dflash_retrace.training import data as training_data
from dflash_retrace.training import loop as training_loop
from dflash_retrace.training.objective import (
    block_attention_mask,
    block_hidden_states,
    dflash_block_loss,
    drafter_core,
    flex_block_mask,
    block_inputs,
    pad_anchors,
    target_features,
    vocab_rows,
)
from tiny import continuations, prompts, tiny_target

BLOCK = 8
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", seed=0)


@pytest.fixture(scope="module")
def train_prompts():
    return prompts(8, seed=3)


@pytest.fixture(scope="module")
def rows(target, train_prompts):
    """The target's own greedy continuations, pre-tokenized (`input_ids` + `loss_mask` on the response)."""
    return [{"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for i, (ids, mask) in enumerate(continuations(target, train_prompts, NEW_TOKENS))]


def quick(**overrides):
    """A tiny-model configuration: small blocks, a high lr, no held-out slice, no checkpoints."""
    base = dict(block_size=BLOCK, num_layers=2, lr=5e-3, max_anchors=16, eval_size=0, progress=False,
                checkpoint_every=0)
    base.update(overrides)
    return TrainConfig(**base)


def drafts_and_taus(target, drafter, prompt_list):
    """Generated ids, per-round drafts and acceptance lengths of greedy speculative generation."""
    core = drafter_core(drafter)
    outs, drafts, lengths = [], [], []
    for p in prompt_list:
        outs.append(target.generate(p, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False))
        drafts.append(core.last_stats.drafts)
        lengths.append(core.last_stats.acceptance_lengths)
    return outs, drafts, lengths


@pytest.fixture(scope="module")
def dflash_run(target, rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash")
    drafter = train_drafter(target, None, rows, out, quick(max_steps=300))
    return out, drafter


# ------------------------------------------------------------------------------ attention rule
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_block_sees_only_context_before_its_anchor_and_its_own_block(target, impl):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=4).eval()
    drafter.config._attn_implementation = impl
    T, B = 24, 4
    ids = torch.randint(3, 90, (T,))
    mask = torch.ones(T, dtype=torch.bool)
    anchors = torch.tensor([5, 11])
    feats = torch.randn(1, T, drafter.fc.in_features)

    def run(ids=ids, feats=feats):
        with torch.no_grad():
            hidden, _, _ = block_hidden_states(drafter, target, ids, mask, anchors, features=feats)
        return hidden[0, :B], hidden[0, B:]  # block 0 (anchor 5), block 1 (anchor 11)

    first, second = run()

    def perturbed_features(positions):
        f = feats.clone()
        f[:, positions] += torch.randn_like(f[:, positions])
        return f

    # Features at or after the anchor are invisible...
    a, b = run(feats=perturbed_features(slice(5, T)))
    assert torch.equal(a, first) and not torch.allclose(b, second)
    a, b = run(feats=perturbed_features(slice(11, T)))
    assert torch.equal(a, first) and torch.equal(b, second)
    # ...and those just before it are seen.
    a, _ = run(feats=perturbed_features([4]))
    assert not torch.allclose(a, first)
    _, b = run(feats=perturbed_features([10]))
    assert not torch.allclose(b, second)
    # Blocks are isolated from each other, but see their own anchor token.
    other = ids.clone()
    other[11] = (other[11] + 1 - 3) % 87 + 3
    a, b = run(ids=other)
    assert torch.equal(a, first) and not torch.allclose(b, second)


def test_batched_blocks_match_single_sequences(target):
    torch.manual_seed(1)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=4).eval()
    seqs = [torch.randint(3, 90, (20,)), torch.randint(3, 90, (13,))]
    anchors = [torch.tensor([2, 9, 15]), torch.tensor([4])]
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : s.numel()] = s
        mask[i, 3 : s.numel()] = True
    with torch.no_grad():
        batched, _, valid = block_hidden_states(drafter, target, ids, mask, pad_anchors(anchors))
        for i, s in enumerate(seqs):
            single, _, single_valid = block_hidden_states(drafter, target, s, mask[i, : s.numel()], anchors[i])
            n = single.shape[1]
            torch.testing.assert_close(batched[i, :n], single[0], atol=1e-5, rtol=1e-5)
            assert torch.equal(valid[i, :n], single_valid[0]) and not valid[i, n:].any()  # padding blocks: no labels


def test_flex_block_mask_equals_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    anchors = pad_anchors([torch.tensor([1, 6, 30]), torch.tensor([3])])
    T, B = 40, 4
    block_mask = flex_block_mask(T, anchors, B)
    q = anchors.shape[1] * B
    dense = create_mask(block_mask.mask_mod, 2, 1, q, T + q, device="cpu")
    assert torch.equal(dense, block_attention_mask(T, anchors, B))


def _assert_same_loss_stats_and_grads(target, rows, options):
    """dflash_block_loss under each dict of keyword options: identical loss, accuracy stats and fc gradient."""
    torch.manual_seed(2)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=BLOCK)
    ids, mask = torch.tensor(rows[0]["input_ids"]), torch.tensor(rows[0]["loss_mask"]).bool()
    anchors = torch.tensor([5, 12, 20, 30])
    results = []
    for kwargs in options:
        drafter.zero_grad()
        loss, stats = dflash_block_loss(drafter, target, ids, mask, anchors, **kwargs)
        loss.backward()
        results.append((loss.detach(), stats["correct"], drafter.fc.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    torch.testing.assert_close(results[0][2], results[1][2])
    return drafter, ids, mask, anchors


@pytest.mark.parametrize("recompute_above", [4096, 3])
def test_chunked_lm_head_gives_the_same_loss_and_gradients(target, rows, monkeypatch, recompute_above):
    """Chunks of 5 slots equal one chunk, with the chunks kept for backward and with them recomputed (above
    `LOGITS_CHUNK` slots in all; lowered here so a tiny row crosses it)."""
    from dflash_retrace.training import objective

    calls = []
    checkpoint = objective.checkpoint
    monkeypatch.setattr(objective, "LOGITS_CHUNK", recompute_above)
    monkeypatch.setattr(objective, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    _assert_same_loss_stats_and_grads(target, rows, [{"logits_chunk": 100_000}, {"logits_chunk": 5}])
    assert bool(calls) == (recompute_above == 3)


def test_default_logits_chunk_is_sized_by_the_head_it_runs(target, rows, monkeypatch):
    """logits_chunk=None sizes the chunk by the width of the head the loss runs over: the full head, a loss
    vocabulary, or the drafter's draft vocabulary."""
    from dflash_retrace.training import objective

    widths = []
    size = objective.logits_chunk_size
    monkeypatch.setattr(objective, "logits_chunk_size", lambda device, w: widths.append(w) or size(device, w))
    torch.manual_seed(2)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=BLOCK)
    ids, mask = torch.tensor(rows[0]["input_ids"]), torch.tensor(rows[0]["loss_mask"]).bool()
    anchors = torch.tensor([5, 12, 20, 30])
    vocab = vocab_rows([torch.tensor(r["input_ids"]) for r in rows])
    dflash_block_loss(drafter, target, ids, mask, anchors)
    dflash_block_loss(drafter, target, ids, mask, anchors, vocab=vocab)
    drafter.set_draft_vocabulary(vocab[:40])
    dflash_block_loss(drafter, target, ids, mask, anchors)
    assert widths == [target.get_output_embeddings().weight.shape[0], vocab.numel(), 40]


def test_logits_chunk_size_keeps_cpu_buffers_small():
    from dflash_retrace.training.objective import CPU_LOGITS_BYTES, LOGITS_CHUNK, logits_chunk_size

    assert logits_chunk_size("cpu", 8192) == 512  # the shipped draft vocabulary: 16 MiB of fp32 logits
    assert logits_chunk_size("cpu", 49152) * 49152 * 4 <= CPU_LOGITS_BYTES
    assert logits_chunk_size(torch.device("cpu"), 10 ** 7) == 64  # never below 64 slots
    assert logits_chunk_size("cuda", 8192) == LOGITS_CHUNK


def test_data_vocabulary_loss_is_the_softmax_over_those_rows(target, rows):
    """loss_vocab="data": the same CE as a softmax restricted by hand; all rows = the full loss and gradients."""
    vocab_size = target.get_output_embeddings().weight.shape[0]
    drafter, ids, mask, anchors = _assert_same_loss_stats_and_grads(
        target, rows, [{"vocab": None}, {"vocab": torch.arange(vocab_size)}])

    vocab = vocab_rows([torch.tensor(r["input_ids"]) for r in rows])
    assert 0 < vocab.numel() < vocab_size and torch.equal(vocab, vocab.sort().values)
    with torch.no_grad():
        loss, stats = dflash_block_loss(drafter, target, ids, mask, anchors, vocab=vocab)
        hidden, labels, valid = block_hidden_states(drafter, target, ids, mask, anchors)
        logits = drafter.compute_logits(hidden[valid], target.get_output_embeddings())[:, vocab]
        position = {int(t): i for i, t in enumerate(vocab)}
        ce = torch.nn.functional.cross_entropy(logits, torch.tensor([position[int(t)] for t in labels[valid]]),
                                               reduction="none")
        slot = torch.arange(BLOCK).repeat(anchors.numel())[None].expand_as(valid)[valid]
        w = torch.exp(-(slot.float() - 1) / 4.0)
    torch.testing.assert_close(loss, (ce * w).sum() / w.sum())
    assert stats["correct"].sum() == (vocab[logits.argmax(-1)] == labels[valid]).sum()
    with pytest.raises(ValueError, match="outside the loss vocabulary"):
        dflash_block_loss(drafter, target, ids, mask, anchors, vocab=vocab[vocab != labels[valid][0]])


def test_target_labels_are_the_targets_own_next_tokens(target, rows):
    """labels="target": on the target's greedy output they are the tokens themselves (same loss); on other text
    each is the target's argmax after the true prefix, and the anchors stay the sequence's own tokens."""
    torch.manual_seed(2)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=BLOCK)
    layers = drafter.config.target_layer_ids
    ids, mask = torch.tensor(rows[0]["input_ids"]), torch.tensor(rows[0]["loss_mask"]).bool()
    anchors = torch.tensor([5, 12, 20, 30])
    features, labels = target_features(target, ids[None], layers, with_labels=True)
    assert torch.equal(labels[0][mask], ids[mask])  # greedy continuation: argmax of each prefix = next token
    with torch.no_grad():
        a, _ = dflash_block_loss(drafter, target, ids, mask, anchors, features=features)
        b, _ = dflash_block_loss(drafter, target, ids, mask, anchors, features=features, label_ids=labels[0])
    torch.testing.assert_close(a, b)

    g = torch.Generator().manual_seed(0)
    other = ids.clone()
    other[mask] = torch.randint(3, target.config.vocab_size, (int(mask.sum()),), generator=g)  # not the target's
    _, labels = target_features(target, other[None], layers, with_labels=True)
    logits = target(other[None]).logits[0]
    assert torch.equal(labels[0, 1:], logits[:-1].argmax(-1)) and not torch.equal(labels[0][mask], other[mask])
    block_ids, positions, got, valid = block_inputs(other, mask, anchors, BLOCK, 0, label_ids=labels[0])
    assert torch.equal(got, labels[0][positions.clamp_max(other.numel() - 1)])
    assert torch.equal(block_ids[::BLOCK], other[anchors])  # the anchor is the token itself, never a label


def test_block_size_override_retargets_an_init_drafter(target, rows, tmp_path):
    torch.manual_seed(0)
    DFlashDrafter.from_target(target, num_hidden_layers=1, block_size=BLOCK).save_pretrained(tmp_path / "init")
    out = train_drafter(target, None, rows, tmp_path / "run", quick(init=str(tmp_path / "init"), block_size=4,
                                                                      max_steps=2, loss_vocab="data"))
    assert out.config.block_size == 4 and out.train_summary["block_size"] == 4
    eos = target.generation_config.eos_token_id
    expected = vocab_rows([torch.tensor(r["input_ids"]) for r in rows], [] if eos is None else [eos])
    assert out.train_summary["loss_vocab_size"] == expected.numel()
    assert DFlashDrafter.from_pretrained(tmp_path / "run").config.block_size == 4
    # The ReTrace stage trains on its rolled-out continuations: its loss vocabulary comes from those.
    tl = train_drafter(target, None, rows, tmp_path / "tl", quick(init=str(tmp_path / "run"), block_size=None,
                                                                  max_steps=2, loss_vocab="data", labels="target"))
    assert tl.train_summary["steps"] == 2
    with pytest.raises(ValueError, match="labels"):
        quick(labels="teacher").resolved()
    rt_config = quick(stage="retrace", init=str(tmp_path / "run"), block_size=None, max_steps=2, loss_vocab="data")
    rt = train_drafter(target, None, rows, tmp_path / "rt", rt_config)
    assert rt.config.block_size == 4 and rt.train_summary["loss_vocab_size"] > 0
    with pytest.raises(ValueError, match="loss_vocab"):
        quick(loss_vocab="some").resolved()


# ------------------------------------------------------------------------------------ trainer
@pytest.mark.slow
def test_dflash_training_raises_tau(target, train_prompts, dflash_run):
    out, drafter = dflash_run
    torch.manual_seed(0)  # the trainer's seed: the same initial weights
    untrained = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=BLOCK)
    before = measure_acceptance(target, untrained, train_prompts, NEW_TOKENS)
    after = measure_acceptance(target, drafter, train_prompts, NEW_TOKENS)
    assert before["tau"] < 1.3
    assert after["tau"] > 1.8, (before, after)

    # The target is frozen: its weights are the fixture's original ones.
    fresh = tiny_target("qwen3", seed=0)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), target.state_dict().values()))
    assert all(not p.requires_grad for p in target.parameters())

    # Saved with save_pretrained (payload code + auto_map): both loaders give the same drafts.
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["final_loss"] > 0
    _, drafts, lengths = drafts_and_taus(target, drafter, train_prompts[:3])
    for loaded in (DFlashDrafter.from_pretrained(out), AutoModel.from_pretrained(out, trust_remote_code=True)):
        _, d2, l2 = drafts_and_taus(target, loaded, train_prompts[:3])
        assert d2 == drafts and l2 == lengths


def test_held_out_summary(target, rows, tmp_path):
    drafter = train_drafter(target, None, rows, tmp_path, quick(max_steps=4, eval_size=2, eval_prompts=2,
                                                                eval_max_new_tokens=12))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == drafter.train_summary
    assert summary["train_sequences"] == 6 and summary["held_out_sequences"] == 2
    assert len(summary["held_out_slot_accuracy"]) == BLOCK - 1
    assert 1.0 <= summary["held_out_tau"] <= BLOCK and summary["held_out_rounds"] > 0
    assert json.loads((tmp_path / "train_config.json").read_text())["lr"] == 5e-3


def test_resume_after_a_crash_matches_an_uninterrupted_run(target, rows, tmp_path, monkeypatch):
    # 2 sequences x 2 micro-batches per update: 2 updates per epoch, so the run crosses epochs.
    config = quick(max_steps=7, batch_size=2, grad_accum=2, checkpoint_every=3, keep_checkpoints=1)
    reference = train_drafter(target, None, rows, tmp_path / "straight", config)

    calls = {"n": 0}
    real_loss = training_loop.dflash_block_loss

    def crashing_loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 * 5 + 1:  # first micro-batch of update 6
            raise KeyboardInterrupt("killed")
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(training_loop, "dflash_block_loss", crashing_loss)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(target, None, rows, tmp_path / "crashed", config)
    monkeypatch.setattr(training_loop, "dflash_block_loss", real_loss)
    assert latest_checkpoint(tmp_path / "crashed").name == "step-3"
    assert [p.name for p in (tmp_path / "crashed" / "checkpoints").iterdir()] == ["step-3"]  # older ones rotated

    resumed = train_drafter(target, None, rows, tmp_path / "crashed", dataclass_replace(config, resume=True))
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert reference.train_summary["final_loss"] == resumed.train_summary["final_loss"]


def dataclass_replace(config, **changes):
    
    return dataclasses.replace(config, **changes)


# ------------------------------------------------------------------------------------ ReTrace
@pytest.mark.slow
def test_retrace_stage_starts_as_dflash_and_does_not_lose_tau(target, rows, train_prompts, dflash_run, tmp_path):
    dflash_dir, dflash = dflash_run
    outs, drafts, lengths = drafts_and_taus(target, dflash, train_prompts)

    # Step 0: ReTrace weights added (W_v = 0), no update: the very same drafts and acceptance.
    start = train_drafter(target, None, rows, tmp_path / "rt0",
                          quick(stage="retrace", init=str(dflash_dir), max_steps=0))
    assert start.retrace is not None and not start.retrace.value.weight.any()
    o0, d0, l0 = drafts_and_taus(target, start, train_prompts)
    assert d0 == drafts and l0 == lengths and all(torch.equal(a, b) for a, b in zip(o0, outs))
    pooled = sum(map(sum, lengths)) / sum(map(len, lengths))
    assert start.train_summary["rollout_tau_start"] == pytest.approx(pooled)

    trained = train_drafter(target, None, rows, tmp_path / "rt", quick(
        stage="retrace", init=str(dflash_dir), max_steps=100, lr=1e-3, beta_warmup=20, max_anchors=64))
    assert trained.retrace.value.weight.abs().sum() > 0 and trained.config.retrace_beta == 1.0
    assert trained.config.retrace_beta == 1.0
    rollout = torch.load(tmp_path / "rt" / "rollouts" / "0000000.pt", weights_only=True)
    assert rollout["valid"].any() and not rollout["valid"][:, 0].any()  # memory recorded; slot 0 never conditioned
    after = measure_acceptance(target, trained, train_prompts, NEW_TOKENS)
    before = measure_acceptance(target, dflash, train_prompts, NEW_TOKENS)
    assert after["tau"] >= before["tau"], (before, after)
    assert after["conditioned_slots"] > 0  # the memory is in use
    o1, _, _ = drafts_and_taus(target, trained, train_prompts[:2])
    assert all(torch.equal(a, b) for a, b in zip(o1, outs[:2]))  # lossless: the target's greedy output
    reloaded = AutoModel.from_pretrained(tmp_path / "rt", trust_remote_code=True)
    _, d2, _ = drafts_and_taus(target, reloaded, train_prompts[:2])
    _, d1, _ = drafts_and_taus(target, trained, train_prompts[:2])
    assert d2 == d1


def test_replayed_rounds_reproduce_the_generators_drafter_states(target, rows, dflash_run, tmp_path):
    """Replay = inference: a round replayed as a training block (anchor, context < anchor, recorded memory) gives
    the drafter states the generator computed, which the next round's memory holds for the rejected slots."""
    dflash_dir, _ = dflash_run
    drafter = DFlashDrafter.from_pretrained(dflash_dir).add_retrace()
    torch.manual_seed(0)
    for linear in (drafter.retrace.value, drafter.retrace.correction, drafter.retrace.gate):
        linear.weight.data.normal_(0.0, 0.05)  # non-zero W_v: the memory changes the states
    drafter = train_drafter(target, None, rows, tmp_path, quick(stage="retrace", max_steps=0), drafter=drafter)
    checked = 0
    for path in sorted((tmp_path / "rollouts").glob("*.pt")):
        rollout = torch.load(path, weights_only=True)
        ids, mask, anchors, memory = training_data.collate([(0, rollout)], BLOCK, 10**6, 0, 0,
                                                            drafter.config.hidden_size)
        with torch.no_grad():
            hidden, _, _ = block_hidden_states(drafter, target, ids, mask, anchors, retrace_memory=memory)
        hidden = hidden[0].view(-1, BLOCK, hidden.shape[-1])  # (rounds, B, H)
        anchors, rows_of = rollout["anchors"].tolist(), rollout["memory_index"].tolist()
        for r in range(len(anchors) - 1):
            row = rows_of[r + 1]
            if row < 0:
                continue
            shift = anchors[r + 1] - anchors[r]  # a + 1: new slot i holds old slot i + a + 1
            for i in rollout["valid"][row].nonzero().view(-1).tolist():
                torch.testing.assert_close(hidden[r, i + shift], rollout["m"][row, i], atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked > 20


def test_retrace_freeze_backbone_trains_retrace_weights_only(target, rows, dflash_run, tmp_path):
    dflash_dir, dflash = dflash_run
    trained = train_drafter(target, None, rows, tmp_path, quick(
        stage="retrace", init=str(dflash_dir), max_steps=5, lr=1e-2, beta_warmup=2, freeze_backbone=True))
    base = dflash.state_dict()
    for name, value in trained.state_dict().items():
        if name.startswith("retrace."):
            continue
        assert torch.equal(value, base[name]), name
    assert trained.retrace.value.weight.any()


def test_retrace_rollouts_sample_a_seeded_share_of_rows(target, rows, dflash_run, tmp_path):
    dflash_dir, _ = dflash_run
    config = quick(stage="retrace", init=str(dflash_dir), max_steps=1, rollout_temperature=1.0,
                   rollout_sampled_share=0.5, seed=5)

    def recorded(out):
        return [torch.load(f, weights_only=True) for f in sorted((out / "rollouts").glob("*.pt"))]

    train_drafter(target, None, rows, tmp_path / "a", config)
    first = recorded(tmp_path / "a")
    assert len(first) == len(rows) and {r["temperature"] for r in first} == {0.0, 1.0}
    greedy = [row["input_ids"] for row in rows]  # the target's own greedy continuations
    assert all(r["input_ids"].tolist() in greedy for r in first if r["temperature"] == 0.0)
    assert any(r["input_ids"].tolist() not in greedy for r in first if r["temperature"] == 1.0)
    # Seeded per row: a second run samples the same rows and the same tokens.
    train_drafter(target, None, rows, tmp_path / "b", config)
    second = recorded(tmp_path / "b")
    assert [(r["temperature"], r["input_ids"].tolist()) for r in second] == \
           [(r["temperature"], r["input_ids"].tolist()) for r in first]
    # Resuming with other rollouts would mix them: refused.
    with pytest.raises(ValueError, match="rollout-temperature"):
        train_drafter(target, None, rows, tmp_path / "a", dataclasses.replace(config, rollout_temperature=0.7,
                                                                             resume=True))
    with pytest.raises(ValueError, match="stage"):
        quick(rollout_temperature=1.0).resolved()
    with pytest.raises(ValueError, match="rollout_sampled_share"):
        quick(stage="retrace", rollout_sampled_share=1.5).resolved()


def test_retrace_needs_a_drafter(target, rows, tmp_path):
    with pytest.raises(ValueError, match="--init"):
        train_drafter(target, None, rows, tmp_path, quick(stage="retrace", max_steps=1))


# --------------------------------------------------------------------------------------- LoRA
@pytest.mark.slow
def test_lora_trains_adapters_only_and_round_trips(target, rows, train_prompts, dflash_run, tmp_path):
    from peft import PeftModel

    dflash_dir, _ = dflash_run
    peft_model = train_drafter(target, None, rows, tmp_path, quick(init=str(dflash_dir), lora=True, max_steps=30,
                                                                   lr=1e-2, lora_r=4))
    assert isinstance(peft_model, PeftModel)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(LORA_TARGETS)
    assert config["base_model_name_or_path"] == str(dflash_dir.resolve())

    # Base weights bit-identical; adapters trained.
    init = DFlashDrafter.from_pretrained(dflash_dir).state_dict()
    lora_b = 0.0
    for name, value in peft_model.get_base_model().state_dict().items():
        if "lora_" in name:
            lora_b += float(value.abs().sum()) if "lora_B" in name else 0.0
            continue
        assert torch.equal(value, init[name.replace("base_layer.", "")]), name
    assert lora_b > 0

    # The PeftModel itself is an assistant (the dispatch unwraps it): our generator runs, output is lossless.
    plain = [target.generate(p, max_new_tokens=NEW_TOKENS, do_sample=False) for p in train_prompts[:3]]
    peft_model.get_base_model().last_stats = None
    outs, drafts, _ = drafts_and_taus(target, peft_model, train_prompts[:3])
    assert all(torch.equal(a, b) for a, b in zip(outs, plain)) and all(drafts)

    # Reload on both kinds of base, then merge: the same drafts every time.
    remote_code_base = AutoModel.from_pretrained(dflash_dir, trust_remote_code=True)
    for base in (remote_code_base, DFlashDrafter.from_pretrained(dflash_dir)):
        loaded = PeftModel.from_pretrained(base, tmp_path)
        assert drafts_and_taus(target, loaded, train_prompts[:3])[1] == drafts
    merged = PeftModel.from_pretrained(DFlashDrafter.from_pretrained(dflash_dir), tmp_path).merge_and_unload()
    assert type(merged) is DFlashDrafter and not any("lora_" in n for n, _ in merged.named_parameters())
    assert drafts_and_taus(target, merged, train_prompts[:3])[1] == drafts
    merged.save_pretrained(tmp_path / "merged")
    again = AutoModel.from_pretrained(tmp_path / "merged", trust_remote_code=True)
    assert drafts_and_taus(target, again, train_prompts[:3])[1] == drafts


def test_lora_retrace_saves_its_base(target, rows, train_prompts, dflash_run, tmp_path):
    from peft import PeftModel

    dflash_dir, _ = dflash_run
    peft_model = train_drafter(target, None, rows, tmp_path, quick(
        stage="retrace", init=str(dflash_dir), lora=True, max_steps=6, lr=1e-2, beta_warmup=2, lora_r=4))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    assert config["modules_to_save"] == ["retrace"]
    base = DFlashDrafter.from_pretrained(tmp_path / "base")
    assert base.retrace is not None and not base.retrace.value.weight.any()  # the zero-initialised start
    _, drafts, _ = drafts_and_taus(target, peft_model, train_prompts[:2])
    loaded = PeftModel.from_pretrained(base, tmp_path)
    assert drafts_and_taus(target, loaded, train_prompts[:2])[1] == drafts
    merged = loaded.merge_and_unload()
    assert merged.retrace.value.weight.any()
    assert drafts_and_taus(target, merged, train_prompts[:2])[1] == drafts


# ----------------------------------------------------------------------------------------- DDP
DDP_SCRIPT = """
import os, sys, torch
from accelerate import PartialState
from tiny import continuations, prompts, tiny_target
from dflash_retrace.training import TrainConfig, train_drafter
out, stage = sys.argv[1], sys.argv[2]
target = tiny_target("qwen3", seed=0)
rows = [{"input_ids": i.tolist(), "loss_mask": m.long().tolist()}
        for i, m in continuations(target, prompts(8, seed=3), 24)]
config = TrainConfig(stage=stage, init=sys.argv[3] if stage == "retrace" else None, block_size=8, num_layers=1, lr=1e-3,
                     max_anchors=8, eval_size=2, eval_prompts=1, eval_max_new_tokens=8, progress=False,
                     checkpoint_every=2, max_steps=3, resume="--resume" in sys.argv)
drafter = train_drafter(target, None, rows, out, config)
weights = torch.cat([p.detach().flatten() for p in drafter.parameters()])
state = PartialState()
# One file per rank: two ranks printing to one pipe can interleave their lines.
with open(os.path.join(os.environ["RESULT_DIR"], f"rank{state.process_index}.txt"), "w") as f:
    f.write(f"{state.process_index} {state.num_processes} {float(weights.abs().sum())!r}")
"""


@pytest.mark.slow
def test_torchrun_two_processes_train_both_stages(tmp_path):
    """DDP on CPU (gloo) through torchrun: both ranks end with the same weights; a resumed run reproduces them."""
    import os
    import pathlib
    import subprocess
    import sys

    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT)
    tests = str(pathlib.Path(__file__).parent)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}

    def launch(*args):
        result_dir = tmp_path / f"results-{len(list(tmp_path.glob('results-*')))}"
        result_dir.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script), *args]
        done = subprocess.run(cmd, env={**env, "RESULT_DIR": str(result_dir)}, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        results = sorted(p.read_text().split() for p in result_dir.glob("rank*.txt"))
        assert [r[:2] for r in results] == [["0", "2"], ["1", "2"]]
        assert results[0][2] == results[1][2]  # DDP kept the ranks identical
        return results[0][2]

    first = launch(str(tmp_path / "d"), "dflash")
    assert launch(str(tmp_path / "d"), "dflash", "--resume") == first  # from checkpoints/step-2
    launch(str(tmp_path / "rt"), "retrace", str(tmp_path / "d"))
    assert len(list((tmp_path / "rt" / "rollouts").glob("*.pt"))) == 6  # both ranks rolled out their share


# ---------------------------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_bf16_training_all_stages(train_prompts, tmp_path):
    from peft import PeftModel

    target = tiny_target("qwen3", seed=0).to("cuda", torch.bfloat16)
    cuda_prompts = [p.cuda() for p in train_prompts]
    rows = [{"input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for ids, mask in continuations(target, cuda_prompts, NEW_TOKENS)]
    drafter = train_drafter(target, None, rows, tmp_path / "d", quick(max_steps=300, mixed_precision="bf16"))
    param = next(drafter.parameters())
    assert param.device.type == "cuda" and param.dtype == torch.bfloat16  # saved/returned in the target's dtype
    dflash = measure_acceptance(target, drafter, cuda_prompts, NEW_TOKENS)
    assert dflash["tau"] > 1.8, dflash

    rt = train_drafter(target, None, rows, tmp_path / "rt", quick(
        stage="retrace", init=str(tmp_path / "d"), max_steps=40, lr=1e-3, beta_warmup=10, mixed_precision="bf16"))
    assert torch.load(tmp_path / "rt" / "rollouts" / "0000000.pt", weights_only=True)["m"].dtype == torch.bfloat16
    retrace = measure_acceptance(target, rt, cuda_prompts, NEW_TOKENS)
    assert retrace["tau"] > 1.8 and retrace["conditioned_slots"] > 0, retrace

    lora = train_drafter(target, None, rows, tmp_path / "lora", quick(
        init=str(tmp_path / "d"), lora=True, max_steps=20, lr=1e-3, mixed_precision="bf16"))
    assert isinstance(lora, PeftModel)
    assert measure_acceptance(target, lora, cuda_prompts[:2], NEW_TOKENS)["rounds"] > 0
    print("cuda taus: dflash", dflash, "retrace", retrace)


@cuda
def test_cuda_flex_attention_matches_dense(rows, tmp_path):
    target = tiny_target("qwen3", seed=0).cuda()
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, num_hidden_layers=2, block_size=BLOCK).eval()
    ids = torch.tensor([r["input_ids"] for r in rows[:2]])  # (2, T): equal lengths
    mask = torch.tensor([r["loss_mask"] for r in rows[:2]]).bool()
    anchors = pad_anchors([torch.tensor([6, 10, 20, 33]), torch.tensor([7, 15])])
    with torch.no_grad():
        dense, _, valid = block_hidden_states(drafter, target, ids, mask, anchors, attention="dense")
        drafter.config._attn_implementation = "flex_attention"
        flex, _, _ = block_hidden_states(drafter, target, ids, mask, anchors, attention="flex")
    torch.testing.assert_close(flex[valid], dense[valid], atol=2e-3, rtol=2e-3)
    trained = train_drafter(target, None, rows, tmp_path, quick(max_steps=5, attention="flex"))
    assert trained.config._attn_implementation == "flex_attention"
