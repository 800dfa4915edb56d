"""`replay`: every round it computes from one target forward equals what greedy `generate(assistant_model=drafter)`
records (fp32, tiny targets), for every drafter variant, caps, thresholds, budgets and EOS; ReTrace drafters and a
near-tie are handled as documented; the CLI writes a report whose τ is the generator's."""

import copy
import json

import pytest
import torch

from dflash_retrace import DFlashDrafter
from dflash_retrace.evaluation.replay import (References, _CommittedCache, paired_tau_ratio_interval, replay_turn,
                                              target_forward)
from test_bench import tiny_assets  # noqa: F401  (the bench tests' tiny chat target, drafter and prompts)
from tiny import VOCAB, prompts


def _real(target, drafter, prompt, new):
    out = target.generate(prompt, do_sample=False, max_new_tokens=new)
    spec = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=new)
    assert torch.equal(out, spec)
    stats = drafter.last_stats
    return out[0, prompt.shape[1]:].tolist(), stats


def _check_same_rounds(target, drafter, prompt, new):
    new_ids, stats = _real(target, drafter, prompt, new)
    got = replay_turn(target, drafter, prompt, new_ids, new)
    assert got["cut_at"] is None
    assert got["acceptance_lengths"] == stats.acceptance_lengths, (got, stats)
    assert got["num_proposals"] == stats.num_proposals
    assert got["drafts"] == stats.drafts
    assert got["replayed_tokens"] == len(new_ids)
    return got


@pytest.fixture()
def drafter(qwen3_drafter):
    return copy.deepcopy(qwen3_drafter)


@pytest.mark.parametrize("new", [1, 2, 7, 9, 40])
@pytest.mark.parametrize("seed", range(3))
def test_replay_equals_generate(qwen3_target, drafter, train_prompts, new, seed):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 96, (1, int(torch.randint(2, 12, (1,), generator=g))), generator=g)
    trained = _check_same_rounds(qwen3_target, drafter, train_prompts[seed], new)
    _check_same_rounds(qwen3_target, drafter, prompt, new)
    if new == 40:
        assert max(trained["acceptance_lengths"]) > 1  # the drafter drafts: the comparison is not all-ones


def test_replay_equals_generate_on_llama(llama_target, llama_drafter, train_prompts):
    for p in train_prompts[:3]:
        _check_same_rounds(llama_target, llama_drafter, p, 33)


@pytest.mark.parametrize("settings", [{"max_proposals": 2}, {"proposal_threshold": 0.5},
                                      {"max_proposals": 5, "proposal_threshold": 0.9}])
def test_replay_follows_shorter_rounds(qwen3_target, drafter, train_prompts, settings):
    for name, value in settings.items():
        setattr(drafter.config, name, value)
    proposals = []
    for p in train_prompts[:4] + prompts(2, length=5, seed=3):
        proposals += _check_same_rounds(qwen3_target, drafter, p, 37)["num_proposals"]
    if "proposal_threshold" in settings:
        assert 0 in proposals  # some rounds were cut to nothing, and the replay counted them as generate() does


