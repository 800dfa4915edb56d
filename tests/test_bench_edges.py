"""bench, replay and examples/bench_table.py at their edges: errors on some prompts, rounds cut to nothing, T > 0,
multi-turn sampling seeds, EOS inside the baselines' drafts, runs without rounds (tiny models, CPU, fp32)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_retrace import DFlashDrafter
from dflash_retrace.evaluation import format_report, run_benchmark
from dflash_retrace.evaluation import methods as methods_module
from dflash_retrace.evaluation.methods import _budget_rounds
from dflash_retrace.evaluation.replay import format_replay, paired_tau_ratio_interval, run_replay
from test_bench import tiny_assets  # noqa: F401  (the bench tests' tiny chat target, drafter and prompts)

BENCH_TABLE = Path(__file__).resolve().parents[1] / "examples" / "bench_table.py"


def _bench_table(*paths) -> str:
    return subprocess.run([sys.executable, str(BENCH_TABLE), *map(str, paths)], capture_output=True, text=True,
                          check=True).stdout


def _table_row(table: str, start: str) -> list:
    row = next(line for line in table.splitlines() if line.startswith(start))
    return [c.strip() for c in row.strip("|").split("|")]


def _fail_compared_once(monkeypatch):
    """The --compare drafter raises on its second timed prompt (its first call is the warm-up)."""
    original, calls = methods_module.Methods.speculative, {"n": 0}

    def flaky(self, input_ids, max_new_tokens, drafter=None):
        if drafter is not None:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected failure")
        return original(self, input_ids, max_new_tokens, drafter)

    monkeypatch.setattr(methods_module.Methods, "speculative", flaky)


# ------------------------------------------------------------------ comparisons over the prompts both completed
def test_tau_ratio_and_table_cover_the_prompts_both_completed(tiny_assets, tmp_path, monkeypatch):
    """The compared drafter has the main drafter's weights but fails on one prompt: over the prompts both completed
    the τ ratio is 1 exactly (over each one's own prompts it was not), the JSON says how many prompts it covers, and
    bench_table computes every figure of the row on one prompt set and says how many prompts had errors."""
    _fail_compared_once(monkeypatch)
    out = tmp_path / "r.json"
    report = run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                           dataset=str(tiny_assets / "prompts.jsonl"), max_samples=None, source_order=True,
                           max_new_tokens=16, device="cpu", dtype="float32", output=out, progress=False,
                           compare={"dflash": str(tiny_assets / "drafter")})
    summary = report["summary"]
    methods = summary["methods"]
    assert methods["speculative"]["num_ok"] == 4 and methods["speculative:dflash"]["num_errors"] == 1
    key = "speculative/speculative:dflash"
    assert summary["tau_ratios"][key] == 1.0
    assert summary["tau_ratio_prompts"][key] == {"num_prompts": 3, "num_errors": 1}
    # the agreement says what it left out
    assert methods["speculative:dflash"]["agreement"]["num_prompts"] == 3
    assert methods["speculative:dflash"]["agreement"]["num_errors"] == 1
    assert methods["speculative"]["agreement"]["num_errors"] == 0
    text = format_report(report)
    assert "over the 3 prompts both completed (1 left out: an error in either)" in text
    assert "1 prompt with an error not compared" in text

    table = _bench_table(out)
    cells = _table_row(table, "| 0 | prompts (")
    assert cells[1] == "prompts (3 of 4; 1 with errors)"
    assert cells[2] == cells[4], "the same drafter on the same prompts: the same τ"
    assert cells[6] == "1.000" and cells[9] == "1.000 [1.000, 1.000]"
    both = [p["methods"] for p in report["prompts"] if p["methods"]["speculative:dflash"]["error"] is None]
    for cell, name in ((cells[3], "speculative:dflash"), (cells[5], "speculative")):  # the speedups: the same 3 prompts
        speedup = sum(m["plain"]["total_s"] for m in both) / sum(m[name]["total_s"] for m in both)
        assert cell == f"{speedup:.2f}", (cell, name)
    assert "greedy (T=0) outputs identical to plain generate() for every method and prompt: True over the 3 " \
           "prompts every method completed, 1 with errors not compared" in table
    rows_json = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(BENCH_TABLE), str(out), "--json", str(rows_json)], check=True,
                   capture_output=True)
    row = json.loads(rows_json.read_text())[0]
    assert (row["n"], row["n_ok"], row["errors"]) == (4, 3, 1)


# ------------------------------------------------------------------ what a round is
def test_rounds_cut_to_zero_proposals_are_rounds_as_defined(tiny_assets):
    """Under proposal_threshold a round whose first proposal is unsure is logged with 0 proposals and length 1, and
    τ and ms/round count it: the written definition says so."""
    from dflash_retrace.evaluation import bench, metrics

    report = run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                           dataset=str(tiny_assets / "prompts.jsonl"), max_samples=None, max_new_tokens=24,
                           device="cpu", dtype="float32", output=None, progress=False, proposal_threshold=0.05)
    spec = report["summary"]["methods"]["speculative"]
    lengths = [n for p in report["prompts"] for n in p["methods"]["speculative"]["acceptance_lengths"]]
    proposals = [k for p in report["prompts"] for k in p["methods"]["speculative"]["num_proposals"]]
    assert 0 < proposals.count(0) < len(proposals), proposals
    assert spec["num_rounds"] == len(lengths) and spec["tau_pooled"] == sum(lengths) / len(lengths)
    for text in (report["definitions"]["round"], bench.__doc__, metrics.__doc__):
        assert "at least one proposal" not in text and ">= 1 proposal" not in text
        assert "0 proposals" in text, text
    assert "proposal_threshold" in report["definitions"]["round"]


# ------------------------------------------------------------------ sampling seeds
def test_each_turn_samples_from_its_own_seed(tiny_assets, monkeypatch):
    """T > 0: every method gets the same seed on the same turn, and each turn of each prompt its own (the second turn
    of a prompt no longer replays the first one's random stream)."""
    calls = []
    for name in ("plain", "speculative"):
        original = getattr(methods_module.Methods, name)

        def spy(self, input_ids, max_new_tokens, *args, _name=name, _original=original):
            calls.append((_name, torch.initial_seed()))
            return _original(self, input_ids, max_new_tokens, *args)

        monkeypatch.setattr(methods_module.Methods, name, spy)
    report = run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                           dataset=str(tiny_assets / "prompts.jsonl"), max_samples=None, source_order=True,
                           max_new_tokens=6, warmup_tokens=2, device="cpu", dtype="float32", output=None,
                           progress=False, temperature=1.0, seed=3)
    assert all(m["error"] is None for p in report["prompts"] for m in p["methods"].values())
    assert [p["turns"] for p in report["prompts"]] == [1, 1, 1, 2]  # source order: the two-turn prompt is index 3
    timed = calls[2:]  # after the warm-up calls; then per turn both methods, one after the other
    pairs = [timed[i:i + 2] for i in range(0, len(timed), 2)]
    assert len(pairs) == 5 and all({name for name, _ in pair} == {"plain", "speculative"} for pair in pairs)
    assert all(pair[0][1] == pair[1][1] for pair in pairs), pairs  # one seed per turn for every method
    seeds = [pair[0][1] for pair in pairs]
    assert seeds[:4] == [3, 4, 5, 6]  # each prompt's first turn keeps seed + prompt index
    assert len(set(seeds)) == 5, seeds  # the second turn of the two-turn prompt samples from a stream of its own


# ------------------------------------------------------------------ the baselines' rounds at EOS
def test_budget_rounds_stop_counting_at_the_first_eos():
    # B 6, budget 24: round 1 proposes [7, 2, 9, 9, 9] with EOS 2 in slot 2 and commits 2 (the EOS ends the turn):
    # proposals after the EOS could never be committed, so the round counts 2, as this library's generator does.
    lengths, counts = _budget_rounds([3, 2], [[7, 8, 5, 5, 5], [7, 2, 9, 9, 9]], max_new_tokens=24, block_size=6,
                                     stop_ids={2})
    assert lengths == [3, 2] and counts == [5, 2]
    # the budget cuts first: an EOS past the usable proposals does not matter
    lengths, counts = _budget_rounds([4, 3, 1, 1], [[1, 1, 1]] * 4, max_new_tokens=10, block_size=4, stop_ids={2})
    assert counts == [3, 3, 1]
    lengths, counts = _budget_rounds([1], [[2, 2, 2]], max_new_tokens=10, block_size=4, stop_ids={2})
    assert counts == [1]
    with pytest.raises(RuntimeError, match="2 rounds but 1 verified blocks"):
        _budget_rounds([1, 1], [[3, 3, 3]], max_new_tokens=10, block_size=4, stop_ids={2})


def test_baseline_rounds_stop_counting_at_the_first_eos(tiny_assets):
    """With an EOS the drafter proposes mid-block, z-lab's loop and transformers' built-in path verify the proposals
    after it too; their logs count proposals up to the first EOS, as ours: the same rounds, the same counts."""
    target = AutoModelForCausalLM.from_pretrained(tiny_assets / "target", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "target")
    drafter = DFlashDrafter.from_pretrained(tiny_assets / "drafter").eval()
    target.generation_config.eos_token_id = 73  # a token the drafter proposes inside blocks on these prompts
    report = run_benchmark(target, drafter, tokenizer=tokenizer, dataset=str(tiny_assets / "prompts.jsonl"),
                           max_samples=None, source_order=True, max_new_tokens=24, device="cpu", dtype="float32",
                           output=None, progress=False, baselines=True)
    names = [n for n in ("zlab_reference", "transformers_builtin") if n in report["summary"]["methods"]]
    assert "transformers_builtin" in names
    cut_by_eos = 0
    for row in report["prompts"]:
        ours = row["methods"]["speculative"]
        assert ours["error"] is None
        if row["turns"] == 1:  # rounds with fewer proposals than B - 1 and the budget allow: cut after an EOS
            offset = 1
            for length, k in zip(ours["acceptance_lengths"], ours["num_proposals"]):
                cut_by_eos += k < min(5, 24 - offset - 1)
                offset += length
        for name in names:
            theirs = row["methods"][name]
            assert theirs["error"] is None
            assert theirs["acceptance_lengths"] == ours["acceptance_lengths"], (row["id"], name)
            assert theirs["num_proposals"] == ours["num_proposals"], (row["id"], name, ours, theirs)
    assert cut_by_eos, "no round was cut by the EOS: the test does not test the cut"
    for name in names:
        assert report["summary"]["methods"][name]["per_slot"] == report["summary"]["methods"]["speculative"]["per_slot"]


# ------------------------------------------------------------------ runs without rounds or prompts
def test_overhead_over_no_prompts_claims_nothing(tiny_assets, monkeypatch):
    """Our generator fails on every prompt: the comparison with transformers' built-in path covers 0 prompts, and its
    'same acceptance lengths' is None (not all([]) = True)."""

    def broken(self, input_ids, max_new_tokens, drafter=None):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(methods_module.Methods, "speculative", broken)
    report = run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                           dataset=str(tiny_assets / "prompts.jsonl"), max_samples=2, max_new_tokens=6,
                           device="cpu", dtype="float32", output=None, progress=False, baselines=True)
    overhead = report["summary"]["overhead"]["speculative_vs_transformers_builtin"]
    assert overhead["num_prompts"] == 0 and overhead["same_acceptance_lengths"] is None
    assert "same acceptance lengths: -" in format_report(report)


