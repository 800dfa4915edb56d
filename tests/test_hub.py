"""Publishing: exported folders load and generate without the library, custom_generate, z-lab export, push, templates."""

import ast
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors import safe_open

import dflash_retrace
from dflash_retrace import DFlashConfig, DFlashDrafter, cli, default_target_layer_ids, hub
from tiny import prompts

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = hub.PAYLOAD_FILES
CUSTOM_GENERATE = REPO / "hub_configs" / "custom_generate"
BASE = "Qwen/Qwen3-0.6B"  # any Hub id: only the model card reads it
NEW_TOKENS = 24


def _retrace_variant(drafter, seed=0):
    """The trained drafter plus ReTrace weights that are not zero, so memory changes the drafts."""
    rt = copy.deepcopy(drafter).add_retrace()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in rt.retrace.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return rt.eval()


def _run(target, drafter, prompt, **kwargs):
    out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)
    s = drafter.last_stats
    return out, {"acceptance": s.acceptance_lengths, "drafts": s.drafts, "conditioned": s.conditioned_slots}


@pytest.fixture(scope="module")
def drafters(qwen3_drafter):
    return {"dflash": qwen3_drafter, "retrace": _retrace_variant(qwen3_drafter)}


@pytest.fixture(scope="module")
def hub_prompts(train_prompts):
    return train_prompts[:2] + prompts(1, length=5, seed=99)  # high acceptance, and frequent rejections


@pytest.fixture(scope="module")
def exported(tmp_path_factory, qwen3_target, drafters):
    """Saved drafters (with a training summary and a bench report) and their `ours` exports; the saved target."""
    root = tmp_path_factory.mktemp("hub")
    paths = {"target": root / "target"}
    qwen3_target.save_pretrained(paths["target"])
    for name, drafter in drafters.items():
        saved = root / f"saved-{name}"
        drafter.save_pretrained(saved)
        (saved / "summary.json").write_text(json.dumps({"stage": name, "steps": 400, "held_out_tau": 3.21875,
                                                        "held_out_slot_accuracy": [0.9, 0.75]}))
        (saved / "bench-humaneval.json").write_text(json.dumps({
            "schema": "dflash-retrace/bench/v1",
            "config": {"dataset": "humaneval", "temperature": 0.0, "num_prompts": 164, "max_new_tokens": 256},
            "summary": {"methods": {"speculative": {"num_ok": 164, "tau_pooled": 4.5678, "tau_prompt_mean": 4.4,
                                                    "speedup": 2.25}}},
        }))
        paths[f"saved-{name}"] = saved
        paths[name] = hub.export_drafter(saved, root / f"export-{name}", base_model=BASE, repo_id=f"org/{name}")
    return paths


