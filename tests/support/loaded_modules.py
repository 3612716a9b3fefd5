"""Which modules a running kas or agentk has loaded, through the probe in ``tests/support/probe`` (issue 28 item 4)."""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Put on a process' ``PYTHONPATH`` (with ``TETHER_MODULE_PROBE`` set) so that it answers :func:`loaded_modules`.
PROBE_PATH = Path(__file__).parent / "probe"


def probe_environment(directory: Path) -> dict[str, str]:
    """The environment variables that make processes started with them answer :func:`loaded_modules`."""
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROBE_PATH), path])),
        "TETHER_MODULE_PROBE": str(directory),
    }


def loaded_modules(pid: int, directory: Path, limit_s: float = 30.0) -> list[str]:
    """The names in ``sys.modules`` of process ``pid`` (started with :func:`probe_environment`), in load order.

    Raises:
        RuntimeError: no answer within ``limit_s`` (the process was started without the probe).
    """
    (directory / f"{pid}.request").touch()
    answer = directory / f"{pid}.modules"
    deadline = time.monotonic() + limit_s
    while not answer.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not list its modules (started without the probe?)")
        time.sleep(0.2)
    return answer.read_text().split()
