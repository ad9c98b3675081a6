"""Helpers of horovod.ray: blocking maps over actors, and the network interfaces of the job."""

import socket
from typing import Any, Callable, Dict, Iterable, List, Optional

import psutil
import ray

from horovod.runner.driver import driver_service
from horovod.runner.util import network
from horovod.runner.common.util import env_names


def map_blocking(fn: Callable[[Any], "ray.ObjectRef"], collection: Iterable[Any]) -> List[Any]:
    """``ray.get`` of ``fn(item)`` (an object ref) for every item, in order."""
    return ray.get([fn(item) for item in collection])


def _interface_of_node_ip(_executable=None) -> Optional[str]:
    """The name of this machine's interface that holds its Ray node IP (None if none does)."""
    ip = ray.util.get_node_ip_address()
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def detect_nics(settings, all_host_names: List[str], node_workers: Optional[List] = None) -> List[str]:
    """The network interfaces the workers use (Gloo takes the first).

    * Every host is this machine: the interfaces holding 127.0.0.1 (within ``settings.nics``).
    * Otherwise ``settings.nics`` when given.
    * Otherwise the interface that carries the Ray node IP on each host, found by running a
      function on one worker per host (``node_workers``, through ``execute``); the hosts must
      agree on its name.

    Raises:
        ValueError: no interface could be chosen; the message says to pass ``nics``.
    """
    if not network.filter_local_addresses(all_host_names):
        return driver_service.get_local_interfaces(settings)
    if settings.nics:
        return sorted(settings.nics)
    if not node_workers:
        raise ValueError("the workers run on other hosts (%s) and no worker per host was given to find "
                         "their network interface: pass nics={'<interface>'} to "
                         "RayExecutor.create_settings" % ", ".join(sorted(set(all_host_names))))
    found = ray.get([w.execute.remote(_interface_of_node_ip) for w in node_workers])
    names = set(found)
    if None in names or len(names) != 1:
        raise ValueError("cannot choose one network interface for the workers: the interfaces holding "
                         "the Ray node IP on their hosts are %s; pass nics={'<interface>'} to "
                         "RayExecutor.create_settings"
                         % ", ".join(str(n) for n in found))
    return sorted(names)


def nics_to_env_var(nics: Iterable[str]) -> Dict[str, str]:
    """``HOROVOD_GLOO_IFACE`` (the first interface) and ``NCCL_SOCKET_IFNAME`` (all, comma-joined)."""
    nics = list(nics)
    return {env_names.GLOO_IFACE: nics[0], env_names.NCCL_SOCKET_IFNAME: ",".join(nics)}
