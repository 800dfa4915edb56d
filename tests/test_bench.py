"""Benchmark: metric functions on hand-built round logs, and a bench run on a tiny random target and drafter."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformers import AutoModelForCausalLM
from dflash_retrace import DFlashDrafter
from dflash_retrace.evaluation import format_report, run_benchmark
from dflash_retrace.evaluation.methods import _budget_rounds
from dflash_retrace.cli import main as cli_main
from dflash_retrace.evaluation.metrics import (
    acceptance_histogram,
    agreement,
    merge_suffix_matches,
    paired_ratio_interval,
    per_slot_acceptance,
    rejected_suffix_matches,
    summarize_rounds,
    tau_pooled,
    tau_prompt_mean,
)
from tiny import EOS, VOCAB, tiny_target



# ------------------------------------------------------------------------------- metrics

# Block size 4 (K = 3 proposal slots). Prompt A: 3 rounds; prompt B: 1 round; prompt C: none.
LENGTHS = [[1, 4, 2], [3], []]
PROPOSALS = [[3, 3, 3], [2], []]


def test_tau_pooled_and_prompt_mean_differ_as_defined():
    assert tau_pooled(LENGTHS) == pytest.approx((1 + 4 + 2 + 3) / 4)  # 2.5: every round weighs the same
    assert tau_prompt_mean(LENGTHS) == pytest.approx(((1 + 4 + 2) / 3 + 3) / 2)  # 2.667: prompt C has no rounds
    assert tau_pooled([[], []]) is None and tau_prompt_mean([]) is None  # no rounds: None, as DFlashStats says


def test_histogram_counts_lengths_1_to_b():
    hist = acceptance_histogram(LENGTHS, block_size=4)
    assert hist["lengths"] == [1, 2, 3, 4]
    assert hist["counts"] == [1, 1, 1, 1]
    assert hist["fractions"] == [0.25] * 4
    with pytest.raises(ValueError, match="outside 1..4"):
        acceptance_histogram([[5]], block_size=4)


def test_per_slot_rate_is_accepted_over_proposed():
    slots = per_slot_acceptance(LENGTHS, PROPOSALS, block_size=4)
    # slot 1: proposed in all 4 rounds, accepted where length >= 2: rounds 2, 3 of A and B's round -> 3/4
    # slot 2: proposed 4 times, accepted in A's round 2 (length 4) and B's round (length 3) -> 2/4
    # slot 3: proposed 3 times (B proposed only 2), accepted in A's round 2 -> 1/3
    assert slots["proposed"] == [4, 4, 3]
    assert slots["accepted"] == [3, 2, 1]
    assert slots["rate"] == pytest.approx([0.75, 0.5, 1 / 3])


def test_round_logs_are_validated():
    with pytest.raises(ValueError, match="acceptance length 4 outside 1..3"):
        per_slot_acceptance([[4]], [[2]], block_size=4)  # 2 proposals + bonus = at most 3
    with pytest.raises(ValueError, match="4 proposals, outside 0..3"):
        per_slot_acceptance([[1]], [[4]], block_size=4)
    # a round whose proposals were all cut commits the target's one token, and proposes no slot
    assert per_slot_acceptance([[1, 2]], [[0, 1]], block_size=4)["proposed"] == [1, 0, 0]
    with pytest.raises(ValueError, match="acceptance length 2 outside 1..1"):
        per_slot_acceptance([[2]], [[0]], block_size=4)
    with pytest.raises(ValueError, match="2 acceptance lengths but 1"):
        summarize_rounds([[1, 1]], [[3]], block_size=4)


def test_summary_collects_everything():
    s = summarize_rounds(LENGTHS, PROPOSALS, block_size=4)
    assert s["num_rounds"] == 4 and s["block_size"] == 4
    assert s["tau_pooled"] == pytest.approx(2.5)
    assert s["histogram"]["counts"] == [1, 1, 1, 1]
    assert s["per_slot"]["accepted"] == [3, 2, 1]


def test_agreement():
    a = agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 3, 4], [5, 7, 8]])
    assert a["exact_rate"] == 0.5
    assert a["first_divergence"] == [None, 1]
    assert a["prefix_rate"] == pytest.approx((4 + 1) / (4 + 3))
    assert agreement([[1, 2]], [[1, 2, 3]])["first_divergence"] == [2]  # a longer output is not identical


def test_budget_rounds_drop_proposals_past_the_budget():
    # max_new_tokens 10, B 4: after prefill 1 token; round 1 commits 4 (offset 5), round 2 commits 3 (offset 8),
    # then 2 tokens remain: 1 usable proposal; a round with 1 remaining token is a plain step.
    lengths, counts = _budget_rounds([4, 3, 1, 1], [[5, 5, 5]] * 4, max_new_tokens=10, block_size=4, stop_ids=set())
    assert lengths == [4, 3, 1] and counts == [3, 3, 1]


# ------------------------------------------------------------------------------- a tiny bench run
def _tiny_tokenizer():
    """A word-level tokenizer over the tiny targets' vocabulary: ids 0..3 special, then words w4..w95."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}{{ 'w4 ' if m['role'] == 'user' else 'w5 ' }}{{ m['content'] }} "
                         "{% endfor %}{% if add_generation_prompt %}w6{% endif %}")
    return tok


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    """A tiny Qwen3 target (with tokenizer, EOS enabled), a drafter briefly trained on its greedy answers to the
    bench prompts (so that τ > 1), and a local JSONL prompt set (one two-turn prompt), saved to folders."""
    from tiny import continuations, train_drafter

    root = tmp_path_factory.mktemp("bench")
    tokenizer = _tiny_tokenizer()
    g = torch.Generator().manual_seed(7)
    rows = []
    for i in range(3):
        words = torch.randint(7, VOCAB, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
        rows.append({"id": f"p{i}", "prompt": " ".join(f"w{int(t)}" for t in words)})
    rows.append({"id": "two-turn", "turns": ["w10 w11 w12", "w13 w14"]})
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    target = tiny_target("qwen3", seed=3)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": r.get("prompt") or r["turns"][0]}],
                                           tokenize=False, add_generation_prompt=True) for r in rows]
    ids = [tokenizer(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]
    drafter = train_drafter(target, continuations(target, ids, new_tokens=24), steps=120, block_size=6, layers=1,
                            lr=5e-3)
    target.generation_config.eos_token_id = EOS  # lets EOS end some answers
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    return root


def _check_schema(report, methods):
    assert report["schema"] == "dflash-retrace/bench/v1"
    for key in ("config", "environment", "definitions", "notes", "summary", "timing", "prompts"):
        assert key in report
    env = report["environment"]
    for key in ("device", "dtype", "torch", "transformers", "git_sha", "seed", "platform"):
        assert key in env
    assert env["dtype"] == "float32" and env["device"] == "cpu"
    summary = report["summary"]
    assert list(summary["methods"]) == methods
    assert summary["prefill_ms_mean"] > 0
    for name in methods:
        m = summary["methods"][name]
        for key in ("num_ok", "new_tokens", "total_s", "decode_s", "tokens_per_s", "decode_tokens_per_s"):
            assert m[key] is not None, (name, key)
        if name != "plain":
            for key in ("speedup", "decode_speedup", "agreement", "tau_pooled", "tau_prompt_mean", "histogram",
                        "per_slot", "num_rounds", "ms_per_round", "speedup_spread", "measurement_fault"):
                assert key in m, (name, key)
            # a speedup above its bound τ is never reported as a result
            assert (m["measurement_fault"] is not None) == (m["decode_rate_ratio"] > (m["tau_pooled"] or 1.0)), m
            spread = m["speedup_spread"]
            assert spread["n"] == m["num_ok"] and spread["min"] <= spread["median"] <= spread["max"]
            B = report["config"]["block_size"]
            assert m["histogram"]["lengths"] == list(range(1, B + 1))
            assert len(m["per_slot"]["rate"]) == B - 1
            assert sum(m["histogram"]["counts"]) == m["num_rounds"]
    for row in report["prompts"]:
        assert set(row) == {"id", "turns", "prompt_tokens", "prefill_s", "methods"}
        assert len(row["prompt_tokens"]) == row["turns"]
        for name in methods:
            assert row["methods"][name]["error"] is None, row["methods"][name]


def _check_token_counts(report, max_new_tokens):
    """Token counts agree with the generated outputs, and the rounds account for every new token."""
    for row in report["prompts"]:
        plain = row["methods"]["plain"]
        for name, m in row["methods"].items():
            assert m["new_tokens"] == len(m["output_ids"])
            assert 1 <= m["new_tokens"] <= max_new_tokens * row["turns"]
            if name == "plain":
                continue
            assert m["output_ids"] == plain["output_ids"], name  # fp32 greedy: lossless
            assert m["agrees_with_plain"] and m["first_divergence"] is None
            assert m["rounds"] == len(m["acceptance_lengths"]) == len(m["num_proposals"])
            # each turn: 1 token from prefill, the rounds' tokens, and at most one plain step at the budget's end
            unaccounted = m["new_tokens"] - row["turns"] - sum(m["acceptance_lengths"])
            assert 0 <= unaccounted <= row["turns"], (name, unaccounted)
    total = sum(r["methods"]["plain"]["new_tokens"] for r in report["prompts"])
    assert report["summary"]["methods"]["plain"]["new_tokens"] == total


def test_rejected_suffix_matches_by_hand():
    new_ids = [10, 11, 12, 13, 14, 15, 16, 17]  # index 0: the prefill's token; rounds start at 1, 4, 5
    lengths = [3, 1, 3]
    drafts = [[11, 12, 99, 14],  # 99 rejected at index 3; its suffix [14] lands on index 4 (a match at shift 0)
              [50, 16, 17],  # 50 rejected at index 4; [16, 17] run one ahead of the target (shift +1 matches)
              [15, 16, 17]]  # cut by the budget after 3 tokens: its third proposal equals the target's, no rejection
    got = rejected_suffix_matches(new_ids, lengths, drafts)
    assert got == {"rounds": 2, "compared": {"-1": 3, "0": 3, "1": 3}, "matched": {"-1": 0, "0": 1, "1": 2}}
    merged = merge_suffix_matches([got, got])
    assert merged["rounds"] == 4 and merged["compared"]["0"] == 6
    assert merged["match_rate"] == {"-1": 0.0, "0": pytest.approx(1 / 3), "1": pytest.approx(2 / 3)}
    assert merge_suffix_matches([])["match_rate"]["0"] is None
    with pytest.raises(ValueError, match="2 rounds of drafts but 3"):
        rejected_suffix_matches(new_ids, lengths, drafts[:2])


def test_drafts_align_with_the_output_as_the_suffix_metric_assumes(tiny_assets):
    """The real generator's rounds: round r proposes from index 1 + sum(lengths[:r]) of the new tokens, its
    accepted proposals are the output there, and the first rejected one differs from it."""
    from tiny import prompts

    target = AutoModelForCausalLM.from_pretrained(tiny_assets / "target").eval()
    drafter = DFlashDrafter.from_pretrained(tiny_assets / "drafter").eval()
    rejections = 0
    for prompt in prompts(6, seed=5):
        out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=24)
        new_ids, stats = out[0, prompt.shape[1]:].tolist(), drafter.last_stats
        start = 1
        for length, proposals in zip(stats.acceptance_lengths, stats.drafts):
            assert proposals[: length - 1] == new_ids[start : start + length - 1]
            if length - 1 < len(proposals) and start + length - 1 < len(new_ids):
                assert proposals[length - 1] != new_ids[start + length - 1]
                rejections += 1
            start += length
        assert len(new_ids) - start in (0, 1)  # a last token with no room for a proposal is the target's alone
    assert rejections > 0