# ------------------------------------------------------------------------------- ours: folder
def test_export_folder_has_weights_code_and_card(exported, drafters):
    out = exported["retrace"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["README.md", "config.json", "model.safetensors", *PAYLOAD, "summary.json", "bench-humaneval.json"])
    for name in PAYLOAD:  # the payload travels verbatim
        assert (out / name).read_bytes() == (REPO / "src" / "dflash_retrace" / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "dflash_retrace" and config["retrace"] is True
    assert config["auto_map"] == {"AutoConfig": "configuration_dflash.DFlashConfig",
                                  "AutoModel": "modeling_dflash.DFlashDrafter"}

    card = ModelCard.load(out / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers" and meta["base_model"] == BASE
    assert meta["pipeline_tag"] == "text-generation" and meta["license"] == "apache-2.0"
    assert {"dflash", "retrace", "speculative-decoding"} <= set(meta["tags"])
    text = card.text
    assert 'AutoModel.from_pretrained("org/retrace", trust_remote_code=True' in text
    assert "target.generate(**inputs, assistant_model=drafter" in text
    assert "| held_out_tau | 3.22 |" in text and "| held_out_slot_accuracy | [0.9, 0.75] |" in text
    assert "| humaneval | 0 | 164 | 256 | 4.57 | 4.4 | 2.25 |" in text
    plain = ModelCard.load(exported["dflash"] / "README.md").data.to_dict()
    assert "retrace" not in plain["tags"]


def test_export_keeps_retrace_weights(exported, drafters):
    reloaded = DFlashDrafter.from_pretrained(exported["retrace"])
    original = drafters["retrace"].state_dict()
    assert reloaded.state_dict().keys() == original.keys()
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, original[key]), key
    assert reloaded.retrace.value.weight.abs().sum() > 0


def test_export_refuses_non_empty_out_and_templates(exported, tmp_path):
    with pytest.raises(FileExistsError, match="--overwrite"):
        hub.export_drafter(exported["saved-dflash"], exported["dflash"])
    with pytest.raises(FileNotFoundError, match="no weights"):
        hub.export_drafter(REPO / "hub_configs" / "templates" / "qwen3-8b", tmp_path / "out")


@pytest.mark.filterwarnings("ignore:Could not find a config file")  # peft, about the moved base path
def test_export_merges_a_lora_adapter(qwen3_drafter, tmp_path):
    peft = pytest.importorskip("peft")
    qwen3_drafter.save_pretrained(tmp_path / "base")
    base = DFlashDrafter.from_pretrained(tmp_path / "base")
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "fc"], init_lora_weights=False))
    model.peft_config["default"].base_model_name_or_path = str(tmp_path / "moved-away")  # falls back to ./base
    model.save_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / "base").symlink_to(tmp_path / "base")
    merged = copy.deepcopy(model).merge_and_unload()
    out = hub.export_drafter(tmp_path / "adapter", tmp_path / "out", base_model=BASE)
    reloaded = DFlashDrafter.from_pretrained(out).state_dict()
    for key, value in merged.state_dict().items():
        torch.testing.assert_close(reloaded[key], value)
    assert not torch.equal(reloaded["fc.weight"], qwen3_drafter.state_dict()["fc.weight"])


# ------------------------------------------------------------------ ours: a fresh process
CHILD = r'''
import json, sys


class BlockLibrary:  # dflash_retrace is pip-installed (editable): refuse it outright
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "dflash_retrace":
            raise ImportError(f"{name} is blocked in this process")


sys.meta_path.insert(0, BlockLibrary())
args = json.loads(sys.argv[1])
import torch
from transformers import AutoModel, AutoModelForCausalLM

torch.set_num_threads(1)
try:
    import dflash_retrace  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
target = AutoModelForCausalLM.from_pretrained(args["target"], dtype=torch.float32).eval()
target.generation_config.eos_token_id = None
drafters = {n: AutoModel.from_pretrained(p, trust_remote_code=True, dtype=torch.float32).eval()
            for n, p in args["drafters"].items()}
greedy = dict(do_sample=False, max_new_tokens=args["new_tokens"])
result = {"blocked": blocked, "drafter_classes": {}, "drop_in": {}, "custom_generate": {}}
for name, drafter in drafters.items():
    result["drafter_classes"][name] = type(drafter).__module__ + "." + type(drafter).__name__
    rows = result["drop_in"][name] = []
    for ids in args["prompts"]:
        prompt = torch.tensor([ids])
        plain = target.generate(prompt, **greedy)
        out = target.generate(prompt, assistant_model=drafter, **greedy)
        s = drafter.last_stats
        rows.append({"plain": plain[0].tolist(), "out": out[0].tolist(), "acceptance": s.acceptance_lengths,
                     "drafts": s.drafts, "conditioned": s.conditioned_slots})
generation = sys.modules[type(drafters["dflash"]).__module__.rsplit(".", 1)[0] + ".dispatch_dflash"]
generation.uninstall_dispatch()
result["dispatch_before_custom_generate"] = generation.dispatch_enabled()
for name, drafter in drafters.items():
    rows = result["custom_generate"][name] = []
    for ids in args["prompts"]:
        out = target.generate(torch.tensor([ids]), assistant_model=drafter, custom_generate=args["custom_generate"],
                              trust_remote_code=True, **greedy)
        rows.append({"out": out[0].tolist(), "drafts": drafter.last_stats.drafts})
result["dispatch_after_custom_generate"] = generation.dispatch_enabled()
result["library_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "dflash_retrace")
print("RESULT " + json.dumps(result))
'''


