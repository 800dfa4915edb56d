"""CLI input errors: one clear line saying what was wrong and what would work, exit code 2; tracebacks with --debug."""

import pytest

from dflash_retrace import cli
from dflash_retrace.assets import MODELS


def _run(capsys, argv):
    """Exit code and the error lines (progress bars aside); no traceback anywhere."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, [line for line in captured.err.splitlines() if line.startswith("dflash-retrace")]


def test_unknown_target_lists_the_registry_names(capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network, deterministically
    code, lines = _run(capsys, ["bench", "--target", "nosuch", "--drafter", "untrained", "--max-samples", "1"])
    assert code == 2 and len(lines) == 1, lines
    assert "'nosuch'" in lines[0] and all(name in lines[0] for name in MODELS) and "offline" in lines[0]


def test_missing_drafter_folder_says_no_such_folder(capsys):
    code, lines = _run(capsys, ["bench", "--target", "./no/such/target", "--drafter", "/nonexistent"])
    assert code == 2 and len(lines) == 1 and "no such folder: ./no/such/target" in lines[0], lines
    code, lines = _run(capsys, ["export", "/nonexistent", "--out", "/tmp/never-written"])
    assert code == 2 and len(lines) == 1 and "no such folder: /nonexistent" in lines[0], lines


def test_payload_refuses_a_folder_that_is_not_a_drafter(capsys, tmp_path):
    missing = tmp_path / "no-such-drafter-*"  # an unmatched glob reaches the CLI as this literal name
    code, lines = _run(capsys, ["payload", str(missing)])
    assert code == 2 and len(lines) == 1 and "does not exist" in lines[0], lines
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text("{}")
    code, lines = _run(capsys, ["payload", str(tmp_path / "drafter"), str(tmp_path / "empty")])
    assert code == 2 and len(lines) == 1 and "holds no config.json" in lines[0], lines
    assert list((tmp_path / "drafter").iterdir()) == [tmp_path / "drafter" / "config.json"]  # nothing written
    assert cli.main(["payload", str(tmp_path / "drafter")]) == 0
    assert (tmp_path / "drafter" / "modeling_dflash.py").is_file()


def test_push_offline_says_offline(capsys, monkeypatch, tmp_path):
    import huggingface_hub.constants

    from tiny import tiny_target
    from dflash_retrace import DFlashDrafter

    drafter = DFlashDrafter.from_target(tiny_target(), num_hidden_layers=1, block_size=4)
    drafter.save_pretrained(tmp_path / "drafter")

    def unreachable(*args, **kwargs):  # what a machine without network gets from the Hub client
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", unreachable)
    code, lines = _run(capsys, ["push", str(tmp_path / "drafter"), "--repo-id", "org/name", "--base-model", "x/y"])
    assert code == 2 and len(lines) == 1, lines
    assert "offline" in lines[0] and "HF_TOKEN" in lines[0] and "network" in lines[0]


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(FileNotFoundError):
        cli.main(["export", "/nonexistent", "--out", "/tmp/never-written", "--debug"])


def test_unexpected_error_is_one_line_with_a_hint(capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("something internal")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["export"].set_defaults(func=broken)
    code, lines = _run(capsys, ["export", "x", "--out", "y"])
    assert code == 1 and len(lines) == 1 and "RuntimeError: something internal" in lines[0] and "--debug" in lines[0]
