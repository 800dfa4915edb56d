"""The layout's rules, checked on the source: the import graph, size limits, one version range, generated CLIs,
the README's architecture section, and the deprecated module paths."""

import ast
import dataclasses
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dflash_retrace.cli import build_parser
from dflash_retrace.config_cli import add_config_arguments, config_from_args
from dflash_retrace.evaluation import BenchConfig
from dflash_retrace.generation_dflash import SUPPORTED_TRANSFORMERS
from dflash_retrace.training import RegenerateConfig, TrainConfig
from dflash_retrace.training.corpus import CorpusConfig

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "dflash_retrace"
PAYLOAD = {p.stem for p in SRC.glob("*_dflash.py")}  # the Hub payload: flat, torch + transformers + siblings
SHARED = {"__init__", "_moved", "assets", "config_cli", "prompts", "runtime", "templates"}
COMMANDS = {"demo", "training", "evaluation", "hub"}  # a module, or a package of modules
ENTRY = {"cli"}
UNITS = {p.stem for p in SRC.glob("*.py")} | {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}


def _modules() -> dict:
    """{dotted name under dflash_retrace: path}."""
    return {".".join(p.relative_to(SRC).with_suffix("").parts): p for p in sorted(SRC.rglob("*.py"))}


def _imports(name: str, path: Path) -> tuple:
    """(library modules imported, anywhere in the file, as top-level units; other top-level packages)."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                full = base + (node.module.split(".") if node.module else [])
                if full:
                    ours.add(full[0])
                else:  # `from . import x`: the unit x, or the package's own __init__ (`__version__`)
                    ours |= {a.name if a.name in UNITS else "__init__" for a in node.names}
            elif node.module.split(".")[0] == "dflash_retrace":
                parts = node.module.split(".")[1:]
                ours |= {parts[0]} if parts else {a.name if a.name in UNITS else "__init__" for a in node.names}
            else:
                others.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "dflash_retrace":
                    ours.add(parts[1] if len(parts) > 1 else "__init__")
                else:
                    others.add(parts[0])
    return ours, others


def _unit(name: str) -> str:
    return name.split(".")[0]


def test_import_graph():
    """payload -> nothing else of the library; shared modules -> payload and shared; a command -> payload, shared
    and its own package, never another command; only the entry point (cli) reaches every command."""
    allowed = {"payload": PAYLOAD, "shared": PAYLOAD | SHARED}
    problems = []
    for name, path in _modules().items():
        unit = _unit(name)
        ours, others = _imports(name, path)
        ours.discard(unit)
        if unit in PAYLOAD:
            bad = ours - PAYLOAD
            bad_third_party = others - {"torch", "transformers"} - set(sys.stdlib_module_names)
            if bad_third_party:
                problems.append(f"{name} (payload) imports {sorted(bad_third_party)}")
        elif unit in SHARED:
            bad = ours - allowed["shared"]
        elif unit in COMMANDS:
            bad = ours - allowed["shared"]
        elif unit in ENTRY:
            bad = ours - allowed["shared"] - COMMANDS
        else:
            problems.append(f"{name}: not placed in a layer (add it to PAYLOAD/SHARED/COMMANDS in this test)")
            continue
        if bad:
            problems.append(f"{name} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)


def test_the_graph_check_can_fail(tmp_path):
    """The parser sees relative, absolute and function-level imports (what a sideways import would use)."""
    path = tmp_path / "bench.py"
    path.write_text("def f():\n    from ..training import loop\n    import dflash_retrace.hub\n"
                    "from . import methods\nfrom dflash_retrace import runtime\n")
    ours, _ = _imports("evaluation.bench", path)
    assert ours == {"training", "hub", "evaluation", "runtime"}


def test_size_limits():
    """No module over 600 lines, no function over 80."""
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > 600:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


def test_transformers_range_has_one_source():
    """`generation_dflash.SUPPORTED_TRANSFORMERS` is the range; pyproject, CI's floor job, the custom_generate
    requirements and the README state the same one."""
    floor, ceiling = SUPPORTED_TRANSFORMERS  # ("5.15.0", "5.25.0")
    short = lambda v: v[:-2] if v.endswith(".0") else v  # noqa: E731
    spec = f"transformers>={short(floor)},<{short(ceiling)}"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.findall(r'"(transformers[^"]*)"', pyproject.split("[project.optional-dependencies]")[0]) == [spec]
    ci = (REPO / ".ci" / "run").read_text()
    assert f'"transformers=={floor}"' in ci and f"transformers.__version__ == '{floor}'" in ci and spec in ci
    requirements = (REPO / "hub_configs" / "custom_generate" / "custom_generate" / "requirements.txt").read_text()
    assert f"transformers>={short(floor)}" in requirements.split()
    assert f"`>={short(floor)},<{short(ceiling)}`" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("config_class, required", [
    (TrainConfig, ["--target", "t", "--data", "d", "--out", "o"]),
    (BenchConfig, ["--target", "t", "--drafter", "untrained"]),
    (RegenerateConfig, ["--target", "t", "--prompts", "p", "--out", "o"]),
    (CorpusConfig, ["--out", "o"]),
])
def test_cli_is_generated_from_the_config(config_class, required):
    """Every field is an option with help, and parsing no options gives the dataclass's own defaults."""
    command = {TrainConfig: "train", BenchConfig: "bench", RegenerateConfig: "regenerate", CorpusConfig: "corpus"}
    parser = build_parser()
    args = parser.parse_args([command[config_class], *required])
    sub = parser._subparsers._group_actions[0].choices[command[config_class]]
    dests = {a.dest: a for a in sub._actions}
    skipped = {"target_name", "progress"} if config_class is RegenerateConfig else set()
    for f in dataclasses.fields(config_class):
        if f.name in skipped:
            continue
        assert f.name in dests and dests[f.name].help, f.name
    config = config_from_args(config_class, args)
    expected = {f.name: f.default for f in dataclasses.fields(config_class)}
    expected.update({f.name: f.metadata["cli_default"] for f in dataclasses.fields(config_class)
                     if "cli_default" in f.metadata})
    expected.update({k: getattr(args, k) for k in ("out",) if k in expected})
    assert {k: getattr(config, k) for k in expected if k not in skipped} == {k: v for k, v in expected.items()
                                                                            if k not in skipped}


