"""Process sets: subsets of global ranks that run collectives independently (spec core.md §5).

Each registered set has its own negotiation (its coordinator is its lowest global rank), its own
tensor name space and its own response cache. Sets are registered statically with
``hvd.init(process_sets=[...])`` or, with ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or
``hvd.init(process_sets="dynamic")``), added and removed at run time by every rank together.
"""


class ProcessSet:
    """A set of global ranks.

    Args:
        ranks_or_comm: a sequence of int global ranks (sorted on construction). mpi4py
            communicators need an MPI build.

    Raises:
        ValueError: an element is not an int, or a communicator was given without MPI.
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if hasattr(ranks_or_comm, "Get_group") and hasattr(ranks_or_comm, "handle"):
            # An mpi4py communicator: its members' global ranks are resolved by hvd.init().
            from horovod.common import _core
            if "mpi" not in _core.built_backends():
                raise ValueError("ProcessSet expects a list of ranks or an mpi4py Comm; mpi4py "
                                 "communicators need a build of Horovod with MPI, which this is not.")
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet expects a list of ranks or an mpi4py Comm, got "
                             f"{type(ranks_or_comm).__name__}.") from None
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet expects a list of ranks or an mpi4py Comm, got {ranks_or_comm!r}")
        self.ranks = sorted(ranks)

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set, or None while the set is not registered.

        Raises ValueError when the engine does not know the set (removed, or from an earlier init)."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_size(self.process_set_id)

    def rank(self):
        """This process's rank within the set (0..size()-1), or None while the set is not
        registered.

        Raises ValueError when the engine does not know the set, or this process is not a member
        (the message says which)."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_rank(self.process_set_id)

    def included(self):
        """Whether this process belongs to the set (None while ranks are unknown)."""
        if self.ranks is None:
            return None
        return _basics.rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_basics = None


def check_adasum_process_set(process_set, what='Adasum'):
    """The Adasum process-set rule, for the framework packages: Adasum combines the ranks by
    recursive halving over the global process set (core.md §6.10), so it runs on that set only.
    The core enforces the same rule when an Adasum allreduce is enqueued
    (csrc/collectives/allreduce.cc); this answers earlier, where nothing is enqueued yet (an
    optimizer's constructor), with upstream's exception type.

    Args:
        process_set: a :class:`ProcessSet`.
        what: the operation or class named in the error.

    Raises:
        NotImplementedError: ``process_set`` is not the global process set.
    """
    if process_set is not global_process_set and process_set.process_set_id != global_process_set.process_set_id:
        raise NotImplementedError(f'{what} with op=Adasum supports only the global process set, not {process_set}.')


def _temp_process_set_object(process_set_id):
    """A bare ProcessSet carrying only an id."""
    ps = ProcessSet([])
    ps.process_set_id = process_set_id
    ps.ranks = None
    return ps


def _registered_id(process_set):
    """The id of ``process_set``, for a framework's collectives. Raises ValueError when it is not a
    ProcessSet or is not registered."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f'process_set must be a horovod ProcessSet, got {type(process_set).__name__}.')
    if process_set.process_set_id is None:
        raise ValueError(f'{process_set} is not registered with Horovod (it has no process set id); '
                         'pass a registered process set such as global_process_set.')
    return process_set.process_set_id


def _setup(basics):
    global _basics
    _basics = basics


def _init_process_sets(process_set_list):
    """Called by init() once the engine is up: fills in the global set's ranks and gives each
    object of ``process_set_list`` the id the engine registered for its ranks. Returns the list
    indices of objects that duplicate an earlier entry or the global set (they are invalidated)."""
    ids_and_ranks = _basics._get_process_set_ids_and_ranks()
    global_process_set.ranks = ids_and_ranks[0]
    by_ranks = {tuple(ranks): set_id for set_id, ranks in ids_and_ranks.items()}
    seen = {tuple(global_process_set.ranks)}
    duplicates = []
    for index, ps in enumerate(process_set_list or []):
        key = tuple(ps.ranks)
        if key in seen:
            ps._invalidate()
            duplicates.append(index)
            continue
        seen.add(key)
        ps.process_set_id = by_ranks.get(key)
    return duplicates


def add_process_set(process_set):
    """Registers a new process set on every rank (a blocking collective over all global ranks,
    which must all call it with the same ranks). Needs ``HOROVOD_DYNAMIC_PROCESS_SETS=1``.

    Args:
        process_set: a ProcessSet or a sequence of int global ranks.

    Returns:
        The ProcessSet, with its ``process_set_id`` set.

    Raises:
        ValueError: dynamic process sets are not enabled, a rank is out of range, or a set with
            these ranks already exists (the message shows it).
        NotImplementedError: for a set built from an mpi4py communicator.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.mpi_comm is not None:
        raise NotImplementedError("Adding a process set built from an mpi4py communicator is not supported.")
    set_id = _basics._add_process_set_impl(process_set.ranks)
    if set_id is None:
        existing = [i for i, r in _basics._get_process_set_ids_and_ranks().items() if r == process_set.ranks]
        shown = _temp_process_set_object(existing[0] if existing else None)
        shown.ranks = process_set.ranks
        raise ValueError(f"Attempted to add a duplicate process set: {shown} is already registered.")
    process_set.process_set_id = set_id
    return process_set


def remove_process_set(process_set):
    """Removes a process set on every rank (a blocking collective over all global ranks) and
    invalidates the object. Operations still queued on the set fail.

    Args:
        process_set (ProcessSet): the set to remove, as returned by :func:`add_process_set` or
            passed to ``hvd.init(process_sets=...)``.

    Returns:
        False for an object that is not registered or for the global set, else whether the
        engine removed the set."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    removed = _basics._remove_process_set_impl(set_id)
    process_set._invalidate()
    return removed is not None
