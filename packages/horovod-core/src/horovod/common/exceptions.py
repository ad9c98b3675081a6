"""Exceptions shared by every framework package."""


class HorovodInternalError(RuntimeError):
    """A collective operation failed inside the engine: ranks disagreed on the operation, Horovod
    was shut down (possibly by another rank), or a peer process was lost. Elastic training catches
    it to restore state and re-initialise."""


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by elastic state when hosts were added or removed.

    Args:
        skip_sync (bool): True when hosts were only removed, so that state is still in sync and
            the next synchronisation can be skipped.
    """

    def __init__(self, skip_sync):
        super().__init__()
        self.skip_sync = skip_sync


def get_version_mismatch_message(name, version, installed_version):
    """Text explaining that Horovod was built for ``name`` ``version`` but ``installed_version``
    is installed."""
    return (f"Framework {name} installed with version {installed_version} but found version {version}. "
            f"This can result in unexpected behavior including runtime errors. Reinstall Horovod "
            f"against the installed framework version.")


class WorkerRemovedError(RuntimeError):
    """The elastic launcher removed this worker's slot from the job (its host was blacklisted or
    is no longer listed by the host discovery, or the job ended): the process should exit."""


class HorovodVersionMismatchError(ImportError):
    """A framework package found a framework version it does not support.

    Args:
        name (str): the framework's distribution name, e.g. ``"torch"``.
        version (str): the version Horovod was built or checked for.
        installed_version (str): the version found installed.
    """

    def __init__(self, name, version, installed_version):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version
