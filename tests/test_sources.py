"""The exact call line behind a profiler frame (which names only the function's def line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuadvisor.analysis import sources
from gpuadvisor.analysis.sources import call_sites, resolve_location

REPO = Path(__file__).resolve().parents[1]

SMALL = """\
import torch


def train_step(model, batch, labels):
    x = batch.to("cuda")
    y = labels.cuda(non_blocking=True)
    h = x.to(torch.bfloat16)  # a cast, not a copy
    loss = model(h, y)

    def log():
        return loss.item()  # a nested function: its own frame

    print(float(loss))
    return loss.item(), loss.detach().cpu().numpy()


@torch.no_grad()
def evaluate(model, x):
    return model(x).argmax().item()


def no_calls(x):
    return x + 1
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small_model.py"
    path.write_text(SMALL)
    sources.clear_cache()
    yield str(path)
    sources.clear_cache()


def lines(sites):
    return [(site.line, site.text) for site in sites]


def test_item_calls_in_the_body_not_in_nested_functions(small):
    assert lines(call_sites(small, 4, "train_step", "item")) == [(14, "loss.item()")]


def test_float_of_a_tensor_is_a_second_choice_for_item(small, tmp_path):
    path = tmp_path / "floaty.py"
    path.write_text("def f(loss):\n    total = 0\n    total += float(loss)\n    return total\n")
    assert lines(call_sites(str(path), 1, "f", "item")) == [(3, "float(loss)")]


def test_copies_by_direction(small):
    assert lines(call_sites(small, 4, "train_step", "host_to_device")) == [
        (5, 'batch.to("cuda")'),
        (6, "labels.cuda(non_blocking=True)"),
    ]
    # x.cpu().numpy() is one copy, named once by the whole chain.
    assert lines(call_sites(small, 4, "train_step", "device_to_host")) == [(14, "loss.detach().cpu().numpy()")]


def test_decorated_function_is_found_by_its_first_decorator_line(small):
    # A code object's first line is its first decorator's line; the def is one line further down.
    assert lines(call_sites(small, 17, "evaluate", "item")) == [(19, "model(x).argmax().item()")]
    assert lines(call_sites(small, 18, "evaluate", "item")) == [(19, "model(x).argmax().item()")]


def test_resolve_location_names_the_line_or_falls_back(small):
    assert resolve_location(f"{small}:4 (train_step)", "item") == f"{small}:14 (loss.item())"
    # The ordinal picks one of several sites when the count of events matches the count of sites.
    two = f"{small}:4 (train_step)"
    assert resolve_location(two, "host_to_device", 1, 2) == f"{small}:6 (labels.cuda(non_blocking=True))"
    assert resolve_location(two, "host_to_device", 0, 3) == (
        f'{small}:5 (batch.to("cuda")), {small}:6 (labels.cuda(non_blocking=True))'
    )
    # No matching call, wrong def line (file edited since), missing file, unknown kind: the frame as it was.
    assert resolve_location(f"{small}:22 (no_calls)", "item") == f"{small}:22 (no_calls)"
    assert resolve_location(f"{small}:5 (train_step)", "item") == f"{small}:5 (train_step)"
    assert resolve_location("/no/such/file.py:4 (train_step)", "item") == "/no/such/file.py:4 (train_step)"
    assert resolve_location(f"{small}:4 (train_step)", None) == f"{small}:4 (train_step)"
    assert resolve_location("not a location", "item") == "not a location"


def test_unparsable_file_falls_back(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    assert call_sites(str(path), 1, "f", "item") == []


def test_input_pipeline_example_lines():
    """examples/input_pipeline.py, as its H200 trace names it: relative to the repository root."""
    cwd = os.getcwd()
    os.chdir(REPO)
    sources.clear_cache()
    try:
        text = (REPO / "examples" / "input_pipeline.py").read_text().splitlines()
        def_line = next(i for i, line in enumerate(text, 1) if line.startswith("def step("))
        item_line = next(i for i, line in enumerate(text, 1) if i > def_line and "loss.item()" in line)
        to_line = next(i for i, line in enumerate(text, 1) if i > def_line and "features.to(DEVICE)" in line)
        location = f"examples/input_pipeline.py:{def_line} (step)"
        assert resolve_location(location, "item") == f"examples/input_pipeline.py:{item_line} (loss.item())"
        assert resolve_location(location, "host_to_device", 0, 2) == (
            f"examples/input_pipeline.py:{to_line} (features.to(DEVICE))"
        )
    finally:
        os.chdir(cwd)
        sources.clear_cache()


def test_sample_trace_findings_name_the_call_lines():
    """The H200 input-pipeline trace: GA401 and GA402 name the .item() and .to() lines, not the def line."""
    from gpuadvisor.pipeline import analyze_path

    cwd = os.getcwd()
    os.chdir(REPO)
    sources.clear_cache()
    try:
        report = analyze_path(REPO / "sample_traces" / "input_pipeline.json.gz")
    finally:
        os.chdir(cwd)
        sources.clear_cache()
    findings = {f["rule_id"]: f for f in report["findings"]}
    syncs = {s["op"]: s["source"] for s in findings["GA401"]["evidence"]["sources"] if s["op"]}
    assert syncs["aten::_local_scalar_dense"] == "examples/input_pipeline.py:50 (loss.item())"
    assert "examples/input_pipeline.py:50 (loss.item())" in findings["GA401"]["message"]
    copies = findings["GA402"]["evidence"]["sources"]
    assert copies[0] == "examples/input_pipeline.py:44 (features.to(DEVICE))"
    assert "examples/input_pipeline.py:44 (features.to(DEVICE))" in findings["GA402"]["message"]
    table = {row["source"] for row in report["host_syncs"]}
    assert "examples/input_pipeline.py:50 (loss.item())" in table
