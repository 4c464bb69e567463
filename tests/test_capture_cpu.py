"""Trace capture and the examples on the CPU (tiny sizes; no GPU needed)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuadvisor.capture.profiler import record_trace, warm_up  # noqa: E402
from gpuadvisor.errors import BadInputError, UserCodeError  # noqa: E402
from gpuadvisor.workload import load_workload  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def read_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_record_tiny_mlp_trace(tmp_path):
    workload = load_workload(str(EXAMPLES / "tiny_mlp.py"))
    warm_up(workload, 2)
    out = record_trace(workload, tmp_path / "tiny.json.gz", wait=1, warmup=1, active=3)
    assert out == tmp_path / "tiny.json.gz"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.json.gz"]  # no temporary files left behind

    events = read_events(out)
    steps = sorted(e["name"] for e in events if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))))
    # wait=1 and warmup=1 come first (steps 0 and 1); the active steps are 2, 3 and 4.
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::addmm" for e in cpu_ops)
    assert any("Input Dims" in e.get("args", {}) for e in cpu_ops)  # record_shapes
    # with_flops: the counts torch leaves out of its export are written into the trace.
    first_layer = [e for e in cpu_ops if e["name"] == "aten::addmm" and e["args"]["Input Dims"][1] == [16, 32]]
    assert first_layer and all(e["args"]["flops"] == 2 * 16 * 32 * 64 for e in first_layer)
    assert any(e.get("cat") == "python_function" for e in events)  # with_stack


def test_failed_step_leaves_no_file(tmp_path):
    model_file = tmp_path / "flaky.py"
    model_file.write_text(
        "calls = []\n\ndef build():\n    return (lambda: calls.append(1) or (len(calls) > 2 and 1 / 0)), ()\n"
    )
    workload = load_workload(str(model_file))
    out = tmp_path / "traces" / "flaky.json.gz"
    out.parent.mkdir()
    with pytest.raises(UserCodeError, match="ZeroDivisionError"):
        record_trace(workload, out, wait=0, warmup=1, active=3)
    assert list(out.parent.iterdir()) == []


def test_bad_schedule_and_folder(tmp_path):
    workload = load_workload(str(EXAMPLES / "tiny_mlp.py"))
    with pytest.raises(BadInputError, match="active must be an int >= 1"):
        record_trace(workload, tmp_path / "t.json.gz", active=0)
    with pytest.raises(BadInputError, match="no such folder"):
        record_trace(workload, tmp_path / "missing" / "t.json.gz")


@pytest.mark.parametrize("name", ["tiny_mlp", "llama_decode", "add_rmsnorm", "gemm", "input_pipeline"])
def test_example_builds_and_steps_on_cpu(name):
    workload = load_workload(str(EXAMPLES / f"{name}.py"))
    assert workload.name == name
    workload.step_fn()
    workload.step_fn()


def test_llama_decode_contract():
    workload = load_workload(str(EXAMPLES / "llama_decode.py"))
    assert workload.tokens_per_step == 1
    model = workload.model
    norms = [m for m in model.modules() if type(m).__name__ == "RMSNorm"]
    assert len(norms) == 2 * model.config.n_layers + 1
    assert all(hasattr(m, "weight") and hasattr(m, "eps") for m in norms)
    logits = workload.step_fn()
    assert logits.shape == (1, 1, model.config.vocab_size)
    assert torch.isfinite(logits.float()).all()
    # The static cache: the step writes the token's keys at the position and keeps every shape.
    cache = model.layers[0].attention.kv_cache.k_cache
    assert cache.shape[2] == model.config.max_seq_len


def test_record_script_writes_trace_and_recording(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("record_sample_traces", REPO / "sample_traces" / "record.py")
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    assert record.main(["--out", str(tmp_path), "--only", "gemm"]) == 0
    recording = json.loads((tmp_path / "recording.json").read_text())
    assert recording["torch"] == torch.__version__
    assert recording["examples"]["gemm"]["steps_recorded"] == record.SCHEDULE["active"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.json.gz", "recording.json"]
    assert "gemm.json.gz" in capsys.readouterr().out