@pytest.fixture(scope="module")
def child(exported, hub_prompts, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path_factory.mktemp("modules")),
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1", PYTHONPATH="")
    args = {"target": str(exported["target"]), "prompts": [p[0].tolist() for p in hub_prompts],
            "drafters": {n: str(exported[n]) for n in ("dflash", "retrace")},
            "custom_generate": str(CUSTOM_GENERATE), "new_tokens": NEW_TOKENS}
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], cwd=tmp_path_factory.mktemp("cwd"),
                          env=env, capture_output=True, text=True, timeout=600)
    print(f"fresh process: {time.time() - start:.1f}s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_fresh_process_runs_the_export_without_the_library(child):
    assert child["blocked"] and child["library_modules"] == []
    assert all(cls.startswith("transformers_modules.") for cls in child["drafter_classes"].values())
    for name, rows in child["drop_in"].items():
        taus = [a for r in rows for a in r["acceptance"]]
        for r in rows:
            assert r["out"] == r["plain"], name  # lossless: the target's greedy tokens
        assert max(taus) > 1, (name, taus)  # the drafter really drafted
    # The trained plain drafter keeps its acceptance; the ReTrace variant's random conditioner weights perturb drafts.
    plain_taus = [a for r in child["drop_in"]["dflash"] for a in r["acceptance"]]
    assert sum(plain_taus) / len(plain_taus) > 1.5, plain_taus
    assert sum(sum(r["conditioned"]) for r in child["drop_in"]["retrace"]) > 0


def test_fresh_process_matches_the_library(child, qwen3_target, drafters, hub_prompts):
    """Same drafts round by round as the library's drafter objects: weights and ReTrace behaviour survive export."""
    for name, drafter in drafters.items():
        for prompt, row in zip(hub_prompts, child["drop_in"][name]):
            out, stats = _run(qwen3_target, drafter, prompt)
            assert out[0].tolist() == row["out"]
            assert stats == {k: row[k] for k in stats}, name
    plain, rt = child["drop_in"]["dflash"], child["drop_in"]["retrace"]
    assert any(a["drafts"] != b["drafts"] for a, b in zip(plain, rt))  # memory changed some drafts


def test_fresh_process_custom_generate_without_dispatch(child):
    assert child["dispatch_before_custom_generate"] is False
    assert child["dispatch_after_custom_generate"] is False  # neither relied on nor re-installed
    for name in ("dflash", "retrace"):
        for drop_in, custom in zip(child["drop_in"][name], child["custom_generate"][name]):
            assert custom == {"out": drop_in["out"], "drafts": drop_in["drafts"]}


# ---------------------------------------------------------------------------- custom_generate
def _custom(target, drafter, prompt, **kwargs):
    out = target.generate(prompt, assistant_model=drafter, custom_generate=str(CUSTOM_GENERATE),
                          trust_remote_code=True, max_new_tokens=NEW_TOKENS, **kwargs)
    s = drafter.last_stats
    return out, {"acceptance": s.acceptance_lengths, "drafts": s.drafts, "conditioned": s.conditioned_slots}


@pytest.mark.parametrize("name", ["dflash", "retrace"])
@pytest.mark.parametrize("sampling", [False, True])
def test_custom_generate_matches_drop_in(qwen3_target, drafters, hub_prompts, name, sampling):
    drafter = drafters[name]
    kwargs = dict(do_sample=True, temperature=0.8, top_k=20) if sampling else dict(do_sample=False)
    for i, prompt in enumerate(hub_prompts[:2] if sampling else hub_prompts):
        torch.manual_seed(i)
        ref = qwen3_target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, **kwargs)
        ref_stats = copy.deepcopy(drafter.last_stats)
        torch.manual_seed(i)
        out, stats = _custom(qwen3_target, drafter, prompt, **kwargs)
        assert torch.equal(out, ref)
        assert stats["drafts"] == ref_stats.drafts and stats["acceptance"] == ref_stats.acceptance_lengths
    assert not {"_get_candidate_generator", "_validate_generation_mode"} & set(qwen3_target.__dict__)  # nothing left


