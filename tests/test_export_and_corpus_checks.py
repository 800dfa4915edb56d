"""Checks around publishing and data building: export never deletes what it reads, the z-lab card reports what
was exported, the overlap checks judge content (not template wording), `--exclude` reads chat rows, `regenerate`
resumes only rows of the same prompt, and load errors name the right fix."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_retrace import DFlashDrafter, hub
from dflash_retrace.prompts import HUMANEVAL_TEMPLATE, MATH_SUFFIX
from dflash_retrace.training import corpus, prompt_mix, regenerate
from tiny import tiny_target

BASE = "org/target"


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _export(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hub.export_drafter(*args, base_model=BASE, **kwargs)


def _listing(folder):
    return {p.name: p.read_bytes() if p.is_file() else "folder" for p in folder.iterdir()}


# ------------------------------------------------------------------------------------------- export
def test_export_refuses_an_out_folder_that_holds_the_drafter(target, tmp_path):
    src = tmp_path / "runs" / "drafter"
    DFlashDrafter.from_target(target).save_pretrained(src)
    (src / "summary.json").write_text(json.dumps({"stage": "dflash", "steps": 400}))
    before = _listing(src)
    for out in (tmp_path / "runs", tmp_path):  # the parent, and a folder further up
        with pytest.raises(ValueError, match="contains the drafter folder"):
            _export(src, out, overwrite=True)
        assert _listing(src) == before
    out = _export(src, src / "export", overwrite=True)  # an export inside the drafter folder deletes nothing
    assert (out / "summary.json").read_bytes() == before["summary.json"]
    assert "| stage | dflash |" in (out / "README.md").read_text()
    assert {n: b for n, b in _listing(src).items() if n != "export"} == before


def test_refused_or_failed_export_keeps_the_previous_one(target, tmp_path, monkeypatch):
    DFlashDrafter.from_target(target).set_draft_vocabulary([3, 4, 5]).save_pretrained(tmp_path / "dv")
    prev = _export(tmp_path / "dv", tmp_path / "export")
    before = _listing(prev)
    with pytest.raises(ValueError, match="draft vocabulary"):  # z-lab's layout has none: refused
        _export(tmp_path / "dv", prev, format="zlab", overwrite=True)
    assert _listing(prev) == before

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(DFlashDrafter, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        _export(tmp_path / "dv", prev, overwrite=True)
    assert _listing(prev) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dv", "export"]  # no staging folder left behind


def test_overwrite_replaces_the_whole_previous_export(target, tmp_path):
    DFlashDrafter.from_target(target).save_pretrained(tmp_path / "d")
    out = tmp_path / "export"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier export")
    with pytest.raises(FileExistsError, match="--overwrite"):
        _export(tmp_path / "d", out)
    assert (out / "stale.txt").exists()
    _export(tmp_path / "d", out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "export"]


def _bench(folder, methods, name="bench-humaneval.json"):
    (folder / name).write_text(json.dumps({
        "schema": "dflash-retrace/bench/v1",
        "config": {"dataset": "humaneval", "temperature": 0.0, "num_prompts": 164, "max_new_tokens": 256},
        "summary": {"methods": methods}}))


def _tau_rows(out):
    return [line for line in (out / "README.md").read_text().splitlines() if line.startswith("| humaneval")]


SPEC = {"num_ok": 164, "tau_pooled": 4.57, "speedup": 2.25}  # with ReTrace
REF = {"num_ok": 164, "tau_pooled": 3.10, "speedup": 1.60}  # plain DFlash, z-lab's loop


def test_zlab_card_of_a_retrace_drafter_reports_plain_dflash(target, tmp_path):
    src = tmp_path / "retrace"
    DFlashDrafter.from_target(target, retrace=True).save_pretrained(src)
    _bench(src, {"speculative": SPEC, "zlab_reference": REF})
    zlab = _export(src, tmp_path / "zlab", format="zlab")
    assert _tau_rows(zlab) == ["| humaneval | 0 | 164 | 256 | 3.1 | - | 1.6 |"]
    card = (zlab / "README.md").read_text()
    assert "`zlab_reference` figures" in card and "measured the drafter with ReTrace" in card
    ours = _export(src, tmp_path / "ours")  # our layout keeps ReTrace: the headline figures
    assert _tau_rows(ours) == ["| humaneval | 0 | 164 | 256 | 4.57 | - | 2.25 |"]
    assert "Note:" not in (ours / "README.md").read_text()

    _bench(src, {"speculative": SPEC})  # no baselines measured: no τ for the z-lab export
    (src / "bench-plain.json").write_text(json.dumps({"dataset": "mt-bench", "tau_pooled": 4.0}))
    with pytest.warns(UserWarning, match="zlab_reference"):
        zlab = hub.export_drafter(src, tmp_path / "zlab", format="zlab", base_model=BASE, overwrite=True)
    card = (zlab / "README.md").read_text()
    assert _tau_rows(zlab) == [] and "| mt-bench" not in card and "Not measured yet" in card
    assert "`bench-humaneval.json` has no `zlab_reference` figures" in card
    assert "`bench-plain.json` holds plain rows that do not say which method" in card


def test_zlab_card_of_a_plain_drafter_keeps_the_headline(target, tmp_path):
    src = tmp_path / "plain"
    DFlashDrafter.from_target(target).save_pretrained(src)
    _bench(src, {"speculative": REF})
    out = _export(src, tmp_path / "zlab", format="zlab")
    assert _tau_rows(out) == ["| humaneval | 0 | 164 | 256 | 3.1 | - | 1.6 |"]
    assert "Note:" not in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------- overlap
HUMANEVAL_CODE = ('def below_zero(operations):\n    """You are given a list of deposit and withdrawal operations on a '
                  'bank account that starts with zero balance. Detect if at any point the balance falls below zero."""\n')
