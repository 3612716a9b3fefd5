"""Devfile validation: the workspace definition a user gives (devfile 2.2 subset GitLab supports).

Every problem names the field (``devfile.components[0].container.image: is missing``). Supported: container
and volume components, exec and apply commands, ``events.preStart``/``postStart``, variables and attributes
at the top level. Unknown fields are refused, as are the component kinds GitLab refuses (kubernetes,
openshift, image). Source of the restrictions: GitLab "Workspace devfile" docs (devfile schema 2.2.x, one
container at least, names are DNS labels, endpoint ports 1-65535).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

#: Upstream column limit on the devfile text (reference §6.1).
MAX_DEVFILE_BYTES = 65535
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCHEMA_VERSION = re.compile(r"^2\.2\.\d+$")
#: The component attribute that asks for the editor (GitLab's).
INJECT_EDITOR = "gl/inject-editor"


class DevfileError(ValueError):
    """The devfile is invalid; ``field`` is the path at fault, ``problem`` what is wrong."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"{field_path}: {problem}")
        self.field = field_path
        self.problem = problem


@dataclass(frozen=True)
class Endpoint:
    """A port a container serves: ``name`` (DNS label) and ``target_port``."""

    name: str
    target_port: int


@dataclass(frozen=True)
class Container:
    """A container component of the devfile.

    Attributes:
        name: component name (DNS label).
        image: image reference.
        command, args: overrides, possibly empty.
        env: (name, value) pairs.
        endpoints: ports it serves.
        memory_limit, cpu_limit, memory_request, cpu_request: Kubernetes quantities or "".
        volume_mounts: (volume component name, path).
        inject_editor: the component's ``gl/inject-editor`` attribute: the editor is injected into this
            container and served on port 60001 (GitLab's rule; reference workspaces.md §4.2).
    """

    name: str
    image: str
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: list[tuple[str, str]] = field(default_factory=list)
    endpoints: list[Endpoint] = field(default_factory=list)
    memory_limit: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    cpu_request: str = ""
    volume_mounts: list[tuple[str, str]] = field(default_factory=list)
    inject_editor: bool = False


@dataclass(frozen=True)
class Devfile:
    """A validated devfile.

    Attributes:
        text: the YAML as given.
        containers: container components in order.
        volumes: volume component name -> size ("" for the default).
        post_start: (command id, command line, component) for each postStart exec command.
    """

    text: str
    containers: list[Container]
    volumes: dict[str, str]
    post_start: list[tuple[str, str, str]]

    @property
    def editor_injected(self) -> bool:
        """True when one container gets the editor (``gl/inject-editor: true``), served on port 60001."""
        return any(c.inject_editor for c in self.containers)


_TOP = {"schemaVersion", "metadata", "components", "commands", "events", "variables", "attributes"}
_COMPONENT = {"name", "container", "volume", "attributes"}
_REFUSED_KINDS = {"kubernetes", "openshift", "image", "custom", "plugin"}
_CONTAINER = {
    "image",
    "command",
    "args",
    "env",
    "endpoints",
    "memoryLimit",
    "cpuLimit",
    "memoryRequest",
    "cpuRequest",
    "mountSources",
    "sourceMapping",
    "volumeMounts",
    "dedicatedPod",
}
_ENDPOINT = {"name", "targetPort", "exposure", "protocol", "secure", "path", "attributes"}
_COMMAND = {"id", "exec", "apply", "attributes"}
_EXEC = {"commandLine", "component", "workingDir", "label", "env", "hotReloadCapable", "group"}
_EVENTS = {"preStart", "postStart", "preStop", "postStop"}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DevfileError(where, "must be a mapping")
    return value


