"""The model.py contract: load a user's workload file, validate it, and wrap one step.

A workload file is a plain Python file::

    TOKENS_PER_STEP = 1          # optional: positive int; lets the report print tokens/s
    KIND = "decode"              # optional: "decode" adds the KV cache's capacity to profile's memory figures

    def build():                 # required: returns (model_or_callable, example_inputs_tuple)
        model = MyModel().cuda()
        return model, (torch.randn(8, 1024, device="cuda"),)

    def step(model, inputs):     # optional: one training/inference step; default: model(*inputs)
        return model(*inputs)

The example inputs may also be a dict of keyword inputs (a batch such as ``{"input_ids": ..., "labels": ...}``):
``step(model, batch)`` then receives that dict, and the default step is ``model(**batch)``. Inside, the inputs
are the 1-tuple ``(batch,)``, so every fix treats the batch as one nested input.

``load_workload("model.py")`` imports the file in-process (its folder is on ``sys.path`` while it
loads, so it can import its neighbours), calls ``build()`` once and returns a :class:`Workload`
whose ``step_fn()`` runs one step. ``entry`` names another build function: ``"build_small"`` (a
function in the same file) or ``"pkg.module:function"`` (a module importable from ``path``'s folder;
``step`` and ``TOKENS_PER_STEP`` are then looked up in that module).

Anything missing or of the wrong type raises :class:`BadInputError` (exit code 2); an exception
raised by the user's own code (on import, in ``build()`` or in a step) raises
:class:`UserCodeError` (exit code 3). Every message is one line and names the file.

Torch is not imported here: loading a workload imports whatever the user's file imports.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuadvisor.errors import BadInputError, UserCodeError

BUILD_NAME = "build"
STEP_NAME = "step"
TOKENS_NAME = "TOKENS_PER_STEP"
KIND_NAME = "KIND"  # optional: what the step is ("decode" turns on the KV-cache capacity figures)
# The longest exception text quoted in a one-line error; the rest is cut with an ellipsis.
_MAX_ERROR_CHARS = 300


def default_step(model: Any, inputs: tuple) -> Any:
    """The step used when the file defines none: one call of the model on the example inputs."""
    return model(*inputs)


def default_batch_step(model: Any, inputs: tuple) -> Any:
    """The step used when the example inputs are a dict of keyword inputs and the file defines none:
    ``model(**batch)``, the batch being the 1-tuple's only item."""
    (batch,) = inputs
    return model(**batch)


def batch_step(step: Callable[[Any, Any], Any]) -> Callable[[Any, tuple], Any]:
    """The file's ``step(model, batch)`` for example inputs given as a dict: called with the dict itself, out of
    the 1-tuple ``(batch,)`` that the inputs are inside. ``functools.wraps``, so that what reads the step's
    source or globals (the graphs and optimizer checks) reads the user's."""

    @functools.wraps(step)
    def step_on_batch(model: Any, inputs: tuple) -> Any:
        (batch,) = inputs
        return step(model, batch)

    return step_on_batch


def user_defined_step(step: Callable[[Any, tuple], Any]) -> bool:
    """Whether ``step`` is the file's own (possibly behind :func:`batch_step`), not one of the defaults."""
    return step is not default_step and step is not default_batch_step


def batch_inputs(
    inputs: Any, step: Callable[[Any, Any], Any] | None, label: str
) -> tuple[tuple, Callable[[Any, tuple], Any]] | None:
    """For example inputs given as a dict of keyword inputs: the inputs as the 1-tuple ``(batch,)`` and the step
    that takes the dict out of it (``step`` behind :func:`batch_step`, or ``model(**batch)`` when ``step`` is
    None); None for inputs that are no mapping. A mapping that is not a dict (transformers' BatchEncoding) is
    refused with the fix: the fixes walk dicts, not other mappings, so its tensors would be missed."""
    if isinstance(inputs, dict):
        if not all(isinstance(key, str) for key in inputs):
            raise BadInputError(
                f"{label}: a dict of example inputs needs str keys (keyword names), got {_show(inputs)}"
            )
        return (inputs,), (default_batch_step if step is None else batch_step(step))
    if isinstance(inputs, Mapping):
        raise BadInputError(
            f"{label}: example inputs are a {type(inputs).__name__}; return a tuple, or a plain dict of keyword"
            " inputs (dict(batch))"
        )
    return None


