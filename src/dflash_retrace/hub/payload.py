"""The payload copies that travel next to shipped weights, written by one function.

`save_pretrained` copies the payload modules next to the weights it writes; folders kept in the repository
(`hub_configs/smollm2-135m-instruct-*`) get theirs from `write_payload`, and a test checks that they equal
what it writes.
"""

import shutil
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1]
# The payload is every `*_dflash.py` module of the library (flat; imports only torch, transformers and siblings).
PAYLOAD_FILES = tuple(sorted(path.name for path in LIBRARY.glob("*_dflash.py")))


def write_payload(folder) -> list:
    """Copies the library's payload modules into `folder`, byte for byte; returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PAYLOAD_FILES:
        shutil.copyfile(LIBRARY / name, folder / name)
        written.append(folder / name)
    return written
