"""The reconcile request body agentk sends (reference §1.3) and its validation (vectors §V8).

:func:`validate` applies upstream's JSON schema and words every problem as Rails' validator does
(``property '/update_type' is not one of: ["partial", "full"]``), several joined with ``". "``.
:func:`parse` then also requires what upstream reads with ``fetch`` (``name``, ``namespace``) so that a body
upstream would answer with a 500 gets a clear 400 here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.modules.remote_development.protocol import UPDATE_FULL, UPDATE_PARTIAL

_UPDATE_TYPES = [UPDATE_PARTIAL, UPDATE_FULL]
_TERMINATION = ["Terminating", "Terminated"]
_ERROR_TYPES = ["applier", "kubernetes"]
#: Prefix of every validation error (reference §1.5).
ERROR_PREFIX = "Workspace reconcile params validation failed: "
#: Longest error message agentk may report per workspace; longer ones are cut (bounded storage).
MAX_ERROR_MESSAGE = 4096


class ParamsError(ValueError):
    """The body breaks the schema; ``str()`` is the full message agentk sees."""


def _enum(values: list[str]) -> str:
    return json.dumps(values, separators=(", ", ": "))


def _type_name(value: object) -> str:
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else "string"


def _problems(body: object) -> list[str]:
    if not isinstance(body, Mapping):
        return ["root is not of type: object"]
    problems: list[str] = []
    missing = [key for key in ("update_type", "workspace_agent_infos") if key not in body]
    if missing:
        problems.append(f"root is missing required keys: {', '.join(missing)}")
    if "update_type" in body and body["update_type"] not in _UPDATE_TYPES:
        problems.append(f"property '/update_type' is not one of: {_enum(_UPDATE_TYPES)}")
    infos = body.get("workspace_agent_infos")
    if "workspace_agent_infos" in body and not isinstance(infos, list):
        problems.append("property '/workspace_agent_infos' is not of type: array")
        return problems
    for index, info in enumerate(infos or []):
        where = f"/workspace_agent_infos/{index}"
        if not isinstance(info, Mapping):
            problems.append(f"property '{where}' is not of type: object")
            continue
        for key in ("name", "namespace"):
            if key in info and info[key] is not None and not isinstance(info[key], str):
                problems.append(f"property '{where}/{key}' is not of type: string")
        deployment = info.get("latest_k8s_deployment_info")
        if deployment is not None and not isinstance(deployment, Mapping):
            problems.append(f"property '{where}/latest_k8s_deployment_info' is not of type: object")
        if "termination_progress" in info and info["termination_progress"] not in _TERMINATION:
            problems.append(f"property '{where}/termination_progress' is not one of: {_enum(_TERMINATION)}")
        details = info.get("error_details")
        if details is None:
            continue
        if not isinstance(details, Mapping):
            problems.append(f"property '{where}/error_details' is not of type: object")
            continue
        if "error_type" not in details:
            problems.append(f"property '{where}/error_details' is missing required keys: error_type")
        elif details["error_type"] not in _ERROR_TYPES:
            problems.append(f"property '{where}/error_details/error_type' is not one of: {_enum(_ERROR_TYPES)}")
        message = details.get("error_message")
        if message is not None and not isinstance(message, str):
            problems.append(f"property '{where}/error_details/error_message' is not of type: string")
    return problems


def validate(body: object) -> None:
    """Check ``body`` against the reconcile params schema (reference §1.3; vectors §V8).

    Raises:
        ParamsError: ``Workspace reconcile params validation failed: <details>``.
    """
    problems = _problems(body)
    if problems:
        raise ParamsError(ERROR_PREFIX + ". ".join(problems))


@dataclass(frozen=True)
class AgentInfo:
    """One ``workspace_agent_info`` as reported.

    Attributes:
        name, namespace: the workspace.
        deployment: ``latest_k8s_deployment_info`` or None.
        termination_progress: None, ``Terminating`` or ``Terminated``.
        error_details: ``{"error_type", "error_message"}`` or None.
        pod_failure: Tether's ``{"reason", "message"}`` from the workspace's pods, or None.
    """

    name: str
    namespace: str | None
    deployment: Mapping[str, Any] | None
    termination_progress: str | None
    error_details: Mapping[str, Any] | None
    pod_failure: Mapping[str, Any] | None

    @property
    def resource_version(self) -> str | None:
        """``metadata.resourceVersion`` of the reported Deployment (the acknowledgement key), or None."""
        if self.deployment is None:
            return None
        metadata = self.deployment.get("metadata")
        version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
        return str(version)[:64] if version is not None else None

    @property
    def error_message(self) -> str:
        """The reported error message, cut to :data:`MAX_ERROR_MESSAGE` characters."""
        if not self.error_details:
            return ""
        return str(self.error_details.get("error_message") or "")[:MAX_ERROR_MESSAGE]


@dataclass(frozen=True)
class ReconcileParams:
    """A validated reconcile request: ``update_type`` and the infos in the order sent."""

    update_type: str
    infos: list[AgentInfo]


def parse(body: object) -> ReconcileParams:
    """Validate and convert a reconcile body.

    Raises:
        ParamsError: a schema problem (:func:`validate`) or an info without ``name``/``namespace`` keys, or
            with an empty or repeated name.
    """
    validate(body)
    assert isinstance(body, Mapping)
    infos: list[AgentInfo] = []
    seen: set[str] = set()
    for index, raw in enumerate(body["workspace_agent_infos"]):
        missing = [key for key in ("name", "namespace") if key not in raw]
        if missing:
            where = f"/workspace_agent_infos/{index}"
            raise ParamsError(f"{ERROR_PREFIX}property '{where}' is missing required keys: {', '.join(missing)}")
        name = raw["name"]
        if not name:
            raise ParamsError(f"{ERROR_PREFIX}property '/workspace_agent_infos/{index}/name' is empty")
        if name in seen:
            raise ParamsError(f"{ERROR_PREFIX}property '/workspace_agent_infos/{index}/name' repeats {name!r}")
        seen.add(name)
        failure = raw.get("pod_failure")
        infos.append(
            AgentInfo(
                name=name,
                namespace=raw["namespace"],
                deployment=raw.get("latest_k8s_deployment_info"),
                termination_progress=raw.get("termination_progress"),
                error_details=raw.get("error_details"),
                pod_failure=failure if isinstance(failure, Mapping) else None,
            )
        )
    return ReconcileParams(update_type=body["update_type"], infos=infos)
