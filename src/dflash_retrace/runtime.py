"""What every command needs, defined once: devices and dtypes, loading a target and a drafter, EOS ids,
prompt encoding, the environment record of a measurement, the cuDNN attention switch, the speedup's τ-bound.

Commands (`training`, `evaluation`, `hub`, `demo`) import this module and the payload, never each other.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
import warnings
from pathlib import Path

import torch
import transformers

from . import __version__
from .assets import folder_or_hub_id, model_not_found, resolve_model
from .configuration_dflash import DFlashConfig
from .modeling_dflash import DFlashDrafter

__all__ = ["apply_chat_template", "cpu_has_bf16_matmul", "cudnn_sdpa", "encode_messages", "encode_prompt", "environment",
           "eos_token_ids", "load_drafter", "load_target", "prompt_messages", "resolve_device", "resolve_dtype",
           "speedup_bound_fault", "uses_chat_template", "warn_slow_bf16", "zlab_incompatibility"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
DTYPE_HELP = "auto (bf16 on CUDA, fp32 elsewhere), float32, bfloat16, float16"
INFERENCE_DTYPE_HELP = ("auto (bf16 on CUDA and on CPUs with bf16 matrix units (AMX / AVX512-BF16), fp32 elsewhere), "
                        "float32, bfloat16, float16")


# ------------------------------------------------------------------------------ device and dtype
def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None): cuda if available, else cpu."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU has bf16 matrix units (AMX-BF16 or AVX512-BF16): bf16 matmuls then run several times faster
    than fp32 (measured ~6x on one core with AMX), so inference is faster in bf16 there."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        flags = ""
    if "amx_bf16" in flags or "avx512_bf16" in flags:
        return True
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None) or getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe()) if probe is not None else False


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, inference: bool = False) -> torch.dtype:
    """`auto` (or None): bfloat16 on CUDA, float32 elsewhere; for `inference`, also bfloat16 on CPUs with bf16
    matrix units (`cpu_has_bf16_matmul`). bfloat16 asked for on a CPU without them warns (`warn_slow_bf16`)."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in (None, "auto"):
        if torch.device(device).type == "cuda" or (inference and cpu_has_bf16_matmul()):
            return torch.bfloat16
        return torch.float32
    elif dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(DTYPES)}")
    else:
        resolved = DTYPES[dtype]
    if resolved == torch.bfloat16:
        warn_slow_bf16(device, "--dtype bfloat16", "--dtype float32 (or auto)")
    return resolved


def warn_slow_bf16(device, what: str, instead: str) -> bool:
    """Warns (and returns True) when `what` asks for bf16 matrix products on a CPU without bf16 matrix units, where
    they are emulated: measured 0.95 GFLOP/s against 88 in fp32 on one AVX2 core, about 90x slower."""
    if torch.device(device).type != "cpu" or cpu_has_bf16_matmul():
        return False
    warnings.warn(f"{what} on this CPU, which has no bf16 matrix units (AMX-BF16 / AVX512-BF16): bf16 matrix products "
                  f"are emulated here and run about 90x slower than fp32. Use {instead}.", stacklevel=3)
    return True


