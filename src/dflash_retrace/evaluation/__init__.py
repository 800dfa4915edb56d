"""Measuring drafters: `bench` (τ and speedup against plain generate(), with a `BenchConfig`), `methods` (the
generate() calls compared), `metrics` (τ, histograms, per-slot acceptance, agreement), `report` (table and plot),
`gpu_check` (cost on one GPU at Qwen3-8B shapes), `replay` (exact greedy τ on whole prompt sets without verify
forwards)."""

from .bench import BenchConfig, run_benchmark
from .bench import register_cli as _register_bench
from .gpu_check import SHAPES, format_gpu_check, run_gpu_check
from .gpu_check import register_cli as _register_gpu_check
from .methods import build_reference_drafter
from .replay import ReplayConfig, format_replay, run_replay
from .replay import register_cli as _register_replay
from .report import format_report, plot_results

__all__ = ["BenchConfig", "ReplayConfig", "SHAPES", "build_reference_drafter", "format_gpu_check", "format_replay",
           "format_report", "plot_results", "register_cli", "run_benchmark", "run_gpu_check", "run_replay"]


def register_cli(subparsers) -> None:
    _register_bench(subparsers)
    _register_gpu_check(subparsers)
    _register_replay(subparsers)
