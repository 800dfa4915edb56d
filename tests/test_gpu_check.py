"""gpu-check at its small shapes on the CPU (the same code path the GPU run takes)."""

import json

import torch

from dflash_retrace.cli import main as cli_main
from dflash_retrace.evaluation.gpu_check import SHAPES, build_models


def test_qwen3_8b_shapes_are_the_published_ones():
    """SHAPES reads the `qwen3-8b` template; these are Qwen3-8B's and z-lab/Qwen3-8B-DFlash-b16's config values."""
    spec = SHAPES["qwen3-8b"]
    assert spec["target"] == dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                                  num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936)
    assert spec["drafter"] == dict(num_hidden_layers=5, block_size=16, target_layer_ids=[1, 9, 17, 25, 33],
                                   mask_token_id=151669)


def test_models_are_created_in_the_requested_dtype_without_casting():
    target, drafter = build_models("small", torch.device("cpu"), torch.bfloat16)
    assert {p.dtype for p in target.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in drafter.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored
    assert drafter.config.target_layer_ids == [1, 3] and drafter.config.block_size == 16


def test_gpu_check_small_on_cpu(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    assert cli_main(["gpu-check", "--small", "--device", "cpu", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["config"]["shape"] == "small" and report["environment"]["dtype"] == "float32"
    # fp32: verifying a block gives the same greedy tokens as one-at-a-time decoding.
    assert report["agreement"]["all_identical"] and report["agreement"]["exact_rate"] == 1.0
    timing = report["timing_ms"]
    for key in ("plain_decode_step", "plain_step_wall", "round_wall", "target_verify", "drafter_forward",
                "drafter_logits", "other"):
        assert timing[key] is not None, key
    for key in ("plain_decode_step", "target_verify", "drafter_forward", "drafter_logits", "round_wall"):
        assert timing[key] > 0, key
    # The parts cannot exceed the whole by more than timer noise.
    assert timing["target_verify"] + timing["drafter_forward"] < timing["round_wall"] * 1.2
    acc = report["acceptance"]
    assert acc["num_rounds"] > 0 and 1.0 <= acc["tau_pooled"] <= 16
    assert sum(acc["histogram_counts"]) == acc["num_rounds"]
    assert all(row["new_tokens"] == report["config"]["max_new_tokens"] for row in report["prompts"])
    assert report["memory"]["peak_rss_gib"] > 0
    # The table is printed last.
    assert "target verify (B tokens)" in printed and "greedy agreement with plain" in printed
