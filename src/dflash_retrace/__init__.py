"""dflash-retrace: lossless speculative decoding with DFlash block-diffusion drafters and ReTrace.

Importing the package installs the `generate(assistant_model=drafter)` dispatch.
"""

from .configuration_dflash import DFlashConfig, default_target_layer_ids
from .dispatch_dflash import dispatch_enabled, install_dispatch, no_dispatch, uninstall_dispatch
from .generation_dflash import DFlashCandidateGenerator, DFlashStats
from .modeling_dflash import DFlashDrafter, ReTraceMemory

__version__ = "0.1.0"

from . import _moved  # noqa: E402 - old module paths, deprecated

_moved.install()

__all__ = [
    "DFlashConfig",
    "DFlashDrafter",
    "DFlashCandidateGenerator",
    "DFlashStats",
    "ReTraceMemory",
    "default_target_layer_ids",
    "install_dispatch",
    "uninstall_dispatch",
    "no_dispatch",
    "dispatch_enabled",
]
