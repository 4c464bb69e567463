"""The report.json schema as code: one :class:`msgspec.Struct` per section, from which the published JSON Schema
(``docs/report.schema.json``, :func:`json_schema`) is generated.

Every report gpuadvisor writes (``analyze``, ``profile``, ``apply``, a multi-rank merge) is assembled by
:func:`assemble_report`, which puts the sections in the schema's order under ``schema_version`` and ``tool`` and
checks the result against :class:`Report`: a builder that writes a section of the wrong shape fails there, not in
a reader. :func:`decode_report` reads a report.json into the typed model.

Times are in µs, sizes in bytes, rates per second; a figure a run could not measure is ``null``. A field typed
``X | UnsetType`` is optional: it is absent from reports that have nothing for it (an ``analyze`` report has no
``before``; reports written by earlier 0.1 versions lack some newer fields). Readers ignore keys they do not know,
so a newer minor addition never breaks an older reader; :data:`gpuadvisor.report.json.SCHEMA_VERSION` changes only
when a key changes meaning or goes away.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

Number = Union[float, None]
Count = Union[int, None]
Text = Union[str, None]


class _Section(msgspec.Struct, kw_only=True):
    pass


class Tool(_Section):
    name: str
    version: str


class Source(_Section):
    """What was analysed: a trace (analyze), the profiled run's trace (profile), the run (apply)."""

    path: Text
    ranks: Union[list[int], UnsetType] = UNSET
    events: Union[Count, UnsetType] = UNSET
    size_bytes: Union[Count, UnsetType] = UNSET
    model: Union[str, UnsetType] = UNSET
    rank_folders: Union[list[str], UnsetType] = UNSET
    fixes_requested: Union[str, UnsetType] = UNSET
    fix_ids: Union[list[str], UnsetType] = UNSET
    before_trace: Union[Text, UnsetType] = UNSET
    after_trace: Union[Text, UnsetType] = UNSET


class Env(_Section):
    """The machine: GPU, driver, CUDA, torch, triton, clocks (each may be null); on the CPU its name."""

    gpu_name: Union[Text, UnsetType] = UNSET
    sm_count: Union[Count, UnsetType] = UNSET
    compute_capability: Union[Text, UnsetType] = UNSET
    driver: Union[Text, UnsetType] = UNSET
    cuda: Union[Text, UnsetType] = UNSET
    torch: Union[Text, UnsetType] = UNSET
    triton: Union[Text, UnsetType] = UNSET
    python: Union[Text, UnsetType] = UNSET
    clocks: Union[dict[str, Any], None, UnsetType] = UNSET
    device: Union[Text, UnsetType] = UNSET
    cpu_name: Union[Text, UnsetType] = UNSET
    cpu_threads: Union[Count, UnsetType] = UNSET
    # How the CUDA caching allocator was configured (gpuadvisor/environment.py, allocator_config): what torch
    # reports it runs with ("" for the defaults), and the environment variables as set.
    allocator_settings: Union[Text, UnsetType] = UNSET
    pytorch_cuda_alloc_conf: Union[Text, UnsetType] = UNSET
    pytorch_alloc_conf: Union[Text, UnsetType] = UNSET


class Peaks(_Section):
    """The roofs the classes were computed against: datasheet table, calibration or --peaks file."""

    gpu: Text
    known: bool
    source: Text
    hbm_bytes_per_s: Number
    flops_per_s: dict[str, float]


