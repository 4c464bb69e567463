"""The one build step pyproject.toml cannot declare: ship the top-level sample traces as package data.

``gpuadvisor analyze`` with no trace reads a bundled sample (gpuadvisor/sample_data.py). The repository
keeps one copy of each, in sample_traces/, beside the expected findings the tests compare; the build
copies ``sample_traces/*.json.gz`` (not the larger real/ and ddp_2xh200/ folders) into the wheel as
``gpuadvisor/samples/``; MANIFEST.in puts them into an sdist, so a wheel built from that has them too.
Everything else about the build is in pyproject.toml.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SAMPLES_SRC = "sample_traces"  # relative: the build backends run this file from its own folder
SAMPLES_PACKAGE_DIR = ("gpuadvisor", "samples")


class build_py_with_samples(build_py):
    """Adds the samples to build_py's package data, so its copy and get_outputs (and with it the editable
    install's strict mode, which links them) include them."""

    def _get_data_files(self):
        data_files = list(super()._get_data_files())
        names = sorted(p.name for p in Path(SAMPLES_SRC).glob("*.json.gz"))
        if not names:
            raise SystemExit(f"setup.py: no {SAMPLES_SRC}/*.json.gz to bundle (run from the repository root)")
        data_files.append(("gpuadvisor", SAMPLES_SRC, os.path.join(self.build_lib, *SAMPLES_PACKAGE_DIR), names))
        return data_files


setup(cmdclass={"build_py": build_py_with_samples})
