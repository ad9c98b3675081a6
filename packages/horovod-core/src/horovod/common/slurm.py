"""Slurm's descriptions of jobs and steps, and ``hvd.init()`` inside a Slurm step started
without a launcher (``srun python train.py``).

Slurm names nodes in its hostlist syntax (:func:`parse_hostlist`) and counts tasks per node as
``2(x3),1`` (:func:`parse_tasks_per_node`); ``horovodrun`` reads allocations with them
(:mod:`horovod.runner.util.slurm`) and :func:`configure_step` reads a step.

In a step that ``srun`` started directly (``SLURM_STEP_NUM_TASKS`` is set) and that no launcher
described to Horovod (no ``HOROVOD_RANK``/``HOROVOD_SIZE``), :func:`configure_step` derives the
topology from the step:

* rank ``SLURM_PROCID``, size ``SLURM_STEP_NUM_TASKS``, local rank ``SLURM_LOCALID``;
* local size: this node's count in ``SLURM_STEP_TASKS_PER_NODE``, the node found by
  ``SLURMD_NODENAME`` in ``SLURM_STEP_NODELIST``;
* cross rank and size: among the step's nodes, in order, those with more tasks than the local
  rank; the host name (``HOROVOD_HOSTNAME``) is the node's name, which Gloo binds to unless
  ``HOROVOD_GLOO_IFACE`` names an interface.

The ranks meet through a rendezvous server that the step's first task on its first node (rank 0
under the block and cyclic distributions) runs in its own process, at that node's address and
the port :func:`rendezvous_port` derives from the job and step ids (``HOROVOD_SLURM_RENDEZVOUS_PORT``
overrides it). Requests are signed with the job secret, read from ``_HOROVOD_SECRET_KEY`` (hex)
when the environment has it, else from ``~/.horovod/slurm_secret``, which the host task creates
(mode 0600) when it is missing; the other tasks wait for it, so the home folder must be one the
nodes share, as it is on clusters. The secret is never put on a command line.

Under ``srun --mpi=pmix`` (or ``pmi2``) with an MPI build, the MPI controller runs as it does
under ``mpirun``; nothing here applies.
"""

import os
import re
import secrets
import socket
import time
from types import SimpleNamespace

PORT_ENV = "HOROVOD_SLURM_RENDEZVOUS_PORT"
SECRET_FILE = os.path.join("~", ".horovod", "slurm_secret")
# Ports PORT_BASE .. PORT_BASE + PORT_SPAN - 1: below Linux's ephemeral range (32768-60999), so
# that no outgoing connection of the node holds the port.
PORT_BASE = 21000
PORT_SPAN = 9000
POLL_S = 0.2

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")