class Summary(_Section):
    """Step time (median, every sample), GPU busy and idle, launches, syncs, the findings' combined saving; a
    ``profile`` adds the timed steps' figures and NVML's, ``apply`` the speedup."""

    step_time_us: Number
    samples_us: list[Number]
    steps: Union[Count, UnsetType] = UNSET
    step_time_source: Union[Text, UnsetType] = UNSET
    gpu_busy_us: Union[Number, UnsetType] = UNSET
    gpu_busy_pct: Union[Number, UnsetType] = UNSET
    kernels_per_step: Union[Number, UnsetType] = UNSET
    idle_launch_us: Union[Number, UnsetType] = UNSET
    idle_sync_us: Union[Number, UnsetType] = UNSET
    idle_other_us: Union[Number, UnsetType] = UNSET
    host_syncs_per_step: Union[Number, UnsetType] = UNSET
    launch_calls_per_step: Union[Number, UnsetType] = UNSET
    launch_call_us_per_step: Union[Number, UnsetType] = UNSET
    median_queue_depth: Union[Number, UnsetType] = UNSET
    kernels_shorter_than_launch_pct: Union[Number, UnsetType] = UNSET
    memcpy_us_per_step: Union[Number, UnsetType] = UNSET
    kernel_us_per_step: Union[Number, UnsetType] = UNSET
    top_finding: Union[Text, UnsetType] = UNSET
    combined_saving_us: Union[Number, UnsetType] = UNSET
    combined_saving_pct: Union[Number, UnsetType] = UNSET
    combined_upper_bound_us: Union[Number, UnsetType] = UNSET
    combined_upper_bound_pct: Union[Number, UnsetType] = UNSET
    combined_saving_basis: Union[Text, UnsetType] = UNSET
    # profile: the steps timed without the profiler, and NVML
    trace_step_time_us: Union[Number, UnsetType] = UNSET
    step_time_p10_us: Union[Number, UnsetType] = UNSET
    step_time_p90_us: Union[Number, UnsetType] = UNSET
    timed_steps: Union[Count, UnsetType] = UNSET
    timing_wall_s: Union[Number, UnsetType] = UNSET
    # host time of one step started with the GPU idle (median of the probes; capture.timing.probe_host)
    host_enqueue_us: Union[Number, None, UnsetType] = UNSET
    # what TF32 did to the step's time per step in a loop, on minus off (median over rounds; profile.tf32_step_delta)
    tf32_step_delta_us: Union[Number, None, UnsetType] = UNSET
    tf32_step_delta_rounds: Union[Count, None, UnsetType] = UNSET
    # reports written before tf32_step_delta_us: what TF32 added to host_enqueue_us (paired probes)
    tf32_host_extra_us: Union[Number, None, UnsetType] = UNSET
    # host time inside torch.optim's optimizer.step() per step (capture.timing.OptimizerClock)
    optimizer_step_host_us: Union[Number, None, UnsetType] = UNSET
    tokens_per_s: Union[Number, UnsetType] = UNSET
    profiler_slowdown: Union[Number, UnsetType] = UNSET
    memory_allocated_peak_bytes: Union[Count, UnsetType] = UNSET
    memory_reserved_peak_bytes: Union[Count, UnsetType] = UNSET
    energy_j_per_step: Union[Number, UnsetType] = UNSET
    energy_source: Union[Text, UnsetType] = UNSET
    power_w_average: Union[Number, UnsetType] = UNSET
    power_w_median: Union[Number, UnsetType] = UNSET
    temperature_c_max: Union[Number, UnsetType] = UNSET
    throttle_reasons: Union[list[str], None, UnsetType] = UNSET
    nvml_samples: Union[Count, UnsetType] = UNSET
    cpu_op_self_us_per_step: Union[Number, UnsetType] = UNSET
    world_size: Union[Count, UnsetType] = UNSET
    # apply
    speedup: Union[Number, UnsetType] = UNSET
    before_step_time_us: Union[Number, UnsetType] = UNSET


class Step(_Section):
    step: int
    step_time_us: Number
    start_us: Union[Number, UnsetType] = UNSET
    gpu_busy_us: Union[Number, UnsetType] = UNSET
    gpu_busy_pct: Union[Number, UnsetType] = UNSET
    idle_launch_us: Union[Number, UnsetType] = UNSET
    idle_sync_us: Union[Number, UnsetType] = UNSET
    idle_other_us: Union[Number, UnsetType] = UNSET
    kernels: Union[Count, UnsetType] = UNSET
    host_syncs: Union[Count, UnsetType] = UNSET


class Timeline(_Section):
    """One profiled step (the one nearest the median) as intervals ``[start_us, duration_us]`` from its start, per
    lane: what the GPU did and why it idled (analysis/timeline.py, step_timeline)."""

    step: int
    step_time_us: Number
    kernels: list[list[float]]
    copies: list[list[float]]
    idle_launch: list[list[float]]
    idle_sync: list[list[float]]
    idle_other: list[list[float]]
    copy_us_per_step: Union[list[Number], UnsetType] = UNSET
    omitted: Union[dict[str, int], UnsetType] = UNSET


