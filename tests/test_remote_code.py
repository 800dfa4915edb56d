"""A saved drafter runs through `trust_remote_code` in a fresh process that never imports dflash_retrace."""

import json
import subprocess
import sys
import textwrap

from dflash_retrace.hub import PAYLOAD_FILES

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "dflash_retrace" or name.startswith("dflash_retrace."):
                raise ImportError("dflash_retrace is blocked in this process")
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    drafter = AutoModel.from_pretrained(sys.argv[2], trust_remote_code=True).eval()
    prompts = json.loads(sys.argv[3])
    result = {"outputs": [], "acceptance": [], "drafts": []}
    for p in prompts:
        ids = torch.tensor([p])
        out = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=30)
        result["outputs"].append(out[0].tolist())
        result["acceptance"].append(drafter.last_stats.acceptance_lengths)
        result["drafts"].append(drafter.last_stats.drafts)
    result["modules"] = sorted(m for m in sys.modules if "dflash_retrace" in m)
    result["class"] = type(drafter).__module__
    result["submodules"] = sorted({type(m).__module__ for m in drafter.modules()})
    print("RESULT" + json.dumps(result))
    """
)


def _run(target_dir, drafter_dir, prompts):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(target_dir), str(drafter_dir), json.dumps(prompts)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_fresh_process_trust_remote_code(qwen3_target, qwen3_drafter, train_prompts, tmp_path):
    qwen3_target.save_pretrained(tmp_path / "target")
    qwen3_drafter.save_pretrained(tmp_path / "drafter")
    files = sorted(p.name for p in (tmp_path / "drafter").iterdir())
    assert {*PAYLOAD_FILES, "config.json"} <= set(files)  # save_pretrained copies the whole payload
    prompts = [p[0].tolist() for p in train_prompts[:3]]
    result = _run(tmp_path / "target", tmp_path / "drafter", prompts)
    assert result["modules"] == [] and result["class"].startswith("transformers_modules")
    for prompt, out, lengths in zip(train_prompts[:3], result["outputs"], result["acceptance"]):
        ref = qwen3_target.generate(prompt, do_sample=False, max_new_tokens=30)
        assert out == ref[0].tolist()
        qwen3_target.generate(prompt, assistant_model=qwen3_drafter, do_sample=False, max_new_tokens=30)
        assert lengths == qwen3_drafter.last_stats.acceptance_lengths  # same drafting in both worlds
    assert max(max(l) for l in result["acceptance"]) > 1