@dataclass
class Workload:
    """A loaded workload: the model, its example inputs and a zero-argument step.

    ``step_fn()`` runs one step (the file's ``step(model, inputs)``, or ``model(*inputs)``) and turns an
    exception from the user's code into :class:`UserCodeError`. ``step`` is the two-argument step
    itself, kept so that a fix can rebuild ``step_fn`` around a patched model (:meth:`with_model`).
    """

    path: str
    model: Any
    inputs: tuple
    step_fn: Callable[[], Any]
    tokens_per_step: int | None
    name: str
    step: Callable[[Any, tuple], Any] = dataclasses.field(default=default_step, repr=False)
    kind: str | None = None  # the file's optional KIND constant ("decode", "train", ...), when it is a str

    def with_model(self, model: Any, inputs: tuple | None = None) -> Workload:
        """The same workload around another model (and optionally other inputs), e.g. a patched one."""
        inputs = self.inputs if inputs is None else tuple(inputs)
        step_fn = make_step_fn(self.step, model, inputs, self.path)
        return dataclasses.replace(self, model=model, inputs=inputs, step_fn=step_fn)

    def with_step(self, model: Any, step: Callable[[Any, tuple], Any], inputs: tuple | None = None) -> Workload:
        """The same workload with another two-argument step (and model, and optionally inputs).

        A fix that replaces how a step runs (a CUDA graph replays a captured step) uses this; the new step
        is called as ``step(model, inputs)`` like the user's, and its exceptions become UserCodeError.
        """
        inputs = self.inputs if inputs is None else tuple(inputs)
        step_fn = make_step_fn(step, model, inputs, self.path)
        return dataclasses.replace(self, model=model, inputs=inputs, step_fn=step_fn, step=step)


def load_workload(path: str, entry: str | None = None) -> Workload:
    """Load the workload file at ``path`` (or the build function named by ``entry``) and call its build.

    Raises :class:`BadInputError` for a missing or malformed file and :class:`UserCodeError` when the
    user's code raises while importing or building.
    """
    module_name, function_name = _parse_entry(entry)
    file_path = Path(path)
    if module_name is None:
        label = str(path)
        module = _import_file(file_path, label)
        name = file_path.stem
        folder = file_path.parent
    else:
        if not file_path.exists():
            raise BadInputError(f"{path}: no such file or folder (it names where {module_name} is imported from)")
        folder = file_path if file_path.is_dir() else file_path.parent
        label = module_name
        module = _import_module(module_name, folder)
        name = module_name.rsplit(".", 1)[-1]

    build = getattr(module, function_name, None)
    if build is None:
        hint = " (def build(): return model, example_inputs)" if function_name == BUILD_NAME else ""
        raise BadInputError(f"{label}: no function {function_name}(){hint}")
    if not callable(build):
        raise BadInputError(f"{label}: {function_name} is a {type(build).__name__}, expected a function")

    step = getattr(module, STEP_NAME, None)
    if step is not None and not callable(step):
        raise BadInputError(f"{label}: {STEP_NAME} is a {type(step).__name__}, expected a function step(model, inputs)")
    tokens_per_step = _tokens_per_step(module, label)

    with _on_sys_path(folder):
        try:
            built = build()
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # a build() that calls sys.exit() failed too
            raise UserCodeError(f"{label}: {function_name}() raised {describe_error(error)}") from error
    model, inputs = _check_built(built, label, function_name, needs_callable_model=step is None)
    batch = batch_inputs(inputs, step, label)
    if batch is not None:  # a batch of keyword inputs: (batch,) inside, the dict in the step
        inputs, step = batch
    if step is None:
        step = default_step
    return Workload(
        path=str(path),
        model=model,
        inputs=inputs,
        step_fn=make_step_fn(step, model, inputs, label),
        tokens_per_step=tokens_per_step,
        name=name,
        step=step,
        kind=kind if isinstance(kind := getattr(module, KIND_NAME, None), str) else None,
    )


def _parse_entry(entry: str | None) -> tuple[str | None, str]:
    """``None`` -> (None, "build"); ``"fn"`` or ``":fn"`` -> (None, "fn"); ``"pkg.mod:fn"`` -> ("pkg.mod", "fn")."""
    if entry is None:
        return None, BUILD_NAME
    module_name, _, function_name = entry.rpartition(":")
    identifier = r"[A-Za-z_]\w*"
    if not re.fullmatch(identifier, function_name) or (
        module_name and not re.fullmatch(rf"{identifier}(\.{identifier})*", module_name)
    ):
        raise BadInputError(f"--entry {entry!r}: expected FUNCTION or package.module:FUNCTION")
    return module_name or None, function_name


