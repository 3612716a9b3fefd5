"""Probe: lets a test or benchmark read which modules a running kas or agentk has loaded (issue 28 item 4).

Loaded by ``site`` at interpreter start when this directory is on ``PYTHONPATH`` and ``TETHER_MODULE_PROBE``
names a directory. A daemon thread waits for ``<dir>/<pid>.request`` (written by the caller, the benchmark after it
read the RSS) and answers with ``<dir>/<pid>.modules``: the names in ``sys.modules``, one a line, in load
order (:func:`tests.support.loaded_modules.loaded_modules`). Never part of an image: only tests and
benchmarks put this directory on the path.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path


def _answer(directory: Path) -> None:
    request = directory / f"{os.getpid()}.request"
    while not request.exists():
        time.sleep(0.5)
    answer = directory / f"{os.getpid()}.modules"
    answer.with_suffix(".tmp").write_text("".join(f"{name}\n" for name in list(sys.modules)))
    answer.with_suffix(".tmp").rename(answer)


if os.environ.get("TETHER_MODULE_PROBE"):
    threading.Thread(target=_answer, args=(Path(os.environ["TETHER_MODULE_PROBE"]),), daemon=True).start()
