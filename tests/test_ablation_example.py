"""examples/ablation_variants.py end to end on a tiny random target (CPU): every variant trained from one DFlash
drafter on one feature store (two `train` subprocesses at a time, --jobs 2), the T=0 cell from `replay`, the T=1 cell
from `bench` with its own smaller prompt count (--sample-datasets), then OUT/ablation.json and OUT/ablation.png."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from dflash_retrace import cli
from test_bench import tiny_assets  # noqa: F401  (the bench tests' tiny chat target, drafter and prompts)

CLI = Path(sys.executable).with_name("dflash-retrace")


def _example():
    spec = importlib.util.spec_from_file_location(
        "ablation_variants", Path(__file__).parents[1] / "examples" / "ablation_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not CLI.exists(), reason="the dflash-retrace executable is not installed next to python")
def test_ablation_example_end_to_end(tiny_assets, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # each subprocess on one core (the script only sets a default)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The set is a path with a folder: the script's file names flatten it (references-sets_prompts.jsonl.jsonl).
    monkeypatch.chdir(tmp_path)
    prompts = [json.loads(line) for line in (tiny_assets / "prompts.jsonl").read_text().splitlines()]
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts[:3]))
    (tmp_path / "rows.jsonl").write_text("".join(
        json.dumps({"id": f"r{i}", "prompt": f"w{10 + i} w{20 + i} w{30 + i}",
                    "response": " ".join(f"w{(7 * i + 3 * j) % 80 + 10}" for j in range(24))}) + "\n"
        for i in range(4)))
    target = str(tiny_assets / "target")
    assert cli.main(["features", "--target", target, "--data", "rows.jsonl", "--out", "store", "--layers", "0,1,2,3",
                     "--dtype", "float32", "--no-progress"]) == 0

    names = ["dflash", "steps", "vat"]
    out = tmp_path / "ablation"
    _example().main([
        "--target", target, "--features", str(tmp_path / "store"), "--init", str(tiny_assets / "drafter"),
        "--out", str(out), "--steps", "2", "--variants", ",".join(names), "--jobs", "2", "--replay",
        "--datasets", "sets/prompts.jsonl:3", "--sample-datasets", "sets/prompts.jsonl:2", "--temperatures", "0,1",
        "--max-new-tokens", "8", "--dtype", "float32",
        "--train-args", "--max-anchors 8 --eval-size 0 --no-progress --checkpoint-every 0 "
                        "--new-weights-lr-scale 10 --lr 1e-3",
    ])
    printed = capsys.readouterr().out
    assert "| 0 | sets/prompts.jsonl (3) | steps |" in printed and "| 1 | sets/prompts.jsonl (2) | vat |" in printed

    for name in names:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["ablation_wall_s"] > 0
    assert json.loads((out / "steps" / "train_config.json").read_text())["step_embeddings"] is True
    assert json.loads((out / "vat" / "train_config.json").read_text())["loss"] == "vat"
    assert (out / "replay-sets_prompts.jsonl-T0.json").exists() and (out / "bench-sets_prompts.jsonl-T1.json").exists()
    assert (out / "references-sets_prompts.jsonl.jsonl").exists()
    assert not (out / "bench-sets_prompts.jsonl-T0.json").exists()  # --replay: no T=0 bench

    report = json.loads((out / "ablation.json").read_text())
    rows = report["rows"]
    assert sorted((r["variant"], r["T"]) for r in rows) == sorted((n, t) for n in names for t in (0.0, 1.0))
    for r in rows:
        assert r["dataset"] == "sets/prompts.jsonl" and r["tau"] >= 1
        if r["variant"] == "dflash":
            assert r["tau_ratio"] == 1.0
        if r["T"] == 0:  # replay: the three --datasets prompts, a drafter cost and no speedup
            assert r["prompts"] == 3 and r["speedup"] is None and r["exact_rate"] is None
            assert r["cost"] == "drafter ms per round (replay)"
        else:  # bench: the two --sample-datasets prompts, timed
            assert r["prompts"] == 2 and r["speedup"] is not None and r["ms_per_round"] > 0
            assert r["cost"].startswith("ms per round (bench")
        assert r["tau_ratio_ci"] is None or r["tau_ratio_ci"][0] <= r["tau_ratio"] <= r["tau_ratio_ci"][1]
    assert set(report["training"]) == set(names) and all(t["steps"] == 2 for t in report["training"].values())
    assert report["config"]["jobs"] == 2 and report["config"]["sample_datasets"] == "sets/prompts.jsonl:2"
    png = out / "ablation.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Resumable: a rerun trains nothing and measures nothing (every summary and report exists) and rewrites the table.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}
    logs = {p: p.read_text() for p in out.glob("*.log")}
    _example().main(["--target", target, "--features", "unused", "--init", "unused", "--out", str(out),
                     "--steps", "2", "--variants", ",".join(names), "--replay", "--datasets", "sets/prompts.jsonl:3",
                     "--sample-datasets", "sets/prompts.jsonl:2", "--max-new-tokens", "8"])
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/summary.json")} == stamps
    assert {p: p.read_text() for p in out.glob("*.log")} == logs
    assert json.loads((out / "ablation.json").read_text())["rows"] == rows

    # A kept report of another cell (here: 3 sampled prompts asked, the kept T=1 report has 2) is refused, not reused.
    with pytest.raises(SystemExit, match=r"bench-sets_prompts.jsonl-T1.json is from another run .*'prompts': \(2, 3\)"):
        _example().main(["--target", target, "--features", "unused", "--init", "unused", "--out", str(out),
                         "--steps", "2", "--variants", ",".join(names), "--replay", "--datasets",
                         "sets/prompts.jsonl:3", "--sample-datasets", "sets/prompts.jsonl:3", "--max-new-tokens", "8"])
