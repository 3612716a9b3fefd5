"""``tether graph``: watch the live graph of an agent's cluster through kas (issue 6 item 9)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from aiohttp import web
from rich.console import Console
from rich.live import Live
from rich.table import Table

from tether.modules.graph.client.client import Endpoint, GraphClientError, GraphView, build_request, watch_graph
from tether.tool.http_server import SafeAppRunner

_PAGE = Path(__file__).with_name("page.html")


def _table(view: GraphView) -> Table:
    table = Table(title=f"{len(view.vertices)} vertices, {len(view.arcs)} arcs", title_justify="left")
    for column in ("resource", "namespace", "name", "arcs out"):
        table.add_column(column)
    out: dict[Any, list[str]] = {}
    for (source, destination, kind), attrs in view.arcs.items():
        flags = "".join(sorted(attrs))
        out.setdefault(source, []).append(
            f"{kind}{'[' + flags + ']' if flags else ''}→{destination[2]}/{destination[4]}"
        )
    for key in sorted(view.vertices):
        table.add_row(key[2], key[3], key[4], ", ".join(sorted(out.get(key, []))))
    return table


async def _serve_page(view: GraphView, changed: asyncio.Condition, address: str) -> web.AppRunner:
    async def index(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(_PAGE)

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        while True:
            await response.write(f"data: {json.dumps(view.snapshot())}\n\n".encode())
            async with changed:
                await changed.wait()

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/events", events)
    runner = SafeAppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()
    return runner


async def _run(endpoint: Endpoint, request: dict[str, Any], output: str, serve: str | None) -> None:
    view, changed = GraphView(), asyncio.Condition()
    runner = await _serve_page(view, changed, serve) if serve else None
    if runner is not None:
        Console(stderr=True).print(f"live page: http://{serve}/")
    try:
        if output == "json":
            async for message in watch_graph(endpoint, request):
                view.apply(message)
                sys.stdout.write(json.dumps(message) + "\n")
                sys.stdout.flush()
                async with changed:
                    changed.notify_all()
            return
        with Live(_table(view), refresh_per_second=4, console=Console()) as live:
            async for message in watch_graph(endpoint, request):
                view.apply(message)
                live.update(_table(view))
                async with changed:
                    changed.notify_all()
    finally:
        if runner is not None:
            await runner.cleanup()


@click.command("graph")
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A kubeconfig whose server is kas' Kubernetes API proxy (e.g. the one `tether up` prints).",
)
@click.option("--server", default=None, help="kas' Kubernetes API proxy URL, e.g. https://kas:8154/k8s-proxy/.")
@click.option("--agent", "agent_id", type=int, default=None, help="Agent id (with --token).")
@click.option("--token", default=None, envvar="TETHER_PAT", help="Personal access token with k8s_proxy scope.")
@click.option("--ca-file", type=click.Path(exists=True, path_type=Path), default=None, help="CA of the proxy.")
@click.option("--query", "query_file", type=click.File(), default=None, help="Watch request JSON (seed 002).")
@click.option("--resource", "resources", multiple=True, help="CEL resource selector, e.g. \"resource == 'pods'\".")
@click.option("--namespace", "namespaces", multiple=True, help="Namespace to watch (repeatable).")
@click.option("--root", "roots", multiple=True, help="CEL root object selector (repeatable).")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--serve", default=None, metavar="HOST:PORT", help="Also serve a live page in the browser.")
def graph_command(
    kubeconfig: Path | None,
    server: str | None,
    agent_id: int | None,
    token: str | None,
    ca_file: Path | None,
    query_file: Any,
    resources: tuple[str, ...],
    namespaces: tuple[str, ...],
    roots: tuple[str, ...],
    output: str,
    serve: str | None,
) -> None:
    """Watch the live graph of Kubernetes objects of an agent's cluster through kas (Graph API).

    Either --kubeconfig (server and pat:<agent id>:<token> taken from it) or --server, --agent and --token.
    Without --query, --resource/--namespace/--root build the request; with neither, everything is watched.
    Ctrl-C stops.
    """
    if kubeconfig is not None:
        endpoint = Endpoint.from_kubeconfig(kubeconfig)
    elif server and agent_id and token:
        endpoint = Endpoint(server.rstrip("/") + "/", f"pat:{agent_id}:{token}", ca_file)
    else:
        raise click.UsageError("give --kubeconfig, or --server with --agent and --token")
    if ca_file is not None:
        endpoint = Endpoint(endpoint.url, endpoint.token, ca_file)
    request = json.load(query_file) if query_file else build_request(list(resources), list(namespaces), list(roots))
    try:
        asyncio.run(_run(endpoint, request, output, serve))
    except GraphClientError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass
