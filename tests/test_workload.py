"""The model.py contract: bad files give one-line errors with the documented exit codes."""

from __future__ import annotations

import sys
import textwrap

import pytest

from gpuadvisor.errors import EXIT_BAD_INPUT, EXIT_USER_CODE, BadInputError, UserCodeError
from gpuadvisor.workload import Workload, load_workload


def write(tmp_path, source: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def load_error(path: str, error_type: type, entry: str | None = None) -> str:
    with pytest.raises(error_type) as caught:
        load_workload(path, entry)
    message = str(caught.value)
    assert "\n" not in message
    return message


GOOD = """
    TOKENS_PER_STEP = 4

    class Doubler:
        def __call__(self, x):
            return 2 * x

    def build():
        return Doubler(), (21,)
"""


def test_good_file_default_step(tmp_path):
    workload = load_workload(write(tmp_path, GOOD))
    assert isinstance(workload, Workload)
    assert workload.name == "model"
    assert workload.tokens_per_step == 4
    assert workload.inputs == (21,)
    assert workload.step_fn() == 42


def test_custom_step_and_list_inputs(tmp_path):
    path = write(
        tmp_path,
        """
        def build():
            return {"scale": 3}, [1, 2]

        def step(model, inputs):
            return model["scale"] * sum(inputs)
        """,
    )
    workload = load_workload(path)
    assert workload.inputs == (1, 2)
    assert workload.tokens_per_step is None
    assert workload.step_fn() == 9
    assert workload.with_model({"scale": 10}).step_fn() == 30


def test_file_can_import_its_neighbours(tmp_path):
    write(tmp_path, "FACTOR = 5\n", name="helpers_for_model.py")
    path = write(tmp_path, "from helpers_for_model import FACTOR\n\ndef build():\n    return abs, (-FACTOR,)\n")
    assert load_workload(path).step_fn() == 5
    assert str(tmp_path) not in sys.path


def test_dataclass_in_user_file(tmp_path):
    # dataclasses look the defining module up in sys.modules while the file runs.
    path = write(
        tmp_path,
        """
        from dataclasses import dataclass

        @dataclass
        class Config:
            n: int = 2

        def build():
            return (lambda c: c.n), (Config(),)
        """,
    )
    assert load_workload(path).step_fn() == 2


def test_entry_names_another_build_function(tmp_path):
    path = write(tmp_path, "def build():\n    return abs, (-1,)\n\ndef build_big():\n    return abs, (-100,)\n")
    assert load_workload(path, "build_big").step_fn() == 100
    assert load_workload(path, ":build_big").step_fn() == 100


def test_entry_module_function(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "workloads.py").write_text("TOKENS_PER_STEP = 2\n\ndef make():\n    return abs, (-7,)\n")
    workload = load_workload(str(tmp_path), "mypkg.workloads:make")
    assert (workload.step_fn(), workload.tokens_per_step, workload.name) == (7, 2, "workloads")
    message = load_error(str(tmp_path), BadInputError, "mypkg.nothere:make")
    assert "mypkg.nothere" in message and "no such module" in message


def test_missing_file(tmp_path):
    message = load_error(str(tmp_path / "nope.py"), BadInputError)
    assert "nope.py" in message and "no such file" in message


def test_not_a_python_file(tmp_path):
    path = tmp_path / "model.txt"
    path.write_text("def build(): pass\n")
    assert "not a Python file" in load_error(str(path), BadInputError)
    assert "folder" in load_error(str(tmp_path), BadInputError)


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "def build():\n    return 1,\n\ndef broken(:\n    pass\n")
    message = load_error(path, BadInputError)
    assert message.startswith(f"{path}:4: syntax error")


def test_no_build(tmp_path):
    message = load_error(write(tmp_path, "def step(model, inputs):\n    pass\n"), BadInputError)
    assert "no function build()" in message


def test_build_not_callable(tmp_path):
    message = load_error(write(tmp_path, "build = 3\n"), BadInputError)
    assert "build is a int, expected a function" in message


def test_step_not_callable(tmp_path):
    message = load_error(write(tmp_path, "step = 'x'\n\ndef build():\n    return abs, (1,)\n"), BadInputError)
    assert "step is a str" in message


@pytest.mark.parametrize(
    ("returned", "expected_fragment"),
    [
        ("None", "got None"),
        ("abs", "got builtin_function_or_method"),
        ("(abs, (1,), 3)", "a tuple of length 3"),
        ("(abs, 5)", "got (builtin_function_or_method, int 5)"),
        ("(None, (1,))", "got (None, ...)"),
    ],
)
def test_build_returns_wrong_types(tmp_path, returned, expected_fragment):
    message = load_error(write(tmp_path, f"def build():\n    return {returned}\n"), BadInputError)
    assert "expected build() to return (model_or_callable, example_inputs_tuple)" in message
    assert expected_fragment in message


