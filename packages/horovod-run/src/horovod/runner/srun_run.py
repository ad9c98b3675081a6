"""Static launch with the launcher-rendezvous ("Gloo") controller inside a Slurm allocation: the
ranks start on the allocated nodes as one ``srun`` step, not over ssh.

The launcher (:func:`srun_run`) starts the rendezvous server as :func:`gloo_run.gloo_run` does
and runs ``srun --nodes=N --ntasks=NP --ntasks-per-node=K --nodelist=... python -m
horovod.runner.srun_run``. Each task of the step is this module's bootstrap (:func:`main`): it
finds its slot by its node (``SLURMD_NODENAME``) and ``SLURM_LOCALID``, sets the slot's
``HOROVOD_*`` variables (and ``HOROVOD_GLOO_IFACE``, the node's interface towards the rendezvous
server, unless the launcher names interfaces), and runs the command as a child, so that it stays
in the step (Slurm's process tracking, hence ``scancel``, finds it), with its output prefixed
``[rank]<stdout>:`` by the same code as the other launch paths; srun relays it to the launcher.

The step carries the launcher's environment (``srun --export=ALL``), the job secret included: it
never appears on a command line. When a rank fails its bootstrap writes ``horovodrun_exit/<rank>``
(host, exit code, time) to the rendezvous server and exits with the rank's status; srun's
``--kill-on-bad-exit`` then stops every other task, and the launcher names the first rank that
failed and its node.
"""

import json
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time

from horovod.runner.common.util import env_names, hosts, safe_shell_exec, secret
from horovod.runner.util import network
from horovod.runner.gloo_run import (JOB_FAILED_MESSAGE, _pad_rank, _say, create_run_env_vars,
                                     create_slot_env_vars, describe_exit_code, register_shutdown_event)

SLOTS_VAR = "HOROVOD_SRUN_SLOTS"        # JSON: {"<node>": [[rank, local, local_size, cross, cross_size], ...]}
COMMAND_VAR = "HOROVOD_SRUN_COMMAND"    # JSON: the command, a list or one shell string
OPTIONS_VAR = "HOROVOD_SRUN_OPTIONS"    # JSON: {"timestamp": bool, "output_filename": str or None, "prefix": bool}
REPORT_VAR = "HOROVOD_SRUN_REPORT"      # an elastic worker's key for its exit status in EXIT_SCOPE
EXIT_SCOPE = "horovodrun_exit"


def srun_command(slots, nodes):
    """The ``srun`` argv that starts one bootstrap per slot of ``slots`` (``SlotInfo`` list) on
    ``nodes`` (node names in allocation order; only those with slots are used)."""
    per_node = {}
    for slot in slots:
        per_node[slot.hostname] = per_node.get(slot.hostname, 0) + 1
    used = [node for node in nodes if node in per_node]
    argv = ["srun", "--nodes=%d" % len(used), "--ntasks=%d" % len(slots),
            "--nodelist=%s" % ",".join(used), "--kill-on-bad-exit=1", "--export=ALL",
            "--mpi=none", "--unbuffered"]
    counts = set(per_node.values())
    if len(counts) == 1:
        argv.append("--ntasks-per-node=%d" % counts.pop())
    argv += ["--distribution=block", sys.executable, "-m", "horovod.runner.srun_run"]
    return argv


def step_run_vars(server_ip, nics, port, elastic=False):
    """The rendezvous variables of ranks started by srun: ``create_run_env_vars``'s, without
    the interface names when ``nics`` is empty (each node's bootstrap then picks its interface
    towards ``server_ip``)."""
    if nics:
        return create_run_env_vars(server_ip, sorted(nics), port, elastic=elastic)
    run_vars = create_run_env_vars(server_ip, ["-"], port, elastic=elastic)
    del run_vars[env_names.GLOO_IFACE], run_vars[env_names.NCCL_SOCKET_IFNAME]
    return run_vars