def test_custom_generate_with_dispatch_uninstalled(qwen3_target, drafters, hub_prompts):
    expected = [_run(qwen3_target, drafters["retrace"], p) for p in hub_prompts]
    dflash_retrace.uninstall_dispatch()
    try:
        assert not dflash_retrace.dispatch_enabled()
        for prompt, (ref, ref_stats) in zip(hub_prompts, expected):
            out, stats = _custom(qwen3_target, drafters["retrace"], prompt, do_sample=False)
            assert torch.equal(out, ref) and stats == ref_stats
        assert not dflash_retrace.dispatch_enabled()
    finally:
        dflash_retrace.install_dispatch()


def test_custom_generate_fails_loudly(qwen3_target, drafters, hub_prompts):
    prompt = hub_prompts[0]
    with pytest.raises(ValueError, match="needs the drafter"):
        qwen3_target.generate(prompt, custom_generate=str(CUSTOM_GENERATE), trust_remote_code=True)
    with pytest.raises(TypeError, match="not a dflash-retrace drafter"):
        _custom(qwen3_target, qwen3_target, prompt)
    with pytest.raises(ValueError, match="num_beams=2"):
        _custom(qwen3_target, drafters["dflash"], prompt, num_beams=2)
    with pytest.raises(ValueError, match="batch size 2"):
        _custom(qwen3_target, drafters["dflash"], prompt.repeat(2, 1))
    assert "_get_candidate_generator" not in qwen3_target.__dict__


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt_lookup_num_tokens=3), "prompt lookup decoding"),
    (dict(assistant_early_exit=1), "early-exit self-speculation"),
    (dict(assistant_ensemble_weight=0.5), "ensemble verification"),
    (dict(use_mtp=True), "multi-token prediction"),
    (dict(num_beams=2), "Beam search"),
    (dict(num_return_sequences=2, do_sample=True), "num_return_sequences=2"),
])
def test_custom_generate_refuses_what_the_dispatch_refuses(qwen3_target, drafters, hub_prompts, kwargs, message):
    """custom_generate runs the drafter's own checks (the payload's), not a copy: the same refusals, the same words,
    with the dispatch uninstalled so that only custom_generate can be the one refusing."""
    prompt = hub_prompts[0]
    with pytest.raises(ValueError, match=message):
        qwen3_target.generate(prompt, assistant_model=drafters["dflash"], max_new_tokens=4, **kwargs)
    dflash_retrace.uninstall_dispatch()
    try:
        with pytest.raises(ValueError, match=message):
            _custom(qwen3_target, drafters["dflash"], prompt, **kwargs)
    finally:
        dflash_retrace.install_dispatch()
    assert not {"_get_candidate_generator", "_validate_generation_mode"} & set(qwen3_target.__dict__)


