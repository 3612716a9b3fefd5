"""The front proxy before kas' agent listener: HAProxy from Debian, with the shipped template (issue 27 item 8).

grpcio keeps memory for an HTTP/2 header block that never ends (a CONTINUATION flood: about 93 MiB per
unauthenticated connection on kas' agent listener) and no grpcio setting bounds it. HAProxy terminates HTTP/2,
refuses a header block larger than its buffer and relays gRPC unchanged, so the deployment puts it in front of
the agent listener. The configuration is the template ``deploy/front-proxy/haproxy.cfg.template`` (its
parameters are documented there and in docs/configuration.md "Front proxy"); this module renders it and runs
HAProxy for ``tether up --front-proxy`` and the tests.

Why HAProxy rather than nginx (both in Debian 12, both bound header blocks): nginx's ``grpc_pass`` opens one
upstream connection per gRPC call (it does not multiplex streams towards the upstream), so every agentk
tunnel and configuration stream would become its own connection to kas, each with grpcio's per-connection
memory; HAProxy keeps one kas connection per agentk connection (``http-reuse never``), as agentk connects
directly.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil
import string
from dataclasses import asdict, dataclass
from pathlib import Path

from tether_devenv.process import EnvironmentProblem, ManagedProcess, tcp_open

__all__ = ["TEMPLATE", "FrontProxyParameters", "haproxy_binary", "render_config", "start_front_proxy"]

#: The shipped template (a deployment artefact, found in the source tree: ``tether up`` runs from a checkout).
TEMPLATE = Path(__file__).resolve().parents[3] / "deploy" / "front-proxy" / "haproxy.cfg.template"


@dataclass(frozen=True)
class FrontProxyParameters:
    """The template's parameters (names in upper case in the template); see the template for each one.

    Attributes:
        listen_address: where agentk connects, ``host:port``.
        kas_agent_address: kas' agent listener, ``host:port``.
        bind_options: HAProxy ``bind`` options: ``proto h2`` (plaintext) or ``ssl crt <pem> alpn h2``.
        server_options: HAProxy ``server`` options towards kas: ``proto h2`` or ``ssl alpn h2 verify ...``.
        max_connections: connections accepted in all.
        connections_per_source: concurrent connections from one source address.
        header_block_bytes: the largest header block of one request (HAProxy's ``tune.bufsize``), bytes.
        header_timeout: time to send a whole header block (HAProxy duration, e.g. ``10s``).
        stream_idle_timeout: how long a stream may stay silent (above kas' ``max_connection_age`` + grace).
    """

    listen_address: str
    kas_agent_address: str
    bind_options: str = "proto h2"
    server_options: str = "proto h2"
    max_connections: int = 20000
    connections_per_source: int = 1000
    header_block_bytes: int = 16384
    header_timeout: str = "10s"
    stream_idle_timeout: str = "3h"


def render_config(parameters: FrontProxyParameters, template: Path = TEMPLATE) -> str:
    """The HAProxy configuration: ``template`` with every ``${NAME}`` replaced.

    Raises:
        EnvironmentProblem: the template is missing, or names a parameter that has no value.
    """
    try:
        text = template.read_text()
    except OSError as exc:
        raise EnvironmentProblem(f"the front proxy template {template} cannot be read: {exc.strerror}") from exc
    values = {name.upper(): str(value) for name, value in asdict(parameters).items()}
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as exc:
        raise EnvironmentProblem(f"the front proxy template {template} has a parameter without a value: {exc}") from exc


def haproxy_binary() -> str:
    """Path of ``haproxy``. Raises EnvironmentProblem when Debian's package is not installed."""
    found = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None
    )
    if found is None:
        raise EnvironmentProblem("haproxy is not installed: run scripts/bootstrap.sh (apt-get install haproxy)")
    return found


def start_front_proxy(
    parameters: FrontProxyParameters, directory: Path, name: str = "front-proxy", timeout_s: float = 15.0
) -> ManagedProcess:
    """Render the configuration into ``directory``, start HAProxy in the foreground and wait for its port.

    Returns:
        The running process (stop it with ``stop()``); its log is ``directory / f"{name}.log"``.

    Raises:
        EnvironmentProblem: HAProxy is missing, refuses the configuration, or does not listen in time.
    """
    directory.mkdir(parents=True, exist_ok=True)
    # HAProxy needs two descriptors per connection (agentk's and kas') and refuses to start when the process
    # may not open that many: on a development machine, accept what the limit allows.
    _, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard_limit != resource.RLIM_INFINITY:
        allowed = max((hard_limit - 100) // 2, 1)
        parameters = dataclasses.replace(parameters, max_connections=min(parameters.max_connections, allowed))
    config = directory / f"{name}.cfg"
    config.write_text(render_config(parameters))
    # -db: stay in the foreground (no daemon, no master process), so stopping the pid stops the proxy.
    process = ManagedProcess(name, [haproxy_binary(), "-db", "-f", str(config)], directory / f"{name}.log")
    process.start()
    host, _, port = parameters.listen_address.rpartition(":")
    process.wait_ready(lambda: tcp_open(int(port), host or "127.0.0.1"), timeout_s, "listening")
    return process
