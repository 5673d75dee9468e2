"""Local ports for the stack and its tests."""

from __future__ import annotations

from ops.ports import free_ports, port_is_free


def test_ports_asked_for_together_are_distinct_and_free() -> None:
    """A stack's four ports come from one call: held open together, no two can be the same
    (ports asked for one by one were, once: the stack refused to start)."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert all(port_is_free(port) for port in ports)
