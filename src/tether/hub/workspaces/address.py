"""Where a user opens a workspace: its address through kas (issue 13; reference §6.2 ``url``).

Two forms: the host form ``https://<port>-<name>.<dns_zone>/`` (GitLab's, wildcard DNS) and the path form
``<kas workspaces URL>-/workspaces/<name>/<port>/`` on kas' workspace listener, for set-ups without wildcard
DNS. Both carry GitLab's ``?folder=/projects/<project path>`` for the editor.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit


def address(url_prefix: str, name: str, dns_zone: str, project_path: str, workspaces_url: str | None = None) -> str:
    """The workspace's address.

    Args:
        url_prefix: the workspace's ``<port>-<name>`` (``60001-ws1``: the editor's port).
        name: the workspace name (a DNS label).
        dns_zone: the agent's ``remote_development.dns_zone`` the workspace was created with.
        project_path: the project's full path.
        workspaces_url: kas' workspace listener as users reach it, ending with ``/`` (hub ``kas.workspaces_url``);
            None gives the host form.
    """
    folder = "?folder=" + quote("/projects/" + project_path, safe="")
    if workspaces_url is None:
        return f"https://{url_prefix}.{dns_zone}/{folder}"
    port = url_prefix.split("-", 1)[0]
    return f"{workspaces_url}-/workspaces/{quote(name, safe='')}/{port}/{folder}"


def editor_base_path(name: str, port: int, workspaces_url: str | None) -> str:
    """The path at which browsers reach the workspace's port ``port``: what the editor serves its pages under.

    ``/`` in the host form; in the path form the path of :func:`address` without its query
    (``/-/workspaces/<name>/<port>/`` under ``workspaces_url``'s own path).
    """
    if workspaces_url is None:
        return "/"
    return f"{urlsplit(workspaces_url).path or '/'}-/workspaces/{quote(name, safe='')}/{port}/"
