"""Validation of an agent's configuration file (kas.md §6.1; upstream ``.gitlab/agents/<name>/config.yaml``).

The YAML is read into plain data and parsed with protobuf JSON rules into ``agentcfg.ConfigurationFile``, as kas
does; Tether then applies the rules GitLab enforces when it uses ``user_access`` (``AuthorizeProxyUserService``):
``access_as`` present, with exactly one of ``agent`` or ``user``, and projects/groups given by full path. Every
error names the field (``user_access.access_as: ...``).

A file written for GitLab may carry sections Tether does not serve (:data:`GITLAB_ONLY_SECTIONS`): they are
accepted with one warning each, so that a user moving an agent from GitLab keeps their file; any other unknown
top-level key is still refused, so that a typo in a served section's name is not silently ignored.

Tether's own sections (:data:`TETHER_SECTIONS`, e.g. ``audit: {record_sessions: true}``, issue 25 item 2) are
not in the protobuf: they are checked here and kept in the document beside the protobuf's fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from tether.hub.errors import BadRequest
from tether.hub.validation import is_full_path
from tether.modules.remote_development.hub import settings as workspaces_settings
from tether.pb.gitlab.agent.agentcfg.agentcfg_pb2 import ConfigurationFile

#: Upstream ``agent.configuration.max_configuration_file_size`` default (kas.md §7).
MAX_SIZE_BYTES = 131072
#: Upstream limit of projects or groups per access section (``AUTHORIZED_ENTITY_LIMIT``).
MAX_AUTHORIZED_ENTITIES = 500
_FIELD = "configuration"
#: Tether's section of the agent configuration about the audit trail; not in upstream's protobuf.
AUDIT_SECTION = "audit"
#: Top-level sections that are Tether's own (kas leaves them out of what agentk receives).
TETHER_SECTIONS = frozenset({AUDIT_SECTION})
_CHAIN = re.compile(r"Failed to parse (\w+) field: ")
_LOCATION = re.compile(r' at "?ConfigurationFile\.?([\w\[\]]+(?:\.[\w\[\]]+)*)?"?\.*$')
_UNKNOWN = re.compile(r'has no field named "([^"]+)"')
#: GitLab agent configuration sections Tether does not serve -> what GitLab uses them for (set aside by
#: :func:`_set_aside_gitlab_sections`).
GITLAB_ONLY_SECTIONS = {
    "gitops": "GitLab's pull-based GitOps",
    "ci_access": "GitLab CI/CD access to the cluster",
    "container_scanning": "GitLab's operational container scanning",
    "starboard": "GitLab's former Starboard scanning",
    "flux": "GitLab's Flux integration",
}


@dataclass(frozen=True)
class ValidConfiguration:
    """A configuration that passed validation.

    Attributes:
        content: the YAML text as given.
        document: the ``ConfigurationFile`` as protobuf JSON with snake_case field names.
    """

    content: str
    document: dict[str, Any]
    warnings: tuple[str, ...] = ()


def parse_configuration(content: str) -> ValidConfiguration:
    """Validate the YAML ``content`` of an agent configuration file.

    Args:
        content: YAML text, at most 131072 bytes (UTF-8). Empty text is an empty configuration.

    Returns:
        the configuration, with one warning per section of :data:`GITLAB_ONLY_SECTIONS` present
        (``configuration.gitops: accepted but not served by Tether (GitLab's pull-based GitOps)``).

    Raises:
        BadRequest: on field ``configuration`` or a path inside it (``configuration.user_access.access_as``),
            saying what is wrong.
    """
    if len(content.encode()) > MAX_SIZE_BYTES:
        raise BadRequest.field(_FIELD, f"is too large (maximum is {MAX_SIZE_BYTES} bytes)")
    try:
        data = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        raise BadRequest.field(_FIELD, f"is not valid YAML: {_yaml_problem(exc)}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadRequest.field(_FIELD, f"must be a mapping at the top level, not {_kind(data)}")
    data, warnings = _set_aside_gitlab_sections(data)
    audit = _audit_section(data.pop(AUDIT_SECTION, None))
    _check_user_access(data)
    _check_shapes(data, ConfigurationFile.DESCRIPTOR, _FIELD)
    try:
        message = json_format.ParseDict(data, ConfigurationFile())
    except json_format.ParseError as exc:
        where, problem = explain_parse_error(str(exc))
        raise BadRequest.field(f"{_FIELD}.{where}" if where else _FIELD, problem) from exc
    except (TypeError, ValueError) as exc:  # e.g. non-string mapping keys
        raise BadRequest.field(_FIELD, str(exc)) from exc
    document = json_format.MessageToDict(message, preserving_proto_field_name=True)
    if audit is not None:
        document[AUDIT_SECTION] = audit
    try:
        workspaces_settings.from_configuration(document.get("remote_development"))
    except ValueError as exc:
        where, _, problem = str(exc).partition(": ")
        raise BadRequest.field(f"{_FIELD}.{where}", problem) from exc
    return ValidConfiguration(content=content, document=document, warnings=warnings)


def _audit_section(section: Any) -> dict[str, Any] | None:
    """``audit``: a mapping whose only key is ``record_sessions`` (a boolean, default false); None when absent."""
    if section is None:
        return None
    where = f"{_FIELD}.{AUDIT_SECTION}"
    if not isinstance(section, dict):
        raise BadRequest.field(where, f"must be a mapping, not {_kind(section)}")
    for key, value in section.items():
        if key != "record_sessions":
            raise BadRequest.field(f"{where}.{key}", "unknown field (the audit section has `record_sessions`)")
        if not isinstance(value, bool):
            raise BadRequest.field(f"{where}.{key}", f"must be true or false, not {_kind(value)}")
    return {"record_sessions": section.get("record_sessions", False)}


def record_sessions(document: dict[str, Any]) -> bool:
    """Whether a stored configuration document asks kas to record exec/attach sessions (issue 25 item 2)."""
    section = document.get(AUDIT_SECTION)
    return isinstance(section, dict) and section.get("record_sessions") is True


def _set_aside_gitlab_sections(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Split off the :data:`GITLAB_ONLY_SECTIONS` of ``data``, with one warning each.

    A section the protobuf knows and that parses is kept: kas hands it to an upstream agentk, which may serve
    it. One it does not know (``starboard``) or that uses fields of another GitLab version is left out of the
    document (the stored text keeps it) and its warning says why.
    """
    kept = {key: value for key, value in data.items() if key not in GITLAB_ONLY_SECTIONS}
    warnings = []
    for key, what in GITLAB_ONLY_SECTIONS.items():
        if key not in data:
            continue
        warning = f"{_FIELD}.{key}: accepted but not served by Tether ({what})"
        try:
            if key not in ConfigurationFile.DESCRIPTOR.fields_by_name:
                raise BadRequest.field(f"{_FIELD}.{key}", "not in this agent protocol version")
            _check_shapes({key: data[key]}, ConfigurationFile.DESCRIPTOR, _FIELD)
            json_format.ParseDict({key: data[key]}, ConfigurationFile())
        except (BadRequest, json_format.ParseError, TypeError, ValueError) as exc:
            warnings.append(f"{warning}; left out of what agents receive: {exc}")
            continue
        kept[key] = data[key]
        warnings.append(warning)
    return kept, tuple(warnings)


def _check_user_access(data: dict[str, Any]) -> None:
    section = data.get("user_access", data.get("userAccess"))
    if section is None:
        return
    key = "user_access"
    if not isinstance(section, dict):
        raise BadRequest.field(f"{_FIELD}.{key}", f"must be a mapping, not {_kind(section)}")
    access_as = section.get("access_as", section.get("accessAs"))
    if access_as is None:
        raise BadRequest.field(f"{_FIELD}.{key}.access_as", "is missing: set `agent: {}` or `user: {}`")
    if not isinstance(access_as, dict):
        raise BadRequest.field(f"{_FIELD}.{key}.access_as", f"must be a mapping, not {_kind(access_as)}")
    if len(access_as) != 1 or next(iter(access_as)) not in ("agent", "user"):
        raise BadRequest.field(f"{_FIELD}.{key}.access_as", "must have exactly one of `agent` or `user`")
    only = next(iter(access_as))
    if access_as[only] is None:  # `agent:` with nothing after it means `agent: {}`
        access_as[only] = {}
    for kind in ("projects", "groups"):
        entries = section.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise BadRequest.field(f"{_FIELD}.{key}.{kind}", f"must be a list, not {_kind(entries)}")
        if len(entries) > MAX_AUTHORIZED_ENTITIES:
            raise BadRequest.field(f"{_FIELD}.{key}.{kind}", f"has more than {MAX_AUTHORIZED_ENTITIES} entries")
        for index, entry in enumerate(entries):
            where = f"{_FIELD}.{key}.{kind}[{index}].id"
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise BadRequest.field(where, "must be the full path of a project or group, e.g. `group/project`")
            if not is_full_path(entry["id"]):
                raise BadRequest.field(where, f"{entry['id']!r} is not a valid full path")


def _check_shapes(data: dict[str, Any], descriptor: Descriptor, where: str) -> None:
    """Walk ``data`` along the message ``descriptor``: unknown fields, and mappings or lists of the wrong shape.

    Scalars (strings, numbers, enums, durations) are left to protobuf's parser, which names them well.
    """
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key) if isinstance(key, str) else None
        if field is None and isinstance(key, str):
            field = next((f for f in descriptor.fields if f.json_name == key), None)
        path = f"{where}.{key}"
        if field is None:
            raise BadRequest.field(path, "unknown field")
        if value is None:
            continue
        nested = field.message_type
        message = nested if nested is not None and not nested.full_name.startswith("google.protobuf.") else None
        if message is not None and message.GetOptions().map_entry:
            if not isinstance(value, dict):
                raise BadRequest.field(path, f"must be a mapping, not {_kind(value)}")
        elif field.is_repeated:
            if not isinstance(value, list):
                raise BadRequest.field(path, f"must be a list, not {_kind(value)}")
            if message is not None:
                for index, item in enumerate(value):
                    if not isinstance(item, dict):
                        raise BadRequest.field(f"{path}[{index}]", f"must be a mapping, not {_kind(item)}")
                    _check_shapes(item, message, f"{path}[{index}]")
        elif message is not None:
            if not isinstance(value, dict):
                raise BadRequest.field(path, f"must be a mapping, not {_kind(value)}")
            _check_shapes(value, message, path)
        elif isinstance(value, dict | list):
            raise BadRequest.field(path, f"must be a single value, not {_kind(value)}")
        elif field.enum_type is not None:
            names = field.enum_type.values_by_name
            if not (value in names or (isinstance(value, int) and value in field.enum_type.values_by_number)):
                raise BadRequest.field(path, f"{value!r} is not one of {', '.join(names)}")


def explain_parse_error(message: str) -> tuple[str, str]:
    """Split a protobuf ``ParseError`` message into (field path, problem).

    ``Failed to parse user_access field: Failed to parse projects field: repeated field projects must be in []
    which is oops at ConfigurationFile.user_access..`` becomes ``("user_access.projects", "repeated field ...")``.
    """
    chain = []
    rest = message
    while match := _CHAIN.match(rest):
        chain.append(match.group(1))
        rest = rest[match.end() :]
    rest = rest.split("\n", 1)[0]
    location = _LOCATION.search(rest)
    where = ".".join(chain)
    if location is not None:
        rest = rest[: location.start()]
        if location.group(1):
            where = location.group(1)
    unknown = _UNKNOWN.search(rest)
    if unknown is not None:
        field = unknown.group(1)
        return (f"{where}.{field}" if where else field), "unknown field"
    return where, rest.rstrip(". ") or "invalid value"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)
