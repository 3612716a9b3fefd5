"""A tunnel still waiting for its descriptor is cut only when its peer, not kas, is behind (issue 28 item 5).

During a connection storm on a saturated machine kas was behind reading descriptors that had been sent at once,
cut those tunnels after 10 s and agentk re-opened them: repeated work. :class:`ArrivalOrder` tells the cases
apart: kas read past the waiting tunnel, or nothing else waits (the peer stalled), or neither (kas behind).
"""

from __future__ import annotations

from tether.modules.reverse_tunnel.server import ArrivalOrder


def test_a_waiting_tunnel_is_stalled_once_a_later_tunnel_s_descriptor_came() -> None:
    order = ArrivalOrder()
    first, second, third = order.waiting(), order.waiting(), order.waiting()
    assert (first, second, third) == (1, 2, 3)
    assert not any(order.stalled(n) for n in (first, second, third))  # kas has read nothing yet: behind
    order.done(first, read=True)
    assert not order.stalled(second) and not order.stalled(third)  # an earlier tunnel's descriptor: in turn
    fourth = order.waiting()
    order.done(fourth, read=True)
    assert order.stalled(second) and order.stalled(third)  # kas read past them: their peers stalled


def test_a_lone_waiting_tunnel_is_stalled() -> None:
    # Nothing else for kas to read (issue 9 item 5: a peer stalling before its descriptor is cut within seconds).
    order = ArrivalOrder()
    lone = order.waiting()
    assert order.stalled(lone)
    other = order.waiting()
    assert not order.stalled(lone) and not order.stalled(other)
    order.done(other, read=False)  # ended without its descriptor (cancelled): it no longer waits
    assert order.stalled(lone)