GSM8K_QUESTION = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for "
                  "her friends every day with four.")
MT_BENCH = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
            "and must-see attractions.", "Can you parallelize it?"]


@pytest.fixture
def eval_sets(monkeypatch):
    """Stand-in evaluation sets, formatted as the harness formats them (HumanEval's instruction, the math suffix)."""
    sets = {"humaneval": [{"id": "HumanEval/3", "turns": [HUMANEVAL_TEMPLATE.format(prompt=HUMANEVAL_CODE)]}],
            "mt-bench": [{"id": "81", "turns": MT_BENCH}],
            "gsm8k": [{"id": "gsm8k/0", "turns": [GSM8K_QUESTION + MATH_SUFFIX]}]}
    monkeypatch.setattr(corpus, "load_prompts", lambda name: sets[name])


def _kept(rows):
    kept, dropped, checked = corpus._drop_eval_overlap([{"prompt": p} for p in rows], lambda r: r["prompt"])
    assert checked == [{"set": "humaneval", "prompts": 1}, {"set": "mt-bench", "prompts": 1},
                       {"set": "gsm8k", "prompts": 1}] and dropped == len(rows) - len(kept)
    return [r["prompt"] for r in kept]


def test_shared_template_wording_is_not_overlap(eval_sets):
    spec = 'def clamp(x, lo, hi):\n    """Return x limited to the closed interval from lo to hi."""'
    rows = [t.format(code=spec) for t in prompt_mix.SOLVE_TEMPLATES]  # the first one is HumanEval's instruction
    rows += ["Alice has 12 apples. She buys 5 more apples and then gives 3 to Ben. How many apples does Alice have "
             "now?" + suffix for suffix in prompt_mix.MATH_SUFFIXES]  # the first suffix is the harness's
    assert _kept(rows) == rows


def test_content_overlap_is_dropped_whatever_the_wrapping(eval_sets):
    middle = "at any point the balance falls below zero and detect if the deposit and withdrawal operations"
    rows = {
        "humaneval code in our template": prompt_mix.SOLVE_TEMPLATES[0].format(code=HUMANEVAL_CODE),
        "humaneval code bare": HUMANEVAL_CODE,
        "13 words of it in a prose excerpt": corpus.PROSE_TEMPLATES["summarize"].format(
            text="The clerk wrote: on a bank account that starts with zero balance. Detect if at any point the "
                 "ledger was wrong."),
        "gsm8k question with our suffix": GSM8K_QUESTION + prompt_mix.MATH_SUFFIXES[1],
        "gsm8k question in a writing template": prompt_mix.WRITING_TEMPLATES["letter"].format(text=GSM8K_QUESTION),
        "an mt-bench turn": "Please help. " + MT_BENCH[0],
        "a short mt-bench turn, contained": "Here is my merge sort. Can you parallelize it? Thanks.",
        "a short mt-bench turn, exact": MT_BENCH[1],
    }
    assert _kept(list(rows.values()) + [middle]) == [middle]  # `middle` shares only 8 words in a row: kept


