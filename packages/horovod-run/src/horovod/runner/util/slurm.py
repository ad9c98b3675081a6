"""The hosts and slots of the Slurm allocation horovodrun runs in.

To the launcher Slurm is a source of hosts and slots (this module) and ``srun`` a way to start
processes on them (:mod:`horovod.runner.srun_run`). Inside an allocation (``salloc``, or a line of
an ``sbatch`` script) Slurm describes it in the environment:

* ``SLURM_JOB_ID``: the job;
* ``SLURM_JOB_NODELIST``: its nodes in Slurm's hostlist syntax, e.g. ``n[01-03,07],g[1-2]``
  (:func:`~horovod.common.slurm.parse_hostlist`);
* ``SLURM_TASKS_PER_NODE``: tasks of each node in that order, runs compressed as ``2(x3),1``
  (:func:`~horovod.common.slurm.parse_tasks_per_node`); one slot per task;
* ``SLURM_NTASKS``: the number of tasks (the default ``-np``).

A node's address, for the route from this host to the nodes, is its ``NodeAddr`` as
``scontrol show node`` reports it, else what its name resolves to.
"""

import os
import subprocess

from horovod.common.slurm import parse_hostlist, parse_tasks_per_node  # noqa: F401 - part of this module's API
from horovod.runner.elastic.discovery import HostDiscovery
from horovod.runner.util import network

SCONTROL_TIMEOUT_S = 30


