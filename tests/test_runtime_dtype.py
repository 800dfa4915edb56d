"""The "auto" dtype rule: bf16 on CUDA; for inference also on CPUs with bf16 matrix units; fp32 otherwise."""

import torch

from dflash_retrace import runtime


def test_auto_dtype_rule(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for has_units in (True, False):
        monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: has_units)
        assert runtime.resolve_dtype("auto", cuda) == torch.bfloat16
        assert runtime.resolve_dtype("auto", cuda, inference=True) == torch.bfloat16
        assert runtime.resolve_dtype("auto", cpu) == torch.float32  # training keeps fp32 master weights
        assert runtime.resolve_dtype("auto", cpu, inference=True) == (torch.bfloat16 if has_units else torch.float32)
        assert runtime.resolve_dtype("float32", cpu, inference=True) == torch.float32  # an explicit dtype wins


def test_cpu_flags_are_read(monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    for flags, expected in (("fpu sse avx512f amx_bf16 amx_tile", True), ("fpu sse avx2", False)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor : 0\nflags : {flags}\n")
        monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(info if p == "/proc/cpuinfo" else p, *a, **k))
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
        assert runtime.cpu_has_bf16_matmul() is expected