def test_replay_without_rounds_prints_a_dash_for_the_ratio(tiny_assets, tmp_path):
    report = run_replay(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                        dataset=str(tiny_assets / "prompts.jsonl"), max_samples=2, max_new_tokens=2, device="cpu",
                        dtype="float32", output=None, progress=False, compare={"other": str(tiny_assets / "drafter")})
    assert report["summary"]["tau_ratios"]["main/other"] == {"ratio": None, "ci95": None}
    text = format_replay(report)
    row = next(line for line in text.splitlines() if line.startswith("| other"))
    assert [c.strip() for c in row.strip("|").split("|")][1:3] == ["-", "-"]


def test_paired_tau_ratio_interval_keeps_the_prompts_of_the_point_estimate():
    """A prompt where only the main drafter had rounds counts in both pooled τ: the interval is over the same
    prompts, so it holds the point estimate."""
    num, den = [[3, 3], [1]], [[2, 2], []]
    point = (7 / 3) / (4 / 2)
    low, high = paired_tau_ratio_interval(num, den)
    assert low <= point <= high, (low, point, high)
    assert paired_tau_ratio_interval([[], []], [[1], [1]]) is None


def test_replay_seed_builds_the_untrained_drafter(tiny_assets, monkeypatch):
    from dflash_retrace.evaluation import bench

    seeds, original = [], bench.load_drafter

    def spy(spec, target=None, seed=0):
        seeds.append((str(spec), seed))
        return original(spec, target, seed)

    monkeypatch.setattr(bench, "load_drafter", spy)
    report = run_replay(str(tiny_assets / "target"), "untrained", dataset=str(tiny_assets / "prompts.jsonl"),
                        max_samples=1, max_new_tokens=4, device="cpu", dtype="float32", output=None, progress=False,
                        seed=5)
    assert seeds == [("untrained", 5)] and report["environment"]["seed"] == 5


