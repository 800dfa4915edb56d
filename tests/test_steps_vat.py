"""PAD-Rec step-position embeddings (`step_embeddings=True`) and VAT, verification-aware training (`--loss vat`)."""

import copy
import json
import math

import pytest
import torch
from transformers import AutoModel

from dflash_retrace import DFlashDrafter, cli
from dflash_retrace.configuration_dflash import DFlashConfig
from dflash_retrace.training import TrainConfig, train_drafter
from dflash_retrace.training.objective import block_hidden_states, dflash_block_loss, slot_weights, vat_weights
from test_remote_code import _run as run_remote
from tiny import continuations, prompts, tiny_tokenizer

B = 8


def live(drafter, seed=5, retrace=False):
    """Non-zero step weights (and ReTrace weights if asked): the option really changes the drafts."""
    out = copy.deepcopy(drafter).add_step_embeddings()
    if retrace:
        out.add_retrace()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name.startswith(("steps.", "retrace.")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return out.eval()


@pytest.fixture(scope="module")
def live_steps(qwen3_drafter):
    return live(qwen3_drafter)


def run(target, drafter, prompt, max_new_tokens=40):
    """(output ids, per-round drafts, acceptance lengths) of greedy speculative generation."""
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
    core = drafter.get_base_model() if hasattr(drafter, "get_base_model") else drafter
    return out, core.last_stats.drafts, core.last_stats.acceptance_lengths


# ------------------------------------------------------------------------------ (1) zero-init
def test_zero_initialised_steps_are_the_dflash_drafter(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path, step_embeddings=True).eval()  # meta-device load, steps.* missing
    added = copy.deepcopy(qwen3_drafter).add_step_embeddings().eval()
    longest = 1
    for drafter in (loaded, added):
        assert drafter.config.step_embeddings and not drafter.steps.table.any()
        assert sorted(k for k in drafter.state_dict() if k.startswith("steps.")) == [
            "steps.gate.bias", "steps.gate.weight", "steps.table"]
        assert drafter.steps.gate.weight.abs().max() < 1  # initialised, not left as empty memory
    for prompt in train_prompts[:4] + prompts(2, seed=77):
        ref, ref_drafts, ref_lengths = run(qwen3_target, qwen3_drafter, prompt)
        for drafter in (loaded, added):
            out, drafts, lengths = run(qwen3_target, drafter, prompt)
            assert torch.equal(out, ref) and drafts == ref_drafts and lengths == ref_lengths
        longest = max(longest, *ref_lengths)
    assert longest > 2  # a drafter that drafts: the comparison means something


# ------------------------------------------------------------------ (2) live steps stay lossless
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_live_steps_greedy_equals_target(request, family, train_prompts):
    target = request.getfixturevalue(f"{family}_target")
    drafter = live(request.getfixturevalue(f"{family}_drafter"), seed=11)
    for max_new_tokens in (1, 2, B - 1, B, B + 1, 2 * B + 3, 40):  # budgets that shorten the last block
        for prompt in train_prompts[:2] + prompts(2, length=9, seed=99):
            ref = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
            out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
            assert torch.equal(ref, out), (family, max_new_tokens)


def test_live_steps_with_retrace_greedy_equals_target(qwen3_target, qwen3_drafter, train_prompts):
    drafter = live(qwen3_drafter, seed=3, retrace=True)
    conditioned = 0
    for max_new_tokens in (B - 1, B + 1, 40):
        for prompt in train_prompts[:3]:
            ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens)
            out, _, _ = run(qwen3_target, drafter, prompt, max_new_tokens)
            assert torch.equal(ref, out)
            conditioned += sum(drafter.last_stats.conditioned_slots)
    assert conditioned > 0  # ReTrace memory was fed alongside the step embeddings


def test_live_steps_change_the_drafts(qwen3_target, qwen3_drafter, live_steps, train_prompts):
    changed = 0
    for prompt in train_prompts[:3]:
        _, plain, _ = run(qwen3_target, qwen3_drafter, prompt)
        _, steps, _ = run(qwen3_target, live_steps, prompt)
        changed += plain != steps
    assert changed > 0


