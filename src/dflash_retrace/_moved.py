"""Module paths of the layout before 0.1.0's reorganisation, kept importable with a FutureWarning that names the
new path (`python -m dflash_retrace.train_data ...` keeps working the same way)."""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {
    "dflash_retrace.bench": "dflash_retrace.evaluation",
    "dflash_retrace.datasets": "dflash_retrace.prompts",
    "dflash_retrace.gpu_check": "dflash_retrace.evaluation.gpu_check",
    "dflash_retrace.metrics": "dflash_retrace.evaluation.metrics",
    "dflash_retrace.regenerate": "dflash_retrace.training.regenerate",
    "dflash_retrace.train": "dflash_retrace.training",
    "dflash_retrace.train_data": "dflash_retrace.training.corpus",
    "dflash_retrace.training_core": "dflash_retrace.training.objective",
}


def _warn(old: str, new: str) -> None:
    replacement = "`dflash-retrace corpus ...`" if old.endswith("train_data") else f"`{new}`"
    warnings.warn(f"`{old}` is deprecated and will be removed: use {replacement} instead.", FutureWarning,
                  stacklevel=3)


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec):
        return types.ModuleType(self.old)

    def exec_module(self, module):
        _warn(self.old, self.new)
        target = importlib.import_module(self.new)
        module.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(target, name)

    def get_code(self, name):  # `python -m <old path>`: the new module's `main()`
        _warn(self.old, self.new)
        return compile(f"from {self.new} import main; raise SystemExit(main())", f"<{self.old}>", "exec")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, _Alias(name, MOVED[name]), origin=name)
        return None


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
