"""The wheel, as `pip install .` builds it: it must carry the bundled samples and the rule catalog, and its
`gpuadvisor analyze` with no trace must read the sample from the installed package, not from a checkout.

The wheel is built from a copy of the source (so a stale build/ of this checkout cannot leak into it) with
the installed setuptools, or pip's isolated build when that is missing; the test skips only when pip can
get no build backend at all (no setuptools here and no package index to fetch one from).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
CATALOG = REPO / "rules"
BUNDLED = ("llama_decode", "add_rmsnorm", "gemm", "input_pipeline")  # README and `analyze --sample`
MAX_WHEEL_BYTES = 2 * 1024 * 1024  # the real/ and ddp_2xh200/ traces (5.6 MB) stay out of it

# Build outputs and caches a copy of the checkout leaves out.
_IGNORE = shutil.ignore_patterns(
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".benchmarks",
    ".whl",
    ".venv*",
    "venv",
)
# What pip prints when it cannot get the build backend (setuptools) into an isolated build environment.
_NO_BACKEND = (
    "installing build dependencies",
    "No matching distribution found for setuptools",
    "Could not find a version that satisfies the requirement setuptools",
)


def _setuptools_can_build() -> bool:
    """setuptools >= 70.1 builds wheels by itself (older ones need the `wheel` package too)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    if version >= (70, 1):
        return True
    try:
        import wheel  # noqa: F401
    except ImportError:
        return False
    return version >= (64,)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("wheel") / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE)
    return src


@pytest.fixture(scope="module")
def wheel(source) -> Path:
    src, root = source, source.parent
    out = root / "dist"
    attempts = [["--no-build-isolation"]] if _setuptools_can_build() else []
    attempts.append([])  # pip's isolated build: fetches setuptools from the package index
    failures = []
    for extra in attempts:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *extra, str(src), "-w", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        built = sorted(out.glob("gpuadvisor-*.whl"))
        if result.returncode == 0 and built:
            return built[-1]
        failures.append(result)
    last = failures[-1]
    if "No module named pip" in last.stderr:
        pytest.skip("pip is not installed in this interpreter: cannot build a wheel")
    if not _setuptools_can_build() and any(s.lower() in last.stderr.lower() for s in _NO_BACKEND):
        pytest.skip("no build backend: setuptools>=64 is not installed and pip cannot fetch it (offline)")
    pytest.fail("pip wheel failed:\n" + "\n\n".join(r.stdout + r.stderr for r in failures))


@pytest.mark.slow
def test_wheel_ships_the_samples_and_the_rule_catalog(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for sample in BUNDLED:
            member = f"gpuadvisor/samples/{sample}.json.gz"
            assert member in names, (member, sorted(n for n in names if "sample" in n))
            assert archive.read(member) == (SAMPLES / f"{sample}.json.gz").read_bytes(), member
    assert {n.removeprefix("gpuadvisor/samples/") for n in names if n.startswith("gpuadvisor/samples/")} == {
        p.name for p in SAMPLES.glob("*.json.gz")
    }

    tomls = {p.name for p in CATALOG.glob("*.toml")}
    assert tomls, CATALOG
    catalog = "gpuadvisor/rules/catalog/"
    assert {n.removeprefix(catalog) for n in names if n.startswith(catalog)} == tomls

    # Every module of the package (a subpackage left out of packages.find would be missing), nothing else.
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "gpuadvisor").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert not [n for n in names if n.startswith(("sample_traces/", "tests/", "benchmarks/", "examples/"))]
    assert not [n for n in names if n.endswith(".expected.json")]
    assert wheel.stat().st_size < MAX_WHEEL_BYTES, wheel.stat().st_size


@pytest.mark.slow
def test_wheel_analyze_reads_its_own_bundled_sample(wheel, tmp_path):
    """The unpacked wheel first on the path, run from a folder that holds no checkout: the sample it analyzes
    is the package's copy (importlib.resources), and an unknown one lists the four it has."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env.update(PYTHONPATH=str(site), NO_COLOR="1", COLUMNS="160")

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "gpuadvisor", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    result = run("analyze", "--format", "json")
    assert result.returncode == 0, result.stderr
    path = Path(json.loads(result.stdout)["source"]["path"]).resolve()
    assert path == (site / "gpuadvisor" / "samples" / "llama_decode.json.gz").resolve(), path

    result = run("analyze", "--sample", "nosuch")
    assert result.returncode == 2, result.stderr
    assert "available: add_rmsnorm, gemm, input_pipeline, llama_decode" in result.stderr, result.stderr


@pytest.mark.slow
def test_wheel_and_checkout_list_the_same_rules(wheel, tmp_path, cli):
    """The rule catalog is the top-level rules/ folder: a checkout reads it there, an installed wheel from its
    package data (gpuadvisor/rules/catalog/); `gpuadvisor rules` lists the same rules, with the same data, from
    both."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env.update(PYTHONPATH=str(site), NO_COLOR="1", COLUMNS="160")
    installed = subprocess.run(
        [sys.executable, "-m", "gpuadvisor", "rules", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert installed.returncode == 0, installed.stderr
    checkout = cli("rules", "--format", "json")
    assert checkout.returncode == 0, checkout.stderr
    rules = json.loads(installed.stdout)
    assert rules == json.loads(checkout.stdout)
    assert len(rules) >= 10 and [r["id"] for r in rules] == sorted(p.name.split("-")[0] for p in CATALOG.glob("*.toml"))
    assert not (REPO / "gpuadvisor" / "rules" / "catalog").exists()  # one copy of the rules in the repository


def test_sdist_carries_the_samples_for_its_wheel(source, tmp_path):
    """`python -m build` builds the wheel from the sdist: without MANIFEST.in's line it has no sample_traces/
    and setup.py stops the wheel build."""
    if not _setuptools_can_build():
        pytest.skip("setuptools>=64 is not installed: cannot build an sdist offline")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=source,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with tarfile.open(tmp_path / result.stdout.split()[-1]) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert "setup.py" in names
    assert {n for n in names if n.startswith("sample_traces/") and n.endswith(".json.gz")} == {
        f"sample_traces/{p.name}" for p in SAMPLES.glob("*.json.gz")
    }