def test_custom_generate_repo_is_self_contained():
    folder = CUSTOM_GENERATE / "custom_generate"
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == ["generate.py", "requirements.txt"]
    tree = ast.parse((folder / "generate.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert imported <= {"torch", "transformers"} | set(sys.stdlib_module_names)
    assert not any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(tree))
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate" for n in tree.body)
    assert (folder / "requirements.txt").read_text().split() == ["torch>=2.4", "transformers>=5.15"]
    readme = (CUSTOM_GENERATE / "README.md").read_text()
    for section in ("Description", "Base model", "Model compatibility", "Additional Arguments",
                    "Output Type changes", "Example usage"):
        assert f"\n## {section}\n" in readme
    assert "custom_generate" in ModelCard(readme).data.to_dict()["tags"]


# ------------------------------------------------------------------------------------ z-lab
@pytest.fixture(scope="module")
def zlab_dir(exported, tmp_path_factory):
    out = tmp_path_factory.mktemp("zlab") / "repo"
    assert cli.main(["export", str(exported["saved-dflash"]), "--out", str(out), "--format", "zlab",
                     "--base-model", BASE]) == 0
    return out


def test_zlab_export_layout(zlab_dir, qwen3_drafter):
    config = json.loads((zlab_dir / "config.json").read_text())
    c = qwen3_drafter.config
    assert config["model_type"] == "qwen3" and config["architectures"] == ["DFlashDraftModel"]
    assert "auto_map" not in config
    assert config["block_size"] == c.block_size and config["num_target_layers"] == c.num_target_layers
    assert config["dflash_config"] == {"mask_token_id": c.mask_token_id, "target_layer_ids": c.target_layer_ids}
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size"):
        assert config[key] == getattr(c, key), key
    with safe_open(zlab_dir / "model.safetensors", "pt") as f:
        assert set(f.keys()) == set(qwen3_drafter.state_dict())
    assert not any(p.suffix == ".py" for p in zlab_dir.iterdir())
    meta = ModelCard.load(zlab_dir / "README.md").data.to_dict()
    assert meta["base_model"] == BASE and "dflash" in meta["tags"] and "retrace" not in meta["tags"]
    # Our library reads the z-lab layout back to the same drafter.
    back = DFlashDrafter.from_pretrained(zlab_dir)
    assert back.config.target_layer_ids == c.target_layer_ids and back.config.mask_token_id == c.mask_token_id
    for key, value in qwen3_drafter.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_zlab_export_matches_reference_dflash_generate(zlab_dir, qwen3_target, qwen3_drafter, train_prompts, monkeypatch):
    """The reference loop on the z-lab export gives our plain DFlash tokens, round for round.

    One bookkeeping difference, asserted exactly: when a round leaves exactly one token of budget, the reference
    runs one more drafter + verify round (a 2-token block whose proposal can never be committed) and logs
    acceptance length 1; our generator lets transformers take that last step without a proposal and logs no
    round. Tokens are identical either way.
    """
    dflash_model = pytest.importorskip("dflash.model")
    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)  # the reference synchronises CUDA for stats
    ref, info = dflash_model.DFlashDraftModel.from_pretrained(zlab_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ref.eval()
    assert ref.config.rope_parameters["rope_theta"] == qwen3_drafter.config.rope_theta
    assert ref.block_size == qwen3_drafter.config.block_size
    B = qwen3_drafter.config.block_size
    cases = extra_rounds = drafted = 0
    for max_new_tokens in (1, 2, B - 1, B, B + 1, 2 * B + 3, 40):
        for prompt in train_prompts[:2] + prompts(2, length=5, seed=max_new_tokens):
            ours = qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False,
                                         max_new_tokens=max_new_tokens)
            lengths = qwen3_drafter.last_stats.acceptance_lengths
            theirs = dflash_model.dflash_generate(ref, qwen3_target, prompt, max_new_tokens=max_new_tokens,
                                                  stop_token_ids=None, temperature=0.0, return_stats=True)
            assert torch.equal(theirs.output_ids, ours), max_new_tokens
            plain_steps = ours.shape[1] - prompt.shape[1] - 1 - sum(lengths)  # 1 when the budget left one token
            assert plain_steps in (0, 1)
            assert theirs.acceptance_lengths == lengths + [1] * plain_steps, (max_new_tokens, lengths)
            cases, extra_rounds = cases + 1, extra_rounds + plain_steps
            drafted += sum(a > 1 for a in lengths)
    assert cases > extra_rounds > 0 and drafted > 10  # both kinds of ending, and real multi-token rounds


def test_zlab_export_drops_retrace_with_warning(exported, tmp_path):
    with pytest.warns(UserWarning, match="dropped .* `retrace.\\*` tensors"):
        out = hub.export_drafter(exported["saved-retrace"], tmp_path / "z", format="zlab", base_model=BASE)
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert keys and not any(k.startswith("retrace.") for k in keys)
    assert all(hub._ZLAB_KEY.match(k) for k in keys)


