"""kas' gitlab_access module with a real hub: module requests pass through unchanged; bad ones are refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from grpc import aio

from tests.fixtures.hub import HubLauncher, RealHub
from tests.fixtures.system import KasProc, System
from tests.hub.helpers import kas_config, project_with_agent
from tests.hub.workspace_helpers import RD_CONFIG, bulk_create
from tether.hub.server import HubServer
from tether.modagent.gitlab_request import GitlabRequestError, make_gitlab_request
from tether.pb.gitlab.agent.gitlab_access.rpc import rpc_pb2, rpc_pb2_grpc
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether_devenv.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def hub_and_kas(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, private_secret_file: Path
) -> Iterator[tuple[RealHub, KasProc, str]]:
    """One hub and kas for the module (starting them and seeding forty workspaces is most of each test's time):
    the tests only read, and the one stopping the hub starts it again."""
    tmp_path = tmp_path_factory.mktemp("gitlab-access")
    launcher = HubLauncher(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'hub.db'}")
    hub = launcher.prepare()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server)  # type: ignore[arg-type]
    try:
        kas = system.kas()
        launcher.start(hub, {"kas.api_address": kas.api_target})
        setup = project_with_agent(hub, roles=("developer",))
        kas_config(hub, setup, RD_CONFIG)
        token = hub.api().post(
            f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens", json={"name": "a"}
        )
        bulk_create(hub, setup, setup.agent_id, 40, "many")
        yield hub, kas, token.json()["token"]
    finally:
        system.stop_all()
        launcher.stop_all()


def meta(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def raw_call(kas: KasProc, token: str, messages: list[grpctool_pb2.HttpRequest]) -> grpc.StatusCode:
    """kas' status for ``messages``, through grpcio's blocking client in a thread. kas may refuse after the first
    message; grpcio.aio then fails the next write with its own INTERNAL ("Failed execute_batch") and loses kas'
    status, while the blocking client stops writing and reports kas' status (the flake seen in CI)."""

    def call() -> grpc.StatusCode:
        with grpc.insecure_channel(kas.agent_address.removeprefix("grpc://")) as channel:
            stub = rpc_pb2_grpc.GitlabAccessStub(channel)
            try:
                for _ in stub.MakeRequest(iter(messages), metadata=meta(token), timeout=10):
                    pass
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    return await asyncio.to_thread(call)


def header(
    path: str = "/reconcile", module: str | None = "remote_development", **headers: str
) -> grpctool_pb2.HttpRequest:
    request = prototool_pb2.HttpRequest(method="POST", url_path=path)
    for key, value in headers.items():
        request.header[key].value.append(value)
    head = grpctool_pb2.HttpRequest.Header(request=request)
    if module is not None:
        extra = any_pb2.Any()
        extra.Pack(rpc_pb2.HeaderExtra(module_name=module))
        head.extra.CopyFrom(extra)
    return grpctool_pb2.HttpRequest(header=head)


TRAILER = grpctool_pb2.HttpRequest(trailer=grpctool_pb2.HttpRequest.Trailer())


async def test_requests_pass_through_and_hub_errors_arrive_unchanged(hub_and_kas: tuple[RealHub, KasProc, str]) -> None:
    _hub, kas, token = hub_and_kas
    async with aio.insecure_channel(kas.agent_address.removeprefix("grpc://")) as channel:
        body = json.dumps({"update_type": "full", "workspace_agent_infos": []}).encode()
        ok = await make_gitlab_request(
            channel, meta(token), "remote_development", "/reconcile", method="POST", body=body
        )
        assert ok.status == 201 and len(ok.body) > 200_000  # forty workspaces with all their objects
        assert len(json.loads(ok.body)["workspace_rails_infos"]) == 40
        bad = await make_gitlab_request(
            channel, meta(token), "remote_development", "/reconcile", method="POST", body=b"{}"
        )
        assert bad.status == 400
        assert json.loads(bad.body) == {
            "message": {
                "error": "Workspace reconcile params validation failed: "
                "root is missing required keys: update_type, workspace_agent_infos"
            }
        }
        missing = await make_gitlab_request(channel, meta(token), "remote_development", "/nothing", method="POST")
        assert missing.status == 404
        with pytest.raises(GitlabRequestError) as refused:
            await make_gitlab_request(channel, meta("wrong-token"), "remote_development", "/reconcile", body=body)
        assert not refused.value.retryable and "UNAUTHENTICATED" in str(refused.value)


@pytest.mark.parametrize(
    ("messages", "code"),
    [
        ([header(module=None), TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header(module="../x"), TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header(path="/../../agent_info"), TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header(path="/a/%2e%2e/b"), TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header(path="reconcile"), TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header(Upgrade="websocket", Connection="Upgrade"), TRAILER], grpc.StatusCode.FAILED_PRECONDITION),
        (
            [header(), grpctool_pb2.HttpRequest(upgradeData=grpctool_pb2.HttpRequest.UpgradeData(data=b"x"))],
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        ([TRAILER], grpc.StatusCode.INVALID_ARGUMENT),
        ([header()], grpc.StatusCode.INVALID_ARGUMENT),  # ended before its trailer
    ],
)
async def test_bad_requests_are_refused(
    hub_and_kas: tuple[RealHub, KasProc, str], messages: list[grpctool_pb2.HttpRequest], code: grpc.StatusCode
) -> None:
    _hub, kas, token = hub_and_kas
    assert await raw_call(kas, token, messages) == code


async def test_hub_down_is_retryable(hub_and_kas: tuple[RealHub, KasProc, str]) -> None:
    hub, kas, token = hub_and_kas
    async with aio.insecure_channel(kas.agent_address.removeprefix("grpc://")) as channel:
        body = json.dumps({"update_type": "full", "workspace_agent_infos": []}).encode()
        await make_gitlab_request(channel, meta(token), "remote_development", "/reconcile", method="POST", body=body)
        hub.server.stop()
        try:
            with pytest.raises(GitlabRequestError) as down:
                await make_gitlab_request(
                    channel, meta(token), "remote_development", "/reconcile", method="POST", body=body
                )
            assert down.value.retryable, str(down.value)
        finally:
            hub.server = HubServer(hub.config)
            hub.server.start_in_thread()
        ok = await make_gitlab_request(
            channel, meta(token), "remote_development", "/reconcile", method="POST", body=body
        )
        assert ok.status == 201
