"""`corpus.build_text_rows`: source-text rows, on stand-in archives (no network)."""

import pytest

from dflash_retrace.training import corpus as train_data


@pytest.fixture
def fake_sources(monkeypatch):
    words = [f"w{i}" for i in range(3000)]
    prose = " ".join(words)  # every word unique: a response can be located in its document
    play = "\n".join(f"line {i} " + "x" * 30 for i in range(600))
    funcs = [(f"mod{i}.py:f{i}:1", f"def f{i}(a):\n" + "\n".join(f"    a = a + {j}" for j in range(8)) + "\n    return a")
             for i in range(20)]
    monkeypatch.setattr(train_data, "fetch_sources", lambda cache_dir=None: {"sotu": None, "brown": None,
                                                                             "shakespeare": None})
    monkeypatch.setattr(train_data, "_stdlib_functions", lambda: list(funcs))
    monkeypatch.setattr(train_data, "_sotu_docs", lambda path: [("sotu-doc", prose)])
    monkeypatch.setattr(train_data, "_brown_docs", lambda path: [("brown-doc", prose)])
    monkeypatch.setattr(train_data, "_shakespeare_docs", lambda path: [("play", play)])
    return prose, play, dict(funcs)


def test_text_rows_answer_with_the_source_text(fake_sources, monkeypatch):
    prose, play, funcs = fake_sources
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (set(), [{"set": "stand-in", "prompts": 0}]))
    rows, manifest = train_data.build_text_rows(num_rows=12, seed=3)
    assert len(rows) == manifest["num_rows"] == 12 and manifest["eval_overlap_check"]["dropped"] == 0
    assert len({r["id"] for r in rows}) == 12 and all(r["finish_reason"] == "eos" for r in rows)
    code = [r for r in rows if r["kind"] == "code"]
    assert len(code) == 6
    for r in code:
        whole = funcs[r["source"].split(":", 1)[1]]
        assert r["response"] == f"```python\n{whole}\n```"
        head = r["prompt"].split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        assert whole.startswith(head) and len(head) < len(whole)  # the first half, completed by the response
    for r in rows:
        if r["kind"] != "prose":
            continue
        text = r["prompt"].split("\n\n", 1)[1]
        doc = play if r["source"].endswith(":play") else prose
        sep = "\n" if doc is play else " "
        assert text + sep + r["response"] in doc  # the response is what follows the excerpt in the document


def test_text_rows_drop_overlap_with_evaluation_sets(fake_sources, monkeypatch):
    prose, _, _ = fake_sources
    rows, _ = train_data.build_text_rows(num_rows=30, seed=1, check_overlap=False)
    victim = next(r for r in rows if r["kind"] == "prose" and "w" in r["response"])
    shingles = train_data._windows(train_data._words(victim["response"]))
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (set(list(shingles)[:1]), []))
    kept, manifest = train_data.build_text_rows(num_rows=30, seed=1)
    assert manifest["eval_overlap_check"]["dropped"] >= 1 and len(kept) == len(rows) - manifest[
        "eval_overlap_check"]["dropped"]
    assert victim["response"] not in {r["response"] for r in kept}


def test_prompt_mix_covers_every_kind_and_drops_overlap(fake_sources, monkeypatch):
    from dflash_retrace.training import prompt_mix

    funcs = [(f"mod{i}.py:g{i}:1", f'def g{i}(a, b):\n    """Return the sum of a and b plus {i} for item {i}."""\n'
              f"    return a + b + {i}") for i in range(40)]
    monkeypatch.setattr(train_data, "_stdlib_functions", lambda: list(funcs))
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (set(), []))
    monkeypatch.setattr(train_data.assets, "sha256_file", lambda path: "stand-in")
    rows, manifest = prompt_mix.build_prompt_mix(num_prompts=40, seed=0)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"code", "math", "prose"} and len({r["id"] for r in rows}) == len(rows)
    solve = [r for r in rows if r["template"].startswith("solve")]
    assert solve and all('"""Return the sum' in r["prompt"] and "return a + b" not in r["prompt"] for r in solve)
    again, _ = prompt_mix.build_prompt_mix(num_prompts=40, seed=0)
    assert again == rows  # deterministic for a seed
    victim = next(r for r in rows if r["kind"] == "math")
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (train_data._windows(train_data._words(victim["prompt"])), []))
    kept, manifest = prompt_mix.build_prompt_mix(num_prompts=40, seed=0)
    assert manifest["eval_overlap_check"]["dropped"] >= 1 and victim["prompt"] not in {r["prompt"] for r in kept}


