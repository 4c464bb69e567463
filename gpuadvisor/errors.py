"""Errors that map to the documented exit codes (DESIGN.md, "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1  # gate regression, or --fail-on matched
EXIT_BAD_INPUT = 2
EXIT_USER_CODE = 3


class GpuAdvisorError(Exception):
    """An error with a one-line message for the user and an exit code."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str):
        # The CLI prints exactly one line: fold any newline a caller or library put in the text. A message quotes
        # input (a path, a rule's id, a kernel name): its control characters are escaped (gpuadvisor.textsafe), so
        # an error line cannot carry ESC or BEL to the terminal.
        from gpuadvisor.textsafe import escape_control

        super().__init__(escape_control(" ".join(str(message).split())))


class BadInputError(GpuAdvisorError):
    """The input (a trace, a report, a rules folder, a flag) cannot be used. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class UserCodeError(GpuAdvisorError):
    """The user's own model code raised. Exit code 3."""

    exit_code = EXIT_USER_CODE
