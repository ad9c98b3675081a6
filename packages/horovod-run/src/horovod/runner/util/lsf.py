"""The hosts, cores and GPUs of the IBM Spectrum LSF job horovodrun runs in.

To the launcher LSF is a source of hosts and slots (this module) and ``jsrun`` a way to start
processes on them (``horovod.runner.js_run``). The allocation is read from one of two sources:

* CSM, the Cluster System Management of CORAL-type clusters (Summit, Sierra), when
  ``CSM_ALLOCATION_ID`` is set: ``csm_allocation_query -a <id>`` names the compute nodes and the
  cores per socket kept for system services (``isolated_cores``), and
  ``csm_node_attributes_query -n <node>`` gives the first node's cores, sockets and GPUs. The
  cores a job can use are ``discovered_cores - discovered_sockets * isolated_cores``.
* Otherwise LSF's own job variables: ``LSB_MCPU_HOSTS`` (``"hostA 1 hostB 42 hostC 42"``), else the
  file named by ``LSB_DJOB_HOSTFILE`` or the list ``LSB_HOSTS`` (each: one host name per slot).
  Where jobs start on a launch node (CORAL), LSF lists that node first with a single slot while
  every compute host has more; such a first host is not a compute host. The cores of a host are
  the slots LSF gave on the first compute host, and its GPUs are counted by ``nvidia-smi -L``
  there.

The hardware threads per core come from ``lscpu`` on the first compute host, run over ssh (or
here, when this host is that host), in the same remote call as the GPU count.

Every compute host is taken to look like the first one: one rank per GPU, or per core where the
hosts have no GPU.
"""

import os
import subprocess

import yaml

from horovod.runner.util import network, remote

REMOTE_QUERY_TIMEOUT_S = 60


def _run(argv, what):
    """stdout of ``argv`` (a list); ``RuntimeError`` naming ``what`` when it fails."""
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=REMOTE_QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError("%s: cannot run %s: %s" % (what, " ".join(argv), e)) from e
    if result.returncode != 0:
        raise RuntimeError("%s: %s failed with exit code %d: %s"
                           % (what, " ".join(argv), result.returncode,
                              (result.stdout + result.stderr).strip()))
    return result.stdout


def _parse_mcpu_hosts(value):
    """``"hostA 1 hostB 4"`` -> ``[("hostA", 1), ("hostB", 4)]``; ``ValueError`` when malformed."""
    words = value.split()
    if not words or len(words) % 2:
        raise ValueError("LSB_MCPU_HOSTS is not a list of '<host> <slots>' pairs: %r" % value)
    try:
        return [(words[i], int(words[i + 1])) for i in range(0, len(words), 2)]
    except ValueError:
        raise ValueError("LSB_MCPU_HOSTS is not a list of '<host> <slots>' pairs: %r"
                         % value) from None


def _count_slots(names):
    """Host names, one per slot, in order -> ``[(host, slots), ...]`` in order of appearance."""
    counts = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def _lsf_job_hosts(environ):
    """``[(host, slots), ...]`` of the job as LSF lists it, launch node included."""
    if environ.get("LSB_MCPU_HOSTS", "").strip():
        return _parse_mcpu_hosts(environ["LSB_MCPU_HOSTS"])
    if environ.get("LSB_DJOB_HOSTFILE"):
        with open(environ["LSB_DJOB_HOSTFILE"]) as f:
            return _count_slots(f.read().split())
    if environ.get("LSB_HOSTS", "").strip():
        return _count_slots(environ["LSB_HOSTS"].split())
    raise RuntimeError("cannot find the hosts of this LSF job: none of CSM_ALLOCATION_ID, "
                       "LSB_MCPU_HOSTS, LSB_DJOB_HOSTFILE and LSB_HOSTS is set; give the hosts "
                       "with -H")


def _compute_hosts(job_hosts):
    """Leaves out a launch node: a first host with one slot where every other host has more."""
    first, rest = job_hosts[0], job_hosts[1:]
    if rest and first[1] == 1 and all(slots > 1 for _, slots in rest):
        return rest
    return job_hosts