def test_a_second_mix_excludes_an_earlier_one_and_keeps_its_own_ids(fake_sources, monkeypatch, tmp_path):
    import json

    funcs = [(f"mod{i}.py:g{i}:1", f'def g{i}(a, b):\n    """Return the sum of a and b plus {i} for item {i} of the list."""'
              f"\n    return a + b + {i}") for i in range(60)]
    monkeypatch.setattr(train_data, "_stdlib_functions", lambda: list(funcs))
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (set(), []))
    monkeypatch.setattr(train_data.assets, "sha256_file", lambda path: "stand-in")
    first = tmp_path / "mix0.jsonl"
    train_data.build_corpus(train_data.CorpusConfig(out=str(first), num_prompts=40, seed=0, mix=True))
    earlier = train_data.read_jsonl(first)
    assert all(r["id"].startswith("m0") for r in earlier)  # seed 0 keeps the committed answers' ids
    second = tmp_path / "mix1.jsonl"
    printed = train_data.build_corpus(train_data.CorpusConfig(out=str(second), num_prompts=40, seed=1, mix=True,
                                                              exclude=str(first)))
    rows = train_data.read_jsonl(second)
    report = json.loads((tmp_path / "mix1.jsonl.manifest.json").read_text())["exclude_check"]
    from dflash_retrace.training.prompt_mix import build_prompt_mix

    unfiltered, _ = build_prompt_mix(40, 1)
    assert report["dropped"] >= 1 and len(rows) == len(unfiltered) - report["dropped"] == printed["num_rows"]
    assert report["files"] == [{"file": str(first), "prompts": len(earlier)}]
    manifest = json.loads((tmp_path / "mix1.jsonl.manifest.json").read_text())
    assert manifest["num_prompts"] == len(rows) == sum(manifest["counts"].values())
    content = lambda p: train_data._windows(train_data._content_words(p))  # noqa: E731 - templates left out
    old_shingles = set().union(*(content(r["prompt"]) for r in earlier))
    old_prompts = {r["prompt"] for r in earlier}
    assert rows and all(r["prompt"] not in old_prompts and not (content(r["prompt"]) & old_shingles) for r in rows)
    assert all(r["id"].startswith("s1m") for r in rows) and not {r["id"] for r in rows} & {r["id"] for r in earlier}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no rows with a 'prompt'"):
        train_data.build_corpus(train_data.CorpusConfig(out=str(tmp_path / "x.jsonl"), num_prompts=10, seed=2,
                                                        mix=True, exclude=str(empty)))


def test_installed_packages_join_the_code_sources(fake_sources, monkeypatch, tmp_path):
    import json

    pkg = tmp_path / "site" / "toypkg"
    (pkg / "tests").mkdir(parents=True)
    body = "\n".join(f"    total = total + {j} * x" for j in range(10))
    spec = '    """Return the running total of x over the ten steps of item {i}."""\n'
    (pkg / "__init__.py").write_text("".join(f"def step{i}(x):\n{spec.format(i=i)}    total = 0\n{body}\n    return total\n\n"
                                             for i in range(30)))
    (pkg / "tests" / "test_skip.py").write_text(f"def skipped(x):\n{spec.format(i=0)}{body}\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(train_data, "_eval_shingles", lambda: (set(), []))
    monkeypatch.setattr(train_data.assets, "sha256_file", lambda path: "stand-in")
    out = tmp_path / "mix.jsonl"
    train_data.build_corpus(train_data.CorpusConfig(out=str(out), num_prompts=40, seed=3, mix=True,
                                                    mix_shares="0.5,0.25,0.25,0", code_packages="toypkg"))
    rows = train_data.read_jsonl(out)
    manifest = json.loads((tmp_path / "mix.jsonl.manifest.json").read_text())
    report = manifest["code_sources"]["python-package:toypkg"]
    assert report["functions_available"] == 30 and report["version"] is None and report["import_name"] == "toypkg"
    from_pkg = [r for r in rows if r["source"].startswith("python-package:toypkg/__init__.py:step")]
    assert any(r["template"].startswith("solve") for r in from_pkg) and not any("skipped" in r["prompt"] for r in rows)
    assert {r["kind"] for r in rows} == {"code", "math"} and manifest["shares"] == [0.5, 0.25, 0.25, 0.0]
    stdlib_only, _ = train_data._code_functions()
    assert len(stdlib_only) == 20  # the stand-in stdlib; no package unless asked for
    with pytest.raises(ValueError, match="not an installed package here"):
        train_data.build_corpus(train_data.CorpusConfig(out=str(out), mix=True, code_packages="toypkg,no_such_pkg"))
    with pytest.raises(ValueError, match="sum to 1"):
        train_data.build_corpus(train_data.CorpusConfig(out=str(out), mix=True, mix_shares="0.5,0.5,0.5,0"))
    with pytest.raises(ValueError, match="--mix only"):
        train_data.build_corpus(train_data.CorpusConfig(out=str(out), mix_shares="0.5,0.25,0.25,0"))