def test_bench_run_on_tiny_models(tiny_assets, tmp_path, capsys):
    out, png = tmp_path / "results.json", tmp_path / "plot.png"
    report = run_benchmark(
        str(tiny_assets / "target"), str(tiny_assets / "drafter"), dataset=str(tiny_assets / "prompts.jsonl"),
        max_samples=None, max_new_tokens=16, seed=0, device="cpu", dtype="float32", output=out, plot=png, save_outputs=True,
        progress=False,
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_schema(report, ["plain", "speculative"])
    _check_token_counts(report, 16)
    spec = report["summary"]["methods"]["speculative"]
    assert spec["agreement"]["exact_rate"] == 1.0
    assert spec["tau_pooled"] > 1.2, "the briefly trained drafter should accept something"
    text = format_report(report)
    assert "speedup per prompt (speculative): " in text
    assert "greedy output identical to plain generate() (float32: must be 100% (exact)): speculative 100%" in text
    two = next(r for r in report["prompts"] if r["id"] == "two-turn")
    assert two["turns"] == 2 and two["prompt_tokens"][1] > two["prompt_tokens"][0] + 2  # answer fed back
    assert report["summary"]["num_prompts"] == 4
    assert report["config"]["prompt_order"] == "shuffled (seed 0)"
    source_ids = [json.loads(line)["id"] for line in (tiny_assets / "prompts.jsonl").read_text().splitlines()]
    assert [row["id"] for row in report["prompts"]] != source_ids, "seed 0 should reorder these 4 prompts"
    text = format_report(report)
    assert "τ pooled" in text and "speculative" in text and "ERRORS" not in text


def test_compared_drafters_and_memory_ablation_share_one_plain_run(tiny_assets, tmp_path, capsys):
    """--compare and --no-memory-ablation: more speculative methods against the same plain run. The ReTrace
    drafter's backbone is the compared DFlash drafter, so with its memory off it must draft exactly as that one."""
    retrace = DFlashDrafter.from_pretrained(tiny_assets / "drafter").add_retrace()
    with torch.no_grad():
        torch.manual_seed(0)
        for param in retrace.retrace.parameters():
            param.normal_(0, 0.5)  # a memory that changes the drafts
    retrace.save_pretrained(tmp_path / "retrace")
    out = tmp_path / "r.json"
    code = cli_main(["bench", "--target", str(tiny_assets / "target"), "--drafter", str(tmp_path / "retrace"),
                     "--compare", f"dflash={tiny_assets / 'drafter'}", "--no-memory-ablation",
                     "--dataset", str(tiny_assets / "prompts.jsonl"), "--max-new-tokens", "16", "--device", "cpu", "--dtype", "float32",
                     "--output", str(out), "--save-outputs", "--no-progress", "--source-order"])
    text = capsys.readouterr().out
    assert code == 0
    report = json.loads(out.read_text())
    source_ids = [json.loads(line)["id"] for line in (tiny_assets / "prompts.jsonl").read_text().splitlines()]
    assert [row["id"] for row in report["prompts"]] == source_ids  # --source-order: the file's own order
    assert report["config"]["prompt_order"] == "source" and "prompts in source order" in text
    names = ["plain", "speculative", "speculative:dflash", "speculative:no_memory"]
    _check_schema(report, names)
    _check_token_counts(report, 16)  # every method lossless against the one plain run
    methods = report["summary"]["methods"]
    for row in report["prompts"]:
        assert row["methods"]["speculative:no_memory"]["acceptance_lengths"] == \
            row["methods"]["speculative:dflash"]["acceptance_lengths"]
    assert any(r["methods"]["speculative"]["acceptance_lengths"] != r["methods"]["speculative:dflash"]["acceptance_lengths"]
               for r in report["prompts"]), "the memory should change some round"
    for name, memory in (("speculative", True), ("speculative:dflash", False)):
        suffix = methods[name]["rejected_suffix"]
        assert suffix["rounds"] > 0 and suffix["compared"]["0"] > 0 and 0 <= suffix["match_rate"]["0"] <= 1
        assert (methods[name]["memory_slots_mean"] > 0) == memory
        assert (methods[name]["memory_rounds_share"] > 0) == memory
    assert f"rejected suffixes (speculative:dflash, {methods['speculative:dflash']['rejected_suffix']['rounds']} " \
        "rounds)" in text and "ReTrace memory in 0% of rounds, 0.00 slots per round" in text
    ratio = report["summary"]["tau_ratios"]["speculative/speculative:dflash"]
    assert ratio == pytest.approx(methods["speculative"]["tau_pooled"] / methods["speculative:dflash"]["tau_pooled"])
    assert "τ ratio speculative/speculative:dflash" in text and "speculative:no_memory" in text
    script = Path(__file__).resolve().parents[1] / "examples" / "bench_table.py"
    table = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, check=True).stdout
    row = next(line for line in table.splitlines() if line.startswith("| 0 | prompts (4) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{methods['speculative:dflash']['tau_pooled']:.2f}"
    assert cells[4] == f"{methods['speculative']['tau_pooled']:.2f}" and cells[6] == f"{ratio:.3f}"
    assert cells[7] == f"{methods['speculative:no_memory']['tau_pooled']:.2f}"
    for cell, point in ((cells[9], ratio), (cells[10], report["summary"]["tau_ratios"]["speculative/speculative:no_memory"])):
        shown, lo, hi = (float(x) for x in cell.replace("[", "").replace("]", "").replace(",", "").split())
        assert shown == pytest.approx(point, abs=5e-4) and lo <= shown <= hi, cell
    assert "identical to plain generate() for every method and prompt: True" in table
    # memory off drafts exactly as the DFlash backbone here, so the training-effect ratio has no spread at all
    assert "τ(memory off)/τ(DFlash), 95% CI: prompts 1.000 [1.000, 1.000]" in table
    with pytest.raises(ValueError, match="has none"):
        run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"), dataset=str(tiny_assets / "prompts.jsonl"),
                      max_samples=1, max_new_tokens=4, device="cpu", dtype="float32", output=None, progress=False, no_memory=True)


def test_bench_max_proposals_and_threshold_apply_to_the_main_drafter(tiny_assets, tmp_path, capsys):
    """--max-proposals / --proposal-threshold shorten the main drafter's rounds; a --compare drafter keeps its own."""
    out = tmp_path / "short.json"
    code = cli_main(["bench", "--target", str(tiny_assets / "target"), "--drafter", str(tiny_assets / "drafter"),
                     "--compare", f"full={tiny_assets / 'drafter'}", "--max-proposals", "2", "--proposal-threshold",
                     "0.01", "--dataset", str(tiny_assets / "prompts.jsonl"), "--max-new-tokens", "16", "--device",
                     "cpu", "--dtype", "float32", "--output", str(out), "--save-outputs", "--no-progress"])
    capsys.readouterr()
    assert code == 0
    report = json.loads(out.read_text())
    assert report["config"]["max_proposals"] == 2 and report["config"]["proposal_threshold"] == 0.01
    _check_token_counts(report, 16)  # lossless: both methods against the one plain run
    short = [k for r in report["prompts"] for k in r["methods"]["speculative"]["num_proposals"]]
    full = [k for r in report["prompts"] for k in r["methods"]["speculative:full"]["num_proposals"]]
    assert max(short) == 2 and max(full) > 2, (short, full)


def test_cli_untrained_drafter_and_error_rows(tiny_assets, tmp_path, capsys, monkeypatch):
    """CLI path; `untrained` prints its note; an error on one prompt is reported, not fatal (exit code 1)."""
    from dflash_retrace.evaluation import methods

    original = methods.Methods.speculative
    calls = {"n": 0}

    def flaky(self, input_ids, max_new_tokens, drafter=None):
        calls["n"] += 1
        if calls["n"] == 3:  # warm-up is call 1: fail on the second timed prompt
            raise RuntimeError("injected failure")
        return original(self, input_ids, max_new_tokens, drafter)

    monkeypatch.setattr(methods.Methods, "speculative", flaky)
    out = tmp_path / "r.json"
    code = cli_main(["bench", "--target", str(tiny_assets / "target"), "--drafter", "untrained",
                     "--dataset", str(tiny_assets / "prompts.jsonl"), "--max-samples", "3", "--max-new-tokens", "8",
                     "--device", "cpu", "--dtype", "float32", "--output", str(out), "--save-outputs", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 1
    assert "tau ~ 1" in captured.err  # the untrained drafter's note
    assert "injected failure" in captured.out and "ERRORS (1)" in captured.out
    report = json.loads(out.read_text())
    assert report["config"]["drafter_untrained"] is True
    errors = [r["methods"]["speculative"]["error"] for r in report["prompts"]]
    assert sum(e is not None for e in errors) == 1 and "RuntimeError: injected failure" in [e for e in errors if e][0]
    spec = report["summary"]["methods"]["speculative"]
    assert spec["num_ok"] == 2 and spec["num_errors"] == 1
    assert report["summary"]["methods"]["plain"]["num_ok"] == 3


def test_bench_baselines(tiny_assets, tmp_path):
    try:
        import dflash.model  # noqa: F401
    except ImportError as err:
        reason = f"z-lab dflash not importable ({err}); pip install --no-deps dflash==0.1.0"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    report = run_benchmark(
        str(tiny_assets / "target"), str(tiny_assets / "drafter"), dataset=str(tiny_assets / "prompts.jsonl"),
        max_samples=None, max_new_tokens=16, device="cpu", dtype="float32", baselines=True, save_outputs=True, progress=False,
    )
    names = ["plain", "speculative", "zlab_reference", "transformers_builtin"]
    _check_schema(report, names)
    _check_token_counts(report, 16)
    for name in names[1:]:
        assert report["summary"]["methods"][name]["agreement"]["exact_rate"] == 1.0, name
    # Identical weights and greedy: the reference loop commits the same tokens per round as ours. (Checked per
    # prompt; one near-tie flipped by floating-point differences between the two attention codes is tolerated.)
    rows = report["prompts"]
    for name in ("zlab_reference", "transformers_builtin"):
        same = [r["methods"]["speculative"]["acceptance_lengths"] == r["methods"][name]["acceptance_lengths"] for r in rows]
        assert sum(same) >= len(rows) - 1, (name, [(r["id"], r["methods"]["speculative"]["acceptance_lengths"],
                                                    r["methods"][name]["acceptance_lengths"]) for r in rows])
    overhead = report["summary"]["overhead"]
    ours = overhead["speculative_vs_zlab_reference"]
    assert ours["time_ratio"] > 0
    for key in ("time_ratio", "round_time_ratio"):  # the point estimate lies inside its own bootstrap interval
        low, high = ours[f"{key}_ci95"]
        assert low <= ours[key] <= high, (key, ours)
    text = format_report(report)
    assert "overhead speculative_vs_zlab_reference" in text
    assert f"per round {ours['round_time_ratio']:.3f} [{ours['round_time_ratio_ci95'][0]:.3f}," in text


def test_paired_ratio_interval():
    """(Σa/Σb)/(Σc/Σd) over resampled prompts: exact when every prompt has the same ratio, paired (the same prompts
    for both sides), and bracketing the pooled ratio when prompts disagree."""
    assert paired_ratio_interval([]) is None and paired_ratio_interval([(1.0, 0, 1.0, 1)]) is None
    # Every prompt counts, as in the point estimate: one whose rounds are all plain steps (0 rounds) still adds its
    # time to ours, (1 + 2) / 2 over 2 / 2 = 1.5 (draws of that prompt alone have no rounds and are skipped).
    assert paired_ratio_interval([(1.0, 0, 0.0, 0), (2.0, 2, 2.0, 2)]) == pytest.approx([1.0, 1.5])
    same = [(2.0 * t, r, t, r) for t, r in [(1.0, 3), (5.0, 10), (0.5, 1)]]
    assert paired_ratio_interval(same) == pytest.approx([2.0, 2.0])
    # Per round: each side's time is pooled over its own rounds (the same cost per round gives 1 however the
    # rounds differ between prompts), and a side that needs twice the rounds at the same total time costs half.
    assert paired_ratio_interval([(1.0, 1, 1.0, 1), (8.0, 4, 8.0, 4)]) == pytest.approx([1.0, 1.0])
    assert paired_ratio_interval([(2.0, 2, 2.0, 1), (6.0, 6, 6.0, 3)]) == pytest.approx([0.5, 0.5])
    # Paired: one fast and one slow prompt scale both methods alike, so the interval stays at 1.1 exactly.
    assert paired_ratio_interval([(1.1, 1, 1.0, 1), (110.0, 1, 100.0, 1)]) == pytest.approx([1.1, 1.1])
    mixed = [(1.0 + 0.1 * (i % 3), 1, 1.0, 1) for i in range(30)]
    low, high = paired_ratio_interval(mixed)
    pooled = sum(r[0] for r in mixed) / len(mixed)
    assert 1.0 < low < pooled < high < 1.2


def test_bench_baselines_skip_the_reference_for_a_drafter_it_cannot_hold(tiny_assets):
    """z-lab's model is plain DFlash on the full head: a draft-vocabulary (or variant) drafter is skipped, loudly and
    with the reason in the report, instead of crashing or running a different drafter."""
    pytest.importorskip("dflash.model", reason="z-lab dflash not installed")
    from dflash_retrace.evaluation.methods import REFERENCE, Methods
    from dflash_retrace.runtime import zlab_incompatibility

    target = AutoModelForCausalLM.from_pretrained(tiny_assets / "target", dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(tiny_assets / "drafter").eval()
    assert zlab_incompatibility(drafter.config) is None
    assert REFERENCE in Methods(target, drafter, 8, 0.0, baselines=True).available
    drafter.set_draft_vocabulary(list(range(0, drafter.config.vocab_size, 3)))
    with pytest.warns(UserWarning, match="zlab_reference skipped: .*draft vocabulary"):
        methods = Methods(target, drafter, 8, 0.0, baselines=True)
    assert REFERENCE not in methods.available and "draft vocabulary" in methods.skipped[REFERENCE]
    assert "transformers_builtin" in methods.available
    variant = DFlashDrafter.from_pretrained(tiny_assets / "drafter", step_embeddings=True).eval()
    assert "step_embeddings=True" in zlab_incompatibility(variant.config)

def test_reference_drafter_has_the_same_weights(tiny_assets):
    pytest.importorskip("dflash.model", reason="z-lab dflash not installed")
    from dflash_retrace.evaluation import build_reference_drafter

    drafter = DFlashDrafter.from_pretrained(tiny_assets / "drafter")
    ref = build_reference_drafter(drafter)
    ours = drafter.state_dict()
    for key, value in ref.state_dict().items():
        if "rotary" not in key:
            assert torch.equal(value, ours[key]), key
    assert ref.block_size == drafter.config.block_size and ref.target_layer_ids == drafter.config.target_layer_ids
    assert ref.mask_token_id == drafter.config.mask_token_id

    # Same forward: 5 context positions, then a block of B query positions.
    cfg = drafter.config
    g = torch.Generator().manual_seed(0)
    context = torch.randn(1, 5, len(cfg.target_layer_ids) * cfg.hidden_size, generator=g)
    noise = torch.randn(1, cfg.block_size, cfg.hidden_size, generator=g)
    positions = torch.arange(5 + cfg.block_size)[None]
    with torch.no_grad():
        ours = drafter(noise_embeds=noise, context_hidden_states=context, position_ids=positions).last_hidden_state
        theirs = ref(position_ids=positions, noise_embedding=noise, target_hidden=context)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_bench_table_paired_bootstrap():
    """The noise-floor interval: a method that commits exactly twice its rival's tokens per round on every prompt
    has ratio 2 with no spread; a pair that differs only on some prompts gets an interval around the point value."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_table", Path(__file__).resolve().parents[1] / "examples" / "bench_table.py")
    bench_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_table)
    den = [(10 + i, 10) for i in range(20)]
    row = {"per_prompt": {"dflash": den, "retrace": [(2 * c, n) for c, n in den]}}
    assert bench_table.bootstrap_ratio([row], "retrace", "dflash") == pytest.approx((2.0, 2.0))
    row["per_prompt"]["retrace"] = [(c + (5 if i % 2 else 0), n) for i, (c, n) in enumerate(den)]
    lo, hi = bench_table.bootstrap_ratio([row], "retrace", "dflash")
    point = bench_table._tau(row["per_prompt"]["retrace"]) / bench_table._tau(den)
    assert 1.0 < lo < point < hi
    assert bench_table.bootstrap_ratio([row], "no_memory", "dflash") is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_demo_reports_identical_output(tiny_assets, capsys, dtype):
    """The demo says whether the speculative output equals plain generate() (exact in fp32, near-ties in bf16)."""
    from dflash_retrace.demo import run_demo

    result = run_demo(str(tiny_assets / "target"), str(tiny_assets / "drafter"), prompt="w10 w11 w12",
                      max_new_tokens=12, stream=False, dtype=dtype)
    printed = capsys.readouterr().out
    assert result["dtype"] == dtype and isinstance(result["identical_to_plain"], bool)
    assert f"output ({dtype}): " in printed
    if dtype == "float32":
        assert result["identical_to_plain"] and result["first_difference"] is None
    if result["identical_to_plain"]:  # same tokens: the time ratio is the rate ratio the bound applies to
        assert (result["measurement_fault"] is not None) == (result["speedup"] > (result["tau"] or 1.0))
