"""Kubernetes API proxy usage, under upstream's usage counter names (issue 25 item 4; kas.md §8.5).

Upstream kas counts proxied requests by access type and the distinct users and agents behind them
(``internal/module/kubernetes_api/server/factory.go``) and POSTs them to GitLab every minute. Tether exposes the
same names on ``/metrics``: ``k8s_api_proxy_requests_via_{ci,user,pat}_access`` (requests since kas started;
untyped, because a Prometheus counter must end in ``_total`` and these keep upstream's exact names) and
``k8s_api_proxy_requests_unique_{users,agents}_via_{ci,user,pat}_access`` (gauges: distinct ids seen in the
current and the previous minute, the period of upstream's usage report). Tether has no CI job access to the
proxy yet, so the ``ci_access`` series stay 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, UnknownMetricFamily
from prometheus_client.registry import Collector

from tether.modules.kubernetes_api.server.auth import PAT_ACCESS, SESSION_ACCESS

__all__ = ["ProxyUsage"]

#: Upstream's access kinds: CI job tokens, GitLab user sessions, personal access tokens.
_KINDS = ("ci", "user", "pat")
_KIND_OF = {PAT_ACCESS: "pat", SESSION_ACCESS: "user"}
#: Seconds of one usage window (upstream's ``observability.usage_reporting_period`` default, 1 min).
WINDOW_S = 60.0


class _Unique:
    """Distinct ids of the current and the previous window (bounded by what one minute brings)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._window = int(clock() // WINDOW_S)
        self._current: set[int] = set()
        self._previous: set[int] = set()

    def _rotate(self) -> None:
        window = int(self._clock() // WINDOW_S)
        if window != self._window:
            self._previous = self._current if window == self._window + 1 else set()
            self._current = set()
            self._window = window

    def add(self, value: int) -> None:
        self._rotate()
        self._current.add(value)

    def count(self) -> int:
        self._rotate()
        return len(self._current | self._previous)


class ProxyUsage(Collector):
    """Counts proxied requests; register it in kas' registry.

    Args:
        clock: seconds (``time.monotonic`` by default), for the one-minute windows.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._requests = dict.fromkeys(_KINDS, 0)
        self._users = {kind: _Unique(clock) for kind in _KINDS}
        self._agents = {kind: _Unique(clock) for kind in _KINDS}

    def record(self, access_type: str, user_id: int, agent_id: int) -> None:
        """One request relayed (or answered by kas) for ``user_id`` to ``agent_id`` with ``access_type``."""
        kind = _KIND_OF.get(access_type)
        if kind is None:
            return
        self._requests[kind] += 1
        self._users[kind].add(user_id)
        self._agents[kind].add(agent_id)

    def collect(self) -> Iterator[GaugeMetricFamily | UnknownMetricFamily]:
        """The nine series, under upstream's names."""
        for kind in _KINDS:
            yield UnknownMetricFamily(
                f"k8s_api_proxy_requests_via_{kind}_access",
                f"Kubernetes API proxy requests via {kind} access since kas started",
                value=self._requests[kind],
            )
            yield GaugeMetricFamily(
                f"k8s_api_proxy_requests_unique_users_via_{kind}_access",
                f"Distinct users of the Kubernetes API proxy via {kind} access in the current and previous minute",
                value=self._users[kind].count(),
            )
            yield GaugeMetricFamily(
                f"k8s_api_proxy_requests_unique_agents_via_{kind}_access",
                f"Distinct agents reached through the Kubernetes API proxy via {kind} access in the current and "
                "previous minute",
                value=self._agents[kind].count(),
            )
