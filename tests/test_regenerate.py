"""Regeneration (the target writes the training responses), text data for training, and the CLI end to end."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from dflash_retrace import cli
from dflash_retrace.runtime import encode_prompt, eos_token_ids
from dflash_retrace.training import read_done_ids, regenerate, tokenize_rows
from tiny import EOS, VOCAB, tiny_target

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def char_tokenizer():
    """A character-level tokenizer over the tiny target's vocabulary: ids 0-2 are <pad>, <s>, </s>, then
    93 printable characters. Decoding then encoding gives back any id sequence."""
    chars = [chr(c) for c in range(32, 32 + VOCAB - 3)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": EOS, **{c: i + 3 for i, c in enumerate(chars)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def target():
    model = tiny_target("qwen3", seed=0)
    model.generation_config.eos_token_id = EOS
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


PROMPTS = [
    {"id": "a", "prompt": "hello there"},
    {"id": "b", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]},
    {"id": "c", "prompt": "x"},
    {"id": "d", "messages": [{"role": "user", "content": "why is the sky blue"},
                             {"role": "assistant", "content": "an old answer, dropped"}]},
    {"id": "e", "prompt": "count: 1 2 3"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(path):
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_greedy_regeneration_equals_target_generate(target, tokenizer, tmp_path):
    out = tmp_path / "data.jsonl"
    result = regenerate(target, tokenizer, PROMPTS, out, batch_size=3, max_new_tokens=24, progress=False)
    assert result == {"generated": 5, "skipped": 0, "out": str(out)}
    rows = read_rows(out)
    assert sorted(rows) == ["a", "b", "c", "d", "e"]
    for source in PROMPTS:
        row = rows[source["id"]]
        ids = torch.tensor([encode_prompt(tokenizer, source)])
        alone = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        expected = alone[0, ids.shape[1]:].tolist()
        finished = EOS in expected
        expected = expected[: expected.index(EOS)] if finished else expected
        response = row["messages"][-1]["content"] if "messages" in source else row["response"]
        assert tokenizer(response, add_special_tokens=False)["input_ids"] == expected, source["id"]
        assert row["finish_reason"] == ("eos" if finished else "length")
        assert row.get("eos_token_id") == (EOS if finished else None)  # the end token the target emitted
        assert row["num_response_tokens"] == len(expected)
        assert row["generation"]["do_sample"] is False and row["generation"]["max_new_tokens"] == 24
        assert row["generation"]["chat_template"] is True
        assert row["generation"]["dtype"] == "float32" and row["generation"]["batch_size"] == 3
    assert rows["b"]["messages"][:2] == PROMPTS[1]["messages"] and rows["b"]["messages"][2]["role"] == "assistant"
    assert len(rows["d"]["messages"]) == 2  # the old assistant turn was replaced by the target's own
    assert "response" not in rows["b"] and rows["a"]["prompt"] == "hello there"


def test_training_ends_each_response_with_the_eos_the_target_emits(tokenizer):
    """A target that stops at several ids (as Llama-3.1-Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>): a
    regenerated row keeps the one it emitted; other rows get the tokenizer's own EOS, not the config's first id."""
    multi = tiny_target("qwen3", seed=0)
    multi.generation_config.eos_token_id = [5, EOS]  # the tokenizer's EOS (EOS) is not the first one
    eos_ids = eos_token_ids(multi, tokenizer)
    assert eos_ids == [EOS, 5] and eos_token_ids(multi) == [5, EOS]
    rows = [{"prompt": "ab", "response": "cd", "finish_reason": "eos", "eos_token_id": 5},
            {"prompt": "ab", "response": "cd", "finish_reason": "eos"},
            {"prompt": "ab", "response": "cd", "finish_reason": "length"}]
    ends = [int(ex.input_ids[-1]) for ex in tokenize_rows(rows, tokenizer, eos_token_id=eos_ids)]
    assert ends == [5, EOS, tokenizer("d", add_special_tokens=False)["input_ids"][-1]]


def test_regeneration_resumes_without_redoing_rows(target, tokenizer, tmp_path, monkeypatch):
    out = tmp_path / "data.jsonl"
    regenerate(target, tokenizer, PROMPTS, out, batch_size=2, max_new_tokens=16, progress=False)
    complete = read_rows(out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed while writing the third row
    kept = {json.loads(line)["id"] for line in lines[:2]}

    batches = []
    real_generate = target.generate

    def counting_generate(*args, **kwargs):
        batches.append(kwargs["input_ids"].shape[0])
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", counting_generate)
    with pytest.warns(UserWarning, match="incomplete last row"):
        result = regenerate(target, tokenizer, PROMPTS, out, batch_size=2, max_new_tokens=16, progress=False)
    assert result["generated"] == 3 and result["skipped"] == 2 and sum(batches) == 3
    rows = read_rows(out)
    assert len(out.read_text().splitlines()) == 5 and rows == complete
    assert kept <= set(rows)
    # Nothing left to do: no generate call at all.
    batches.clear()
    assert regenerate(target, tokenizer, PROMPTS, out, progress=False)["generated"] == 0 and not batches


def test_sampling_settings_are_recorded(target, tokenizer, tmp_path):
    out = tmp_path / "sampled.jsonl"
    regenerate(target, tokenizer, PROMPTS[:2], out, max_new_tokens=8, do_sample=True, temperature=0.7, top_p=0.9,
               top_k=20, seed=5, target_name="tiny", progress=False)
    settings = [row["generation"] for row in read_rows(out).values()]
    assert settings[0] == settings[1] == {"target": "tiny", "do_sample": True, "temperature": 0.7, "top_p": 0.9,
                                          "top_k": 20, "max_new_tokens": 8, "seed": 5, "chat_template": True,
                                          "dtype": "float32", "batch_size": 8}


def test_bad_prompt_rows_fail_with_the_fix(target, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="`messages` .* or `prompt`"):
        regenerate(target, tokenizer, [{"id": "x", "text": "hi"}], tmp_path / "o.jsonl", progress=False)
    with pytest.raises(ValueError, match="duplicate id"):
        regenerate(target, tokenizer, [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}],
                   tmp_path / "o.jsonl", progress=False)


def test_read_done_ids_ignores_a_missing_file(tmp_path):
    assert read_done_ids(tmp_path / "none.jsonl") == set()


def test_text_rows_tokenize_like_generation(tokenizer):
    rows = [
        {"id": "p", "prompt": "hi", "response": "yo", "finish_reason": "eos"},
        {"id": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"id": "cut", "prompt": "hi", "response": "yo", "finish_reason": "length"},
    ]
    p, m, cut = tokenize_rows(rows, tokenizer, eos_token_id=EOS)
    prompt = encode_prompt(tokenizer, rows[0])
    reply = tokenizer("yo", add_special_tokens=False)["input_ids"]
    assert p.input_ids.tolist() == prompt + reply + [EOS] and p.prompt_length == len(prompt)
    assert p.loss_mask.tolist() == [False] * len(prompt) + [True] * (len(reply) + 1)
    assert torch.equal(m.input_ids, p.input_ids) and torch.equal(m.loss_mask, p.loss_mask)
    assert cut.input_ids.tolist() == prompt + reply  # stopped by the budget: no EOS to learn
    with pytest.raises(ValueError, match="regenerate"):
        tokenize_rows([{"prompt": "hi"}], tokenizer)
    with pytest.raises(ValueError, match="last of `messages`"):
        tokenize_rows([{"messages": [{"role": "user", "content": "hi"}]}], tokenizer)


def test_cli_regenerate_then_train_both_stages(target, tokenizer, tmp_path):
    from dflash_retrace import DFlashDrafter

    model_dir = tmp_path / "tiny-target"
    target.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"id": str(i), "prompt": f"question {i}: {'ab' * i}"}
                                                        for i in range(10)])
    data = tmp_path / "data.jsonl"
    assert cli.main(["regenerate", "--target", str(model_dir), "--prompts", str(prompts), "--out", str(data),
                     "--max-new-tokens", "24", "--batch-size", "4"]) == 0
    assert len(data.read_text().splitlines()) == 10

    common = ["--target", str(model_dir), "--data", str(data), "--block-size", "4", "--max-anchors", "8",
              "--eval-size", "2", "--eval-prompts", "2", "--eval-max-new-tokens", "12", "--no-progress"]
    dflash = tmp_path / "drafter"
    assert cli.main(["train", *common, "--out", str(dflash), "--max-steps", "6", "--lr", "1e-3",
                     "--checkpoint-every", "3"]) == 0
    summary = json.loads((dflash / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["train_sequences"] == 8 and len(summary["held_out_slot_accuracy"]) == 3
    assert (dflash / "checkpoints" / "step-3").is_dir()
    assert DFlashDrafter.from_pretrained(dflash).config.block_size == 4

    retrace = tmp_path / "drafter-rt"
    assert cli.main(["train", *common, "--out", str(retrace), "--stage", "retrace", "--init", str(dflash),
                     "--max-steps", "3"]) == 0
    assert DFlashDrafter.from_pretrained(retrace).retrace is not None
    assert json.loads((retrace / "summary.json").read_text())["stage"] == "retrace"
