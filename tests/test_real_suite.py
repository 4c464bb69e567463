"""The real-client workloads in examples/real/ load and step on the CPU in their small configuration.

Each file is loaded through the model.py contract (``load_workload``) with GPUADVISOR_REAL_SIZE=small and
stepped twice. A file whose library (transformers, timm, torchvision) does not import here is skipped
with the reason. Decode files must write their cache in place, at the position in their inputs.
"""

from __future__ import annotations

import ast
import importlib
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuadvisor.errors import UserCodeError  # noqa: E402
from gpuadvisor.workload import load_workload  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / "examples" / "real"
FILES = sorted(path for path in REAL.glob("*.py") if not path.name.startswith("_"))
KINDS = {"decode", "prefill", "train", "infer"}
LIBRARIES = ("transformers", "timm", "torchvision")


def imported_libraries(path: Path) -> list[str]:
    """The third-party model libraries the file imports at its top level, in order."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in LIBRARIES and root not in found:
                found.append(root)
    return found


def declared_kind(path: Path):
    """The value of the file's module-level ``KIND = "..."`` (None when it has none)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KIND" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def require_libraries(path: Path) -> None:
    for name in imported_libraries(path):
        try:
            importlib.import_module(name)
        except Exception as error:  # torchvision built for another torch raises more than ImportError
            pytest.skip(f"{path.name} needs {name}, which does not import here: {type(error).__name__}: {error}")


def floating_tensors(value) -> list:
    """The floating tensors in a step's output: a tensor, a ModelOutput (a dict), or a tuple/list of them."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in floating_tensors(item)]
    return []


def cache_tensors(cache) -> list:
    """The key and value tensors of a transformers cache: [batch, heads, slots, head_dim] per layer."""
    tensors = []
    for layer in cache.layers:
        tensors += [tensor for tensor in (layer.keys, layer.values) if isinstance(tensor, torch.Tensor)]
    return tensors


def test_the_suite_has_at_least_eight_files():
    assert len(FILES) >= 8, [path.name for path in FILES]


# PyTorch's own prebuilt model blocks count as a model library: the network is not the file's own code.
TORCH_MODEL_BLOCKS = ("nn.TransformerEncoder(", "nn.TransformerDecoder(", "nn.Transformer(", "nn.MultiheadAttention(")


def test_every_file_uses_a_model_library():
    for path in FILES:
        source = path.read_text()
        assert imported_libraries(path) or any(block in source for block in TORCH_MODEL_BLOCKS), (
            f"{path.name} imports none of {LIBRARIES} and builds none of torch's {TORCH_MODEL_BLOCKS}"
        )


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_real_workload_small(path, monkeypatch):
    kind = declared_kind(path)
    assert kind in KINDS, f"{path.name}: KIND = {kind!r}"
    require_libraries(path)
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    torch.manual_seed(1234)  # each build seeds itself; this only shows that it does not depend on the caller
    workload = load_workload(str(path))

    if kind == "decode":
        input_ids, cache_position, cache = workload.inputs
        assert input_ids.shape == (1, 1) and cache_position.shape == (1,)
        slot = int(cache_position[0])
        before = [tensor[:, :, slot].clone() for tensor in cache_tensors(cache)]
        assert before, f"{path.name}: the cache in the inputs holds no tensors after build()"
        assert all(tensor.abs().max() == 0 for tensor in before), "the decode slot is written before any step"
        assert all(tensor[:, :, slot - 1].abs().max() > 0 for tensor in cache_tensors(cache)), "prompt not cached"

    outputs = [workload.step_fn(), workload.step_fn()]
    for output in outputs:
        tensors = floating_tensors(output)
        assert tensors, f"{path.name}: the step returned no floating tensor ({type(output).__name__})"
        for tensor in tensors:
            assert torch.isfinite(tensor).all(), f"{path.name}: non-finite values in the step's output"
    if kind == "train":
        assert outputs[0].ndim == 0 and not outputs[0].requires_grad, "a training step returns the detached loss"
        assert math.isfinite(float(outputs[1]))

    if kind == "decode":
        after = [tensor[:, :, slot] for tensor in cache_tensors(cache)]
        assert all(not torch.equal(old, new) for old, new in zip(before, after)), "the step did not write the cache"
        # Each step decodes the same position again: two steps on the same inputs agree.
        torch.testing.assert_close(outputs[0], outputs[1])
        # and nothing past it was written
        assert all(tensor[:, :, slot + 1 :].abs().max() == 0 for tensor in cache_tensors(cache))


def test_an_unknown_size_is_refused(monkeypatch):
    path = REAL / "hf_vit_infer.py"
    require_libraries(path)
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "medium")
    with pytest.raises(UserCodeError, match="GPUADVISOR_REAL_SIZE must be 'small' or 'full', got 'medium'"):
        load_workload(str(path))


@pytest.mark.parametrize("value", ["0", "-3", "big", "6.5"])
def test_a_batch_that_is_not_a_positive_integer_is_refused(monkeypatch, value):
    path = REAL / "hf_resnet_train.py"
    require_libraries(path)
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    monkeypatch.setenv("GPUADVISOR_REAL_BATCH", value)
    with pytest.raises(UserCodeError, match=f"GPUADVISOR_REAL_BATCH must be a positive integer, got '{value}'"):
        load_workload(str(path))


def test_the_batch_switch_sets_the_batch_of_the_conv_net_steps(monkeypatch):
    path = REAL / "hf_resnet_train.py"
    require_libraries(path)
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    monkeypatch.setenv("GPUADVISOR_REAL_BATCH", "3")
    images, labels = load_workload(str(path)).inputs
    assert images.shape[0] == 3 and labels.shape == (3,)
    monkeypatch.delenv("GPUADVISOR_REAL_BATCH")
    assert load_workload(str(path)).inputs[0].shape[0] == 2
