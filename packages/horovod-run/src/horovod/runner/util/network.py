"""Local network facts: this host's addresses and interfaces, and which hosts are remote."""

import socket
from typing import Iterable, List, Optional, Set

import psutil

LOOPBACK_ADDRESS = "127.0.0.1"


def get_local_host_addresses() -> Set[str]:
    """All IPv4 and IPv6 addresses of this host's interfaces (plus 127.0.0.1)."""
    addresses = {LOOPBACK_ADDRESS}
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                addresses.add(addr.address.split("%")[0])
    return addresses


def resolve_host_address(host_name: str) -> Optional[str]:
    """The IPv4 address ``host_name`` resolves to, or None if it does not resolve."""
    try:
        return socket.gethostbyname(host_name)
    except OSError:
        return None


def filter_local_addresses(all_host_names: Iterable[str]) -> List[str]:
    """Return the host names (order kept) that do not resolve to an address of this host."""
    local = get_local_host_addresses()
    return [name for name in all_host_names if resolve_host_address(name) not in local]


def source_address_towards(address: str) -> str:
    """This host's IPv4 address from which the kernel routes to ``address`` (an IPv4 address).
    Nothing is sent: connecting a UDP socket only chooses the route and its source address.
    Raises ``OSError`` when there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        return s.getsockname()[0]


def get_loopback_intfs(nics: Optional[Set[str]] = None) -> List[str]:
    """Names (sorted) of the interfaces holding 127.0.0.1, restricted to ``nics`` unless it is
    None or empty."""
    found = []
    for name, addrs in psutil.net_if_addrs().items():
        if nics and name not in nics:
            continue
        if any(a.family == socket.AF_INET and a.address == LOOPBACK_ADDRESS for a in addrs):
            found.append(name)
    return sorted(found)


def get_local_intfs(nic: Optional[Set[str]] = None) -> List[str]:
    """Names (sorted) of this host's interfaces with an IPv4 address, restricted to ``nic`` (a
    set of names) unless it is None or empty."""
    found = []
    for name, addrs in psutil.net_if_addrs().items():
        if nic and name not in nic:
            continue
        if any(a.family == socket.AF_INET for a in addrs):
            found.append(name)
    return sorted(found)


def get_driver_ip(nics: Iterable[str]) -> str:
    """The first IPv4 address on the first of ``nics`` (in the given order) that has one.

    Raises ``RuntimeError`` if none of them has an IPv4 address.
    """
    nics = list(nics)
    all_addrs = psutil.net_if_addrs()
    for nic in nics:
        for addr in all_addrs.get(nic, []):
            if addr.family == socket.AF_INET:
                return addr.address
    raise RuntimeError("none of the network interfaces %s has an IPv4 address; choose others "
                       "with --network-interfaces" % ", ".join(nics))
