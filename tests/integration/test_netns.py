"""The namespace "hosts" of the launch tests: side-by-side test processes get disjoint subnets.

Two bridges in one /24 route one test's packets into the other's namespaces (an sshd that
never answers); a bridge is given a /24 that no interface of the host already has.
"""

from __future__ import annotations

import os

import pytest

from tests.netns import Net, _free_subnet, cannot_make_namespaces, sh

pytestmark = pytest.mark.integration


def test_a_bridge_takes_a_subnet_no_other_interface_has() -> None:
    reason = cannot_make_namespaces()
    if reason is not None:
        pytest.skip(reason)
    first = _free_subnet()  # the one this process would take
    squatter = f"rlsq{os.getpid() % 10000}"
    sh("ip", "link", "add", squatter, "type", "bridge")
    nets: list[Net] = []
    try:
        sh("ip", "addr", "add", f"10.231.{first}.1/24", "dev", squatter)  # another test's bridge
        for k in range(2):
            net = Net.for_test(f"rlt{k}")
            nets.append(net)
            net.up()
        subnets = [net.subnet for net in nets]
        assert f"10.231.{first}" not in subnets
        assert subnets[0] != subnets[1], subnets
        net = nets[0]
        net.add()
        assert net.addrs == [f"{net.subnet}.10"]
    finally:
        for net in nets:
            net.teardown()
        sh("ip", "link", "del", squatter)