class ElasticSteps:
    """How an elastic job inside a Slurm allocation starts its workers: each slot as a srun
    step of its own, one task on its node, instead of over ssh.

    Slurm 22.05 ends every task of a step that touches a node set DOWN, healthy nodes
    included; with a step per slot only the lost node's workers end, and the elastic driver
    resets the others. ``--overlap`` lets the steps share the allocation's CPUs, so a new
    worker's step never waits for another's.

    Args:
        server_ip (str): this host's address towards the nodes, where they reach the launcher's
            rendezvous server.
    """

    def __init__(self, server_ip):
        self.server_ip = server_ip

    def run_vars(self, nics, port):
        """The workers' rendezvous variables (see :func:`step_run_vars`); ``port``: the
        launcher's rendezvous server, where the workers' bootstraps also report their exit."""
        return step_run_vars(self.server_ip, nics, port, elastic=True)

    def wrap(self, slot_info, command, env):
        """``(srun argv, environment, check)`` that run ``command`` (argv list or shell string)
        with the worker environment ``env`` (the job secret and rendezvous port in it) as one task on
        ``slot_info.hostname``; ``check(code)`` turns srun's exit status into the worker's.

        The bootstrap leaves the output unprefixed (the launcher labels it with the worker's
        current rank) and reports the worker's exit status to the rendezvous server: srun
        exits 0 when the node of its step fails, so a status that never arrived is a failure
        (1), with a message naming the node.
        """
        env = dict(env)
        token = "%s:%d:%s" % (slot_info.hostname, slot_info.local_rank, secrets.token_hex(8))
        env[COMMAND_VAR] = json.dumps(command)
        env[OPTIONS_VAR] = json.dumps({"prefix": False})
        env[REPORT_VAR] = token
        env["PYTHONUNBUFFERED"] = "1"
        argv = ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                "--nodelist=%s" % slot_info.hostname, "--overlap", "--kill-on-bad-exit=1",
                "--export=ALL", "--mpi=none", "--unbuffered", sys.executable, "-m",
                "horovod.runner.srun_run"]
        key = bytes.fromhex(env[secret.HOROVOD_SECRET_KEY])
        port = int(env[env_names.GLOO_RENDEZVOUS_PORT])

        def check(code):
            from horovod.common.rendezvous import RendezvousClient
            try:
                value = RendezvousClient("127.0.0.1", port, secret=key).try_get(EXIT_SCOPE, token)
            except (OSError, RuntimeError) as e:
                _say("horovodrun: cannot read the exit status of the worker %s[%d]: %s"
                     % (slot_info.hostname, slot_info.local_rank, e), sys.stderr)
                value = None
            if value is not None:
                return json.loads(value)["code"]
            if code == 0:
                _say("horovodrun: the Slurm step of worker %s[%d] ended without its exit status: "
                     "node %s failed or was set DOWN" % (slot_info.hostname, slot_info.local_rank,
                                                         slot_info.hostname), sys.stderr)
                return 1
            return code

        return argv, env, check


def _slot_table(slots):
    table = {}
    for slot in slots:
        table.setdefault(slot.hostname, []).append(
            [slot.rank, slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size])
    return table


def srun_run(settings, nics, env, server_ip, command, allocation):
    """Run ``command`` as ``settings.num_proc`` ranks on the nodes of a Slurm allocation, one
    ``srun`` step, and wait for them.

    Args:
        settings: a :class:`~horovod.runner.common.util.settings.Settings` (``hosts``: the
            allocation's nodes and slots as ``-H`` takes them, ``num_proc``, ``key``,
            ``verbose``, ``prefix_output_with_timestamp``, ``output_filename``: a directory
            that each rank's node writes ``rank.<r>/stdout`` and ``stderr`` into, so one that
            the nodes share with this host).
        nics: interface names for Gloo (the first) and NCCL, or None/empty: each node then uses
            its interface towards ``server_ip``.
        env: the launcher's environment for the step (a mapping); srun passes it to the ranks.
        server_ip (str): address at which the nodes reach the rendezvous server.
        command: list of program arguments, or one string (or a one-item list) run by
            ``/bin/sh -c``.
        allocation: the :class:`~horovod.runner.util.slurm.Allocation` (its node order).

    Raises:
        RuntimeError: a rank exited with a non-zero status (the message names the first rank to
            fail, its exit code and its node), srun failed before any rank did (its exit code;
            srun's own messages are above), or the launcher was interrupted by SIGINT/SIGTERM.
        ValueError: the allocation has fewer slots than ``num_proc``.
    """
    from horovod.common.rendezvous import RendezvousClient
    from horovod.runner.http.http_server import RendezvousServer

    slots = hosts.get_host_assignments(hosts.parse_hosts(settings.hosts), settings.num_proc,
                                       max_num_proc=settings.num_proc)
    if not isinstance(command, str) and len(command) == 1:
        command = command[0]
    rendezvous = RendezvousServer(secret=settings.key)
    port = rendezvous.start()
    shutdown_event, restore_signals = register_shutdown_event()
    try:
        rendezvous.init(slots)
        step_env = dict(env)
        step_env.update(step_run_vars(server_ip, nics, port))
        step_env[secret.HOROVOD_SECRET_KEY] = rendezvous.secret.hex()
        step_env[SLOTS_VAR] = json.dumps(_slot_table(slots))
        step_env[COMMAND_VAR] = json.dumps(command)
        output_filename = os.path.abspath(settings.output_filename) if settings.output_filename else None
        step_env[OPTIONS_VAR] = json.dumps({"timestamp": bool(settings.prefix_output_with_timestamp),
                                            "output_filename": output_filename})
        step_env["PYTHONUNBUFFERED"] = "1"
        argv = srun_command(slots, allocation.nodes)
        if settings.verbose:
            _say("Launching %d rank(s) on %s as one Slurm step of job %s: %s"
                 % (len(slots), ",".join(sorted({s.hostname for s in slots})), allocation.job_id,
                    " ".join(shlex.quote(a) for a in argv)))
        try:
            code = safe_shell_exec.execute(argv, env=step_env, events=[shutdown_event])
        except OSError as e:
            raise RuntimeError("cannot run srun (%s): is Slurm's client installed on this host?" % e) from None
        client = RendezvousClient("127.0.0.1", port, secret=rendezvous.secret)
        failures = []
        for slot in slots:
            value = client.try_get(EXIT_SCOPE, str(slot.rank))
            if value is not None:
                report = json.loads(value)
                failures.append((report["time"], slot.rank, report["code"], report["host"]))
    finally:
        restore_signals()
        rendezvous.stop()
    if failures:
        _, rank, rank_code, host = min(failures)
        raise RuntimeError(JOB_FAILED_MESSAGE.format(rank=rank, code=describe_exit_code(rank_code),
                                                     host=host))
    if shutdown_event.is_set():
        raise RuntimeError("horovodrun was interrupted by a signal; the Slurm step was stopped")
    if code != 0:
        raise RuntimeError("srun exited with status %s before any rank failed (see srun's messages "
                           "above)" % describe_exit_code(code))


