"""A tunnel waiting alone for its descriptor is cut soon; among others, later (issue 28 item 5).

During a connection storm on a saturated machine kas cut tunnels whose descriptor had been sent at once, and
agentk re-opened them: repeated work. :class:`DescriptorWaits` tells a lone stalled peer (nothing else for kas to
read) from a storm; the time bounds themselves are in :mod:`tether.modules.reverse_tunnel.server`.
"""

from __future__ import annotations

from tether.modules.reverse_tunnel.server import DescriptorWaits


def test_a_tunnel_waits_alone_until_another_starts_waiting() -> None:
    waits = DescriptorWaits()
    waits.start()
    assert waits.alone()  # issue 9 item 5: a lone stalled peer is cut after DESCRIPTOR_TIMEOUT_S
    waits.start()
    assert not waits.alone()  # a storm: DESCRIPTOR_MAX_TIMEOUT_S
    waits.stop()  # the other one's descriptor came, or it ended
    assert waits.alone()
