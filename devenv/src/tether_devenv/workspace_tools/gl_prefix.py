"""Jupyter server extension: serve the editor at its base path also when kas strips that path.

In kas' path form a browser asks for ``/-/workspaces/<name>/60001/lab``; kas forwards ``/lab`` (with
``X-Forwarded-Prefix``). The editor's pages must name the full path, so its ``base_url`` is that path, and
requests arriving without it get it back before routing.
"""

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gl_prefix"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.base_url
    if base == "/":
        return
    app = serverapp.web_app
    find = app.find_handler
    root = base.rstrip("/")

    def find_handler(request: Any, **kwargs: Any) -> Any:
        if not (request.path + "/").startswith(base):
            request.path = root + request.path
            request.uri = root + request.uri
        return find(request, **kwargs)

    app.find_handler = find_handler