class Allocator(_Section):
    """``profile`` on CUDA: the caching allocator over the timed steps (capture/memory.py, allocator_summary)."""

    allocated_peak_bytes: Count
    reserved_peak_bytes: Count
    active_peak_bytes: Union[Count, UnsetType] = UNSET
    requested_peak_bytes: Union[Count, UnsetType] = UNSET
    inactive_split_peak_bytes: Union[Count, UnsetType] = UNSET
    reserved_minus_allocated_peak_bytes: Union[Count, UnsetType] = UNSET
    fragmentation_pct: Union[Number, UnsetType] = UNSET
    num_alloc_retries: Union[Count, UnsetType] = UNSET
    num_ooms: Union[Count, UnsetType] = UNSET
    num_device_alloc: Union[Count, UnsetType] = UNSET
    num_device_free: Union[Count, UnsetType] = UNSET
    device_total_bytes: Union[Count, UnsetType] = UNSET
    device_free_bytes: Union[Count, UnsetType] = UNSET
    peak_pct_of_device: Union[Number, UnsetType] = UNSET
    headroom_bytes: Union[Count, UnsetType] = UNSET
    notes: Union[list[str], UnsetType] = UNSET


class MemorySite(_Section):
    site: str
    bytes: int
    count: int


class Snapshot(_Section):
    """``profile --memory``: a memory snapshot over a few untimed steps (capture/memory.py, snapshot_summary)."""

    bytes_by_category: dict[str, int]
    top_sites: list[MemorySite]
    segments: Union[Count, UnsetType] = UNSET
    segments_by_type: Union[dict[str, int], UnsetType] = UNSET
    expandable_segments: Union[Count, UnsetType] = UNSET
    reserved_bytes: Union[Count, UnsetType] = UNSET
    allocated_bytes: Union[Count, UnsetType] = UNSET
    free_bytes: Union[Count, UnsetType] = UNSET
    largest_free_block_bytes: Union[Count, UnsetType] = UNSET
    external_fragmentation_pct: Union[Number, UnsetType] = UNSET
    trace_events: Union[Count, UnsetType] = UNSET
    trace_events_used: Union[Count, UnsetType] = UNSET
    peak_bytes: Union[Count, UnsetType] = UNSET
    ooms: Union[Count, UnsetType] = UNSET
    steps: Union[Count, UnsetType] = UNSET
    notes: Union[list[str], UnsetType] = UNSET


class Memory(_Section):
    """``profile``: the allocator's figures (CUDA only; null without), with ``--memory`` a snapshot summary, and for
    a decode workload the KV cache's capacity (capture/memory.py, kv_cache_capacity, plus the cache found)."""

    allocator: Union[Allocator, None, UnsetType] = UNSET
    snapshot: Union[Snapshot, None, UnsetType] = UNSET
    kv_cache: Union[dict[str, Any], None, UnsetType] = UNSET
    notes: Union[list[str], UnsetType] = UNSET


class Kernel(_Section):
    """One kernel name's row: time, FLOPs and bytes, roofline class and % of the roof it is under."""

    name: str
    count: int
    total_us: Number
    bound: str  # "compute" | "memory" | "latency" | "launch" | "unknown"
    family: Union[Text, UnsetType] = UNSET
    count_per_step: Union[Number, UnsetType] = UNSET
    us_per_step: Union[Number, UnsetType] = UNSET
    mean_us: Union[Number, UnsetType] = UNSET
    pct_of_gpu_time: Union[Number, UnsetType] = UNSET
    flops: Union[Number, UnsetType] = UNSET
    bytes: Union[Number, UnsetType] = UNSET
    intensity: Union[Number, UnsetType] = UNSET
    achieved_flops_per_s: Union[Number, UnsetType] = UNSET
    achieved_bytes_per_s: Union[Number, UnsetType] = UNSET
    pct_of_roof: Union[Number, UnsetType] = UNSET
    estimated: Union[bool, UnsetType] = UNSET
    blocks: Union[Count, UnsetType] = UNSET
    dtype: Union[Text, UnsetType] = UNSET
    bytes_basis: Union[Text, UnsetType] = UNSET
    roof_note: Union[Text, UnsetType] = UNSET


class Transfer(_Section):
    direction: str
    count: int
    bytes: Number
    total_us: Number
    src_kind: Union[Text, UnsetType] = UNSET
    dst_kind: Union[Text, UnsetType] = UNSET
    count_per_step: Union[Number, UnsetType] = UNSET
    bytes_per_step: Union[Number, UnsetType] = UNSET
    us_per_step: Union[Number, UnsetType] = UNSET
    bytes_per_s: Union[Number, UnsetType] = UNSET
    pageable: Union[bool, UnsetType] = UNSET
    sync: Union[bool, UnsetType] = UNSET


