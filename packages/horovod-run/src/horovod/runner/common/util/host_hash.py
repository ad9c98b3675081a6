"""A stable identifier of "this host": processes with the same hash share a machine."""

import hashlib
import os
import socket

_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")


def _hash(string):
    """Hex MD5 of ``string`` (an identifier, not a security measure)."""
    return hashlib.md5(string.encode("utf-8"), usedforsecurity=False).hexdigest()


def host_hash(salt=None):
    """The host name plus the Linux namespaces of this process (containers on one machine
    differ), hashed; ``salt`` (str) is mixed in when given."""
    parts = [socket.gethostname()]
    for name in _NAMESPACES:
        try:
            parts.append(os.readlink("/proc/self/ns/" + name))
        except OSError:
            pass
    if salt is not None:
        parts.append(str(salt))
    return "%s-%s" % (socket.gethostname(), _hash("-".join(parts)))