# The rendezvous server the host task runs; kept for the life of the process (re-inits use it).
_server = None


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
    """Tasks of each node from ``SLURM_TASKS_PER_NODE`` (or ``SLURM_STEP_TASKS_PER_NODE``,
    ``SLURM_JOB_CPUS_PER_NODE``).

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


def _mpi_backend_wanted(environ, mpi_built):
    """True when an MPI launcher (srun --mpi=pmix/pmi2, mpirun) started this process and the
    MPI controller will run, as ``hvd.init()`` chooses it without Slurm."""
    if not any(name in environ for name in _MPI_LAUNCHER_VARIABLES):
        return False
    chosen = environ.get("HOROVOD_CPU_OPERATIONS") or environ.get("HOROVOD_CONTROLLER")
    return chosen == "mpi" or (not chosen and mpi_built)


def is_bare_step(environ=None, mpi_built=False):
    """True when ``environ`` (default ``os.environ``) is that of a task of a Slurm step that
    ``srun`` started without a launcher: ``SLURM_STEP_NUM_TASKS`` and ``SLURM_PROCID`` are set,
    no launcher set ``HOROVOD_RANK`` or ``HOROVOD_SIZE``, and the MPI controller is not about to
    run under an MPI launcher (``mpi_built``: whether this build has MPI)."""
    environ = os.environ if environ is None else environ
    if "HOROVOD_RANK" in environ or "HOROVOD_SIZE" in environ:
        return False
    if not (environ.get("SLURM_STEP_NUM_TASKS") and environ.get("SLURM_PROCID")):
        return False
    return not _mpi_backend_wanted(environ, mpi_built)


def step_topology(environ):
    """The step's view of this task: a dict with ``rank``, ``size``, ``local_rank``,
    ``local_size``, ``cross_rank``, ``cross_size``, ``node`` (this node's name), ``nodes``
    (the step's nodes, in order) and ``counts`` (tasks of each).

    Raises:
        ValueError: a variable is missing, does not parse, or the variables disagree (as many
            counts as nodes, this node among them, the counts adding up to the size).
    """
    try:
        nodes = parse_hostlist(environ["SLURM_STEP_NODELIST"])
        counts = parse_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
        rank = int(environ["SLURM_PROCID"])
        size = int(environ["SLURM_STEP_NUM_TASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", "0"))
    except KeyError as e:
        raise ValueError("cannot read the Slurm step: %s is not set" % e) from None
    except ValueError as e:
        raise ValueError("cannot read the Slurm step: %s" % e) from None
    node = environ.get("SLURMD_NODENAME") or socket.gethostname()
    described = ("SLURM_STEP_NODELIST=%s, SLURM_STEP_TASKS_PER_NODE=%s, SLURM_STEP_NUM_TASKS=%d"
                 % (environ["SLURM_STEP_NODELIST"], environ["SLURM_STEP_TASKS_PER_NODE"], size))
    if len(nodes) != len(counts) or sum(counts) != size:
        raise ValueError("cannot read the Slurm step: %d node(s), %d count(s) adding up to %d "
                         "(%s)" % (len(nodes), len(counts), sum(counts), described))
    if node not in nodes:
        raise ValueError("cannot read the Slurm step: this node, %s (SLURMD_NODENAME), is not "
                         "among its nodes (%s)" % (node, described))
    index = nodes.index(node)
    return dict(rank=rank, size=size, local_rank=local_rank, local_size=counts[index],
                cross_rank=sum(1 for c in counts[:index] if c > local_rank),
                cross_size=sum(1 for c in counts if c > local_rank),
                node=node, nodes=nodes, counts=counts, index=index)


def rendezvous_port(environ):
    """The TCP port of the step's rendezvous server: ``HOROVOD_SLURM_RENDEZVOUS_PORT`` when set,
    else ``21000 + (31 * SLURM_JOB_ID + SLURM_STEP_ID) % 9000``, so that the steps of one job,
    and most jobs sharing a node, use different ports.

    Raises:
        ValueError: the override is not a port number (1-65535).
    """
    given = environ.get(PORT_ENV)
    if given:
        try:
            port = int(given)
        except ValueError:
            port = 0
        if not 0 < port < 65536:
            raise ValueError("%s must be a TCP port number (1-65535), got %r" % (PORT_ENV, given))
        return port
    job = int(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or 0)
    step = int(environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or 0)
    return PORT_BASE + (31 * job + step) % PORT_SPAN


def _read_secret_file(path):
    info = os.stat(path)
    if info.st_mode & 0o077:
        raise ValueError("the Slurm rendezvous secret %s may be read by others (mode %o): "
                         "chmod 600 it" % (path, info.st_mode & 0o777))
    with open(path, encoding="ascii") as f:
        text = f.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError("%s must hold the rendezvous secret as at least 32 hex digits" % path)
    return key


def _create_secret_file(path):
    """Writes a new secret to ``path`` unless one appeared there meanwhile (another step's host
    task): written to a private name, then linked into place, which fails when ``path`` exists."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    scratch = "%s.%s.%d.%s" % (path, socket.gethostname(), os.getpid(), secrets.token_hex(4))
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(scratch)


def job_secret(environ, create, timeout_s):
    """The job secret (bytes): ``_HOROVOD_SECRET_KEY`` (hex) when set, else the content of
    ``~/.horovod/slurm_secret``. With ``create`` (the host task) a missing file is created with
    a new random secret; without, the file is waited for up to ``timeout_s`` seconds.

    Raises:
        ValueError: the variable is not hex, the file is readable by group or others, holds
            no secret, or did not appear in time (the message says the home folder must be
            shared by the nodes, or the variable set).
    """
    from horovod.common.rendezvous import SECRET_ENV
    encoded = environ.get(SECRET_ENV)
    if encoded:
        try:
            return bytes.fromhex(encoded)
        except ValueError:
            raise ValueError("%s must hold the rendezvous secret as hex" % SECRET_ENV) from None
    path = os.path.expanduser(SECRET_FILE)
    if create and not os.path.exists(path):
        _create_secret_file(path)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise ValueError(
                "the Slurm rendezvous secret %s did not appear within %d s: rank 0's node creates "
                "it in the home folder, which must be shared by the nodes; or set %s to a secret "
                "(hex) in the job's environment, e.g. export %s=$(openssl rand -hex 32) before srun"
                % (path, timeout_s, SECRET_ENV, SECRET_ENV))
        time.sleep(POLL_S)
    return _read_secret_file(path)


def _resolve(node):
    try:
        return socket.getaddrinfo(node, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise ValueError("cannot resolve the Slurm step's first node %r, where rank 0 hosts the "
                         "rendezvous (%s); make node names resolve on the nodes" % (node, e)) from None


def _host_rendezvous(topology, port, key):
    """Starts the step's rendezvous server in this process (once; kept until the process ends)."""
    global _server
    from horovod.common.rendezvous import GLOBAL_SCOPE, RendezvousServer
    if _server is None:
        server = RendezvousServer(secret=key)
        # The global scope's size gives DELETEs the rendezvous protocol's completion rule. It is
        # set before the first request is served: the other tasks start as soon as the port
        # listens, and an init() after start() would clear the keys they put first.
        plan = [SimpleNamespace(hostname=GLOBAL_SCOPE, local_rank=0, size=topology["size"],
                                local_size=1, cross_size=1)]
        try:
            server.start(port=port, host_alloc_plan=plan)
        except OSError as e:
            raise ValueError("rank 0 cannot serve the Slurm step's rendezvous on port %d of node %s "
                             "(%s); set %s to a free port in the job's environment"
                             % (port, topology["node"], e, PORT_ENV)) from None
        _server = server


def _wait_for_server(address, port, node, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((address, port), timeout=max(0.1, min(5.0, timeout_s))).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise ValueError(
                    "rank 0's rendezvous server at %s:%d (node %s) did not answer within %.0f s "
                    "(%s): rank 0 may have failed or be slow to call hvd.init(); raise "
                    "HOROVOD_GLOO_TIMEOUT_SECONDS, or check that the nodes reach each other on that "
                    "port (%s sets another)" % (address, port, node, timeout_s, e, PORT_ENV)) from None
        time.sleep(POLL_S)


def configure_step(environ, timeout_s):
    """Sets the ``HOROVOD_*`` variables of a task of a bare Slurm step (see
    :func:`is_bare_step`) in ``environ`` (a mutable mapping, ``os.environ`` in ``hvd.init``):
    rank, sizes, host name, the rendezvous address and port, and the secret; the host task
    starts the rendezvous server. Returns the topology (:func:`step_topology`).

    Args:
        environ: the task's environment.
        timeout_s (float): seconds to wait for the secret file and for the host task's server
            to listen (``hvd.init`` passes ``HOROVOD_GLOO_TIMEOUT_SECONDS``).

    Raises:
        ValueError: the step's variables are inconsistent, the secret cannot be had, the first
            node's name does not resolve, the host task cannot bind the port, or its server does
            not answer within ``timeout_s``.
    """
    from horovod.common.rendezvous import SECRET_ENV
    topology = step_topology(environ)
    hosting = topology["index"] == 0 and topology["local_rank"] == 0
    port = rendezvous_port(environ)
    values = {"HOROVOD_RANK": topology["rank"], "HOROVOD_SIZE": topology["size"],
              "HOROVOD_LOCAL_RANK": topology["local_rank"], "HOROVOD_LOCAL_SIZE": topology["local_size"],
              "HOROVOD_CROSS_RANK": topology["cross_rank"], "HOROVOD_CROSS_SIZE": topology["cross_size"],
              "HOROVOD_HOSTNAME": topology["node"]}
    if topology["size"] > 1:
        key = job_secret(environ, create=hosting, timeout_s=timeout_s)
        address = "127.0.0.1" if topology["index"] == 0 else _resolve(topology["nodes"][0])
        if hosting:
            _host_rendezvous(topology, port, key)
        else:
            _wait_for_server(address, port, topology["nodes"][0], timeout_s)
        values.update({"HOROVOD_GLOO_RENDEZVOUS_ADDR": address, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                       SECRET_ENV: key.hex()})
    for name, value in values.items():
        environ[name] = str(value)
    return topology
