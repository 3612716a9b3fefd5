"""Run-time check of the message order in a gRPC stream, driven by the proto automata options.

Every streamed message of the protocol (``ConnectRequest``/``ConnectResponse``, kas.md §1.3;
``GatewayKasResponse``, kas.md §2.3; ``grpctool.HttpRequest``/``HttpResponse``, kas.md §5.2) puts its
payload in one oneof and declares the allowed order on it with the options of
``proto/gitlab/agent/automata/automata.proto``: ``first_allowed_field`` (OneofOptions, 92001) lists the
field numbers allowed in the first message, ``next_allowed_field`` (FieldOptions, 92000) on each field
lists the field numbers allowed after a message with that field set; ``-1`` stands for the end of the
stream (EOF). The rules are read from the generated descriptors, so the ``.proto`` files stay the single
source of truth.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.descriptor import Descriptor, OneofDescriptor
from google.protobuf.message import Message

from tether.pb.gitlab.agent.automata import automata_pb2

__all__ = ["EOF", "StreamAutomaton", "StreamOrderError", "StreamRules", "eof_allowed_first", "stream_rules"]

EOF: Final[int] = -1
"""The pseudo field number that stands for the end of the stream in the automata options."""

M = TypeVar("M", bound=Message)


class StreamOrderError(ValueError):
    """A stream violated the order declared by its automata options.

    Raised by :meth:`StreamAutomaton.visit` (unexpected field, no oneof field set, message after the
    end) and :meth:`StreamAutomaton.end` (stream ended where EOF is not allowed). Callers map it to a
    gRPC status (kas.md §11 suggests ``InvalidArgument``/``Internal``).
    """


@dataclass(frozen=True)
class StreamRules:
    """The automaton of one streamed message type, as declared in its descriptor.

    Attributes:
        message_name: Short proto name of the message, e.g. ``"ConnectRequest"``.
        full_name: Full proto name, e.g. ``"gitlab.agent.reverse_tunnel.rpc.ConnectRequest"``.
        oneof_name: Name of the oneof that carries the rules, e.g. ``"msg"``.
        field_names: Field number -> field name for every field of that oneof.
        first: Field numbers (and possibly :data:`EOF`) allowed as the first event of the stream.
        next: Field number -> field numbers (and possibly :data:`EOF`) allowed after it.
    """

    message_name: str
    full_name: str
    oneof_name: str
    field_names: Mapping[int, str]
    first: frozenset[int]
    next: Mapping[int, frozenset[int]]

    def field_number(self, name: str) -> int:
        """Return the number of oneof field ``name``; raise ``KeyError`` if the oneof has no such field."""
        for number, field_name in self.field_names.items():
            if field_name == name:
                return number
        raise KeyError(f"{self.message_name}.{self.oneof_name} has no field {name!r}")

    def describe(self, numbers: frozenset[int]) -> str:
        """Render ``numbers`` as ``"header (2), error (5)"`` in field-number order, ``EOF`` last."""
        parts = [f"{self.field_names[n]} ({n})" for n in sorted(numbers) if n != EOF]
        if EOF in numbers:
            parts.append("EOF")
        return ", ".join(parts) if parts else "nothing"


def _automaton_oneof(descriptor: Descriptor, oneof: str | None) -> OneofDescriptor:
    if oneof is not None:
        try:
            return descriptor.oneofs_by_name[oneof]
        except KeyError:
            raise ValueError(f"{descriptor.full_name} has no oneof {oneof!r}") from None
    candidates = [o for o in descriptor.oneofs if o.GetOptions().Extensions[automata_pb2.first_allowed_field]]
    if len(candidates) != 1:
        found = ", ".join(o.name for o in candidates) or "none"
        raise ValueError(
            f"{descriptor.full_name}: expected exactly one oneof with first_allowed_field, found {found}; "
            "pass the oneof name explicitly"
        )
    return candidates[0]


@functools.cache
def _rules(descriptor: Descriptor, oneof: str | None) -> StreamRules:
    # Descriptors are immutable for the life of the process, so the parsed rules can be shared.
    group = _automaton_oneof(descriptor, oneof)
    names = {f.number: f.name for f in group.fields}
    first = frozenset(group.GetOptions().Extensions[automata_pb2.first_allowed_field])
    if not first:
        raise ValueError(f"{descriptor.full_name}.{group.name} declares no first_allowed_field")
    transitions: dict[int, frozenset[int]] = {}
    for field in group.fields:
        allowed = frozenset(field.GetOptions().Extensions[automata_pb2.next_allowed_field])
        if not allowed:
            # Without any successor (not even EOF) a stream could neither continue nor end after this field.
            raise ValueError(f"{descriptor.full_name}.{field.name} declares no next_allowed_field")
        transitions[field.number] = allowed
    for source, numbers in [("first_allowed_field", first), *((names[k], v) for k, v in transitions.items())]:
        unknown = sorted(n for n in numbers if n != EOF and n not in names)
        if unknown:
            raise ValueError(f"{descriptor.full_name}.{group.name}: {source} refers to unknown field numbers {unknown}")
    return StreamRules(
        message_name=descriptor.name,
        full_name=descriptor.full_name,
        oneof_name=group.name,
        # Read-only views: the cached rules are shared by every automaton of this message type.
        field_names=types.MappingProxyType(names),
        first=first,
        next=types.MappingProxyType(transitions),
    )


def stream_rules(message_class: type[Message], oneof: str | None = None) -> StreamRules:
    """Read the automaton declared on ``message_class`` (a generated class such as ``ConnectRequest``).

    Args:
        message_class: A generated protobuf message class whose oneof carries the automata options.
        oneof: Name of that oneof; by default the single oneof carrying ``first_allowed_field``.

    Returns:
        The parsed rules; cached per descriptor.

    Raises:
        ValueError: No or several oneofs carry ``first_allowed_field`` (and ``oneof`` was not given),
            the named oneof does not exist, a field declares no ``next_allowed_field``, or an option
            refers to a field number outside the oneof.
    """
    return _rules(message_class.DESCRIPTOR, oneof)


def eof_allowed_first(message_class: type[Message], oneof: str | None = None) -> bool:
    """Tell whether a stream of ``message_class`` may end before its first message.

    True for ``ConnectResponse`` (kas retires an unused tunnel, kas.md §1.3) and ``GatewayKasResponse``
    (kas.md §2.3); false for ``ConnectRequest`` and the grpctool HTTP messages (kas.md §5.2).

    Raises:
        ValueError: As :func:`stream_rules`.
    """
    return EOF in stream_rules(message_class, oneof).first


class StreamAutomaton(Generic[M]):
    """Validates, message by message, that one stream follows its declared order.

    One instance tracks one direction of one stream; it is not thread-safe. Feed every received (or
    about-to-be-sent) message to :meth:`visit` and call :meth:`end` when the stream ends. A rejected
    message does not change the state.

    Example: ``StreamAutomaton(ConnectRequest)`` accepts ``descriptor, header, message*, trailer[, error]``
    and ``descriptor, error``, each followed by EOF (kas.md §1.3).
    """

    def __init__(self, message_class: type[M], oneof: str | None = None, *, after: str | None = None) -> None:
        """Build the automaton for ``message_class``.

        Args:
            message_class: Generated message class, e.g. ``ConnectRequest`` or ``grpctool_pb2.HttpRequest``.
            oneof: The oneof carrying the rules; auto-detected when omitted.
            after: Start in the state reached after a message with this oneof field, for a stream whose
                earlier part was consumed elsewhere (kas reads the ``descriptor`` when registering a
                tunnel and relays the rest, kas.md §1.7).

        Raises:
            ValueError: As :func:`stream_rules`.
            KeyError: ``after`` is not a field of the oneof.
        """
        self._class = message_class
        self._rules = stream_rules(message_class, oneof)
        self._last: int | None = None if after is None else self._rules.field_number(after)
        self._ended = False

    @property
    def rules(self) -> StreamRules:
        """The declared rules this automaton enforces."""
        return self._rules

    @property
    def last(self) -> str | None:
        """Name of the oneof field of the last accepted message, or ``None`` before the first one."""
        return None if self._last is None else self._rules.field_names[self._last]

    @property
    def ended(self) -> bool:
        """Whether :meth:`end` has accepted the end of the stream."""
        return self._ended

    @property
    def allowed(self) -> frozenset[int]:
        """Field numbers (and possibly :data:`EOF`) allowed next; empty once the stream has ended."""
        if self._ended:
            return frozenset()
        return self._rules.first if self._last is None else self._rules.next[self._last]

    @property
    def eof_allowed(self) -> bool:
        """Whether the stream may end now."""
        return EOF in self.allowed

    def visit(self, message: M) -> str:
        """Accept ``message`` if its oneof field may follow the previous message.

        Args:
            message: An instance of the class the automaton was built for.

        Returns:
            The name of the oneof field set in ``message`` (e.g. ``"header"``), for dispatching.

        Raises:
            TypeError: ``message`` is of another message type.
            StreamOrderError: No oneof field is set, the field is not allowed here, or the stream has
                already ended.
        """
        rules = self._rules
        if message.DESCRIPTOR.full_name != rules.full_name:
            raise TypeError(f"expected {rules.full_name}, got {message.DESCRIPTOR.full_name}")
        name: str | None = message.WhichOneof(rules.oneof_name)
        if name is None:
            raise StreamOrderError(f"{rules.message_name}: no oneof field set in {rules.oneof_name!r}")
        number: int = message.DESCRIPTOR.fields_by_name[name].number
        if self._ended:
            raise StreamOrderError(f"{rules.message_name}: got {name!r} ({number}) after the end of the stream")
        allowed = self.allowed
        if number not in allowed:
            where = self._position("as the first message")
            raise StreamOrderError(
                f"{rules.message_name}: got {name!r} ({number}) {where}; allowed: {rules.describe(allowed)}"
            )
        self._last = number
        return name

    def end(self) -> None:
        """Accept the end of the stream (EOF) if the declared order allows it here.

        Raises:
            StreamOrderError: EOF is not allowed after the last message (or before the first), or
                :meth:`end` was already called.
        """
        rules = self._rules
        if self._ended:
            raise StreamOrderError(f"{rules.message_name}: stream ended twice")
        allowed = self.allowed
        if EOF not in allowed:
            where = self._position("before the first message")
            raise StreamOrderError(f"{rules.message_name}: stream ended {where}; expected {rules.describe(allowed)}")
        self._ended = True

    def _position(self, at_start: str) -> str:
        if self._last is None:
            return at_start
        return f"after {self._rules.field_names[self._last]!r} ({self._last})"
