"""Host lists (``host:slots,...``) and the assignment of ranks to slots."""

import collections
import dataclasses
import re
from typing import Dict, List, Tuple

_HOST_RE = re.compile(r"^[\w.-]+:[0-9]+$")


class HostInfo:
    """A host name and its number of slots."""

    def __init__(self, hostname: str, slots: int):
        self.hostname = hostname
        self.slots = slots

    @staticmethod
    def from_string(host_string: str) -> "HostInfo":
        """Parse ``"host:slots"``. Raises ``ValueError`` if it has no ``:slots`` part."""
        hostname, sep, slots = host_string.strip().rpartition(":")
        if not sep or not hostname:
            raise ValueError("host '%s' must be given as <name>:<slots>" % host_string)
        return HostInfo(hostname, int(slots))

    def __repr__(self):
        return "HostInfo(%r, %d)" % (self.hostname, self.slots)


@dataclasses.dataclass
class SlotInfo:
    """The place of one worker: its host and its global, local and cross ranks and sizes."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def to_response_string(self) -> str:
        """``"rank,size,local_rank,local_size,cross_rank,cross_size"``."""
        return ",".join(str(v) for v in (self.rank, self.size, self.local_rank, self.local_size,
                                         self.cross_rank, self.cross_size))


INVALID_SLOT_INFO = SlotInfo("", -1, -1, -1, -1, -1, -1)


def parse_host_files(filename: str) -> str:
    """Turn a hostfile into ``"host:n,host:n"``.

    Lines are ``<host> slots=<n>`` (Open MPI's form; a ``max_slots=<m>`` field is ignored) or
    ``<host>:<n>`` (Intel MPI's and MPICH's); a host with neither gets 1 slot. Blank lines and
    lines starting with ``#`` are skipped. Raises ``ValueError`` for a line it cannot read.
    """
    hosts = []
    with open(filename) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            name, slots = fields[0], 1
            if len(fields) == 1 and ":" in name:
                name, _, value = name.rpartition(":")
                if not value.isdigit() or not name:
                    raise ValueError("cannot read hostfile line '%s': expected '<host>:<n>' or "
                                     "'<host> slots=<n>'" % line)
                slots = int(value)
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key not in ("slots", "max_slots") or not value.isdigit():
                    raise ValueError("cannot read hostfile line '%s': expected '<host> slots=<n>' "
                                     "or '<host>:<n>'" % line)
                if key == "slots":
                    slots = int(value)
            hosts.append("%s:%d" % (name, slots))
    return ",".join(hosts)


def parse_hosts_and_slots(hosts: str) -> Tuple[List[str], Dict[str, int]]:
    """Parse ``"host:n,host:n"`` into ``([names in order], {name: slots})``.

    Raises ``ValueError`` for an item that is not ``name:slots``.
    """
    names, slots = [], {}
    for item in hosts.split(","):
        if not _HOST_RE.match(item):
            raise ValueError("invalid host '%s': hosts must be given as name:slots,name:slots,... "
                             "(e.g. host1:2,host2:4)" % item)
        name, _, count = item.rpartition(":")
        names.append(name)
        slots[name] = int(count)
    return names, slots


def parse_hosts(hosts_string: str) -> List[HostInfo]:
    """Parse ``"host:n,host:n"`` into a list of :class:`HostInfo` (order kept)."""
    return [HostInfo.from_string(item) for item in hosts_string.split(",") if item.strip()]


def get_host_assignments(hosts: List[HostInfo], min_num_proc: int,
                         max_num_proc: int = None) -> List[SlotInfo]:
    """Assign ranks to slots, host by host in the given order, each host up to its slots.

    At most ``max_num_proc`` ranks are assigned (all slots when None). The cross rank of a slot
    is the index of its host among the hosts that have a slot with the same local rank.
    Raises ``ValueError`` if fewer than ``min_num_proc`` slots are available.
    """
    placed = []  # (hostname, local_rank) in rank order
    for host in hosts:
        for local_rank in range(host.slots):
            if max_num_proc is not None and len(placed) >= max_num_proc:
                break
            placed.append((host.hostname, local_rank))
    if len(placed) < min_num_proc:
        raise ValueError("requested %d processes but only %d slots are available on hosts %s"
                         % (min_num_proc, len(placed),
                            ",".join("%s:%d" % (h.hostname, h.slots) for h in hosts)))

    local_size = collections.Counter(host for host, _ in placed)
    hosts_by_local_rank = collections.defaultdict(list)
    for host, local_rank in placed:
        hosts_by_local_rank[local_rank].append(host)
    size = len(placed)
    return [SlotInfo(hostname=host, rank=rank, local_rank=local_rank,
                     cross_rank=hosts_by_local_rank[local_rank].index(host), size=size,
                     local_size=local_size[host],
                     cross_size=len(hosts_by_local_rank[local_rank]))
            for rank, (host, local_rank) in enumerate(placed)]
