"""The typed report model (gpuadvisor/report/schema.py): the published JSON Schema is the generated one, and every
report gpuadvisor writes, or has written into this repository, decodes into the model and validates."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuadvisor.pipeline import analyze_path
from gpuadvisor.report.json import REQUIRED_KEYS, to_json
from gpuadvisor.report.schema import Report, assemble_report, decode_report, json_schema

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "report.schema.json"
SAMPLES = sorted((REPO / "sample_traces").glob("*.json.gz"))


def _is_report(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return isinstance(data, dict) and "schema_version" in data and isinstance(data.get("tool"), dict)


COMMITTED = sorted(path for path in (REPO / "benchmarks" / "results").rglob("*.json") if _is_report(path))


def test_published_schema_is_the_generated_one():
    """docs/report.schema.json is `python -m gpuadvisor.report.schema`; regenerate it when the model changes."""
    generated = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    assert PUBLISHED.read_text(encoding="utf-8") == generated


def test_schema_requires_what_readers_require():
    schema = json_schema()
    top = schema["$defs"]["Report"]
    assert set(top["required"]) == set(REQUIRED_KEYS)
    assert {"tool", "env", "summary", "kernels", "findings", "source", "peaks", "before", "fixes"} <= set(
        top["properties"]
    )


@pytest.fixture(scope="module")
def sample_reports() -> dict[str, dict]:
    return {path.name: analyze_path(path) for path in SAMPLES}


def test_sample_reports_decode_into_the_model(sample_reports):
    assert len(sample_reports) >= 4
    for name, report in sample_reports.items():
        decoded = decode_report(to_json(report))
        assert isinstance(decoded, Report), name
        assert decoded.command == "analyze" and decoded.schema_version == report["schema_version"]
        assert [k.name for k in decoded.kernels] == [k["name"] for k in report["kernels"]]
        assert [f.rule_id for f in decoded.findings] == [f["rule_id"] for f in report["findings"]]
        # typed to plain and back: the same keys and values (the model drops nothing it knows)
        assert msgspec.to_builtins(decoded) == json.loads(to_json(report)), name


def test_sample_reports_validate_against_the_published_schema(sample_reports):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    for report in sample_reports.values():
        jsonschema.validate(json.loads(to_json(report)), schema)
    for path in COMMITTED:
        jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), schema)


def test_committed_reports_of_every_command_decode():
    """The profile, apply and gate reports kept in benchmarks/results/, some written by earlier versions."""
    assert COMMITTED, "benchmarks/results holds no report.json"
    commands = set()
    for path in COMMITTED:
        decoded = decode_report(path.read_bytes())
        commands.add(decoded.command)
    assert {"profile", "apply"} <= commands, commands


def test_a_builder_that_writes_the_wrong_shape_fails_at_assembly():
    good = analyze_path(SAMPLES[0])
    sections = {k: v for k, v in good.items() if k not in ("schema_version", "tool", "command")}
    assert assemble_report("analyze", sections) == good  # the same keys and values, nothing added or dropped
    broken = dict(sections, kernels=[dict(good["kernels"][0], count="many")])
    with pytest.raises(TypeError, match=r"kernels\[0\]\.count"):
        assemble_report("analyze", broken)


def test_sample_reports_carry_a_timeline_that_decodes(sample_reports):
    for name, report in sample_reports.items():
        timeline = decode_report(to_json(report)).timeline
        assert timeline is not None and timeline.step_time_us > 0, name
        assert timeline.kernels and all(len(iv) == 2 for iv in timeline.kernels), name


def test_the_memory_section_of_profile_fits_the_schema(sample_reports):
    """``memory`` as profile writes it (capture/memory_run.py from capture/memory.py's summaries) decodes and
    validates against the published schema; reports without it (every older one) still do."""
    from gpuadvisor.capture import memory

    stats = {"allocated_bytes.all.peak": 3 << 20, "reserved_bytes.all.peak": 4 << 20, "num_alloc_retries": 0}
    frames = [{"filename": "model.py", "line": 3, "name": "step"}]
    snapshot = {
        "segments": [
            {
                "total_size": 2 << 20,
                "segment_type": "large",
                "blocks": [
                    {"address": 4096, "size": 1 << 20, "state": "active_allocated", "frames": frames},
                    {"address": 4096 + (1 << 20), "size": 1 << 20, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1 << 20, "frames": frames}]],
    }
    report = json.loads(to_json(next(iter(sample_reports.values()))))
    report["memory"] = {
        "allocator": memory.allocator_summary(stats, 8 << 30, 7 << 30),
        "snapshot": {**memory.snapshot_summary(snapshot), "steps": 3},
        "kv_cache": memory.kv_cache_capacity(512, 1 << 30, 1024),
        "notes": [],
    }
    decoded = decode_report(to_json(report))
    assert decoded.memory.allocator.reserved_minus_allocated_peak_bytes == 1 << 20
    assert decoded.memory.snapshot.top_sites[0].site == "model.py:3 (step)"
    assert decoded.memory.snapshot.bytes_by_category == {memory.CATEGORY_ACTIVATIONS: 1 << 20}
    assert decoded.memory.kv_cache["sequences_that_fit"] == (1 << 30) // (512 * 1024)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, json.loads(PUBLISHED.read_text(encoding="utf-8")))
    with pytest.raises(msgspec.ValidationError, match="memory"):
        decode_report(to_json(dict(report, memory={"allocator": {"allocated_peak_bytes": "lots"}})))


def test_the_allocator_settings_survive_the_typed_model():
    """The memory rules read env.allocator_settings / pytorch_cuda_alloc_conf: a typed round trip keeps them."""
    import msgspec

    from gpuadvisor.report.schema import Env

    env = {
        "gpu_name": "NVIDIA H200",
        "allocator_settings": "expandable_segments:True",
        "pytorch_cuda_alloc_conf": "expandable_segments:True",
    }
    decoded = msgspec.json.decode(msgspec.json.encode(env), type=Env)
    assert decoded.allocator_settings == "expandable_segments:True"
    assert decoded.pytorch_cuda_alloc_conf == "expandable_segments:True"