class HostSync(_Section):
    name: str
    count: int
    total_us: Number
    op: Union[Text, UnsetType] = UNSET
    source: Union[Text, UnsetType] = UNSET
    per_step: Union[Number, UnsetType] = UNSET


class CpuOp(_Section):
    name: str
    count: int
    self_us: Number
    total_us: Number
    count_per_step: Union[Number, UnsetType] = UNSET
    per_step_us: Union[Number, UnsetType] = UNSET
    total_per_step_us: Union[Number, UnsetType] = UNSET


class Finding(_Section):
    """One rule's finding, with its evidence and estimated saving (rules/engine.py, make_finding)."""

    rule_id: str
    title: str
    severity: str  # "high" | "medium" | "low" | "info"
    message: str
    evidence: dict[str, Any]
    estimated_saving_us_per_step: Number
    estimated_saving_pct: Number
    fix_id: Text
    name: Union[str, UnsetType] = UNSET
    category: Union[str, UnsetType] = UNSET
    fix: Union[str, UnsetType] = UNSET
    saving_basis: Union[str, UnsetType] = UNSET  # "graph replay model" | "roof" | "measured alternative" | ...
    saving_from: Union[str, UnsetType] = UNSET  # "launch_idle" | "sync_idle" | "copies" | "kernels" | "step"


class SkippedRule(_Section):
    rule_id: str
    reason: str


class Ranks(_Section):
    """All ranks side by side (a multi-rank folder, or ``profile --nproc N``)."""

    rows: list[dict[str, Any]]
    matched_steps: Union[list[int], UnsetType] = UNSET
    step_basis: Union[Text, UnsetType] = UNSET
    straggler: Union[Count, UnsetType] = UNSET
    straggler_excess_wait_us_per_step: Union[Number, UnsetType] = UNSET
    straggler_excess_wait_pct: Union[Number, UnsetType] = UNSET
    world_size: Union[Count, UnsetType] = UNSET
    backend: Union[Text, UnsetType] = UNSET
    launcher: Union[Text, UnsetType] = UNSET
    timing_agreement: Union[dict[str, Any], UnsetType] = UNSET


class Distributed(_Section):
    """One rank's own report of a multi-rank profile."""

    rank: int
    world_size: int
    local_rank: Union[Count, UnsetType] = UNSET
    backend: Union[Text, UnsetType] = UNSET


class Side(_Section):
    """``apply``: one side (before or after the fixes), timed in interleaved rounds."""

    step_time_us: Number
    samples_us: list[Number]
    step_time_p10_us: Union[Number, UnsetType] = UNSET
    step_time_p90_us: Union[Number, UnsetType] = UNSET
    round_medians_us: Union[list[Number], UnsetType] = UNSET
    step_time_source: Union[Text, UnsetType] = UNSET
    timed_steps: Union[Count, UnsetType] = UNSET
    tokens_per_s: Union[Number, UnsetType] = UNSET
    kernels_per_step: Union[Number, UnsetType] = UNSET
    launch_calls_per_step: Union[Number, UnsetType] = UNSET
    gpu_busy_us: Union[Number, UnsetType] = UNSET
    gpu_busy_pct: Union[Number, UnsetType] = UNSET
    host_enqueue_us: Union[Number, None, UnsetType] = UNSET
    tf32_step_delta_us: Union[Number, None, UnsetType] = UNSET
    tf32_step_delta_rounds: Union[Count, None, UnsetType] = UNSET
    tf32_host_extra_us: Union[Number, None, UnsetType] = UNSET  # reports written before tf32_step_delta_us
    optimizer_step_host_us: Union[Number, None, UnsetType] = UNSET
    energy_j_per_step: Union[Number, UnsetType] = UNSET
    energy_source: Union[Text, UnsetType] = UNSET
    peak_memory_bytes: Union[Count, UnsetType] = UNSET
    peak_memory_reserved_bytes: Union[Count, UnsetType] = UNSET
    kernel_classes: Union[dict[str, float], UnsetType] = UNSET
    findings: Union[list[Finding], UnsetType] = UNSET
    trace: Union[Text, UnsetType] = UNSET
    profiled: Union[bool, UnsetType] = UNSET
    notes: Union[list[str], UnsetType] = UNSET


class Fix(_Section):
    """``apply``: one fix's outcome (applied / refused / rolled back / failed) and its numerics check."""

    fix_id: str
    status: str
    reason: Union[Text, UnsetType] = UNSET
    title: Union[Text, UnsetType] = UNSET
    numerics: Union[dict[str, Any], None, UnsetType] = UNSET
    predicted_saving_us: Union[Number, UnsetType] = UNSET
    measured_saving_us: Union[Number, UnsetType] = UNSET
    measured_together_with: Union[list[str], UnsetType] = UNSET