def _import_file(file_path: Path, label: str) -> ModuleType:
    if not file_path.exists():
        raise BadInputError(f"{label}: no such file")
    if file_path.is_dir():
        raise BadInputError(f"{label}: is a folder, expected a Python file (model.py)")
    if file_path.suffix != ".py":
        raise BadInputError(f"{label}: not a Python file (expected a .py file such as model.py)")
    try:
        source = file_path.read_bytes()
    except OSError as error:
        raise BadInputError(f"{label}: cannot read: {error.strerror or error}") from error
    try:
        code = compile(source, str(file_path), "exec")
    except SyntaxError as error:
        raise BadInputError(f"{label}:{error.lineno}: syntax error: {error.msg}") from error
    except ValueError as error:  # e.g. null bytes in the source
        raise BadInputError(f"{label}: not a Python source file: {error}") from error

    # A private name, so that a file called profile.py or test.py never shadows a real module.
    module_name = "_gpuadvisor_workload_" + re.sub(r"\W", "_", file_path.stem)
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    if spec is None:
        raise BadInputError(f"{label}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: dataclasses and pickling look the module up by name.
    sys.modules[module_name] = module
    try:
        with _on_sys_path(file_path.parent):
            exec(code, module.__dict__)
    except KeyboardInterrupt:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as error:  # sys.exit() on import fails too
        sys.modules.pop(module_name, None)
        raise UserCodeError(f"{label}: importing it raised {describe_error(error)}") from error
    return module


def _import_module(module_name: str, folder: Path) -> ModuleType:
    with _on_sys_path(folder):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # The named module itself (or its package) is missing: bad input. A module it imports is
            # missing: the user's code failed.
            if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
                raise BadInputError(f"{module_name}: no such module (looked in {folder} and sys.path)") from error
            raise UserCodeError(f"{module_name}: importing it raised {describe_error(error)}") from error
        except SyntaxError as error:
            where = f"{error.filename}:{error.lineno}" if error.filename else module_name
            raise BadInputError(f"{where}: syntax error: {error.msg}") from error
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            raise UserCodeError(f"{module_name}: importing it raised {describe_error(error)}") from error


def _tokens_per_step(module: ModuleType, label: str) -> int | None:
    if not hasattr(module, TOKENS_NAME):
        return None
    value = getattr(module, TOKENS_NAME)
    # 10**400 overflows the float of tokens/s (and repr() fails past 4,300 digits): at most 2**53, exact as a float.
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        from gpuadvisor.inputs import integer_digits

        digits = integer_digits(value)
        raise BadInputError(f"{label}: {TOKENS_NAME} must be a positive int up to 2**53, got one of {digits} digits")
    # bool is an int subclass; TOKENS_PER_STEP = True is a mistake, not 1 token.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadInputError(f"{label}: {TOKENS_NAME} must be a positive int, got {_show(value)}")
    return value


def _check_built(built: Any, label: str, function_name: str, *, needs_callable_model: bool) -> tuple[Any, Any]:
    expected = f"expected {function_name}() to return (model_or_callable, example_inputs_tuple)"
    if not isinstance(built, (tuple, list)) or len(built) != 2:
        got = f"a {type(built).__name__} of length {len(built)}" if isinstance(built, (tuple, list)) else _show(built)
        raise BadInputError(f"{label}: {expected}, got {got}")
    model, inputs = built
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(inputs, (tuple, Mapping)):  # a Mapping: batch_inputs() takes it or says why not
        hint = " (write (x,) for a single input)" if type(inputs).__name__ in ("Tensor", "Parameter") else ""
        raise BadInputError(f"{label}: {expected}, got ({type(model).__name__}, {_show(inputs)}){hint}")
    if model is None:
        raise BadInputError(f"{label}: {expected}, got (None, ...)")
    if needs_callable_model and not callable(model):
        raise BadInputError(
            f"{label}: the model is a {type(model).__name__}, which cannot be called;"
            f" return a module or callable from {function_name}(), or define step(model, inputs)"
        )
    return model, inputs


def make_step_fn(step: Callable[[Any, tuple], Any], model: Any, inputs: tuple, label: str) -> Callable[[], Any]:
    """A zero-argument ``step(model, inputs)`` whose failures are the user's code failing: any exception, and
    ``sys.exit()`` or another BaseException too, becomes :class:`UserCodeError` (exit 3) naming ``label``, the
    step and the source line. Only KeyboardInterrupt (Ctrl-C, SIGTERM) passes through as it is."""
    what = "the model" if step is default_step else f"{getattr(step, '__name__', 'step')}()"

    def step_fn() -> Any:
        try:
            return step(model, inputs)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - sys.exit() in a step is the step failing, not gpuadvisor
            raise UserCodeError(f"{label}: {what} raised {describe_error(error)}") from error

    return step_fn


# Frames in these folders (the standard library, installed packages, gpuadvisor) are not the user's code.
_LIBRARY_FOLDERS = tuple(
    {
        os.path.join(os.path.abspath(folder), "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (folder := sysconfig.get_paths().get(key))
    }
    | {os.path.join(os.path.dirname(os.path.abspath(__file__)), "")}
)


def safe_text(error: BaseException) -> str:
    """``str(error)``, or a placeholder when the exception's own ``__str__`` raises."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ of the user's exception must not become ours
        return "(its message cannot be printed: its __str__ raised)"


def describe_error(error: BaseException) -> str:
    """``ValueError: message (at model.py:12)``: the exception on one line, with the deepest line of user code."""
    text = " ".join(safe_text(error).split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 1] + "…"
    described = f"{type(error).__name__}: {text}" if text else type(error).__name__
    user_frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<") and not os.path.abspath(frame.filename).startswith(_LIBRARY_FOLDERS)
    ]
    if user_frames:
        described += f" (at {Path(user_frames[-1].filename).name}:{user_frames[-1].lineno})"
    return described


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}" if not isinstance(value, (type(None), bool)) else text


@contextmanager
def _on_sys_path(folder: Path) -> Iterator[None]:
    """Put ``folder`` first on sys.path for the duration, and take it off again if it was not there."""
    entry = str(folder.resolve())
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)
