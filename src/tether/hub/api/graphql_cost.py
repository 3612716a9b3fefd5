"""What one GraphQL request may cost the hub, reckoned from the document before anything runs (issue 27 item 3).

One 280-alias ``workspaces`` query over 1,000 workspaces once took 20 s, returned 62 MB and held the database
pool; so a request is measured first and refused with a GraphQL error, at once, when it asks for more than
:class:`Budget` allows: root fields (each one a resolver on the request's database session), aliases, workspaces
returned in all (each ``workspaces`` field counts its ``first``), devfile texts returned (up to 64 KiB each), the
page size of one ``workspaces`` field, and depth (introspection nests deeply). Tokens are bounded while parsing
(Strawberry's ``MaxTokensLimiter``). Strawberry's depth limiter is not used: it walks a fragment once per spread,
so 30 fragments spreading the next one twice kept the hub busy for hours.

The reckoning walks the operation as written: fragments are expanded (each fragment reckoned once and reused, so
nested spreads cannot make the walk itself expensive; a fragment cycle counts as nothing here and is refused by
GraphQL's own validation), ``first`` is read from the literal or the request's variables, default 100 (the
resolver's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    IntValueNode,
    NullValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    VariableNode,
)

#: ``first`` of ``workspaces`` when the query does not give it.
DEFAULT_PAGE = 100


@dataclass(frozen=True)
class Budget:
    """The most one request may ask for.

    Attributes:
        root_fields: top-level fields of the operation, aliases included (GitLab multiplexes at most 50
            queries; one request of ours is one query, so a handful of root fields is plenty).
        aliases: aliased fields anywhere in the operation.
        depth: fields nested in one another (``workspaces { nodes { clusterAgent { name } } }`` is 4).
        nodes: workspaces returned in all: ``first`` of every ``workspaces`` field plus one per ``workspace``.
        devfiles: ``devfile`` texts returned in all (counted as ``nodes``).
        page: the largest ``first`` of one ``workspaces`` field (1 to ``page``).
    """

    root_fields: int = 10
    aliases: int = 20
    depth: int = 8
    nodes: int = 1000
    devfiles: int = 100
    page: int = 1000


@dataclass
class Cost:
    """What an operation (or a fragment, per unit of its enclosing list) asks for.

    Attributes:
        root_fields, aliases: counted as written (a fragment spread twice counts twice).
        depth: the deepest nesting of fields.
        nodes, devfiles: as :class:`Budget`.
        pages: the distinct values of ``first`` given to ``workspaces`` fields.
    """

    root_fields: int = 0
    aliases: int = 0
    depth: int = 0
    nodes: int = 0
    devfiles: int = 0
    pages: frozenset[int] = frozenset()

    def add(self, other: Cost, times: int = 1) -> None:
        """Add ``other`` (its ``nodes`` and ``devfiles`` multiplied by ``times``)."""
        self.root_fields += other.root_fields
        self.aliases += other.aliases
        self.depth = max(self.depth, other.depth)
        self.nodes += other.nodes * times
        self.devfiles += other.devfiles * times
        self.pages |= other.pages


class _Reckoner:
    def __init__(self, fragments: Mapping[str, FragmentDefinitionNode], variables: Mapping[str, Any]) -> None:
        self._fragments = fragments
        self._variables = variables
        self._done: dict[tuple[str, bool], Cost] = {}
        self._open: set[tuple[str, bool]] = set()
        self._defaults: dict[str, Any] = {}

    def operation(self, node: OperationDefinitionNode) -> Cost:
        self._defaults = {
            d.variable.name.value: d.default_value for d in node.variable_definitions or () if d.default_value
        }
        return self._selection(node.selection_set, root=True)

    def _selection(self, selection_set: SelectionSetNode | None, root: bool) -> Cost:
        cost = Cost()
        for selection in selection_set.selections if selection_set is not None else ():
            if isinstance(selection, FieldNode):
                cost.add(self._field(selection, root))
            elif isinstance(selection, InlineFragmentNode):
                cost.add(self._selection(selection.selection_set, root))
            elif isinstance(selection, FragmentSpreadNode):
                cost.add(self._fragment(selection.name.value, root))
        return cost

    def _fragment(self, name: str, root: bool) -> Cost:
        key = (name, root)
        if key in self._done:
            return self._done[key]
        definition = self._fragments.get(name)
        if definition is None or key in self._open:  # unknown or cyclic: GraphQL's validation refuses it
            return Cost()
        self._open.add(key)
        cost = self._selection(definition.selection_set, root)
        self._open.discard(key)
        self._done[key] = cost
        return cost

    def _field(self, node: FieldNode, root: bool) -> Cost:
        name = node.name.value
        cost = Cost(root_fields=int(root), aliases=int(node.alias is not None))
        times = 1
        if name == "workspaces":
            times = self._first(node)
            cost.pages = frozenset({times})
            cost.nodes = times
        elif name == "workspace":
            cost.nodes = 1
        elif name == "devfile":
            cost.devfiles = 1
        inner = self._selection(node.selection_set, root=False)
        cost.add(inner, times)
        cost.depth = 1 + inner.depth
        return cost

    def _first(self, node: FieldNode) -> int:
        for argument in node.arguments or ():
            if argument.name.value != "first":
                continue
            value: Any = argument.value
            if isinstance(value, VariableNode):
                name = value.name.value
                value = self._variables[name] if name in self._variables else self._defaults.get(name)
            if isinstance(value, IntValueNode):
                value = int(value.value)
            if value is None or isinstance(value, NullValueNode):
                return DEFAULT_PAGE
            # A value of another type is GraphQL's error to report; reckon it as large as a page may be.
            return value if isinstance(value, int) and not isinstance(value, bool) else 10**9
        return DEFAULT_PAGE


def problems(cost: Cost, budget: Budget) -> list[str]:
    """What in ``cost`` goes beyond ``budget``, one sentence each naming the limit (empty when nothing does)."""
    found = [
        f"workspaces(first: {page}): first must be between 1 and {budget.page}"
        for page in sorted(cost.pages)
        if not 1 <= page <= budget.page
    ]
    for what, asked, most in (
        ("top-level fields", cost.root_fields, budget.root_fields),
        ("aliases", cost.aliases, budget.aliases),
        ("levels of nested fields", cost.depth, budget.depth),
        ("workspaces returned (the sum of first over every workspaces field)", cost.nodes, budget.nodes),
        ("devfiles returned", cost.devfiles, budget.devfiles),
    ):
        if asked > most:
            found.append(f"the query asks for {asked} {what}; at most {most} per request")
    return found


def reckon(
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any] | None = None,
) -> Cost:
    """The cost of ``operation`` with ``fragments`` (name -> definition) and the request's ``variables``."""
    return _Reckoner(fragments, variables or {}).operation(operation)


def budget_rule(
    budget: Budget, variables: Mapping[str, Any] | None, record: Callable[[Cost], None] | None = None
) -> type[ValidationRule]:
    """A graphql-core validation rule refusing each operation of the document that goes beyond ``budget``.

    Args:
        budget: the limits.
        variables: the request's variables (``first`` may be one).
        record: called with each operation's cost.

    The error's ``extensions.code`` is ``query_too_expensive``.
    """

    class BudgetRule(ValidationRule):
        """Reckons every operation once, when validation starts."""

        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            definitions = context.document.definitions
            fragments = {d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)}
            for definition in definitions:
                if not isinstance(definition, OperationDefinitionNode):
                    continue
                cost = reckon(definition, fragments, variables)
                if record is not None:
                    record(cost)
                for problem in problems(cost, budget):
                    context.report_error(GraphQLError(problem, definition, extensions={"code": "query_too_expensive"}))

    return BudgetRule