# ------------------------------------------------------------- (3) save + trust_remote_code
def test_saved_steps_drafter_runs_through_remote_code_in_a_fresh_process(qwen3_target, live_steps, train_prompts,
                                                                          tmp_path):
    qwen3_target.save_pretrained(tmp_path / "target")
    live_steps.save_pretrained(tmp_path / "drafter")
    assert (tmp_path / "drafter" / "steps_dflash.py").is_file()
    assert json.loads((tmp_path / "drafter" / "config.json").read_text())["step_embeddings"] is True
    chosen = train_prompts[:3]
    result = run_remote(tmp_path / "target", tmp_path / "drafter", [p[0].tolist() for p in chosen])
    assert result["modules"] == [] and all(m.startswith("transformers_modules") for m in result["submodules"]
                                           if "dflash" in m)
    assert any(m.endswith("steps_dflash") for m in result["submodules"])
    for prompt, out, drafts in zip(chosen, result["outputs"], result["drafts"]):
        ref, ref_drafts, _ = run(qwen3_target, live_steps, prompt, 30)
        assert out == ref[0].tolist() and drafts == ref_drafts


# ------------------------------------------------------------------------------------ (4) PEFT
def test_peft_lora_on_a_steps_drafter(qwen3_target, live_steps, train_prompts):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc"], lora_dropout=0.0,
                             modules_to_save=["steps"])
    wrapped = peft.get_peft_model(copy.deepcopy(live_steps), config).eval()
    for prompt in train_prompts[:2]:
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=24)
        out, drafts, _ = run(qwen3_target, wrapped, prompt, 24)
        assert torch.equal(ref, out)
        _, base_drafts, _ = run(qwen3_target, live_steps, prompt, 24)
        assert drafts == base_drafts  # LoRA B = 0; the steps copy equals the base's


# ------------------------------------------------------------------------ the equation, by hand
def test_step_terms_by_hand(live_steps):
    """e'_i = e_i + sigmoid(W_g c + b)_i * E_i for slots i >= 1, c = context row of position anchor - 1; the anchor
    slot is untouched. A training stream (two blocks, context at 0..T-1) and a short single block (context rows
    for positions 6..9 only, anchor 10, three slots as near the budget)."""
    steps = live_steps.steps
    H = live_steps.config.hidden_size

    def expected(embeds, c_rows):
        out = embeds.clone()
        for j in range(embeds.shape[1]):
            block, slot = divmod(j, B)
            if slot:
                g = torch.sigmoid(steps.gate.weight[slot] @ c_rows[block] + steps.gate.bias[slot])
                out[0, j] += g * steps.table[slot]
        return out

    g = torch.Generator().manual_seed(1)
    context, embeds = torch.randn(1, 20, H, generator=g), torch.randn(1, 2 * B, H, generator=g)
    anchors = [4, 11]
    positions = torch.cat([torch.arange(20), torch.arange(4, 4 + B), torch.arange(11, 11 + B)])[None]
    with torch.no_grad():
        got = steps(embeds, context, positions, B)
        torch.testing.assert_close(got, expected(embeds, [context[0, a - 1] for a in anchors]))
        assert torch.equal(got[0, ::B], embeds[0, ::B])
        short = steps(embeds[:, :3], context[:, :4], torch.arange(6, 13)[None], B)
        torch.testing.assert_close(short, expected(embeds[:, :3], [context[0, 3]]))


# ------------------------------------------------------------- (5) training gate = inference gate
@pytest.mark.parametrize("attention", ["dense", "local"])
def test_training_stream_reproduces_the_generators_blocks(qwen3_target, live_steps, train_prompts, attention):
    """Every full-length block the generator drafted (gate read from the newest context row) is reproduced by the
    training query stream on the final sequence (gate read from row anchor - 1 of the whole context)."""
    calls = []
    handle = live_steps.register_forward_hook(
        lambda module, args, kwargs, out: calls.append((kwargs["position_ids"][0], out.last_hidden_state[0])),
        with_kwargs=True)
    try:
        prompt = train_prompts[5]
        seq = qwen3_target.generate(prompt, assistant_model=live_steps, do_sample=False, max_new_tokens=40)[0]
    finally:
        handle.remove()
    full = [(int(pos[-B]), states) for pos, states in calls if states.shape[0] == B]
    assert len(full) >= 3 and len({a for a, _ in full}) == len(full)
    mask = torch.zeros(seq.numel(), dtype=torch.bool)
    mask[prompt.shape[1]:] = True
    with torch.no_grad():
        hidden, _, _ = block_hidden_states(live_steps, qwen3_target, seq, mask, torch.tensor([a for a, _ in full]),
                                           attention=attention)
    hidden = hidden[0].view(len(full), B, -1)
    for n, (_, states) in enumerate(full):
        torch.testing.assert_close(hidden[n], states, atol=1e-4, rtol=1e-4)


