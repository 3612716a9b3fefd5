"""``tether agentk``: the in-cluster agent's command line, mirroring upstream agentk's flags (kas.md §8.1)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import uvloop

from tether.agentk.app import AgentkApp, configure_logging
from tether.agentk.config import (
    DEFAULT_MAX_MESSAGE_BYTES,
    TOKEN_ENV,
    AgentkConfig,
    AgentkConfigError,
    kas_headers,
    parse_kas_address,
    parse_listen_address,
    read_token,
)
from tether.kube.kubeconfig import KubeConfigError
from tether.tool import tracing

__all__ = ["agentk_command"]


@click.command("agentk")
@click.option(
    "--kas-address",
    required=True,
    help="kas agent listener: grpc://host:port (plaintext) or grpcs://host:port (TLS).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"File with the agent token (trailing newline trimmed). Alternatively set {TOKEN_ENV}.",
)
@click.option(
    "--ca-cert-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="PEM CA certificate(s) to verify kas (grpcs only; default: system roots).",
)
@click.option(
    "--kas-header",
    "kas_header",
    multiple=True,
    metavar='"Key: Value"',
    help="Extra metadata sent on every call to kas; repeatable.",
)
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    help="Kubeconfig path(s), ':'-separated [env KUBECONFIG]; default: the in-cluster service account.",
)
@click.option(
    "--observability-listen-address",
    default="127.0.0.1:8080",
    show_default=True,
    help="host:port for /metrics, /liveness and /readiness (':8080' listens on all interfaces).",
)
@click.option(
    "--max-receive-message-size",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Largest gRPC message accepted, in bytes.",
)
@click.option(
    "--max-send-message-size",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    help="Largest gRPC message sent, in bytes.",
)
@click.option(
    "--tracing-otlp-endpoint",
    default=None,
    help="OTLP/HTTP receiver for trace spans, http(s)://host:port [default: env OTEL_EXPORTER_OTLP_ENDPOINT; "
    "neither: tracing off].",
)
@click.option(
    "--tracing-sampler-ratio",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Share of new traces recorded (a request kas traced is always followed).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Lowest log level written (JSON lines on stderr).",
)
def agentk_command(
    kas_address: str,
    token_file: Path | None,
    ca_cert_file: Path | None,
    kas_header: tuple[str, ...],
    kubeconfig: str | None,
    observability_listen_address: str,
    max_receive_message_size: int,
    max_send_message_size: int,
    tracing_otlp_endpoint: str | None,
    tracing_sampler_ratio: float,
    log_level: str,
) -> None:
    """Run agentk: connect to kas, keep reverse tunnels open and serve the agent APIs.

    Stops cleanly on SIGTERM/SIGINT (in-flight tunnelled calls get 10 s to finish).
    """
    try:
        config = _build_config(
            kas_address,
            token_file,
            ca_cert_file,
            kas_header,
            kubeconfig,
            observability_listen_address,
            max_receive_message_size,
            max_send_message_size,
            log_level,
        )
    except AgentkConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    configure_logging(config.log_level)
    try:
        tracing.setup("tether-agentk", tracing_otlp_endpoint, tracing_sampler_ratio, os.environ.get("POD_NAME"))
    except ValueError as exc:
        raise click.UsageError(f"tracing: {exc}") from exc
    try:
        # uvloop, as kas (agentk ran the default loop): a small proxied request took 2.4 ms less (median of five
        # same-run comparisons under load; issue 28, docs/benchmarks.md "Hot path").
        uvloop.run(AgentkApp(config).run())
    except KubeConfigError as exc:
        raise click.ClickException(f"Kubernetes credentials: {exc}") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot start agentk: {exc}") from exc
    finally:
        tracing.shutdown()


def _build_config(
    kas_address: str,
    token_file: Path | None,
    ca_cert_file: Path | None,
    kas_header: tuple[str, ...],
    kubeconfig: str | None,
    observability_listen_address: str,
    max_receive_message_size: int,
    max_send_message_size: int,
    log_level: str,
) -> AgentkConfig:
    kas = parse_kas_address(kas_address)
    ca_cert = None
    if ca_cert_file is not None:
        if not kas.tls:
            raise AgentkConfigError("--ca-cert-file needs a grpcs:// --kas-address")
        try:
            ca_cert = ca_cert_file.read_bytes()
        except OSError as exc:
            raise AgentkConfigError(f"cannot read --ca-cert-file {ca_cert_file}: {exc.strerror or exc}") from exc
    host, port = parse_listen_address(observability_listen_address)
    return AgentkConfig(
        kas=kas,
        token=read_token(token_file),
        ca_cert=ca_cert,
        kas_headers=kas_headers(kas_header),
        kubeconfig=kubeconfig or None,
        observability_host=host,
        observability_port=port,
        max_receive_message_bytes=max_receive_message_size,
        max_send_message_bytes=max_send_message_size,
        log_level=log_level,
    )
