"""gpuadvisor's own heavy dependencies, imported when a command needs them (DESIGN.md: imports stay lazy).

A missing one is bad input for that command (exit 2, with the line that installs it), never "your code
failed" (exit 3): that is kept for the user's model raising, including a ModuleNotFoundError of its own imports.
"""

from __future__ import annotations

from typing import Any

from gpuadvisor.errors import BadInputError


def require_torch(command: str) -> Any:
    """Import and return torch for ``command`` (``"profile"``, ``"apply"``); BadInputError when it cannot be
    imported: ``profile needs torch: pip install torch``, or why an installed torch does not import."""
    try:
        import torch
    except ModuleNotFoundError as error:
        if error.name is None or error.name == "torch" or error.name.startswith("torch."):
            raise BadInputError(f"{command} needs torch: pip install torch") from error
        raise BadInputError(
            f"{command} needs torch, which does not import here: it needs the module {error.name!r} ({error})"
        ) from error
    except Exception as error:  # noqa: BLE001 - a broken install: an OSError loading its libraries, ...
        text = " ".join(str(error).split())[:300]
        raise BadInputError(
            f"{command} needs torch, which does not import here ({type(error).__name__}: {text}); "
            "reinstall it: pip install --force-reinstall torch"
        ) from error
    return torch