# --- the bootstrap: one per task of the step -----------------------------------------------------

def _interface_towards(address):
    """Name of this host's interface whose IPv4 address routes to ``address``; None if unknown."""
    import psutil
    source = network.source_address_towards(address)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == source for a in addrs):
            return name
    return None


def _fail(message, code=1):
    print("horovodrun: %s" % message, file=sys.stderr, flush=True)
    sys.exit(code)


def _report_exit(env, key, code):
    """Writes ``{"host", "code", "time"}`` under ``EXIT_SCOPE/key`` on the launcher's server."""
    from horovod.common.rendezvous import RendezvousClient
    value = json.dumps({"host": socket.gethostname(), "code": code, "time": time.time()}).encode()
    try:
        RendezvousClient(env[env_names.GLOO_RENDEZVOUS_ADDR], int(env[env_names.GLOO_RENDEZVOUS_PORT]),
                         secret=bytes.fromhex(env[secret.HOROVOD_SECRET_KEY])).set(EXIT_SCOPE, key, value)
    except Exception as e:  # noqa: BLE001 - srun still reports the status
        print("horovodrun: cannot report the exit of %s to the launcher: %s" % (key, e),
              file=sys.stderr, flush=True)


def main():
    """The bootstrap srun starts on each node; exits with its rank's status (``128 + s`` for
    signal ``s``), 1 when its slot cannot be found."""
    env = dict(os.environ)
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    command = json.loads(env.pop(COMMAND_VAR))
    options = json.loads(env.pop(OPTIONS_VAR, "{}"))
    if SLOTS_VAR in env:
        # A static job's step: this task's slot from the launcher's plan.
        table = json.loads(env.pop(SLOTS_VAR))
        local_id = int(env.get("SLURM_LOCALID", "0"))
        node_slots = table.get(node)
        if node_slots is None or local_id >= len(node_slots):
            _fail("Slurm started task %s (local %d) on node %s, where horovodrun placed %d rank(s) "
                  "(its plan: %s)" % (env.get("SLURM_PROCID"), local_id, node,
                                      len(node_slots or []), json.dumps(table)))
        rank, local_rank, local_size, cross_rank, cross_size = node_slots[local_id]
        slot = hosts.SlotInfo(hostname=node, rank=rank, local_rank=local_rank, cross_rank=cross_rank,
                              size=sum(len(v) for v in table.values()), local_size=local_size,
                              cross_size=cross_size)
        env.update(create_slot_env_vars(slot))
    else:
        # An elastic worker's step (ElasticSteps): the launcher set the slot's variables.
        rank = int(env.get(env_names.RANK, "0"))
        slot = None
    report = env.pop(REPORT_VAR, None)
    if not env.get(env_names.GLOO_IFACE):
        iface = _interface_towards(env[env_names.GLOO_RENDEZVOUS_ADDR])
        if iface:
            env[env_names.GLOO_IFACE] = iface
            env.setdefault(env_names.NCCL_SOCKET_IFNAME, iface)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop.set())
    raw = []
    try:
        if options.get("output_filename") and slot is not None:
            rank_dir = os.path.join(options["output_filename"], "rank.%s" % _pad_rank(rank, slot.size))
            os.makedirs(rank_dir, exist_ok=True)
            raw = [open(os.path.join(rank_dir, name), "w", encoding="utf-8") for name in ("stdout", "stderr")]
        code = safe_shell_exec.execute(command, env=env, index=rank if options.get("prefix", True) else None,
                                       events=[stop],
                                       prefix_output_with_timestamp=options.get("timestamp", False),
                                       raw_stdout=raw[0] if raw else None, raw_stderr=raw[1] if raw else None)
    except OSError as e:
        print("horovodrun: node %s cannot start %s: %s" % (node, command, e), file=sys.stderr, flush=True)
        code = 127
    finally:
        for f in raw:
            f.close()
    if report is not None:
        _report_exit(env, report, code)
    elif code != 0 and not stop.is_set():
        _report_exit(env, str(rank), code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
