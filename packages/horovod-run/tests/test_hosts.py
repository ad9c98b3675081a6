"""Host strings, hostfiles and the assignment of ranks to slots."""

import pytest

from horovod.runner.common.util import hosts
from horovod.runner.common.util.hosts import SlotInfo


def test_spec_example():
    slots = hosts.get_host_assignments(hosts.parse_hosts("worker-0:1,worker-1:2"), 3)
    assert slots == [
        SlotInfo("worker-0", rank=0, local_rank=0, cross_rank=0, size=3, local_size=1,
                 cross_size=2),
        SlotInfo("worker-1", rank=1, local_rank=0, cross_rank=1, size=3, local_size=2,
                 cross_size=2),
        SlotInfo("worker-1", rank=2, local_rank=1, cross_rank=0, size=3, local_size=2,
                 cross_size=1),
    ]


def test_max_num_proc_takes_first_slots_host_major():
    slots = hosts.get_host_assignments(hosts.parse_hosts("a:2,b:2"), 3, max_num_proc=3)
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            for s in slots] == [("a", 0, 0, 2, 0, 2), ("a", 1, 1, 2, 0, 1),
                                ("b", 2, 0, 1, 1, 2)]
    assert all(s.size == 3 for s in slots)


def test_not_enough_slots():
    with pytest.raises(ValueError, match="requested 5 processes but only 3"):
        hosts.get_host_assignments(hosts.parse_hosts("a:1,b:2"), 5)


def test_response_string_and_invalid_slot():
    slot = SlotInfo("h", rank=3, local_rank=1, cross_rank=2, size=8, local_size=4, cross_size=3)
    assert slot.to_response_string() == "3,8,1,4,2,3"
    assert hosts.INVALID_SLOT_INFO.rank == -1 and hosts.INVALID_SLOT_INFO.hostname == ""


def test_parse_hosts_and_slots():
    assert hosts.parse_hosts_and_slots("a:1,b.c-d:12") == (["a", "b.c-d"], {"a": 1, "b.c-d": 12})
    with pytest.raises(ValueError, match="name:slots"):
        hosts.parse_hosts_and_slots("a:1,b")
    info = hosts.HostInfo.from_string("host:4")
    assert (info.hostname, info.slots) == ("host", 4)


def test_parse_host_files(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("172.31.32.7 slots=8\n\n# comment\n172.31.33.9 slots=8\nsolo\n")
    assert hosts.parse_host_files(str(path)) == "172.31.32.7:8,172.31.33.9:8,solo:1"
    path.write_text("h slot=3\n")
    with pytest.raises(ValueError, match="slots="):
        hosts.parse_host_files(str(path))
    # Intel MPI's and MPICH's form, and Open MPI's max_slots, as the MPI Operator may write them.
    path.write_text("w-0.job-worker.ns.svc:2\nw-1.job-worker.ns.svc slots=2 max_slots=4\n")
    assert hosts.parse_host_files(str(path)) == "w-0.job-worker.ns.svc:2,w-1.job-worker.ns.svc:2"
    for bad in ("h:x\n", ":2\n"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="<host>:<n>"):
            hosts.parse_host_files(str(path))