class Speedup(_Section):
    median: Number
    ci_low: Number
    ci_high: Number
    confidence: Union[Number, UnsetType] = UNSET
    method: Union[Text, UnsetType] = UNSET
    round_ratios: Union[list[Number], UnsetType] = UNSET
    samples_before: Union[Count, UnsetType] = UNSET
    samples_after: Union[Count, UnsetType] = UNSET
    paired: Union[dict[str, Any], None, UnsetType] = UNSET


class Saving(_Section):
    predicted_us: Number
    measured_us: Number
    predicted_basis: Union[Text, UnsetType] = UNSET
    measured_pct: Union[Number, UnsetType] = UNSET


class Report(msgspec.Struct, kw_only=True):
    """report.json (:data:`gpuadvisor.report.json.SCHEMA_VERSION`): ``command`` is "analyze", "profile" or
    "apply"; the top-level ``summary``, ``kernels`` and ``findings`` of an apply report describe the after run."""

    schema_version: int
    tool: Tool
    env: Env
    summary: Summary
    kernels: list[Kernel]
    findings: list[Finding]
    command: Union[str, UnsetType] = UNSET
    source: Union[Source, UnsetType] = UNSET
    peaks: Union[Peaks, UnsetType] = UNSET
    steps: Union[list[Step], UnsetType] = UNSET
    timeline: Union[Timeline, None, UnsetType] = UNSET
    memory: Union[Memory, None, UnsetType] = UNSET
    kernel_classes: Union[dict[str, float], UnsetType] = UNSET
    transfers: Union[list[Transfer], UnsetType] = UNSET
    host_syncs: Union[list[HostSync], UnsetType] = UNSET
    cpu_ops: Union[list[CpuOp], UnsetType] = UNSET
    skipped_rules: Union[list[SkippedRule], UnsetType] = UNSET
    ranks: Union[Ranks, UnsetType] = UNSET
    distributed: Union[Distributed, UnsetType] = UNSET
    before: Union[Side, UnsetType] = UNSET
    after: Union[Side, UnsetType] = UNSET
    fixes: Union[list[Fix], UnsetType] = UNSET
    speedup: Union[Speedup, UnsetType] = UNSET
    saving: Union[Saving, UnsetType] = UNSET
    kernel_diff: Union[dict[str, Any], None, UnsetType] = UNSET
    search: Union[dict[str, Any], None, UnsetType] = UNSET
    keep: Union[list[str], UnsetType] = UNSET
    notes: Union[list[str], UnsetType] = UNSET


def check_report(report: dict[str, Any]) -> Report:
    """``report`` (plain JSON types) as the typed model; a section of the wrong shape raises TypeError naming
    where (e.g. ``Expected `int`, got `str` - at `$.kernels[0].count```): a bug in the builder, not bad input."""
    try:
        return msgspec.convert(report, Report)
    except msgspec.ValidationError as error:
        raise TypeError(f"the report does not match its schema: {error}") from None


def assemble_report(command: str, sections: dict[str, Any]) -> dict[str, Any]:
    """The one place a report is put together: ``schema_version``, ``tool`` and ``command`` first, then
    ``sections`` in the order given, as plain JSON types (NaN and infinities as None), checked against
    :class:`Report`. Returns the dict (its keys are exactly those given: nothing is added or dropped)."""
    from gpuadvisor import __version__
    from gpuadvisor.report.json import SCHEMA_VERSION, to_plain

    report = to_plain(
        {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "gpuadvisor", "version": __version__},
            "command": command,
            **sections,
        }
    )
    check_report(report)
    return report


def decode_report(data: bytes | str) -> Report:
    """A report.json's bytes as the typed model (msgspec.ValidationError or DecodeError when it is not one)."""
    return msgspec.json.decode(data, type=Report)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of report.json, generated from :class:`Report` (published as docs/report.schema.json)."""
    schema = msgspec.json.schema(Report)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpuadvisor report.json",
        "description": "Generated from gpuadvisor/report/schema.py (python -m gpuadvisor.report.schema).",
        **schema,
    }


def main() -> None:
    """``python -m gpuadvisor.report.schema``: print the JSON Schema (docs/report.schema.json is this output)."""
    import json
    import sys

    sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
