"""Process sets: subsets of ranks that run collectives independently.

This release has only the global process set (id 0, every rank); adding sets comes later.
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
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet expects a list of ranks or an mpi4py Comm; mpi4py "
                             "communicators need a build of Horovod with MPI, which this is not.") from None
        if not all(isinstance(r, int) for r in ranks):
            raise ValueError(f"ProcessSet expects a list of ranks or an mpi4py Comm, got {ranks_or_comm!r}")
        self.ranks = sorted(ranks)

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set, or None while the set is not registered."""
        if self.process_set_id is None:
            return None
        _check_known(self.process_set_id)
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or None while the set is not registered.

        Raises ValueError when this process is not a member."""
        if self.process_set_id is None:
            return None
        _check_known(self.process_set_id)
        own = _basics.rank()
        if own not in self.ranks:
            raise ValueError(f"Rank {own} is not a member of {self}")
        return self.ranks.index(own)

    def included(self):
        """Whether this process belongs to the set (None while ranks are unknown)."""
        if self.ranks is None:
            return None
        return _basics.rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


def _check_known(process_set_id):
    if process_set_id != 0:
        raise ValueError(f"Process set {process_set_id} is not known to Horovod: only the global "
                         "process set (id 0) exists in this release.")


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_basics = None


def _temp_process_set_object(process_set_id):
    """A bare ProcessSet carrying only an id."""
    ps = ProcessSet([])
    ps.process_set_id = process_set_id
    ps.ranks = None
    return ps


def _setup(basics):
    global _basics
    _basics = basics


def _init_process_sets(basics):
    """Called by init(): fills in the global set's ranks."""
    _setup(basics)
    global_process_set.ranks = list(range(basics.size()))
