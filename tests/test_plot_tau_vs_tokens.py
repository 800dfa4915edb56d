"""examples/plot_tau_vs_tokens.py: held-out τ of a drafter lineage against training tokens, read from replay reports."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("plot_tau_vs_tokens", ROOT / "examples" / "plot_tau_vs_tokens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pooled(report, key):
    """τ pooled over every round of every prompt, recomputed from the per-prompt acceptance lengths."""
    lengths = [n for p in report["prompts"] for n in p["drafters"][key]["acceptance_lengths"]]
    return sum(lengths) / len(lengths)


def test_committed_spec_reads_the_tau_its_reports_recorded_round_by_round(tmp_path):
    plot = _module()
    spec = json.loads((ROOT / "results" / "tau_vs_tokens.json").read_text())
    for point in spec:
        point["replay"] = str(ROOT / point["replay"])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    points = plot.read_points(tmp_path / "spec.json")
    assert [p["label"] for p in points] == [p["label"] for p in spec]
    for point in points:
        report = json.loads(Path(point["replay"]).read_text())
        assert point["tau"] == pytest.approx(_pooled(report, point["drafter"]), abs=1e-9)
        assert 0.0 < point["slot1"] < 1.0


def _report(ids, new_tokens=64, lengths=(1, 2, 3)):
    return {"config": {"max_new_tokens": new_tokens, "temperature": 0.0},
            "prompts": [{"id": i, "drafters": {"main": {"acceptance_lengths": list(lengths)}}} for i in ids],
            "summary": {"methods": {"main": {"tau_pooled": sum(lengths) / len(lengths), "num_rounds": len(lengths),
                                             "per_slot": {"rate": [0.5, 0.2]}}}}}


def _write(tmp_path, reports, drafters=None):
    spec = []
    for i, report in enumerate(reports):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(report))
        spec.append({"label": f"run {i}", "slot_tokens": 1e6 * (i + 1), "replay": str(path),
                     "drafter": (drafters or ["main"] * len(reports))[i], "lineage": "a"})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return tmp_path / "spec.json"


def test_reports_on_other_prompts_or_budgets_are_refused(tmp_path):
    plot = _module()
    base = _report(["a", "b"])
    assert [p["tau"] for p in plot.read_points(_write(tmp_path, [base, copy.deepcopy(base)]))] == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"differ in \['prompts'\]"):
        plot.read_points(_write(tmp_path, [base, _report(["a", "c"])]))
    with pytest.raises(ValueError, match=r"differ in \['max_new_tokens'\]"):
        plot.read_points(_write(tmp_path, [base, _report(["a", "b"], new_tokens=32)]))
    with pytest.raises(ValueError, match="has no drafter 'run7'"):
        plot.read_points(_write(tmp_path, [base], drafters=["run7"]))


def test_main_writes_the_plot_and_the_points(tmp_path):
    plot = _module()
    spec = _write(tmp_path, [_report(["a"]), _report(["a"], lengths=(2, 2, 2, 4))])
    plot.main([str(spec), "--output", str(tmp_path / "p.png"), "--json", str(tmp_path / "p.json")])
    assert (tmp_path / "p.png").stat().st_size > 0
    assert [p["tau"] for p in json.loads((tmp_path / "p.json").read_text())] == [2.0, 2.5]


def test_log_fit_recovers_a_log_curve_and_inverts_it():
    import math

    plot = _module()
    points = [{"label": f"r{n}", "slot_tokens": n * 1e6, "tau": 1.0 + 0.1 * math.log(n * 1e6)} for n in (3, 1, 10, 30)]
    fit = plot.log_fit(points)
    assert fit["a"] == pytest.approx(1.0) and fit["b"] == pytest.approx(0.1)
    assert fit["gain_per_doubling"] == pytest.approx(0.1 * math.log(2))
    assert fit["points"] == ["r1", "r3", "r10", "r30"]  # sorted by tokens
    assert [s["gain_per_doubling"] for s in fit["segments"]] == pytest.approx([0.1 * math.log(2)] * 3)
    assert plot.tokens_to_reach(fit, 1.0 + 0.1 * math.log(5e7)) == pytest.approx(5e7)
    last2 = plot.log_fit(points, last=2)
    assert last2["points"] == ["r10", "r30"]
    flat = plot.log_fit([{**p, "tau": 1.5} for p in points])
    assert flat["b"] == pytest.approx(0.0, abs=1e-12) and plot.tokens_to_reach(flat, 2.0) is None
    with pytest.raises(ValueError, match="at least 2 points"):
        plot.log_fit(points, last=1)
    with pytest.raises(ValueError, match="2 or more token counts"):
        plot.log_fit([points[0], dict(points[0], label="same")])


def test_main_fit_projects_tokens_beyond_the_lineage(tmp_path):
    plot = _module()
    spec = _write(tmp_path, [_report(["a"], lengths=(1, 2)), _report(["a"], lengths=(2, 2))])  # τ 1.5 at 1M, 2.0 at 2M
    plot.main([str(spec), "--output", str(tmp_path / "p.png"), "--json", str(tmp_path / "p.json"), "--fit", "a",
               "--targets", "2.5", "--rate", "1000"])
    fit = json.loads((tmp_path / "p.json").read_text())["fit"]
    assert fit["gain_per_doubling"] == pytest.approx(0.5)
    (projection,) = fit["projections"]
    assert projection["slot_tokens"] == pytest.approx(4e6)  # one more doubling
    assert projection["more_slot_tokens"] == pytest.approx(2e6)
    assert projection["hours_more"] == pytest.approx(2e6 / 1000 / 3600)
    with pytest.raises(SystemExit, match="no point has that lineage"):
        plot.main([str(spec), "--output", str(tmp_path / "q.png"), "--fit", "b"])