def in_allocation(environ=None):
    """True when ``environ`` (default ``os.environ``) is that of a Slurm job: ``SLURM_JOB_ID``
    and ``SLURM_JOB_NODELIST`` are set."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))


class Allocation:
    """The nodes and slots of one Slurm job, read by :func:`allocation`.

    Attributes:
        job_id (str): ``SLURM_JOB_ID``.
        nodes (list of str): the nodes, in Slurm's order.
        slots (list of int): tasks (slots) of each node, in the same order.
        source (str): the variables it was read from, with their values, for messages.
    """

    def __init__(self, job_id, nodes, slots, source):
        self.job_id = job_id
        self.nodes = nodes
        self.slots = slots
        self.source = source

    @property
    def total_slots(self):
        return sum(self.slots)

    def hosts_argument(self):
        """``"n1:2,n2:2"``: the allocation as ``horovodrun -H`` takes it."""
        return ",".join("%s:%d" % (node, slots) for node, slots in zip(self.nodes, self.slots, strict=True))

    def describe(self):
        """One line for messages: what was allocated and where it was read."""
        return "Slurm job %s has %d slot(s) on %d node(s): %s (from %s)" % (
            self.job_id, self.total_slots, len(self.nodes), self.hosts_argument(), self.source)


def allocation(environ=None):
    """The :class:`Allocation` of the Slurm job of ``environ`` (default ``os.environ``).

    Slots per node come from ``SLURM_TASKS_PER_NODE``; where it is not set (an allocation made
    without a task count), from ``SLURM_JOB_CPUS_PER_NODE``, one slot per CPU.

    Raises:
        RuntimeError: not inside a Slurm job (see :func:`in_allocation`), or the variables do
            not parse or do not agree (as many counts as nodes).
    """
    environ = os.environ if environ is None else environ
    if not in_allocation(environ):
        raise RuntimeError("not inside a Slurm allocation: SLURM_JOB_ID and SLURM_JOB_NODELIST are "
                           "not both set")
    nodelist = environ["SLURM_JOB_NODELIST"]
    counts_name = "SLURM_TASKS_PER_NODE" if environ.get("SLURM_TASKS_PER_NODE") else "SLURM_JOB_CPUS_PER_NODE"
    counts_value = environ.get(counts_name, "")
    try:
        nodes = parse_hostlist(nodelist)
        slots = parse_tasks_per_node(counts_value) if counts_value else [1] * len(nodes)
    except ValueError as e:
        raise RuntimeError("cannot read the Slurm allocation: %s" % e) from None
    source = "SLURM_JOB_NODELIST=%s, %s=%s" % (nodelist, counts_name, counts_value or "(unset)")
    if len(slots) != len(nodes):
        raise RuntimeError("cannot read the Slurm allocation: %d node(s) but %d count(s) (%s)"
                           % (len(nodes), len(slots), source))
    return Allocation(environ["SLURM_JOB_ID"], nodes, slots, source)


def node_address(node):
    """The IPv4 address of Slurm node ``node`` (str): its ``NodeAddr`` from ``scontrol show
    node``, else what its name resolves to; None when neither gives one."""
    try:
        result = subprocess.run(["scontrol", "-o", "show", "node", node], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
        for word in result.stdout.split():
            if word.startswith("NodeAddr="):
                address = network.resolve_host_address(word.partition("=")[2])
                if address:
                    return address
    except (OSError, subprocess.TimeoutExpired):
        pass
    return network.resolve_host_address(node)


# Node states (sinfo's %T, lower case) in which a node of the job runs its tasks; any other
# (down, drained, draining, fail, failing, future, maint, reboot, unknown), or a state ending in
# "*" (the node does not respond), takes the node out of an elastic job.
USABLE_STATES = ("allocated", "mixed", "idle", "completing", "planned")


def job_nodes(job_id):
    """The nodes job ``job_id`` (str) holds now, in order, as ``scontrol show job`` reports
    them: Slurm drops a node set DOWN from a running job's node list.

    Raises:
        RuntimeError: scontrol fails, times out, or does not report the job's node list.
    """
    try:
        result = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError("cannot ask Slurm for job %s's nodes: %s" % (job_id, e)) from None
    for word in result.stdout.split():
        if word.startswith("NodeList="):
            value = word.partition("=")[2]
            return [] if value in ("", "(null)") else parse_hostlist(value)
    raise RuntimeError("scontrol show job %s did not list the job's nodes (exit status %d): %s"
                       % (job_id, result.returncode, (result.stderr or result.stdout).strip()))


def node_states(nodes):
    """``{node: state}`` for ``nodes`` (list of str) as ``sinfo -N -h -o "%N %T"`` reports
    them (lower case, e.g. ``"allocated"``, ``"down"``, ``"idle*"``); a node sinfo does not
    list is missing from the result.

    Raises:
        RuntimeError: sinfo fails or times out.
    """
    if not nodes:
        return {}
    try:
        result = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T", "-n", ",".join(nodes)],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError("cannot ask Slurm for the state of %s: %s" % (",".join(nodes), e)) from None
    if result.returncode != 0:
        raise RuntimeError("sinfo failed (exit status %d): %s" % (result.returncode, result.stderr.strip()))
    states = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].lower()
    return states


class AllocationDiscovery(HostDiscovery):
    """Host discovery of an elastic job inside a Slurm allocation (``horovodrun --min-np``
    without ``--host-discovery-script``): the nodes the job still holds (:func:`job_nodes`)
    whose state is usable (:data:`USABLE_STATES`, :func:`node_states`), each with the slots the
    allocation gave it. A node that fails or is set DOWN leaves the list; Slurm gives it back
    only to a new allocation, so the job cannot grow past what it holds.

    Args:
        allocation: the job's :class:`Allocation`.
    """

    def __init__(self, allocation):
        self.allocation = allocation
        self._slots = dict(zip(allocation.nodes, allocation.slots, strict=True))

    def find_available_hosts_and_slots(self):
        """``{node: slots}`` of the usable nodes, in the allocation's order. Raises
        RuntimeError when Slurm cannot be asked (see :func:`job_nodes`)."""
        held = set(job_nodes(self.allocation.job_id))
        nodes = [node for node in self.allocation.nodes if node in held]
        states = node_states(nodes)
        return {node: self._slots[node] for node in nodes
                if states.get(node, "").startswith(USABLE_STATES) and not states[node].endswith("*")}