def test_exclude_judges_content_reads_chat_rows_and_skips_empty_prompts(tmp_path):
    solve, letter = prompt_mix.SOLVE_TEMPLATES[2], prompt_mix.WRITING_TEMPLATES["letter"]
    passage = "The harvest failed in the north, and the rivers froze early that winter, so the mills stood idle."
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "m0", "prompt": solve.format(code='def clamp(x, lo, hi):\n    """Return x limited to lo and hi."""')},
        {"id": "m1", "prompt": letter.format(text=passage)}, {"id": "m2", "prompt": ""}]))
    new = [solve.format(code='def mean(xs):\n    """Return the arithmetic mean of a non-empty list."""'),
           letter.format(text="The committee met on Tuesday to discuss railway tariffs and coal prices.")]
    reused = prompt_mix.WRITING_TEMPLATES["story"].format(text=passage)  # the same passage, another template
    kept, report = corpus.drop_overlap_with([{"prompt": p} for p in new + [reused]], [first])
    assert [r["prompt"] for r in kept] == new and report["dropped"] == 1
    assert report["files"] == [{"file": str(first), "prompts": 2}]  # the empty prompt is no prompt

    held = tmp_path / "held_out.jsonl"  # a held-out split in chat form, as `regenerate` writes `messages` rows
    prompt = corpus.PROSE_TEMPLATES["summarize"].format(text=passage)
    held.write_text(json.dumps({"id": "h0", "messages": [{"role": "user", "content": prompt},
                                                         {"role": "assistant", "content": "..."}]}) + "\n")
    kept, report = corpus.drop_overlap_with([{"prompt": prompt}, {"prompt": new[0]}], [held])
    assert [r["prompt"] for r in kept] == [new[0]] and report["files"][0]["prompts"] == 1
    answers = tmp_path / "answers_only.jsonl"
    answers.write_text(json.dumps({"id": "a", "messages": [{"role": "assistant", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match="no rows with a 'prompt' field or user turns in 'messages'"):
        corpus.drop_overlap_with([{"prompt": prompt}], [answers])


def test_corpus_prompt_ids_depend_on_the_seed(monkeypatch):
    funcs = [(f"mod{i}.py:f{i}:1", f"def f{i}(a):\n" + "\n".join(f"    a = a + {j}" for j in range(8)))
             for i in range(8)]
    monkeypatch.setattr(corpus, "fetch_sources", lambda cache_dir=None: dict.fromkeys(corpus.SOURCES))
    for loader in ("_sotu_docs", "_brown_docs", "_shakespeare_docs"):
        monkeypatch.setattr(corpus, loader, lambda path: [])
    monkeypatch.setattr(corpus, "_stdlib_functions", lambda: list(funcs))
    monkeypatch.setattr(corpus.assets, "sha256_file", lambda path: "stand-in")
    ids = {seed: [r["id"] for r in corpus.build_prompts(4, seed=seed, code_share=1.0, check_overlap=False)[0]]
           for seed in (0, 1)}
    assert ids == {0: ["p00000", "p00001", "p00002", "p00003"], 1: ["s1p00000", "s1p00001", "s1p00002", "s1p00003"]}


# ------------------------------------------------------------------------------------------- regenerate
def test_regenerate_refuses_to_resume_rows_of_other_prompts(target, tmp_path):
    from tiny import tiny_tokenizer

    tok, out = tiny_tokenizer(), tmp_path / "answers.jsonl"
    first = [{"id": "p00000", "prompt": "abcdefab"}, {"id": "p00001", "prompt": "cdcdcd"}]
    chat = [{"id": "c0", "messages": [{"role": "user", "content": "abab"}]}]
    kw = dict(chat_template=False, max_new_tokens=4, progress=False)
    assert regenerate(target, tok, first + chat, out, **kw)["generated"] == 3
    assert regenerate(target, tok, first + chat, out, **kw) == {"generated": 0, "skipped": 3, "out": str(out)}
    before = out.read_bytes()
    second = [{"id": "p00000", "prompt": "jijijihg"}, {"id": "p00001", "prompt": "cdcdcd"}]
    with pytest.raises(ValueError, match=r"prompt differs \(ids \['p00000'\]\).*new --out"):
        regenerate(target, tok, second, out, **kw)
    edited = [{"id": "c0", "messages": [{"role": "user", "content": "abba"}]}]
    with pytest.raises(ValueError, match=r"\['c0'\]"):
        regenerate(target, tok, edited, out, **kw)
    assert out.read_bytes() == before


# ------------------------------------------------------------------------------------------- load errors
def _save_edited(drafter, folder, drop=(), config_pop=()):
    drafter.save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    for key in drop:
        state.pop(key)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    for key in config_pop:
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))


def _load_error(folder) -> str:
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(folder)
    return str(err.value).split(". Missing:")[0].split(". Unexpected:")[0]  # the diagnosis, not the key lists


def test_load_errors_name_the_draft_vocabulary(target, tmp_path):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target).set_draft_vocabulary([3, 4, 5])
    _save_edited(drafter, tmp_path / "lost", config_pop=["draft_vocab_size"])
    assert 'set "draft_vocab_size"' in _load_error(tmp_path / "lost")
    _save_edited(drafter, tmp_path / "none", drop=["draft_to_target"])
    assert "remove draft_vocab_size=3 from config.json" in _load_error(tmp_path / "none")


def test_load_errors_list_partly_missing_layer_weights(target, tmp_path):
    torch.manual_seed(0)
    hybrid = DFlashDrafter.from_target(target, num_hidden_layers=2).set_context("hybrid")
    _save_edited(hybrid, tmp_path / "hy", drop=["layers.1.self_attn.kv.o_proj.weight"])
    message = _load_error(tmp_path / "hy")
    assert "lacks weights of layers it has (layers.1.self_attn.kv.o_proj.weight)" in message
    plain = DFlashDrafter.from_target(target, num_hidden_layers=2)
    _save_edited(plain, tmp_path / "mlp", drop=["layers.0.mlp.up_proj.weight"])
    message = _load_error(tmp_path / "mlp")
    assert "(layers.0.mlp.up_proj.weight)" in message and "num_hidden_layers" not in message
    _save_edited(plain, tmp_path / "one", drop=[k for k in plain.state_dict() if k.startswith("layers.1.")])
    assert 'set "num_hidden_layers": 1' in _load_error(tmp_path / "one")  # a whole layer: the layer count
