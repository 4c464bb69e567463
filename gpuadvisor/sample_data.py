"""The bundled sample traces that ``gpuadvisor analyze`` reads when given no trace.

An installed wheel holds them as package data in ``gpuadvisor/samples/`` (setup.py copies them there from
``sample_traces/``); a source checkout, installed editable or run from the tree, reads ``sample_traces/``
itself, the one copy the repository keeps.
"""

from __future__ import annotations

import atexit
import contextlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from 3.11 on

SUFFIX = ".json.gz"
CHECKOUT_DIR = Path(__file__).resolve().parent.parent / "sample_traces"

_extracted = contextlib.ExitStack()  # files copied out of a zipped install, removed at exit
atexit.register(_extracted.close)


def samples_dir() -> Traversable | None:
    """Where the samples are: the package data, else the source checkout's sample_traces/, else None."""
    packaged = resources.files("gpuadvisor").joinpath("samples")
    if packaged.is_dir():
        return packaged
    if CHECKOUT_DIR.is_dir():
        return CHECKOUT_DIR
    return None


def sample_names() -> list[str]:
    folder = samples_dir()
    if folder is None:
        return []
    return sorted(p.name.removesuffix(SUFFIX) for p in folder.iterdir() if p.name.endswith(SUFFIX) and p.is_file())


def sample_path(name: str) -> Path | None:
    """A file-system path to the sample ``name`` (``llama_decode``), or None when there is no such sample."""
    folder = samples_dir()
    if folder is None or "/" in name or "\\" in name:
        return None
    entry = folder.joinpath(name + SUFFIX)
    if not entry.is_file():
        return None
    if isinstance(entry, Path):
        return entry
    return _extracted.enter_context(resources.as_file(entry))  # a zipped install: a temporary copy
