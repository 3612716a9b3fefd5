"""A process' peak resident set size over an interval, without sampling (Linux ``/proc``).

Writing ``5`` to ``/proc/<pid>/clear_refs`` resets the peak (``VmHWM``) to the current RSS (proc(5), Linux 4.0);
the peak read afterwards is the true maximum of the interval, however short the burst, so a test needs no
polling loop that could miss it.
"""

from __future__ import annotations

from pathlib import Path


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def reset_peak_rss(pid: int) -> float:
    """Start an interval: reset process ``pid``'s peak RSS and return its current RSS in MiB.

    Raises:
        PermissionError: ``pid`` belongs to another user.
    """
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_mib(pid, "VmRSS")


def peak_rss_mib(pid: int) -> float:
    """The largest RSS of process ``pid`` in MiB since the last :func:`reset_peak_rss` (``VmHWM``)."""
    return _status_mib(pid, "VmHWM")


def rss_mib(pid: int) -> float:
    """The current RSS of process ``pid`` in MiB (``VmRSS``)."""
    return _status_mib(pid, "VmRSS")
