"""Initialisation, topology queries and build queries shared by every framework package."""

import atexit
import os
import signal
import sys
import threading

from horovod.common import _core, ops
from horovod.common.exceptions import HorovodInternalError  # noqa: F401  (re-exported by bindings)
from horovod.common.knobs import knob


def _require_initialized():
    if not _core.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")


class _RendezvousStore:
    """Adapts the launcher's rendezvous client to the engine's store interface (set/get of bytes),
    within one scope."""

    def __init__(self, client, scope):
        self._client = client
        self._scope = scope

    def set(self, key, value):
        self._client.set(self._scope, key, value)

    def get(self, key):
        return self._client.get(self._scope, key)


def _shutdown_at_exit():
    _core.shutdown()
    _core.mpi_finalize()


DUMP_SIGNAL = signal.SIGUSR2


def _dump_on_signal(signum, frame):
    try:
        path = _core.dump_flight_recorder("", f"signal {signal.Signals(signum).name}")
        print(f"Horovod: flight recorder written to {path}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - a signal handler must not raise into the user's code
        print(f"Horovod: could not write the flight recorder: {e}", file=sys.stderr, flush=True)


def _install_dump_signal():
    """SIGUSR2 writes the flight recorder to HOROVOD_FLIGHT_RECORDER_DIR, when that is set and the
    signal has no handler yet (Python runs handlers in the main thread, also while it waits on a
    Horovod operation)."""
    if not os.environ.get(knob("FLIGHT_RECORDER_DIR")) or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(DUMP_SIGNAL) in (signal.SIG_DFL, None):
        signal.signal(DUMP_SIGNAL, _dump_on_signal)


def _ranks_of_comm(comm, parent_handle):
    """Ranks, in Horovod's global communicator, of the members of mpi4py communicator ``comm``."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if parent_handle:
        world = MPI.Comm.fromhandle(parent_handle)
    return sorted(int(r) for r in comm.Get_group().Translate_ranks(list(range(comm.Get_size())),
                                                                   world.Get_group()))


class HorovodBasics:
    """Basics of one Horovod process (``hvd.init``, ``hvd.rank``, ...). The framework packages
    re-export the methods of one instance, ``horovod.common.api.basics``; every instance shares
    the process's single engine."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5

    HOROVOD_PROCESS_SET_ERROR_INIT = -1
    HOROVOD_PROCESS_SET_ERROR_DYNAMIC = -2
    HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET = -3
    HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET = -4
    HOROVOD_PROCESS_SET_ERROR_SHUTDOWN = -5
    HOROVOD_PROCESS_SET_ERROR_EXISTING_SET = -6

    _lock = threading.Lock()
    _init_count = 0
    _atexit_registered = False

    def __init__(self, pkg_path=None, *args):
        # pkg_path is accepted for upstream compatibility; there is no per-framework library.
        self._pkg_path = pkg_path

    def init(self, comm=None, process_sets=None):
        """Starts Horovod in this process: reads the HOROVOD_* environment, rendezvouses with the
        other ranks through the launcher's store, registers the requested process sets, and starts
        the background engine. Calling it again while initialised starts nothing, but still gives
        the ``ProcessSet`` objects of ``process_sets`` the ids of the registered sets.

        In a Slurm step that ``srun`` started without a launcher, the topology comes from the
        step's ``SLURM_*`` variables and rank 0 hosts the rendezvous (see
        :mod:`horovod.common.slurm`).

        Args:
            comm: None or [] for every process of the job. Lists of ranks and mpi4py
                communicators need the MPI controller, which this build does not have.
            process_sets: None, a list of ``ProcessSet`` objects (registered as ids 1, 2, ...
                in list order; every rank must give the same list), or ``"dynamic"`` to allow
                ``add_process_set`` / ``remove_process_set`` (sets
                ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

        Raises:
            ValueError: a HOROVOD_* variable is invalid (or, in a bare Slurm step, a SLURM_*
                variable, the rendezvous secret or rank 0's server; see
                :func:`horovod.common.slurm.configure_step`), ``comm`` or ``process_sets`` asks for
                something this build cannot do, initialisation failed (the message says why,
                for example a rendezvous timeout), or an entry of ``process_sets`` duplicates an
                earlier one or the global set (Horovod then stays initialised with the others,
                and the duplicate's ``process_set_id`` is None).
        """
        from horovod.common import process_sets as _process_sets
        mpi_comm, mpi_ranks = self._parse_comm(comm)
        if isinstance(process_sets, str):
            if process_sets.lower() != "dynamic":
                raise ValueError(f"process_sets must be a list of ProcessSet objects or 'dynamic', "
                                 f"got {process_sets!r}")
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
            process_sets = None
        process_sets = list(process_sets or [])
        for ps in process_sets:
            if not isinstance(ps, _process_sets.ProcessSet):
                raise ValueError(f"process_sets must contain ProcessSet objects, got {ps!r}")
            if ps.mpi_comm is not None and mpi_ranks:
                raise NotImplementedError("hvd.init(comm=[ranks]) cannot be combined with process sets "
                                          "built from mpi4py communicators.")
        _process_sets._setup(self)
        with HorovodBasics._lock:
            if not _core.is_initialized():
                # Handles and automatic names left from an earlier run mean nothing to the new engine.
                ops.reset()
                self._start(process_sets, mpi_comm, mpi_ranks)
        duplicates = _process_sets._init_process_sets(process_sets)
        if duplicates:
            index = duplicates[0]
            raise ValueError(
                f"process_sets[{index}] (ranks {process_sets[index].ranks}) duplicates an earlier "
                "entry or the global process set; it was not registered (Horovod is initialised "
                "with the other sets).")

    def _parse_comm(self, comm):
        """(mpi4py communicator handle or 0, list of MPI_COMM_WORLD ranks) for ``init(comm=...)``."""
        if comm is None or (isinstance(comm, (list, tuple)) and len(comm) == 0):
            return 0, []
        if not self.mpi_built():
            raise ValueError("hvd.init(comm=...) needs MPI (a list of ranks or an mpi4py communicator), and "
                             f"this build of Horovod was not built with MPI: {_core.plugin_error('mpi')}.")
        if hasattr(comm, "Get_rank") and hasattr(comm, "handle"):
            return int(comm.handle), []
        try:
            ranks = sorted(int(r) for r in comm)
        except TypeError:
            raise ValueError(f"Wrong type for comm: expected a list of ranks or an mpi4py communicator, "
                             f"got {type(comm).__name__}.") from None
        return 0, ranks

    # (host, local rank) that an elastic launcher started this process for; kept across resets.
    _elastic_slot = None

    def _elastic_assignment(self, config):
        """In an elastic job, ask the launcher for this process's place in the next rendezvous
        round: blocks until the round is decided, updates the six HOROVOD_* topology variables
        and returns the round's generation, which fences the rendezvous keys (core.md §13).

        Raises :class:`~horovod.common.exceptions.WorkerRemovedError` (a ``RuntimeError``) when
        the launcher removed this process's slot from the job.
        """
        import json
        from horovod.common.rendezvous import RendezvousClient
        if HorovodBasics._elastic_slot is None:
            HorovodBasics._elastic_slot = (
                os.environ.get("HOROVOD_HOSTNAME", ""), int(os.environ.get("HOROVOD_LOCAL_RANK", "0")))
        host, local_rank = HorovodBasics._elastic_slot
        # The launcher answers once every worker of the round is ready: allow its elastic timeout.
        wait_s = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600")) + 60
        client = RendezvousClient(config["rendezvous_addr"], config["rendezvous_port"], timeout_s=wait_s)
        answer = json.loads(client.get("elastic_slot", f"{host}:{local_rank}"))
        values = [int(v) for v in answer["slot"].split(",")]
        if values[0] < 0:
            from horovod.common.exceptions import WorkerRemovedError
            raise WorkerRemovedError(f"{host}[{local_rank}] has been removed from the elastic job (its host was "
                               "blacklisted or is no longer listed by the host discovery, or the job ended)")
        names = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                 "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"]
        for name, value in zip(names, values, strict=True):
            os.environ[name] = str(value)
        return int(answer["generation"])

    def _start(self, process_sets, mpi_comm=0, mpi_ranks=()):
        from horovod.common import slurm
        if slurm.is_bare_step(os.environ, self.mpi_built()):
            # srun started this process without a launcher: the step describes the job.
            slurm.configure_step(os.environ, float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS") or 30))
        env = _core.read_environment()
        config = _core.parse_config(env)
        generation = None
        if config["elastic"] and config["backend"] != "mpi" and config["rendezvous_addr"]:
            generation = self._elastic_assignment(config)
            env = _core.read_environment()
            config = _core.parse_config(env)
        if (mpi_comm or mpi_ranks) and config["backend"] != "mpi":
            # comm= only makes sense over MPI: ask for it explicitly.
            env["HOROVOD_CONTROLLER"] = "mpi"
            env["HOROVOD_CPU_OPERATIONS"] = "mpi"
            config = _core.parse_config(env)
        if mpi_ranks:
            from mpi4py import MPI
            if MPI.COMM_WORLD.Get_rank() not in mpi_ranks:
                raise ValueError(f"hvd.init(comm={list(mpi_ranks)}): this process (MPI rank "
                                 f"{MPI.COMM_WORLD.Get_rank()}) is not one of those ranks.")
        # Resolve process sets built from mpi4py communicators into global ranks.
        for ps in process_sets:
            if ps.mpi_comm is not None and ps.ranks is None:
                ps.ranks = _ranks_of_comm(ps.mpi_comm, mpi_comm)
        mpi_world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")) or 1)
        if config["backend"] != "mpi" and config["launched_by_mpi"] and mpi_world > 1 and config["size"] == 1:
            raise ValueError(
                f"This process was started by an MPI launcher with {mpi_world} processes, but Horovod was told "
                f"to use {config['backend']} (HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS), which needs the "
                "rendezvous service of horovodrun --gloo. Use the MPI controller under mpirun, or launch with "
                "horovodrun --gloo.")
        store = None
        if config["size"] > 1 and config["backend"] != "mpi":
            if not config["rendezvous_addr"]:
                raise ValueError(
                    f"HOROVOD_SIZE={config['size']} but HOROVOD_GLOO_RENDEZVOUS_ADDR is not set: "
                    "start multi-process jobs with horovodrun, which provides the rendezvous "
                    "service.")
            from horovod.common.rendezvous import RendezvousClient
            client = RendezvousClient(config["rendezvous_addr"], config["rendezvous_port"],
                                      timeout_s=config["gloo_timeout_seconds"])
            store = _RendezvousStore(client, "global")
        # Unique rank lists in order; the global set's list is not registered again.
        static_sets = []
        everyone = list(range(config["size"]))
        for ps in process_sets:
            if ps.ranks != everyone and ps.ranks not in static_sets:
                static_sets.append(list(ps.ranks))
        HorovodBasics._init_count += 1
        # Every rank inits the same number of times, so the prefix keeps the keys of
        # successive inits against one rendezvous service apart.
        prefix = f"init{HorovodBasics._init_count}."
        if generation is not None:
            # Elastic: ranks that joined later have fewer inits behind them; the launcher's
            # generation numbers the round for all of them, so a stale peer of an older round
            # never meets this one.
            prefix = f"elastic{generation}."
        try:
            _core.init(env, store, prefix, static_sets, mpi_comm, list(mpi_ranks))
        except Exception as e:
            raise ValueError(f"Horovod initialization failed: {e}. See the log output above "
                             "for details.") from e
        if not HorovodBasics._atexit_registered:
            atexit.register(_shutdown_at_exit)
            HorovodBasics._atexit_registered = True
        _install_dump_signal()

    def shutdown(self):
        """Stops Horovod on every rank: pending operations everywhere fail with
        HorovodInternalError. Safe to call when not initialised; init() may follow."""
        _core.shutdown()
        # Only now that the engine has stopped may the tensors of pending operations go.
        ops.reset()

    def is_initialized(self):
        """Whether Horovod is initialised in this process."""
        return _core.is_initialized()

    def size(self):
        """Number of processes in the job. Raises ValueError when not initialised."""
        return _core.size()

    def local_size(self):
        """Number of processes on this host. Raises ValueError when not initialised."""
        return _core.local_size()

    def cross_size(self):
        """Number of hosts with a process of this local rank. Raises ValueError when not initialised."""
        return _core.cross_size()

    def rank(self):
        """Global rank of this process, 0..size()-1. Raises ValueError when not initialised."""
        return _core.rank()

    def local_rank(self):
        """Index of this process among those on its host. Raises ValueError when not initialised."""
        return _core.local_rank()

    def cross_rank(self):
        """Index of this host among the hosts with a process of this local rank. Raises ValueError
        when not initialised."""
        return _core.cross_rank()

    def is_homogeneous(self):
        """Whether every host runs the same number of processes. Raises ValueError when not
        initialised."""
        return _core.is_homogeneous()

    def mpi_threads_supported(self):
        """Whether MPI was initialised with MPI_THREAD_MULTIPLE (not with
        ``HOROVOD_MPI_THREADS_DISABLE=1``).

        Raises:
            ValueError: Horovod is not initialised, or the MPI controller is not in use.
        """
        _require_initialized()
        if not self.mpi_enabled():
            raise ValueError("mpi_threads_supported() needs the MPI controller, which is not in use "
                             f"(the {_core.backend_name()} controller is).")
        return _core.mpi_threads_supported()

    def mpi_enabled(self):
        """Whether the MPI controller is in use in this run."""
        return _core.is_initialized() and _core.backend_name() == "mpi"

    def mpi_built(self):
        """Whether Horovod was built with MPI (its MPI backend plugin loads)."""
        return "mpi" in _core.built_backends()

    def gloo_enabled(self):
        """Whether the Gloo controller is in use."""
        return _core.is_initialized() and _core.backend_name() == "gloo"

    def gloo_built(self):
        """Whether Horovod was built with Gloo."""
        return "gloo" in _core.built_backends()

    def nccl_built(self):
        """NCCL's version code (an int, ``major*10000 + minor*100 + patch``, e.g. 23203 for
        2.32.3) that this build was compiled against, or 0 when built without NCCL. Answers
        without loading CUDA or NCCL."""
        return _core.nccl_built()

    def ddl_built(self):
        """Whether Horovod was built with IBM's DDL: always False, this distribution does not build
        it (the method is kept because scripts written for upstream Horovod ask it)."""
        return False

    def ccl_built(self):
        """Whether Horovod was built with Intel's oneCCL: always False, this distribution does not build
        it (the method is kept because scripts written for upstream Horovod ask it)."""
        return False

    def cuda_built(self):
        """Whether this build has CUDA support (GPU tensors through NCCL)."""
        return _core.cuda_built()

    def rocm_built(self):
        """Whether Horovod was built with ROCm (AMD GPUs): always False, this distribution does not build
        it (the method is kept because scripts written for upstream Horovod ask it)."""
        return False

    def start_timeline(self, file_path, mark_cycles=False):
        """Starts writing the timeline (Chrome trace JSON, see docs/timeline.md) to ``file_path``
        on global rank 0, closing any file being written; other ranks accept the call and do
        nothing. Needs ``HOROVOD_TIMELINE`` set at init (a path, or ``DYNAMIC``).

        Args:
            file_path (str): the file to write.
            mark_cycles (bool): also write a ``CYCLE_START`` marker at each engine cycle.

        Raises:
            ValueError: Horovod is not initialised, or the timeline was not enabled at init.
        """
        _require_initialized()
        _core.start_timeline(str(file_path), bool(mark_cycles))

    def stop_timeline(self):
        """Stops the timeline and closes its file before returning (the file is complete JSON).
        A no-op when nothing is being recorded.

        Raises:
            ValueError: Horovod is not initialised.
        """
        _require_initialized()
        _core.stop_timeline()

    def dump_flight_recorder(self, directory=None):
        """Writes this rank's flight recorder: its last ``HOROVOD_FLIGHT_RECORDER_SIZE`` operations
        (default 1024), with when each was submitted, negotiated, started and finished and its
        outcome, as JSON to ``<directory>/flight_recorder_rank_<rank>.json`` (format:
        docs/engine.md, "Flight recorder"). ``python -m horovod.runner.flight_recorder DIR``
        compares the files of several ranks. Each rank writes its own file; call it on every rank
        for a full picture. The same file is written automatically to
        ``HOROVOD_FLIGHT_RECORDER_DIR`` on a deadlock, mismatch or stall error or a lost peer, and
        on ``SIGUSR2``.

        Args:
            directory (str or os.PathLike): where to write (created if missing); default
                ``HOROVOD_FLIGHT_RECORDER_DIR``.

        Returns:
            str: the path of the file written.

        Raises:
            ValueError: Horovod is not initialised, the recorder is off
                (``HOROVOD_FLIGHT_RECORDER_SIZE=0``), no directory is given or configured, or the
                file cannot be written.
        """
        _require_initialized()
        return _core.dump_flight_recorder(os.fspath(directory) if directory is not None else "", "on demand")

    # Process-set internals used by horovod.common.process_sets and upstream's tests.

    def _get_process_set_ids_and_ranks(self):
        """{process set id: sorted list of global ranks} of every registered set."""
        _require_initialized()
        return dict(_core.process_set_ids_and_ranks())

    def _process_set_rank(self, process_set_id):
        """This process's rank within the set; ValueError if the set is unknown or this process
        is not a member."""
        return _core.process_set_rank(process_set_id)

    def _process_set_size(self, process_set_id):
        """Number of ranks of the set; ValueError if the set is unknown."""
        return _core.process_set_size(process_set_id)

    def _add_process_set_impl(self, ranks):
        """Registers a set on every rank (collective); returns its id, or None when a set with
        these ranks already exists. ValueError without HOROVOD_DYNAMIC_PROCESS_SETS=1."""
        _require_initialized()
        return _core.add_process_set(list(ranks))

    def _remove_process_set_impl(self, process_set_id):
        """Removes a set on every rank (collective); returns its id, or None if it was unknown."""
        _require_initialized()
        return _core.remove_process_set(process_set_id)

    def _comm_process_set_id(self, comm):
        """The id of the registered process set whose ranks are the members of mpi4py
        communicator ``comm``; ValueError when there is none or MPI is not in use."""
        if not self.mpi_enabled():
            raise ValueError("Process sets from mpi4py communicators need the MPI controller, which is "
                             "not in use.")
        ranks = _ranks_of_comm(comm, 0)
        for set_id, set_ranks in self._get_process_set_ids_and_ranks().items():
            if set_ranks == ranks:
                return set_id
        raise ValueError(f"No process set is registered for the communicator's ranks {ranks}.")