def _query_host(host):
    """``(threads_per_core, gpus)`` of ``host`` from ``lscpu`` and ``nvidia-smi -L``."""
    # nvidia-smi is missing on hosts without GPUs: that counts as none.
    command = "LC_ALL=C lscpu; nvidia-smi -L 2>/dev/null || true"
    if network.filter_local_addresses([host]):
        argv = remote.ssh_argv(host) + [command]
    else:
        argv = ["/bin/sh", "-c", command]
    output = _run(argv, "reading the cores and GPUs of LSF compute host %s" % host)
    threads = None
    gpus = 0
    for line in output.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Thread(s) per core":
            threads = int(value)
        elif line.startswith("GPU "):
            gpus += 1
    if threads is None:
        raise RuntimeError("lscpu on %s printed no 'Thread(s) per core' line:\n%s"
                           % (host, output))
    return threads, gpus


def _csm_allocation(allocation_id):
    info = yaml.safe_load(_run([LSFUtils.CSM_ALLOCATION_QUERY, "-a", allocation_id],
                               "reading CSM allocation %s" % allocation_id))
    nodes = sorted(info["compute_nodes"])
    record = yaml.safe_load(_run([LSFUtils.CSM_NODE_QUERY, "-n", nodes[0]],
                                 "reading CSM node %s" % nodes[0]))["Record_1"]
    cores = (int(record["discovered_cores"])
             - int(record["discovered_sockets"]) * int(info["isolated_cores"]))
    return {"source": "csm", "compute_nodes": nodes, "compute_node_cores": cores,
            "compute_node_gpus": int(record["discovered_gpus"])}


class LSFUtils:
    """Facts of the current LSF job; every method is static and the allocation is read once.

    The methods besides :meth:`using_lsf` raise ``RuntimeError`` when the allocation cannot be
    read (no source of it is set, a query command fails) and ``ValueError`` when
    ``LSB_MCPU_HOSTS`` is malformed.
    """

    CSM_ALLOCATION_QUERY = "/opt/ibm/csm/bin/csm_allocation_query"
    CSM_NODE_QUERY = "/opt/ibm/csm/bin/csm_node_attributes_query"
    _allocation_info = None

    @staticmethod
    def using_lsf():
        """True when this process runs inside an LSF job (``LSB_JOBID`` is set)."""
        return "LSB_JOBID" in os.environ

    @staticmethod
    def get_allocation_info():
        """The allocation as a dict, read on first use and kept for the process's life.

        Keys: ``source`` (``"csm"`` or ``"lsf"``), ``compute_nodes`` (list of host names, in
        CSM's sorted order or LSF's order), ``compute_node_cores`` (int, usable cores of the
        first compute host), ``compute_node_gpus`` (int) and ``compute_node_threads`` (int,
        hardware threads per core).
        """
        if LSFUtils._allocation_info is None:
            allocation_id = os.environ.get("CSM_ALLOCATION_ID", "").strip()
            if allocation_id:
                info = _csm_allocation(allocation_id)
                threads, _ = _query_host(info["compute_nodes"][0])
            else:
                nodes = _compute_hosts(_lsf_job_hosts(os.environ))
                threads, gpus = _query_host(nodes[0][0])
                info = {"source": "lsf", "compute_nodes": [host for host, _ in nodes],
                        "compute_node_cores": nodes[0][1], "compute_node_gpus": gpus}
            info["compute_node_threads"] = threads
            LSFUtils._allocation_info = info
        return LSFUtils._allocation_info

    @staticmethod
    def get_compute_hosts():
        """The compute hosts of the job (list of str), launch node excluded."""
        return LSFUtils.get_allocation_info()["compute_nodes"]

    @staticmethod
    def get_num_cores():
        """Usable cores per compute host (int)."""
        return LSFUtils.get_allocation_info()["compute_node_cores"]

    @staticmethod
    def get_num_gpus():
        """GPUs per compute host (int, 0 on hosts without GPUs)."""
        return LSFUtils.get_allocation_info()["compute_node_gpus"]

    @staticmethod
    def get_num_threads():
        """Hardware threads per core of the compute hosts (int)."""
        return LSFUtils.get_allocation_info()["compute_node_threads"]

    @staticmethod
    def get_slots_per_host():
        """Ranks per compute host (int): one per GPU, or one per core on hosts without GPUs."""
        return LSFUtils.get_num_gpus() or LSFUtils.get_num_cores()

    @staticmethod
    def get_num_processes():
        """Ranks of a job that fills the allocation (int): hosts times slots per host."""
        return len(LSFUtils.get_compute_hosts()) * LSFUtils.get_slots_per_host()

    @staticmethod
    def get_hosts_argument():
        """The allocation as a ``-H`` value, ``"host1:<slots>,host2:<slots>"`` (str)."""
        slots = LSFUtils.get_slots_per_host()
        return ",".join("%s:%d" % (host, slots) for host in LSFUtils.get_compute_hosts())

