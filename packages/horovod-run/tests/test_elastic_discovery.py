"""Host discovery and blacklisting of the elastic launcher (runner.md §5.5), in one process."""

import time

import pytest

from horovod.runner.elastic import discovery
from horovod.runner.elastic.worker import HostUpdateResult


def test_hosts_keep_the_order_they_were_listed_in_and_new_ones_come_last():
    fixed = discovery.FixedHosts({"localhost": 1, "127.0.0.1": 1})
    manager = discovery.HostManager(fixed)
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert manager.current_hosts.host_assignment_order == ["localhost", "127.0.0.1"]
    fixed.set({"b-new": 2, "127.0.0.1": 1, "localhost": 1})
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert manager.current_hosts.host_assignment_order == ["localhost", "127.0.0.1", "b-new"]
    fixed.set({"b-new": 2, "localhost": 1})
    assert manager.update_available_hosts() == HostUpdateResult.removed
    assert manager.current_hosts.host_assignment_order == ["localhost", "b-new"]
    fixed.set({"b-new": 1, "localhost": 1, "c": 1})
    assert manager.update_available_hosts() == HostUpdateResult.mixed
    assert manager.update_available_hosts() == HostUpdateResult.no_update


def test_permanent_blacklist():
    manager = discovery.HostManager(discovery.FixedHosts({"a": 2, "b": 2}))
    manager.update_available_hosts()
    event = manager.get_host_event("b")
    manager.blacklist("b")
    assert event.is_set() and manager.is_blacklisted("b")
    assert manager.current_hosts.host_slots == {"a": 2}
    assert manager.update_available_hosts() == HostUpdateResult.no_update
    assert manager.current_hosts.count_available_slots() == 2


def test_a_blacklisted_host_that_left_the_discovery_comes_back_as_a_new_host():
    # A deleted pod: its worker fails (blacklisting), its discovery line goes, it comes back.
    hosts = discovery.FixedHosts({"a": 2, "b": 2})
    manager = discovery.HostManager(hosts)
    manager.update_available_hosts()
    manager.blacklist("b")
    old_event = manager.get_host_event("b")
    assert manager.update_available_hosts() == HostUpdateResult.no_update and manager.is_blacklisted("b")
    hosts.set({"a": 2})
    manager.update_available_hosts()
    assert not manager.is_blacklisted("b") and manager.forgotten == ["b"]
    hosts.set({"a": 2, "b": 2})
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert manager.current_hosts.host_slots == {"a": 2, "b": 2}
    assert old_event.is_set() and not manager.get_host_event("b").is_set()


def test_cooldown_brings_the_host_back_with_back_off():
    manager = discovery.HostManager(discovery.FixedHosts({"a": 1, "b": 1}), cooldown_range=(1, 2))
    manager.update_available_hosts()
    manager.blacklist("b")
    assert manager.update_available_hosts() == HostUpdateResult.no_update
    time.sleep(2.1)  # the cooldown is clamped to at most 2 s
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert not manager.is_blacklisted("b") and not manager.get_host_event("b").is_set()
    assert manager.current_hosts.host_assignment_order == ["a", "b"]


@pytest.mark.parametrize("bad", [(0, 5), (5, 2), (1, 3601)])
def test_cooldown_range_is_checked(bad):
    with pytest.raises(ValueError, match="cooldown"):
        discovery.HostManager(discovery.FixedHosts({"a": 1}), cooldown_range=bad)


@pytest.mark.parametrize("output,expected", [
    ("", {}), ("host-1", {"host-1": 3}), ("host-1:2\n\nhost-4:3\n", {"host-1": 2, "host-4": 3}),
    ("h:1\nh:1\n", {"h": 1})])
def test_discovery_script_output(output, expected):
    script = discovery.HostDiscoveryScript("unused", 3)
    script._execute_discovery_script = lambda: output
    assert script.find_available_hosts_and_slots() == expected


def test_discovery_script_failure_names_script_and_code(tmp_path):
    script = tmp_path / "fail.sh"
    script.write_text("#!/bin/sh\nexit 4\n")
    script.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"fail.sh\. Exit code: 4"):
        discovery.HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots()