def _known(value: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in value:
        if key not in allowed:
            raise DevfileError(f"{where}.{key}", "unknown field")


def _text(value: Mapping[str, Any], key: str, where: str, required: bool = False) -> str:
    if key not in value or value[key] is None:
        if required:
            raise DevfileError(f"{where}.{key}", "is missing")
        return ""
    found = value[key]
    if not isinstance(found, str):
        raise DevfileError(f"{where}.{key}", "must be a string")
    return found


def _strings(value: Mapping[str, Any], key: str, where: str) -> list[str]:
    items = value.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise DevfileError(f"{where}.{key}", "must be a list of strings")
    return list(items)


def _name(value: Mapping[str, Any], key: str, where: str) -> str:
    name = _text(value, key, where, required=True)
    if not _DNS_LABEL.match(name):
        raise DevfileError(f"{where}.{key}", f"{name!r} is not a DNS label (lowercase letters, digits, '-')")
    return name


def _quantity(value: Mapping[str, Any], key: str, where: str) -> str:
    text = _text(value, key, where)
    if text and not _QUANTITY.match(text):
        raise DevfileError(f"{where}.{key}", f"{text!r} is not a Kubernetes quantity (e.g. 512Mi, 500m)")
    return text


def _container(name: str, raw: object, where: str, inject_editor: bool) -> Container:
    spec = _mapping(raw, where)
    _known(spec, _CONTAINER, where)
    env: list[tuple[str, str]] = []
    for index, item in enumerate(spec.get("env") or []):
        at = f"{where}.env[{index}]"
        entry = _mapping(item, at)
        _known(entry, {"name", "value"}, at)
        env_name = _text(entry, "name", at, required=True)
        if not _ENV_NAME.match(env_name):
            raise DevfileError(f"{at}.name", f"{env_name!r} is not a valid environment variable name")
        env.append((env_name, _text(entry, "value", at)))
    endpoints: list[Endpoint] = []
    for index, item in enumerate(spec.get("endpoints") or []):
        at = f"{where}.endpoints[{index}]"
        entry = _mapping(item, at)
        _known(entry, _ENDPOINT, at)
        port = entry.get("targetPort")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise DevfileError(f"{at}.targetPort", "must be a port number 1-65535")
        endpoints.append(Endpoint(_name(entry, "name", at), port))
    mounts: list[tuple[str, str]] = []
    for index, item in enumerate(spec.get("volumeMounts") or []):
        at = f"{where}.volumeMounts[{index}]"
        entry = _mapping(item, at)
        _known(entry, {"name", "path"}, at)
        mounts.append((_name(entry, "name", at), _text(entry, "path", at, required=True)))
    return Container(
        name=name,
        image=_text(spec, "image", where, required=True),
        command=_strings(spec, "command", where),
        args=_strings(spec, "args", where),
        env=env,
        endpoints=endpoints,
        memory_limit=_quantity(spec, "memoryLimit", where),
        cpu_limit=_quantity(spec, "cpuLimit", where),
        memory_request=_quantity(spec, "memoryRequest", where),
        cpu_request=_quantity(spec, "cpuRequest", where),
        volume_mounts=mounts,
        inject_editor=inject_editor,
    )


def parse_devfile(text: str) -> Devfile:
    """Validate a devfile given as YAML text.

    Raises:
        DevfileError: naming the field, e.g. ``devfile.components[1].container.image: is missing``.
    """
    if len(text.encode()) > MAX_DEVFILE_BYTES:
        raise DevfileError("devfile", f"is too large (maximum is {MAX_DEVFILE_BYTES} bytes)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DevfileError("devfile", f"is not valid YAML: {exc}") from exc
    root = _mapping(data, "devfile")
    _known(root, _TOP, "devfile")
    version = _text(root, "schemaVersion", "devfile", required=True)
    if not _SCHEMA_VERSION.match(version):
        raise DevfileError("devfile.schemaVersion", f"{version!r} is not supported: use 2.2.0")
    components = root.get("components")
    if not isinstance(components, list) or not components:
        raise DevfileError("devfile.components", "must be a non-empty list")
    containers: list[Container] = []
    volumes: dict[str, str] = {}
    names: set[str] = set()
    for index, item in enumerate(components):
        where = f"devfile.components[{index}]"
        component = _mapping(item, where)
        for kind in _REFUSED_KINDS & set(component):
            raise DevfileError(f"{where}.{kind}", "component kind is not supported (use container or volume)")
        _known(component, _COMPONENT, where)
        name = _name(component, "name", where)
        if name in names:
            raise DevfileError(f"{where}.name", f"{name!r} is used by another component")
        names.add(name)
        kinds = [k for k in ("container", "volume") if k in component]
        if len(kinds) != 1:
            raise DevfileError(where, "must have exactly one of container or volume")
        if kinds[0] == "container":
            attributes = _mapping(component.get("attributes") or {}, f"{where}.attributes")
            inject = attributes.get(INJECT_EDITOR, False)
            if not isinstance(inject, bool):
                raise DevfileError(f"{where}.attributes.{INJECT_EDITOR}", "must be true or false")
            if inject and any(c.inject_editor for c in containers):
                raise DevfileError(f"{where}.attributes.{INJECT_EDITOR}", "only one component may get the editor")
            containers.append(_container(name, component["container"], f"{where}.container", inject))
        else:
            volume = _mapping(component["volume"] or {}, f"{where}.volume")
            _known(volume, {"size", "ephemeral"}, f"{where}.volume")
            volumes[name] = _quantity(volume, "size", f"{where}.volume")
    if not containers:
        raise DevfileError("devfile.components", "must contain at least one container component")
    for c_index, container in enumerate(containers):
        for mount, _path in container.volume_mounts:
            if mount not in volumes:
                raise DevfileError(
                    f"devfile.components[{c_index}].container.volumeMounts", f"{mount!r} is not a volume component"
                )
    post_start = _commands(root, {c.name for c in containers})
    return Devfile(text=text, containers=containers, volumes=volumes, post_start=post_start)


def _commands(root: Mapping[str, Any], containers: set[str]) -> list[tuple[str, str, str]]:
    commands: dict[str, tuple[str, str]] = {}
    raw = root.get("commands") or []
    if not isinstance(raw, list):
        raise DevfileError("devfile.commands", "must be a list")
    for index, item in enumerate(raw):
        where = f"devfile.commands[{index}]"
        command = _mapping(item, where)
        _known(command, _COMMAND, where)
        command_id = _name(command, "id", where)
        if command_id in commands:
            raise DevfileError(f"{where}.id", f"{command_id!r} is used by another command")
        if "exec" in command:
            spec = _mapping(command["exec"], f"{where}.exec")
            _known(spec, _EXEC, f"{where}.exec")
            component = _text(spec, "component", f"{where}.exec", required=True)
            if component not in containers:
                raise DevfileError(f"{where}.exec.component", f"{component!r} is not a container component")
            commands[command_id] = (_text(spec, "commandLine", f"{where}.exec", required=True), component)
        elif "apply" in command:
            commands[command_id] = ("", "")
        else:
            raise DevfileError(where, "must have exec or apply")
    events = root.get("events") or {}
    events = _mapping(events, "devfile.events")
    _known(events, _EVENTS, "devfile.events")
    post_start: list[tuple[str, str, str]] = []
    for kind in _EVENTS:
        ids = _strings(events, kind, "devfile.events")
        for index, command_id in enumerate(ids):
            if command_id not in commands:
                raise DevfileError(f"devfile.events.{kind}[{index}]", f"{command_id!r} is not a command id")
            if kind in ("preStop", "postStop"):
                raise DevfileError(f"devfile.events.{kind}", "is not supported")
            if kind == "postStart" and commands[command_id][0]:
                post_start.append((command_id, *commands[command_id]))
    return post_start


#: GitLab's workspace base image, the default devfile's container (a registry must be reachable).
DEFAULT_DEVFILE_IMAGE = "registry.gitlab.com/gitlab-org/gitlab-build-images/workspaces/ubuntu-24.04:latest"
#: Used when the user gives no devfile (GitLab's default: one container on its workspace base image).
DEFAULT_DEVFILE = f"""schemaVersion: 2.2.0
components:
  - name: development-environment
    attributes:
      {INJECT_EDITOR}: true
    container:
      image: {DEFAULT_DEVFILE_IMAGE}
"""


def default_devfile(image: str = "") -> str:
    """The default devfile, with ``image`` for its container instead of GitLab's when not empty.

    The hub's ``workspaces.default_devfile_image`` sets it, for clusters that cannot pull GitLab's image
    (``tether up``'s node reaches no registry). The image is written as a quoted YAML string.
    """
    if not image:
        return DEFAULT_DEVFILE
    return DEFAULT_DEVFILE.replace(f"image: {DEFAULT_DEVFILE_IMAGE}", f"image: {json.dumps(image)}")
