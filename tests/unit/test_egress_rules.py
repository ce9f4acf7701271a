"""`elastrain.backends.egress`: the rules of a cluster bridge and the ports an admin opens."""

from __future__ import annotations

import pytest

from elastrain.backends.egress import COMMENT, HostEgress, parse_ports


def test_opened_ports_are_accepted_before_everything_new_is_rejected() -> None:
    rules = HostEgress(open_ports=(5432, 9100)).rules("podman7", "elastrain-k-c")
    assert [rule[rule.index("-j") + 1] for rule in rules] == ["ACCEPT", "ACCEPT", "REJECT"]
    assert [rule[rule.index("--dport") + 1] for rule in rules[:2]] == ["5432", "9100"]
    for rule in rules:
        assert rule[:2] == ["-i", "podman7"] and "NEW" in rule and f"{COMMENT}:elastrain-k-c" in rule
    assert "--dport" not in rules[-1]  # every other port and protocol


def test_by_default_no_host_port_is_open() -> None:
    (only,) = HostEgress().rules("podman1", "n")
    assert only[-3:] == ["REJECT", "--reject-with", "icmp-admin-prohibited"]


def test_ports_are_checked() -> None:
    assert parse_ports(["9100", 5432, "9100"]) == (5432, 9100)
    with pytest.raises(ValueError, match="out of range"):
        parse_ports(["70000"])
    with pytest.raises(ValueError, match="not a number"):
        parse_ports(["http"])