def test_cli_options_parse_to_config_values():
    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    config = config_from_args(TrainConfig, parser.parse_args(
        ["--target-layer-ids", "1,14,27", "--lora", "--no-chat-template", "--stage", "retrace", "--lr", "1e-3"]))
    assert config.target_layer_ids == [1, 14, 27] and config.lora and not config.chat_template
    assert config.stage == "retrace" and config.lr == 1e-3 and config.resolved().epochs == 8
    with pytest.raises(SystemExit):
        parser.parse_args(["--stage", "other"])
    with pytest.raises(ValueError, match="stage must be one of"):
        TrainConfig(stage="other").resolved()


def test_readme_architecture_names_every_module():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in _modules() if f"`{name.split('.')[-1]}" not in section and name.split(".")[-1] != "__init__"]
    assert not missing, missing


@pytest.mark.parametrize("old, name", [
    ("dflash_retrace.train", "train_drafter"), ("dflash_retrace.training_core", "dflash_block_loss"),
    ("dflash_retrace.bench", "run_benchmark"), ("dflash_retrace.gpu_check", "run_gpu_check"),
    ("dflash_retrace.metrics", "summarize_rounds"), ("dflash_retrace.datasets", "load_prompts"),
    ("dflash_retrace.regenerate", "regenerate"), ("dflash_retrace.train_data", "build_prompts"),
])
def test_old_module_paths_warn_and_work(old, name):
    import importlib

    sys.modules.pop(old, None)
    with pytest.warns(FutureWarning, match=f"`{re.escape(old)}` is deprecated"):
        module = importlib.import_module(old)
    assert callable(getattr(module, name))


def test_old_train_data_command_warns_and_runs(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "kind": "code", "source": "python-stdlib:x"}\n')
    proc = subprocess.run([sys.executable, "-m", "dflash_retrace.train_data", "--subset-from", str(rows), "--out",
                           str(tmp_path / "out.jsonl"), "--code", "1", "--prose-per-source", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dflash-retrace corpus" in proc.stderr and (tmp_path / "out.jsonl").read_text().count("\n") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import dflash_retrace.training.corpus  # noqa: F401 - the new path does not warn
