"""CEL expressions of the Graph API behind a small :class:`CelProgram` interface (stack.md §5).

Backend: cel-expr-python (Google's cel-cpp) with a type-checked environment, plus the strings, math,
encoders and optional extensions. Two environments exist, with the variables the seed lists (seed 002
"queries" and "roots"):

- resource environment (``resource_selector_expression``): ``group``, ``version``, ``resource`` (strings),
  ``namespaced`` (bool);
- object environment (``object_selector_expression`` of queries and namespaces, and
  ``roots.object_selector_expressions``): ``obj`` (map of the object's JSON), ``group``, ``version``,
  ``resource``, ``namespace``, ``name`` (strings), ``labels``, ``annotations`` (``map(string, string)``).

``namespace`` is a reserved word in CEL, so a bare ``namespace`` identifier is rewritten to an internal
alias of the same length before compiling (member access such as ``obj.metadata.namespace`` is untouched,
as are string literals); error messages show the original name.

Every expression must be statically typed ``bool`` ("The expression must return a boolean"), so an
expression like ``obj.spec.paused`` (type ``dyn``) is rejected at compile time; write ``obj.spec.paused == true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from cel_expr_python import cel  # type: ignore[import-untyped]
from cel_expr_python.ext import (  # type: ignore[import-untyped]
    ext_encoders,
    ext_math,
    ext_optional,
    ext_strings,
)

__all__ = [
    "NAMESPACE_ALIAS",
    "CelCompileError",
    "CelEvaluationError",
    "CelProgram",
    "compile_object_expression",
    "compile_resource_expression",
    "object_variables",
]

#: Name under which the ``namespace`` variable is declared (same length as ``namespace``, see the module doc).
NAMESPACE_ALIAS = "_ns_alias"

#: Expressions longer than this are rejected before compiling (protects agentk and kas from huge input).
MAX_EXPRESSION_LENGTH = 10_000


class CelCompileError(ValueError):
    """The expression does not parse, uses unknown variables or functions, or is not of type bool."""


class CelEvaluationError(RuntimeError):
    """Evaluating the expression failed for this input (e.g. a missing map key, a division by zero)."""


class CelProgram(Protocol):
    """A compiled boolean expression."""

    @property
    def source(self) -> str:
        """The expression text."""
        ...

    def evaluate(self, variables: Mapping[str, Any]) -> bool:
        """Evaluate with ``variables`` (name -> plain Python/JSON value).

        Raises:
            CelEvaluationError: the evaluation produced an error value or the input cannot be converted.
        """
        ...


def _types() -> tuple[dict[str, cel.Type], dict[str, cel.Type]]:
    t = cel.Type
    string_map = t.Map(t.STRING, t.STRING)
    resource = {"group": t.STRING, "version": t.STRING, "resource": t.STRING, "namespaced": t.BOOL}
    obj = {
        "obj": t.Map(t.STRING, t.DYN),
        "group": t.STRING,
        "version": t.STRING,
        "resource": t.STRING,
        NAMESPACE_ALIAS: t.STRING,
        "name": t.STRING,
        "labels": string_map,
        "annotations": string_map,
    }
    return resource, obj


class _Envs:
    """Lazily built environments (building one costs a few milliseconds)."""

    resource: cel.Env | None = None
    object: cel.Env | None = None

    @classmethod
    def get(cls, kind: str) -> cel.Env:
        if cls.resource is None or cls.object is None:
            resource_vars, object_vars = _types()

            def extensions() -> list[cel.CelExtensionBase]:
                return [
                    ext_strings.ExtStrings(),
                    ext_math.ExtMath(),
                    ext_encoders.ExtEncoders(),
                    ext_optional.ExtOptional(),
                ]

            cls.resource = cel.NewEnv(variables=resource_vars, extensions=extensions())
            cls.object = cel.NewEnv(variables=object_vars, extensions=extensions())
        return cls.resource if kind == "resource" else cls.object


class _CppProgram:
    """:class:`CelProgram` on cel-expr-python."""

    __slots__ = ("_expression", "_source")

    def __init__(self, source: str, expression: cel.Expression) -> None:
        self._source = source
        self._expression = expression

    @property
    def source(self) -> str:
        return self._source

    def evaluate(self, variables: Mapping[str, Any]) -> bool:
        try:
            value = self._expression.eval(data=variables)
        except Exception as exc:  # the binding raises RuntimeError/TypeError on unconvertible input
            raise CelEvaluationError(str(exc)) from exc
        result = value.value()
        if value.type() == cel.Type.BOOL and isinstance(result, bool):
            return result
        raise CelEvaluationError(str(result) if value.type() == cel.Type.ERROR else f"result is not bool: {result!r}")


def _compile(kind: str, source: str) -> CelProgram:
    if not source.strip():
        raise CelCompileError("expression is empty")
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(f"expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    if "\x00" in source:
        raise CelCompileError("expression contains a NUL character")
    text = _alias_namespace(source) if kind == "object" else source
    try:
        expression = _Envs.get(kind).compile(text)
    except Exception as exc:
        message = _clean(str(exc))
        if text is not source:
            message = message.replace(text, source).replace(NAMESPACE_ALIAS, "namespace")
        raise CelCompileError(message) from exc
    return_type = expression.return_type()
    if return_type != cel.Type.BOOL:
        raise CelCompileError(f"expression must evaluate to bool, but its type is {return_type.name().lower()}")
    return _CppProgram(source, expression)


_IDENTIFIER_START = frozenset("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_IDENTIFIER_CHARS = _IDENTIFIER_START | frozenset("0123456789")


def _alias_namespace(source: str) -> str:
    """Replace bare ``namespace`` identifiers (not string contents, comments or member names) with the alias."""
    if "namespace" not in source:
        return source
    out: list[str] = []
    i, n = 0, len(source)
    previous = ""  # last significant character before the current token
    while i < n:
        ch = source[i]
        if (
            ch in "'\""
            or (ch in "rRbB" and i + 1 < n and source[i + 1] in "'\"")
            or (ch in "rRbB" and i + 2 < n and source[i + 1] in "rRbB" and source[i + 2] in "'\"")
        ):
            end = _string_end(source, i)
            out.append(source[i:end])
            i, previous = end, "'"
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            out.append(source[i:end])
            i = end
        elif ch == "`":
            end = source.find("`", i + 1)
            end = n if end < 0 else end + 1
            out.append(source[i:end])
            i, previous = end, "`"
        elif ch in _IDENTIFIER_START:
            end = i + 1
            while end < n and source[end] in _IDENTIFIER_CHARS:
                end += 1
            word = source[i:end]
            out.append(NAMESPACE_ALIAS if word == "namespace" and previous != "." else word)
            i, previous = end, "a"
        else:
            out.append(ch)
            if not ch.isspace():
                previous = ch
            i += 1
    return "".join(out)


def _string_end(source: str, start: int) -> int:
    """Index after the string literal starting at ``start`` (prefix letters included)."""
    i = start
    raw = False
    while source[i] in "rRbB":
        raw = raw or source[i] in "rR"
        i += 1
    quote = source[i]
    triple = source.startswith(quote * 3, i)
    delimiter = quote * 3 if triple else quote
    i += len(delimiter)
    n = len(source)
    while i < n:
        if not raw and source[i] == "\\":
            i += 2
            continue
        if source.startswith(delimiter, i):
            return i + len(delimiter)
        if not triple and source[i] == "\n":
            return i
        i += 1
    return n


def object_variables(
    obj: Mapping[str, Any], group: str, version: str, resource: str, namespace: str, name: str
) -> dict[str, Any]:
    """The variables of an object expression (seed 002 ``object_selector_expression`` variables).

    Args:
        obj: the object as decoded JSON.
        group: its API group ("" for core).
        version: its (watched) version.
        resource: its plural resource name.
        namespace: its namespace ("" for cluster-scoped objects).
        name: its name.
    """
    meta = obj.get("metadata") or {}
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    return {
        "obj": obj,
        "group": group,
        "version": version,
        "resource": resource,
        NAMESPACE_ALIAS: namespace,
        "name": name,
        "labels": labels if isinstance(labels, dict) else {},
        "annotations": annotations if isinstance(annotations, dict) else {},
    }


def _clean(message: str) -> str:
    # cel-cpp prefixes "INVALID_ARGUMENT: ERROR: " and repeats the status code at the end.
    message = message.removeprefix("INVALID_ARGUMENT: ").removeprefix("ERROR: ")
    return message.removesuffix(" [INVALID_ARGUMENT]").strip()


def compile_resource_expression(source: str) -> CelProgram:
    """Compile a ``resource_selector_expression`` (variables ``group``, ``version``, ``resource``, ``namespaced``).

    Raises:
        CelCompileError: empty, too long, syntax or type error, or not of type bool.
    """
    return _compile("resource", source)


def compile_object_expression(source: str) -> CelProgram:
    """Compile an object expression (``object_selector_expression(s)`` of queries, namespaces and roots).

    Variables: ``obj``, ``group``, ``version``, ``resource``, ``namespace``, ``name``, ``labels``, ``annotations``.

    Raises:
        CelCompileError: empty, too long, syntax or type error, or not of type bool.
    """
    return _compile("object", source)