def test_replay_stops_at_eos_as_generate_does(qwen3_target, drafter, train_prompts):
    """EOS at a token the drafter proposes: transformers leaves a stopping candidate's last token to the target."""
    target = copy.deepcopy(qwen3_target)
    seen = 0
    for p in train_prompts[:6]:
        free = target.generate(p, do_sample=False, max_new_tokens=30)[0, p.shape[1]:].tolist()
        target.generation_config.eos_token_id = free[len(free) // 2]  # a token the target really emits
        new_ids, stats = _real(target, drafter, p, 30)
        assert new_ids[-1] == target.generation_config.eos_token_id and len(new_ids) < 30
        got = replay_turn(target, drafter, p, new_ids, 30)
        assert got["acceptance_lengths"] == stats.acceptance_lengths
        assert got["num_proposals"] == stats.num_proposals
        seen += any(d and d[-1] == target.generation_config.eos_token_id for d in stats.drafts)
    assert seen  # the EOS was proposed in some round, so the stopping rule was exercised


@pytest.mark.parametrize("options", [dict(fusion="layerwise"), dict(step_embeddings=True), dict(context="hybrid"),
                                     dict(context="kv"), dict(fusion="layerwise", step_embeddings=True,
                                                              context="hybrid")])
def test_replay_equals_generate_for_every_variant(qwen3_target, qwen3_drafter, train_prompts, tmp_path, options):
    from test_variant_combinations import _live

    qwen3_drafter.save_pretrained(tmp_path)
    variant = DFlashDrafter.from_pretrained(tmp_path, **options).eval()
    if options != {"context": "kv"}:  # the KV-only mode adds no weights: its context itself changes
        variant = _live(variant)
    for p in train_prompts[:3]:
        _check_same_rounds(qwen3_target, variant, p, 29)


def test_replay_counts_what_the_draft_vocabulary_cannot_propose(qwen3_target, drafter, train_prompts):
    emitted = set()
    for p in train_prompts[:4]:
        emitted |= set(_real(qwen3_target, drafter, p, 40)[0][1:])
    dropped = sorted(emitted)[::3]  # a third of the tokens the target writes leave the draft vocabulary
    drafter.set_draft_vocabulary([i for i in range(VOCAB) if i not in dropped])
    drafter.config.draft_vocab_context = False  # the saved vocabulary alone (the next test grows it)
    ended = 0
    for p in train_prompts[:4]:
        new_ids = qwen3_target.generate(p, do_sample=False, max_new_tokens=40)[0, p.shape[1]:].tolist()
        got = _check_same_rounds(qwen3_target, drafter, p, 40)
        covered = range(1, 1 + sum(got["acceptance_lengths"]))  # a budget's last token can come from a plain step
        outside = [i for i in covered if new_ids[i] in dropped]
        bonus, pos = [], 1  # the round starting at new_ids[pos] with length L ends at new_ids[pos + L - 1]
        for length, proposals in zip(got["acceptance_lengths"], got["num_proposals"]):
            bonus.append((pos + length - 1, length - 1 < proposals))
            pos += length
        assert set(outside) <= {i for i, _ in bonus}  # the drafter never proposed them: each is a round's last token
        rounds = sum(cut and new_ids[i] in dropped for i, cut in bonus)
        assert got["outside_vocab"] == {"tokens": len(outside), "rounds": rounds}
        ended += rounds
    assert ended > 0


def test_replay_counts_a_context_grown_vocabulary_round_by_round(qwen3_target, drafter, train_prompts):
    """draft_vocab_context: replay equals generate, and a token counts as outside only if neither the saved
    vocabulary nor the context at its round's start (prompt + committed tokens) holds it."""
    emitted = set()
    for p in train_prompts[:4]:
        emitted |= set(_real(qwen3_target, drafter, p, 40)[0][1:])
    dropped = set(sorted(emitted)[::2])
    drafter.set_draft_vocabulary([i for i in range(VOCAB) if i not in dropped])
    drafter.config.draft_vocab_context = True
    grown = 0
    for p in train_prompts[:4]:
        new_ids = qwen3_target.generate(p, do_sample=False, max_new_tokens=40)[0, p.shape[1]:].tolist()
        got = _check_same_rounds(qwen3_target, drafter, p, 40)
        tokens = rounds = 0
        pos = 1
        for length, proposals in zip(got["acceptance_lengths"], got["num_proposals"]):
            context = set(p[0].tolist()) | set(new_ids[:pos])
            outside = [t in dropped and t not in context for t in new_ids[pos:pos + length]]
            tokens, rounds = tokens + sum(outside), rounds + (length - 1 < proposals and outside[-1])
            pos += length
        assert got["outside_vocab"] == {"tokens": tokens, "rounds": rounds}
        grown += drafter.last_stats.draft_vocab_added
    assert grown > 0


def test_the_summary_reports_the_draft_vocabulary_shares():
    from dflash_retrace.evaluation.replay import _summary, format_replay

    def row(lengths, outside):
        return {"drafters": {"main": {"acceptance_lengths": lengths, "num_proposals": [7] * len(lengths),
                                      "drafter_s": 0.0, "outside_vocab": outside},
                             "full": {"acceptance_lengths": lengths, "num_proposals": [7] * len(lengths),
                                      "drafter_s": 0.0, "outside_vocab": None}}}
    summary = _summary([row([3, 1, 4], {"tokens": 2, "rounds": 1}), row([2, 2], {"tokens": 1, "rounds": 1})],
                       ["main", "full"], {"main": 8, "full": 8})
    assert summary["methods"]["main"]["outside_draft_vocab"] == {"tokens": 3, "token_share": 3 / 12, "rounds": 2,
                                                                 "round_share": 2 / 5}
    assert summary["methods"]["full"]["outside_draft_vocab"] is None
    summary["references"] = {"computed": 0, "reused": 2, "turns": 2, "turns_cut_at_near_tie": 0}
    config = {"dataset": "d", "max_new_tokens": 8, "target": "t", "drafters": {"main": "a", "full": "b"}}
    text = format_replay({"summary": summary, "config": config})
    assert text.endswith("cannot propose: main 25.0% of the tokens, 40.0% of the rounds end at one")


def test_committed_cache_is_the_generate_cache(qwen3_target, train_prompts):
    p = train_prompts[0]
    full = qwen3_target.generate(p, do_sample=False, max_new_tokens=10)
    forward = target_forward(qwen3_target, full, with_cache=True)
    view = _CommittedCache(forward.past_key_values, p.shape[1] + 3)
    assert view.get_seq_length() == p.shape[1] + 3
    prefix = target_forward(qwen3_target, full[:, : p.shape[1] + 3], with_cache=True).past_key_values
    for a, b in zip(view.layers, prefix.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-5)


def test_replay_refuses_retrace(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    qwen3_drafter.save_pretrained(tmp_path)
    retrace = DFlashDrafter.from_pretrained(tmp_path, retrace=True)
    with pytest.raises(ValueError, match="ReTrace.*bench"):
        replay_turn(qwen3_target, retrace, train_prompts[0], [5, 6, 7], 3)


def test_a_near_tie_stops_the_turn_before_it(qwen3_target, drafter, train_prompts):
    """A reference token the forward's argmax disagrees with: only the rounds before it are counted."""
    p = train_prompts[1]
    new_ids, stats = _real(qwen3_target, drafter, p, 40)
    changed = list(new_ids)
    changed[25] = (changed[25] + 1) % 96  # as if a near-tie went the other way at token 25
    got = replay_turn(qwen3_target, drafter, p, changed, 40)
    assert got["cut_at"] == 25
    assert got["replayed_tokens"] <= 25
    committed = 1 + sum(got["acceptance_lengths"])
    assert committed == got["replayed_tokens"]
    n = len(got["acceptance_lengths"])
    assert got["acceptance_lengths"] == stats.acceptance_lengths[:n]  # the same rounds up to the cut
    assert 1 + sum(stats.acceptance_lengths[: n + 1]) > 25  # and the next one would have crossed it


def test_paired_interval_holds_the_ratio_and_detects_a_difference():
    same = [[2, 1, 3]] * 20
    assert paired_tau_ratio_interval(same, same) == [1.0, 1.0]
    better = [[3, 2, 4]] * 10 + [[2, 2]] * 10
    worse = [[1, 1, 2]] * 10 + [[1, 2]] * 10
    lo, hi = paired_tau_ratio_interval(better, worse)
    assert 1.0 < lo <= (sum(map(sum, better)) / 50) / (sum(map(sum, worse)) / 50) <= hi


def test_references_are_cached_and_reused(qwen3_target, train_prompts, tmp_path):
    path = tmp_path / "refs.jsonl"
    refs = References(path, "tiny", torch.float32)
    first = refs.get(qwen3_target, train_prompts[0], 12)
    again = References(path, "tiny", torch.float32)
    assert again.get(qwen3_target, train_prompts[0], 12) == first and again.reused == 1 and again.computed == 0
    assert References(path, "tiny", torch.bfloat16).key(train_prompts[0], 12) != again.key(train_prompts[0], 12)
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ValueError, match="delete the file"):
        References(path, "tiny", torch.float32)


def test_replay_cli_equals_bench_prompt_by_prompt(tiny_assets, tmp_path, capsys):
    """The CLI on the bench tests' tiny chat target (EOS on, a two-turn prompt): every prompt's rounds equal those a
    real `bench` run records on the same prompts, and a second run reuses every reference."""
    from dflash_retrace.cli import main
    from dflash_retrace.evaluation import run_benchmark

    root = tiny_assets
    out, refs = tmp_path / "replay.json", tmp_path / "refs.jsonl"
    args = ["replay", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--compare",
            f"same={root / 'drafter'}", "--dataset", str(root / "prompts.jsonl"), "--max-samples", "10",
            "--source-order", "--max-new-tokens", "20", "--dtype", "float32", "--references", str(refs),
            "--output", str(out), "--no-progress"]
    assert main(args) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["references"] == {"file": str(refs), "computed": 5, "reused": 0, "turns": 5,
                                     "turns_cut_at_near_tie": 0}
    assert summary["tau_ratios"]["main/same"]["ratio"] == 1.0
    bench = run_benchmark(str(root / "target"), str(root / "drafter"), dataset=str(root / "prompts.jsonl"),
                          max_samples=10, source_order=True, max_new_tokens=20, dtype="float32", output=None,
                          progress=False)
    for ours, theirs in zip(report["prompts"], bench["prompts"], strict=True):
        assert ours["id"] == theirs["id"]
        assert ours["drafters"]["main"]["acceptance_lengths"] == theirs["methods"]["speculative"]["acceptance_lengths"]
        assert ours["drafters"]["main"]["num_proposals"] == theirs["methods"]["speculative"]["num_proposals"]
        assert ours["new_tokens"] == [theirs["methods"]["plain"]["new_tokens"]] or ours["turns"] > 1
    assert summary["methods"]["main"]["tau_pooled"] == bench["summary"]["methods"]["speculative"]["tau_pooled"]
    assert summary["methods"]["main"]["tau_pooled"] > 1
    assert main(args) == 0  # a second run reuses every reference
    assert json.loads(out.read_text())["summary"]["references"]["reused"] == 5
    assert "| main" in capsys.readouterr().out

    # The ablation example reads the same report: one row per variant, the main drafter's ratio 1 exactly.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "ablation_variants", Path(__file__).parents[1] / "examples" / "ablation_variants.py")
    ablation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablation)
    rows = ablation.replay_rows("tiny", report, ["dflash", "same"])
    assert [r["variant"] for r in rows] == ["dflash", "same"]
    assert rows[0]["tau"] == summary["methods"]["main"]["tau_pooled"] and rows[1]["tau_ratio"] == 1.0
    assert rows[1]["tau_ratio_ci"] == [1.0, 1.0] and rows[0]["speedup"] is None
    assert "| 0 | tiny (4) | same |" in ablation.markdown(rows)
