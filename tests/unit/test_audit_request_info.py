# ruff: noqa: E501  (one case a line reads best as a table)
"""The Kubernetes RequestInfo rules kas applies to audited requests (apiserver ``RequestInfoFactory``)."""

from __future__ import annotations

import pytest

from tether.modules.kubernetes_api.server.request_info import RequestInfo, request_info


def res(verb: str, group: str, version: str, ns: str, resource: str, sub: str = "", name: str = "") -> RequestInfo:
    return RequestInfo(verb, True, group, version, ns, resource, sub, name)


CASES = [
    ("GET", "/api/v1/namespaces/ns/pods", {}, res("list", "", "v1", "ns", "pods")),
    ("GET", "/api/v1/pods", {"watch": "true"}, res("watch", "", "v1", "", "pods")),
    ("GET", "/api/v1/watch/namespaces/ns/pods/p", {}, res("watch", "", "v1", "ns", "pods", "", "p")),
    ("GET", "/apis/apps/v1/namespaces/ns/deployments/d", {}, res("get", "apps", "v1", "ns", "deployments", "", "d")),
    ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", {}, res("patch", "apps", "v1", "ns", "deployments", "scale", "d")),
    ("POST", "/api/v1/namespaces/ns/pods/p/exec", {}, res("exec", "", "v1", "ns", "pods", "exec", "p")),
    ("GET", "/api/v1/namespaces/ns/pods/p/attach", {}, res("attach", "", "v1", "ns", "pods", "attach", "p")),
    ("POST", "/api/v1/namespaces/ns/pods/p/portforward", {}, res("portforward", "", "v1", "ns", "pods", "portforward", "p")),
    ("DELETE", "/api/v1/namespaces/ns/configmaps", {}, res("deletecollection", "", "v1", "ns", "configmaps")),
    ("DELETE", "/api/v1/namespaces/ns", {}, res("delete", "", "v1", "ns", "namespaces", "", "ns")),
    ("PUT", "/api/v1/namespaces/ns/finalize", {}, res("update", "", "v1", "ns", "namespaces", "finalize", "ns")),
    ("GET", "/api/v1/namespaces/ns/pods", {"fieldSelector": "metadata.name=p"}, res("list", "", "v1", "ns", "pods", "", "p")),
    ("GET", "/api/v1/proxy/namespaces/ns/services/s/x", {}, res("proxy", "", "v1", "ns", "services", "", "s")),
    ("GET", "/version", {}, RequestInfo("get")),
    ("GET", "/apis/apps/v1", {}, RequestInfo("get")),
    ("POST", "/apis", {}, RequestInfo("post")),
    ("GET", "/api/v1/watch", {}, RequestInfo("get")),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "query", "expected"), CASES)
def test_request_info(method: str, path: str, query: dict[str, str], expected: RequestInfo) -> None:
    assert request_info(method, path, query) == expected
