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


def test_bf16_on_a_cpu_without_bf16_units_warns(monkeypatch):
    import warnings

    import pytest

    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: False)
    with pytest.warns(UserWarning, match=r"--dtype bfloat16 on this CPU.*about 90x slower than fp32"):
        assert runtime.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.warns(UserWarning, match="emulated"):
        runtime.resolve_dtype(torch.bfloat16, torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runtime.resolve_dtype("auto", torch.device("cpu"), inference=True) == torch.float32
        assert runtime.resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16
        assert runtime.resolve_dtype("float32", torch.device("cpu")) == torch.float32
        monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: True)
        assert runtime.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_training_in_bf16_on_a_cpu_without_bf16_units_warns(monkeypatch, tmp_path):
    import pytest

    from dflash_retrace.training import TrainConfig, train_drafter
    from dflash_retrace.training import loop
    from tiny import continuations, prompts, tiny_target

    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: False)
    target = tiny_target("qwen3", seed=0)
    rows = [{"input_ids": ids.tolist(), "loss_mask": mask.int().tolist()}
            for ids, mask in continuations(target, prompts(2, seed=0), 8)]
    assert loop.warn_slow_bf16 is runtime.warn_slow_bf16
    cfg = TrainConfig(mixed_precision="bf16", max_steps=1, eval_size=0, progress=False, checkpoint_every=0,
                      block_size=4)
    with pytest.warns(UserWarning, match=r"--mixed-precision bf16 on this CPU.*Use --mixed-precision no"):
        train_drafter(target, None, rows, tmp_path, cfg)