# ------------------------------------------------------------------ bench_table at T > 0
def _load_bench_table():
    spec = importlib.util.spec_from_file_location("bench_table", BENCH_TABLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def t1_report(tiny_assets, tmp_path_factory):
    """A T = 1 run with --compare (EOS on: the sampled outputs differ in length between methods)."""
    out = tmp_path_factory.mktemp("t1") / "t1.json"
    report = run_benchmark(str(tiny_assets / "target"), str(tiny_assets / "drafter"),
                           dataset=str(tiny_assets / "prompts.jsonl"), max_samples=None, max_new_tokens=16,
                           device="cpu", dtype="float32", output=out, progress=False, temperature=1.0,
                           compare={"dflash": str(tiny_assets / "drafter")})
    return out, report


def test_bench_table_at_t1_shows_decode_rate_ratios(t1_report):
    """T = 1: sampled outputs differ in length, so the table's speedup cells are decode-rate ratios, and say so."""
    out, report = t1_report
    methods = report["summary"]["methods"]
    table = _bench_table(out)
    header = table.splitlines()[0]
    assert "DFlash speedup†" in header and "ReTrace speedup†" in header and "memory off: speedup†" in header
    assert "† speedup: at T=0" in table and "at T > 0 the decode-rate ratio" in table
    cells = _table_row(table, "| 1 | prompts (4) |")
    assert cells[3] == f"{methods['speculative:dflash']['decode_rate_ratio']:.2f}"
    assert cells[5] == f"{methods['speculative']['decode_rate_ratio']:.2f}"
    rows = _load_bench_table().read([out])
    assert rows[0]["retrace"]["decode_rate_ratio"] == methods["speculative"]["decode_rate_ratio"]
    assert rows[0]["retrace"]["speedup"] == methods["speculative"]["speedup"]  # the time ratio stays in --json


def test_bench_table_without_a_t0_report_claims_no_greedy_identity(t1_report):
    table = _bench_table(t1_report[0])
    assert "outputs identical to plain generate() for every method and prompt: n/a (no T=0 report)" in table
    assert ": True" not in table