def test_padding_blocks_are_finite_and_batches_match_single_sequences(qwen3_target, live_steps):
    from dflash_retrace.training.objective import pad_anchors

    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 90, (20,), generator=g), torch.randint(3, 90, (13,), generator=g)]
    anchors = [torch.tensor([2, 9, 11]), torch.tensor([4])]
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : s.numel()] = s
        mask[i, 3 : s.numel()] = True
    with torch.no_grad():
        batched, _, _ = block_hidden_states(live_steps, qwen3_target, ids, mask, pad_anchors(anchors))
        assert torch.isfinite(batched).all()
        for i, s in enumerate(seqs):
            single, _, _ = block_hidden_states(live_steps, qwen3_target, s, mask[i, : s.numel()], anchors[i])
            torch.testing.assert_close(batched[i, : single.shape[1]], single[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- (7) VAT weights
def test_vat_weights_by_hand():
    gamma = 2.0
    # Two blocks of B = 5 (anchor + 4 proposals). Block 0: slot 2 is the first miss (slot 4 also misses).
    # Block 1: every prediction right, slot 4 has no label (past the end).
    hits = torch.tensor([[0, 1, 0, 1, 0, 0, 1, 1, 1, 0]], dtype=torch.bool)
    valid = torch.tensor([[0, 1, 1, 1, 1, 0, 1, 1, 1, 0]], dtype=torch.bool)
    w = vat_weights(hits, valid, 5, gamma)
    e = math.exp
    expected = [0, 1, 1, e(-1 / gamma), e(-2 / gamma), 0, 1, 1, 1, 0]
    torch.testing.assert_close(w, torch.tensor([expected]))
    # First slot wrong (k* = 1): exactly the DFlash weights exp(-(k-1)/gamma).
    first_wrong = vat_weights(torch.zeros(1, 5, dtype=torch.bool), torch.tensor([[0, 1, 1, 1, 1]]).bool(), 5, gamma)
    torch.testing.assert_close(first_wrong[0], slot_weights(5, gamma))
    # A miss on a slot without a label is no rejection.
    hidden_miss = vat_weights(torch.tensor([[0, 0, 1, 1, 1]]).bool(), torch.tensor([[0, 0, 1, 1, 1]]).bool(), 5, gamma)
    torch.testing.assert_close(hidden_miss, torch.tensor([[0.0, 0, 1, 1, 1]]))


def test_vat_loss_reweights_the_same_cross_entropy(qwen3_target, qwen3_drafter, train_prompts):
    """dflash_block_loss(loss="vat") is the CE weighted by `vat_weights` of the drafter's own argmax hits."""
    ids, mask = continuations(qwen3_target, train_prompts[:1], 32)[0]
    anchors = torch.tensor([7, 12, 20, 25])
    with torch.no_grad():
        hidden, labels, valid = block_hidden_states(qwen3_drafter, qwen3_target, ids, mask, anchors)
        logits = qwen3_drafter.compute_logits(hidden, qwen3_target.get_output_embeddings()).float()
        ce = torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="none")
        hits = (logits.argmax(-1) == labels) & valid
        assert hits[valid].any() and not hits[valid].all()  # both kinds of slot: the weights are not trivial
        w = vat_weights(hits, valid, B, 4.0)[0]
        vat, _ = dflash_block_loss(qwen3_drafter, qwen3_target, ids, mask, anchors, gamma=4.0, loss="vat")
        dflash, _ = dflash_block_loss(qwen3_drafter, qwen3_target, ids, mask, anchors, gamma=4.0)
    torch.testing.assert_close(vat, (ce * w).sum() / w.sum())
    assert not torch.allclose(vat, dflash)


# --------------------------------------------------------------------------- (6) train end to end
def test_cli_train_step_embeddings_with_vat(qwen3_target, qwen3_drafter, train_prompts, tmp_path, monkeypatch):
    from dflash_retrace.training import loop

    losses, original = [], loop.dflash_block_loss
    monkeypatch.setattr(loop, "dflash_block_loss", lambda *a, **k: losses.append(k.get("loss")) or original(*a, **k))
    qwen3_target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    rows = continuations(qwen3_target, train_prompts, 32)
    (tmp_path / "rows.jsonl").write_text("".join(
        json.dumps({"id": str(i), "input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}) + "\n"
        for i, (ids, mask) in enumerate(rows)))
    out = tmp_path / "run"
    assert cli.main(["train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "rows.jsonl"),
                     "--out", str(out), "--init", str(tmp_path / "dflash"), "--step-embeddings", "--loss", "vat",
                     "--max-steps", "4", "--lr", "1e-2", "--max-anchors", "8", "--eval-size", "2",
                     "--eval-prompts", "1", "--eval-max-new-tokens", "8", "--no-progress",
                     "--checkpoint-every", "0"]) == 0
    config = json.loads((out / "train_config.json").read_text())
    assert config["loss"] == "vat" and config["step_embeddings"] is True
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and math.isfinite(summary["held_out_loss"])
    assert losses == ["vat"] * 4  # every update's loss; the held-out loss (held_out.py) stays DFlash's
    trained = DFlashDrafter.from_pretrained(out).eval()
    assert trained.steps.table.any()  # zero at the start, trained since
    for prompt in train_prompts[:2]:
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=24)
        assert torch.equal(run(qwen3_target, trained, prompt, 24)[0], ref)


def test_lora_with_new_step_embeddings_saves_its_base(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    from peft import PeftModel

    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    rows = [{"input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for ids, mask in continuations(qwen3_target, train_prompts[:4], 24)]
    config = TrainConfig(init=str(tmp_path / "dflash"), step_embeddings=True, lora=True, lora_r=4, max_steps=3,
                         lr=1e-2, max_anchors=8, eval_size=0, progress=False, checkpoint_every=0)
    peft_model = train_drafter(qwen3_target, None, rows, tmp_path / "run", config)
    adapter = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert adapter["modules_to_save"] == ["steps"]
    assert adapter["base_model_name_or_path"] == str((tmp_path / "run" / "base").resolve())
    base = DFlashDrafter.from_pretrained(tmp_path / "run" / "base")
    assert base.steps is not None and not base.steps.table.any()
    _, drafts, _ = run(qwen3_target, peft_model, train_prompts[0], 24)
    assert run(qwen3_target, PeftModel.from_pretrained(base, tmp_path / "run"), train_prompts[0], 24)[1] == drafts


# ------------------------------------------------------------------------------ (8) validation
@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_step_embeddings_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="step_embeddings must be True or False"):
        DFlashConfig(num_target_layers=4, hidden_size=64, num_attention_heads=4, step_embeddings=bad)
    config = DFlashConfig(num_target_layers=4, hidden_size=64, num_attention_heads=4)
    with pytest.raises(ValueError, match="step_embeddings"):
        config.step_embeddings = bad


def test_block_longer_than_the_table_is_an_error(qwen3_target, live_steps, train_prompts):
    drafter = copy.deepcopy(live_steps)
    drafter.config.block_size = B + 4
    with pytest.raises(ValueError, match="step-embedding table has 8 slots"):
        qwen3_target.generate(train_prompts[0], assistant_model=drafter, do_sample=False, max_new_tokens=20)


def test_context_without_the_anchors_predecessor_is_an_error(live_steps):
    H = live_steps.config.hidden_size
    noise = torch.randn(1, B, H)
    feats = torch.randn(1, 3, live_steps.fc.in_features)
    ok = live_steps(noise_embeds=noise, context_hidden_states=feats, position_ids=torch.arange(5, 8 + B)[None])
    assert torch.isfinite(ok.last_hidden_state).all()  # context 5..7, anchor 8: reads row 7
    with pytest.raises(ValueError, match="anchor - 1"):  # context 5..7, anchor 10: position 9 is missing
        live_steps(noise_embeds=noise, context_hidden_states=feats,
                   position_ids=torch.cat([torch.arange(5, 8), torch.arange(10, 10 + B)])[None])
    with pytest.raises(ValueError, match="anchor - 1"):  # no context rows at all
        live_steps(noise_embeds=noise, context_hidden_states=feats[:, :0], position_ids=torch.arange(4, 4 + B)[None])


def test_checkpoint_and_config_must_agree_on_steps(live_steps, tmp_path):
    live_steps.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="step_embeddings=True"):
        DFlashDrafter.from_pretrained(tmp_path, step_embeddings=False)
    with pytest.raises(ValueError, match="block_size"):
        DFlashDrafter.from_pretrained(tmp_path, block_size=B + 4)


def test_loss_choice_is_checked(qwen3_target, qwen3_drafter):
    with pytest.raises(ValueError, match="loss must be one of"):
        TrainConfig(loss="focal").resolved()
    ids = torch.randint(3, 90, (20,))
    with pytest.raises(ValueError, match="loss must be one of"):
        dflash_block_loss(qwen3_drafter, qwen3_target, ids, torch.ones(20, dtype=torch.bool), torch.tensor([3]),
                          loss="focal")


def test_retargeting_a_steps_drafter_is_an_error(qwen3_target, live_steps, tmp_path):
    live_steps.save_pretrained(tmp_path / "init")
    rows = [{"input_ids": list(range(3, 40)), "loss_mask": [0] * 5 + [1] * 32}]
    with pytest.raises(ValueError, match="cannot be re-targeted"):
        train_drafter(qwen3_target, None, rows, tmp_path / "run", TrainConfig(
            init=str(tmp_path / "init"), block_size=4, max_steps=1, eval_size=0, progress=False))


# ------------------------------------------------------- new_weights_lr_scale (the option modules' own lr)
def test_new_weight_names_are_exactly_what_the_options_add(qwen3_drafter):
    """`is_new_weight` marks every parameter the options add to a DFlash drafter (ReTrace, steps, layer-wise fusion,
    hybrid KV attention) and nothing of the backbone."""
    from dflash_retrace.training.loop import is_new_weight

    plain = {name for name, _ in qwen3_drafter.named_parameters()}
    full = copy.deepcopy(qwen3_drafter).add_retrace().add_step_embeddings().add_fusion()
    full.set_context("hybrid")
    names = {name for name, _ in full.named_parameters()}
    assert names > plain
    assert {n for n in names if is_new_weight(n)} == names - plain
    for prefix in ("retrace.", "steps.", "fusion."):
        assert any(n.startswith(prefix) for n in names - plain)
    assert any(".kv." in n for n in names - plain)


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_new_weights_lr_scale_multiplies_only_the_new_weights_step(qwen3_target, qwen3_drafter, train_prompts,
                                                                    tmp_path, scale):
    """One AdamW update moves each weight by ~lr (its first step is lr * g/|g|): the step table by lr * scale, the
    backbone by lr."""
    qwen3_drafter.save_pretrained(tmp_path / "dflash")
    rows = [{"input_ids": ids.tolist(), "loss_mask": mask.long().tolist()}
            for ids, mask in continuations(qwen3_target, train_prompts[:4], 24)]
    lr = 1e-3
    config = TrainConfig(init=str(tmp_path / "dflash"), step_embeddings=True, max_steps=1, lr=lr, warmup_ratio=0.0,
                         weight_decay=0.0, new_weights_lr_scale=scale, max_anchors=8, eval_size=0, progress=False,
                         checkpoint_every=0)
    trained = train_drafter(qwen3_target, None, rows, tmp_path / "run", config)
    table_step = trained.steps.table.detach().float().abs().max().item()
    assert table_step == pytest.approx(lr * scale, rel=0.02)
    before = dict(qwen3_drafter.named_parameters())
    backbone_step = max((p.detach().float() - before[n].detach().float()).abs().max().item()
                        for n, p in trained.named_parameters() if n in before)
    assert backbone_step == pytest.approx(lr, rel=0.02)


def test_new_weights_lr_scale_must_be_positive():
    with pytest.raises(ValueError, match="new-weights-lr-scale"):
        TrainConfig(new_weights_lr_scale=0).resolved()
