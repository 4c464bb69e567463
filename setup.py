"""The one build step pyproject.toml cannot declare: ship top-level data folders as package data.

- ``sample_traces/*.json.gz`` (not the larger real/ and ddp_2xh200/ folders) as ``gpuadvisor/samples/``:
  ``gpuadvisor analyze`` with no trace reads a bundled sample (gpuadvisor/sample_data.py). The repository keeps
  one copy of each, in sample_traces/, beside the expected findings the tests compare.
- ``rules/*.toml``, the rule catalog (one file per rule, at the top of the repository), as
  ``gpuadvisor/rules/catalog/``: gpuadvisor/rules/engine.py reads it there in an installed package, and from
  rules/ in a source checkout (installed editable or run from the tree).

MANIFEST.in puts both into an sdist, so a wheel built from that has them too. Everything else about the build
is in pyproject.toml.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# (source folder, file pattern, folder inside the package); the source paths are relative: the build backends
# run this file from its own folder.
BUNDLED = (
    ("sample_traces", "*.json.gz", ("gpuadvisor", "samples")),
    ("rules", "*.toml", ("gpuadvisor", "rules", "catalog")),
)


class build_py_with_data(build_py):
    """Adds the bundled folders to build_py's package data, so its copy and get_outputs (and with it the
    editable install's strict mode, which links them) include them."""

    def _get_data_files(self):
        data_files = list(super()._get_data_files())
        for source, pattern, package_dir in BUNDLED:
            names = sorted(p.name for p in Path(source).glob(pattern))
            if not names:
                raise SystemExit(f"setup.py: no {source}/{pattern} to bundle (run from the repository root)")
            data_files.append(("gpuadvisor", source, os.path.join(self.build_lib, *package_dir), names))
        return data_files


setup(cmdclass={"build_py": build_py_with_data})
