"""Upstream's proxy usage series (issue 25 item 4): counts by access type, distinct ids over two one-minute windows."""

from __future__ import annotations

from tether.modules.kubernetes_api.server.auth import PAT_ACCESS, SESSION_ACCESS
from tether.modules.kubernetes_api.server.usage import ProxyUsage


def _values(usage: ProxyUsage) -> dict[str, float]:
    return {family.name: family.samples[0].value for family in usage.collect()}


def test_requests_and_distinct_users_and_agents_by_access_type() -> None:
    now = [1000.0]
    usage = ProxyUsage(clock=lambda: now[0])
    usage.record(PAT_ACCESS, 7, 1)
    usage.record(PAT_ACCESS, 7, 2)
    usage.record(SESSION_ACCESS, 8, 1)
    usage.record("workspace_session", 9, 1)  # not an upstream kind: not counted
    values = _values(usage)
    assert values["k8s_api_proxy_requests_via_pat_access"] == 2
    assert values["k8s_api_proxy_requests_via_user_access"] == 1
    assert values["k8s_api_proxy_requests_via_ci_access"] == 0
    assert values["k8s_api_proxy_requests_unique_users_via_pat_access"] == 1
    assert values["k8s_api_proxy_requests_unique_agents_via_pat_access"] == 2
    assert values["k8s_api_proxy_requests_unique_users_via_user_access"] == 1

    now[0] += 60  # the next minute still shows the previous one
    usage.record(PAT_ACCESS, 10, 1)
    assert _values(usage)["k8s_api_proxy_requests_unique_users_via_pat_access"] == 2
    now[0] += 60  # two minutes on: only this minute's user
    usage.record(PAT_ACCESS, 11, 1)
    assert _values(usage)["k8s_api_proxy_requests_unique_users_via_pat_access"] == 2
    now[0] += 300  # long idle: nothing distinct left, the request count stays
    values = _values(usage)
    assert values["k8s_api_proxy_requests_unique_users_via_pat_access"] == 0
    assert values["k8s_api_proxy_requests_via_pat_access"] == 4