def test_model_must_be_callable_without_a_step(tmp_path):
    message = load_error(write(tmp_path, "def build():\n    return 42, (1,)\n"), BadInputError)
    assert "the model is a int, which cannot be called" in message and "define step(model, inputs)" in message


def test_uncallable_model_is_fine_with_a_step(tmp_path):
    path = write(tmp_path, "def build():\n    return 42, (1,)\n\ndef step(model, inputs):\n    return model + 1\n")
    assert load_workload(path).step_fn() == 43


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "'8'", "True", "None"])
def test_tokens_per_step_must_be_positive_int(tmp_path, value):
    path = write(tmp_path, f"TOKENS_PER_STEP = {value}\n\ndef build():\n    return abs, (1,)\n")
    message = load_error(path, BadInputError)
    assert "TOKENS_PER_STEP must be a positive int" in message


def test_build_raising_is_user_code_error(tmp_path):
    path = write(tmp_path, "def build():\n    raise ValueError('no weights\\nfound')\n")
    with pytest.raises(UserCodeError) as caught:
        load_workload(path)
    assert caught.value.exit_code == EXIT_USER_CODE
    assert str(caught.value) == f"{path}: build() raised ValueError: no weights found (at model.py:2)"


def test_import_raising_is_user_code_error(tmp_path):
    path = write(tmp_path, "import no_such_module_for_gpuadvisor_tests\n\ndef build():\n    return abs, (1,)\n")
    message = load_error(path, UserCodeError)
    assert "importing it raised ModuleNotFoundError" in message and "no_such_module_for_gpuadvisor_tests" in message
    assert "_gpuadvisor_workload_model" not in sys.modules


def test_step_raising_is_user_code_error(tmp_path):
    path = write(tmp_path, "def build():\n    return abs, ('text',)\n")
    workload = load_workload(path)
    with pytest.raises(UserCodeError, match=r"the model raised TypeError"):
        workload.step_fn()


def test_exit_codes():
    assert BadInputError("x").exit_code == EXIT_BAD_INPUT
    assert UserCodeError("x").exit_code == EXIT_USER_CODE


def test_bad_entry(tmp_path):
    path = write(tmp_path, GOOD)
    assert "expected FUNCTION or package.module:FUNCTION" in load_error(path, BadInputError, "not valid!")
    assert "no function build_other()" in load_error(path, BadInputError, "build_other")


BATCH = """
    class Net:
        def __call__(self, input_ids, labels=None):
            return sum(input_ids) * (labels or 1)

    def build():
        return Net(), {"input_ids": [1, 2, 3], "labels": 2}
"""


def test_a_batch_dict_without_a_step_is_called_as_keywords(tmp_path):
    from gpuadvisor.workload import user_defined_step

    workload = load_workload(write(tmp_path, BATCH))
    assert workload.inputs == ({"input_ids": [1, 2, 3], "labels": 2},)  # one nested input, for every fix
    assert workload.step_fn() == 12
    assert not user_defined_step(workload.step)  # the keep line then passes no step=step


def test_a_batch_dict_reaches_the_files_own_step_as_the_dict(tmp_path):
    from gpuadvisor.fixes.copying import step_source
    from gpuadvisor.workload import user_defined_step

    path = write(
        tmp_path, textwrap.dedent(BATCH) + "\ndef step(model, batch):\n    return model(**batch) + len(batch)\n"
    )
    workload = load_workload(path)
    assert workload.step_fn() == 14
    assert user_defined_step(workload.step)
    # what reads the step's source (the graphs and autocast checks) reads the file's step, not the wrapper
    assert "len(batch)" in step_source(workload.step)[0]
    # a fix that swaps the inputs passes a new 1-tuple; the step gets its dict
    assert workload.with_model(workload.model, ({"input_ids": [5], "labels": None},)).step_fn() == 7


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        ("{1: 2}", "needs str keys (keyword names), got dict {1: 2}"),
        ('types.MappingProxyType({"x": 1})', "example inputs are a mappingproxy; return a tuple, or a plain dict"),
    ],
)
def test_a_batch_that_is_not_a_plain_dict_of_keywords_is_a_one_line_error(tmp_path, returned, fragment):
    path = write(tmp_path, f"import types\n\ndef build():\n    return abs, {returned}\n")
    assert fragment in load_error(path, BadInputError)
