"""The hosts and slots of the Slurm allocation horovodrun runs in.

To the launcher Slurm is a source of hosts and slots (this module) and ``srun`` a way to start
processes on them (:mod:`horovod.runner.srun_run`). Inside an allocation (``salloc``, or a line of
an ``sbatch`` script) Slurm describes it in the environment:

* ``SLURM_JOB_ID``: the job;
* ``SLURM_JOB_NODELIST``: its nodes in Slurm's hostlist syntax, e.g. ``n[01-03,07],g[1-2]``
  (:func:`parse_hostlist`);
* ``SLURM_TASKS_PER_NODE``: tasks of each node in that order, runs compressed as ``2(x3),1``
  (:func:`parse_tasks_per_node`); one slot per task;
* ``SLURM_NTASKS``: the number of tasks (the default ``-np``).

A node's address, for the route from this host to the nodes, is its ``NodeAddr`` as
``scontrol show node`` reports it, else what its name resolves to.
"""

import os
import re
import subprocess

from horovod.runner.util import network

SCONTROL_TIMEOUT_S = 30
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _expand_brackets(expr):
    """One host expression without top-level commas -> its names, brackets expanded left to
    right (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2)."""
    start = expr.find("[")
    if start < 0:
        if "]" in expr:
            raise ValueError("unbalanced ']' in %r" % expr)
        return [expr]
    end = expr.find("]", start)
    if end < 0:
        raise ValueError("unbalanced '[' in %r" % expr)
    prefix, ranges, rest = expr[:start], expr[start + 1:end], expr[end + 1:]
    if "[" in ranges:
        raise ValueError("nested '[' in %r" % expr)
    names = []
    for part in ranges.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError("%r in %r is not a number or a range lo-hi" % (part, expr))
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError("range %s in %r goes down" % (part, expr))
        # Zero padding is the lower bound's width ("[01-10]" -> 01..10).
        width = len(lo_text) if lo_text.startswith("0") else 0
        names += ["%s%0*d" % (prefix, width, i) for i in range(lo, hi + 1)]
    tails = _expand_brackets(rest)
    return [name + tail for name in names for tail in tails]


def parse_hostlist(expr):
    """Host names of a Slurm hostlist expression, in order, duplicates kept.

    Args:
        expr (str): e.g. ``"n[01-03,07],g[1-2]"``, ``"node1,node2"``, ``"r[1-2]n[1-2]"``: names
            separated by commas, each with any number of bracketed lists of numbers and ranges
            ``lo-hi`` (padded to the width of ``lo`` when it starts with 0).

    Returns:
        list of str: ``["n01", "n02", "n03", "n07", "g1", "g2"]`` for the example.

    Raises:
        ValueError: unbalanced or nested brackets, a range that is not ``lo-hi`` with
            ``lo <= hi``, or an empty expression or name.
    """
    names, depth, current = [], 0, ""
    for char in expr.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']' in hostlist %r" % expr)
        if char == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += char
    names.append(current)
    if depth:
        raise ValueError("unbalanced '[' in hostlist %r" % expr)
    hosts = []
    for name in names:
        if not name.strip():
            raise ValueError("empty host name in hostlist %r" % expr)
        hosts += _expand_brackets(name.strip())
    return hosts


def parse_tasks_per_node(value):
    """Tasks of each node from ``SLURM_TASKS_PER_NODE`` (or ``SLURM_JOB_CPUS_PER_NODE``).

    Args:
        value (str): e.g. ``"2(x3),1"``: comma-separated counts, ``c(xn)`` for ``n`` nodes of
            ``c`` each.

    Returns:
        list of int: ``[2, 2, 2, 1]`` for the example.

    Raises:
        ValueError: a part that is neither ``c`` nor ``c(xn)``.
    """
    counts = []
    for part in value.strip().split(","):
        match = _REPEAT.match(part.strip())
        if not match:
            raise ValueError("%r is not a Slurm count list like '2(x3),1'" % value)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


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