# -------------------------------------------------------------------------------------- push
class FakeHfApi:
    """Local stand-in for huggingface_hub.HfApi: records calls and snapshots the uploaded folder."""

    calls: list = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, folder_path, **kwargs):
        files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        self.calls.append(("upload_folder", files, kwargs))
        return type("CommitInfo", (), {"commit_url": "https://huggingface.co/org/x/commit/0"})()


def test_push_is_a_thin_hfapi_call(exported):
    api = FakeHfApi()
    api.calls = []
    hub.push_drafter(exported["saved-retrace"], "org/tiny-retrace", private=True, base_model=BASE, api=api)
    (name, repo_id, kwargs), (name2, files, upload) = api.calls
    assert (name, repo_id, kwargs) == ("create_repo", "org/tiny-retrace",
                                       {"private": True, "exist_ok": True, "repo_type": "model"})
    assert name2 == "upload_folder"
    assert files == sorted(["README.md", "config.json", "model.safetensors", *PAYLOAD, "summary.json",
                            "bench-humaneval.json"])
    assert upload == {"repo_id": "org/tiny-retrace", "repo_type": "model",
                      "commit_message": f"Upload DFlash + ReTrace drafter (dflash-retrace {dflash_retrace.__version__})",
                      "delete_patterns": ["*.safetensors", "*.safetensors.index.json"]}


def test_push_cli_zlab(exported, monkeypatch, capsys):
    import huggingface_hub

    FakeHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    with pytest.warns(UserWarning, match="dropped"):
        assert cli.main(["push", str(exported["saved-retrace"]), "--repo-id", "org/z", "--format", "zlab",
                         "--base-model", BASE]) == 0
    (_, _, create), (_, files, upload) = FakeHfApi.calls
    assert create["private"] is None  # without --private the namespace default applies
    assert files == ["README.md", "bench-humaneval.json", "config.json", "model.safetensors", "summary.json"]
    assert upload["commit_message"] == f"Upload DFlash drafter (dflash-retrace {dflash_retrace.__version__}, zlab format)"
    assert "commit/0" in capsys.readouterr().out


# --------------------------------------------------------------------------------- templates
def test_committed_templates_are_generated(tmp_path):
    root = REPO / "hub_configs" / "templates"
    for name in hub.TEMPLATES:
        for file_name, text in hub.template_files(name).items():
            assert (root / name / file_name).read_text() == text, f"{name}/{file_name}: run `dflash-retrace templates`"
    assert (root / "README.md").read_text() == hub.templates_index()
    written = hub.write_templates(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("name,params", [("qwen3-4b", 0.54e9), ("qwen3-8b", 1.05e9),
                                         ("llama-3.1-8b-instruct", None), ("smollm2-135m-instruct", None)])
def test_templates_build_drafters_of_the_published_shape(name, params):
    config = DFlashConfig.from_pretrained(REPO / "hub_configs" / "templates" / name)
    t = hub.TEMPLATES[name]
    fields = lambda c: {k: v for k, v in c.to_diff_dict().items()  # noqa: E731
                        if k not in ("architectures", "auto_map", "transformers_version")}
    assert fields(config) == fields(hub.template_config(name)) == fields(hub.load_template_config(name))
    assert config.block_size == 16 and config.num_target_layers == t.num_hidden_layers
    assert config.target_layer_ids == default_target_layer_ids(t.num_hidden_layers, t.drafter_layers)
    assert 0 <= config.mask_token_id < config.vocab_size
    with torch.device("meta"):  # the shape, without allocating a billion parameters
        drafter = DFlashDrafter(config)
    count = sum(p.numel() for p in drafter.parameters())
    if params is not None:  # DESIGN.md: about 0.54B / 1.05B for the published Qwen3-4B / 8B drafters
        assert abs(count - params) / params < 0.01, count
    assert drafter.fc.in_features == t.drafter_layers * t.hidden_size