# ----------------------------------------------------------------------------------------- loading
def load_target(name_or_path, device: str | torch.device | None = "auto", dtype: str | torch.dtype | None = "auto",
                inference: bool = False):
    """(target, tokenizer): a registry name (see `dflash-retrace fetch`), a local folder or a Hub id, in eval mode;
    `dtype="auto"` resolves with `resolve_dtype(..., inference=inference)`.

    `target.name_or_path` is the folder it was read from.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device, inference)
    try:
        target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:  # transformers' "not a local folder nor a Hub repo" / "couldn't connect"
        if Path(path).is_dir():  # a folder that does not load: its own error says why
            raise
        raise model_not_found(os.fspath(name_or_path), err) from err
    return target, tokenizer


def load_drafter(spec, target=None, seed: int = 0) -> DFlashDrafter:
    """A drafter from a saved folder or Hub id (ours or z-lab's layout), a PEFT adapter of one (merged into its
    base), or `"untrained"`: a seeded 1-layer `DFlashDrafter.from_target(target)`. With `target`, it takes the
    target's device and dtype; otherwise the checkpoint's dtype."""
    if str(spec) == "untrained":
        if target is None:
            raise ValueError("load_drafter('untrained') builds a drafter sized for a target: pass target=.")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            drafter = DFlashDrafter.from_target(target, num_hidden_layers=1)
    else:
        drafter = _load_saved_drafter(spec)
    if target is not None:
        param = next(target.parameters())
        drafter = drafter.to(device=param.device, dtype=param.dtype)
    return drafter.eval()


def _load_saved_drafter(spec) -> DFlashDrafter:
    folder = Path(os.fspath(spec))
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        import json

        from peft import PeftModel

        base_path = Path(json.loads(adapter.read_text())["base_model_name_or_path"])
        if not base_path.exists() and (folder / "base").is_dir():  # moved with its adapter (train's layout)
            base_path = folder / "base"
        base = DFlashDrafter.from_pretrained(str(base_path), dtype="auto")
        return PeftModel.from_pretrained(base, folder).merge_and_unload()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: it is not a saved drafter (nor a PEFT adapter of one).")
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
            raise FileNotFoundError(
                f"{folder} has a config but no weights (a template?). Train a drafter from it first: "
                f"`dflash-retrace train --init {folder} ...`, then use the trained folder."
            )
    return DFlashDrafter.from_pretrained(folder_or_hub_id(os.fspath(spec)), dtype="auto")


def eos_token_ids(target, tokenizer=None) -> list:
    """Every id that ends generation for `target` (its generation config's `eos_token_id`, int or list; else the
    tokenizer's), the tokenizer's own EOS first when it is one of them (the end-of-turn token a chat model emits,
    e.g. Llama-3.1-Instruct's `<|eot_id|>`)."""
    eos = target.generation_config.eos_token_id
    ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    own = getattr(tokenizer, "eos_token_id", None)
    if own is not None and (own in ids or not ids):
        ids = [own] + [e for e in ids if e != own]
    return ids


# ---------------------------------------------------------------------------------------- prompts
def apply_chat_template(tokenizer, messages: list, enable_thinking: bool = False) -> str:
    """Render `messages` with the tokenizer's chat template, ready for the assistant's reply.

    `enable_thinking` is passed only to templates that mention it (Qwen3-style). A tokenizer without a chat
    template gets the message contents joined by blank lines, with a warning.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        warnings.warn("tokenizer has no chat template; joining the messages as plain text "
                      "(set tokenizer.chat_template for chat models)")
        return "\n\n".join(m["content"] for m in messages)
    extra = {"enable_thinking": enable_thinking} if "enable_thinking" in str(template) else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def encode_messages(tokenizer, messages: list, enable_thinking: bool = False) -> list:
    """Token ids of chat `messages` rendered with the generation prompt (the template has the special tokens)."""
    return tokenizer(apply_chat_template(tokenizer, messages, enable_thinking), add_special_tokens=False)["input_ids"]


def prompt_messages(row: dict, where: str = "row") -> tuple:
    """(messages, prompt): the chat turns to answer (trailing assistant turn dropped), or the `prompt` string."""
    if "messages" in row:
        messages = list(row["messages"])
        if messages and messages[-1].get("role") == "assistant":
            messages = messages[:-1]
        if not messages:
            raise ValueError(f"{where}: `messages` has no turn before the assistant reply.")
        return messages, None
    if "prompt" in row:
        return None, str(row["prompt"])
    raise ValueError(f"{where}: a row needs `messages` (chat) or `prompt`, got fields {sorted(row)}.")


def uses_chat_template(tokenizer, chat_template: bool) -> bool:
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, row: dict, chat_template: bool = True, enable_thinking: bool = False,
                  where: str = "row") -> list:
    """Token ids of a row's prompt exactly as generation sees them.

    With a chat template: `messages` (or `[{"role": "user", "content": prompt}]`) rendered with the generation
    prompt (`encode_messages`). Without one (`chat_template=False` or a tokenizer that has none): the `prompt`
    text (or the turns joined by blank lines) with the tokenizer's usual special tokens.
    """
    messages, prompt = prompt_messages(row, where)
    if uses_chat_template(tokenizer, chat_template):
        return encode_messages(tokenizer, messages or [{"role": "user", "content": prompt}], enable_thinking)
    text = prompt if prompt is not None else "\n\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]


# ---------------------------------------------------------------------------------- measurement
@contextlib.contextmanager
def cudnn_sdpa(enabled: bool):
    """PyTorch's cuDNN attention backend on (if it was) or off inside the block. cuDNN builds an execution plan
    per new key length, which costs milliseconds of CPU per attention call when the length grows every step."""
    previous = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled and previous)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(previous)


def zlab_incompatibility(config: DFlashConfig) -> str | None:
    """Why z-lab's DFlashDraftModel (plain DFlash on the target's full LM head) cannot hold a drafter of `config` as
    the same drafter, or None if it can. ReTrace is not a reason: it is dropped (the export warns, bench notes it)."""
    if config.draft_vocab_size is not None:
        return (f"This drafter proposes from a draft vocabulary of {config.draft_vocab_size} tokens "
                "(`draft_to_target`); z-lab's DFlashDraftModel always uses the target's full LM head, so it would "
                "propose tokens the drafter was never trained on.")
    if config.context != "hidden":
        return (f"This drafter attends to the target's KV cache (context={config.context!r}); z-lab's "
                "DFlashDraftModel attends to the fused hidden states only, so it would draft differently.")
    options = [name for name, on in (("fusion='layerwise' (DFlare)", config.fusion != "fc"),
                                     ("step_embeddings=True (PAD-Rec)", config.step_embeddings)) if on]
    if options:
        return (f"This drafter uses {' and '.join(options)}; z-lab's DFlashDraftModel has neither, so it would draft "
                "differently.")
    return None


def speedup_bound_fault(speedup: float | None, tau: float | None) -> str | None:
    """A message if `speedup` exceeds its τ-bound (a measurement fault), else None.

    A speculative run commits at most τ tokens per target forward (bonus included; τ = 1 with no rounds), and a
    verification forward costs at least one plain decode step, so its decode rate (tokens/s) is at most τ times
    plain decoding's. Pass that rate ratio: the time ratio when both runs produced the same tokens, decode rates
    (prefill excluded) when their outputs differ in length (sampling, bf16 near-ties, EOS). A figure above the
    bound means the runs were not timed under the same conditions (load, clocks, warm-up): not a result.
    """
    bound = 1.0 if tau is None or math.isnan(tau) else tau
    if speedup is None or speedup <= bound:
        return None
    return (f"MEASUREMENT FAULT: speedup {speedup:.3f} is above its bound τ = {bound:.3f} (a round commits at most τ "
            "tokens for at least one plain step's cost): the runs were timed under different conditions (load?); "
            "rerun on an idle machine")


def _git(*args: str) -> str | None:
    """git output in this package's source checkout (None for an installed copy or without git)."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "src" / "dflash_retrace").is_dir():
        return None
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device, dtype: torch.dtype, seed: int | None) -> dict:
    """What produced the numbers (no hostname)."""
    try:
        import dflash

        dflash_version = getattr(dflash, "__version__", None) or _dist_version("dflash")
    except ImportError:
        dflash_version = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine()),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "dflash_retrace": __version__,
        "dflash_reference": dflash_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "seed": seed,
    }
