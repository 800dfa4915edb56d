"""Timing figures that cannot be true are flagged, and gpu-check never switches shapes silently."""

import json
import math

import torch

from dflash_retrace.evaluation import gpu_check
from dflash_retrace.cli import main as cli_main
from dflash_retrace.evaluation.metrics import speedup_bound_fault, spread


def test_speedup_above_tau_is_a_measurement_fault():
    fault = speedup_bound_fault(1.98, 1.0)  # the figure gpu-check once printed at τ = 1.000
    assert fault and "MEASUREMENT FAULT" in fault and "1.980" in fault and "1.000" in fault
    assert speedup_bound_fault(1.1, None) and speedup_bound_fault(1.1, math.nan)  # no rounds: the bound is 1
    assert speedup_bound_fault(0.55, 1.29) is None and speedup_bound_fault(1.3, 1.3) is None
    assert speedup_bound_fault(None, 2.0) is None


def test_spread():
    assert spread([0.5, 0.7, 0.6, None]) == {"min": 0.5, "median": 0.6, "max": 0.7, "n": 3}
    assert spread([1.0, 2.0])["median"] == 1.5 and spread([]) is None


def test_gpu_check_without_cuda_needs_small(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = cli_main(["gpu-check", "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA device" in err and "--small" in err
    assert not (tmp_path / "x.json").exists()


def test_gpu_check_interleaves_and_flags_an_impossible_speedup(monkeypatch, capsys, tmp_path):
    """Plain runs timed under load (here: 1 s added to each) give a speedup above τ: reported as a fault."""
    order, original = [], gpu_check._timed_generate

    def loaded(target, drafter, input_ids, max_new_tokens, timer, speculative):
        tokens, total_ms, records = original(target, drafter, input_ids, max_new_tokens, timer, speculative)
        order.append(speculative)
        return tokens, total_ms + (0.0 if speculative else 1000.0), records

    monkeypatch.setattr(gpu_check, "_timed_generate", loaded)
    out = tmp_path / "gpu_check.json"
    assert cli_main(["gpu-check", "--small", "--device", "cpu", "--num-prompts", "3", "--max-new-tokens", "8",
                     "--output", str(out)]) == 0
    assert order[2:] == [False, True, True, False, False, True]  # after the warm-up: alternating order
    report = json.loads(out.read_text())
    throughput = report["throughput"]
    assert throughput["speedup"] > report["acceptance"]["tau_pooled"]
    assert throughput["measurement_fault"].startswith("MEASUREMENT FAULT")
    assert throughput["speedup_spread"]["n"] == 3
    printed = capsys.readouterr().out
    assert "MEASUREMENT FAULT" in printed and "per prompt" in printed
