"""Where the Estimators keep their data and runs: the training and validation Parquet that
:func:`horovod.spark.common.util.prepare_data` writes, and each run's checkpoint and logs.

Layout under a store's prefix::

    intermediate_train_data.<idx>/   Parquet, one file per Spark partition
    intermediate_val_data.<idx>/
    runs/<run_id>/checkpoint         the last epoch's checkpoint (bytes the estimator wrote)
    runs/<run_id>/logs/

:class:`FilesystemStore` reaches any fsspec URL (``file://``, ``memory://``, ``s3://`` with its
fsspec package, ...); the Parquet is written by Spark, so the prefix must also be a URL that Spark's
Hadoop file systems can write (``file://`` and ``hdfs://`` here). :class:`HDFSStore` reaches HDFS
through :class:`pyarrow.fs.HadoopFileSystem` (libhdfs and a Hadoop client on every host).
"""

import os
import urllib.parse

DEFAULT_CHECKPOINT_FILENAME = "checkpoint"


class Store:
    """The locations of one store; use :meth:`create` to get the right kind for a prefix."""

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        """The store for ``prefix_path`` (str): :class:`HDFSStore` for ``hdfs://`` URLs,
        :class:`FilesystemStore` for everything else (a bare path becomes a ``file://`` URL).
        ``args``/``kwargs`` go to that class. Raises ``ValueError`` for a prefix that is not a
        non-empty string."""
        if not isinstance(prefix_path, str) or not prefix_path:
            raise ValueError("the store's prefix_path must be a non-empty string (a path or a URL), got %r"
                             % (prefix_path,))
        if HDFSStore.matches(prefix_path):
            return HDFSStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)


def _join(base, *parts):
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts if p])


class FilesystemStore(Store):
    """A store on any fsspec file system.

    Args:
        prefix_path: a URL (``file:///data/hvd``, ``memory://x``) or a local path (str).
        train_path, val_path, test_path: where the intermediate Parquet goes; default under
            the prefix (``intermediate_<kind>_data``, suffixed ``.<idx>`` per dataset index).
        runs_path: the folder of the runs; default ``<prefix>/runs``.
        save_runs: keep checkpoints and logs (bool; default True).
        storage_options: a dict passed to fsspec for the prefix's protocol.
        checkpoint_filename: the checkpoint's file name in a run's folder (default ``checkpoint``).
    """

    def __init__(self, prefix_path, train_path=None, val_path=None, test_path=None, runs_path=None,
                 save_runs=True, storage_options=None, checkpoint_filename=None):
        self.prefix_path = self._normalize(prefix_path)
        self._train_path = train_path or _join(self.prefix_path, "intermediate_train_data")
        self._val_path = val_path or _join(self.prefix_path, "intermediate_val_data")
        self._test_path = test_path or _join(self.prefix_path, "intermediate_test_data")
        self._runs_path = runs_path or _join(self.prefix_path, "runs")
        self._save_runs = save_runs
        self.storage_options = dict(storage_options or {})
        self._checkpoint_filename = checkpoint_filename or DEFAULT_CHECKPOINT_FILENAME
        self._fs = None

    @staticmethod
    def _normalize(prefix_path):
        if "://" in prefix_path:
            return prefix_path.rstrip("/")
        return "file://" + os.path.abspath(prefix_path)

    # Paths.

    def get_train_data_path(self, idx=None):
        """The training Parquet folder of dataset ``idx`` (int; None: the unsuffixed one)."""
        return self._train_path if idx is None else "%s.%d" % (self._train_path, idx)

    def get_val_data_path(self, idx=None):
        """The validation Parquet folder of dataset ``idx`` (int; None: the unsuffixed one)."""
        return self._val_path if idx is None else "%s.%d" % (self._val_path, idx)

    def get_test_data_path(self, idx=None):
        """The test Parquet folder of dataset ``idx`` (int; None: the unsuffixed one); the
        Estimators write none, the path is kept for upstream's scripts."""
        return self._test_path if idx is None else "%s.%d" % (self._test_path, idx)

    def get_runs_path(self):
        """The folder that holds one folder per run (a URL, str)."""
        return self._runs_path

    def get_run_path(self, run_id):
        """The folder of run ``run_id`` (str): ``<runs path>/<run_id>``, whether or not the store
        keeps runs."""
        return _join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id):
        """The checkpoint file of ``run_id``; None when the store does not keep runs."""
        return _join(self.get_run_path(run_id), self._checkpoint_filename) if self._save_runs else None

    def get_logs_path(self, run_id):
        """The logs folder of ``run_id`` (str), ``<run path>/logs``; None when the store does not
        keep runs."""
        return _join(self.get_run_path(run_id), "logs") if self._save_runs else None

    def get_checkpoint_filename(self):
        """The checkpoint's file name in a run's folder (str; ``checkpoint`` by default)."""
        return self._checkpoint_filename

    def saving_runs(self):
        """Whether the store keeps checkpoints and logs (the ``save_runs`` it was made with)."""
        return self._save_runs

    # File access through fsspec.

    def get_filesystem(self):
        """The fsspec file system of the prefix (created once per process)."""
        if self._fs is None:
            import fsspec
            self._fs = fsspec.url_to_fs(self.prefix_path, **self.storage_options)[0]
        return self._fs

    def get_arrow_filesystem(self):
        """``(pyarrow.fs.FileSystem, path_of)``: the file system pyarrow.dataset reads with, and
        the function that turns one of this store's URLs into a path on it."""
        import pyarrow.fs
        if self.prefix_path.startswith("file://"):
            return pyarrow.fs.LocalFileSystem(), self._local_path
        fs = self.get_filesystem()
        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)), fs._strip_protocol

    @staticmethod
    def _local_path(url):
        return urllib.parse.urlparse(url).path if url.startswith("file://") else url

    def exists(self, url):
        """Whether the file or folder ``url`` (str, a URL of this store's file system) exists."""
        return self.get_filesystem().exists(url)

    def read(self, url):
        """The bytes of file ``url``."""
        with self.get_filesystem().open(url, "rb") as f:
            return f.read()

    def write(self, url, data):
        """Write ``data`` (bytes) to ``url`` atomically where the file system can (a temporary
        name, then a rename), creating its folder."""
        fs = self.get_filesystem()
        parent = url.rsplit("/", 1)[0]
        fs.makedirs(parent, exist_ok=True)
        tmp = url + ".tmp"
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, url)

    def remove(self, url):
        """Delete the file or folder ``url`` (str), a folder with everything under it; a no-op
        when it does not exist."""
        fs = self.get_filesystem()
        if fs.exists(url):
            fs.rm(url, recursive=True)

    def __getstate__(self):
        # The open file system stays behind: each process (a rank, an executor) opens its own.
        state = dict(self.__dict__)
        state["_fs"] = None
        return state


class LocalStore(FilesystemStore):
    """:class:`FilesystemStore` under its former name (kept for upstream's scripts)."""


_HDFS_URL_PREFIX = "hdfs://"


class HDFSStore(FilesystemStore):
    """A store on HDFS, through :class:`pyarrow.fs.HadoopFileSystem` (libhdfs, the JVM and the
    Hadoop client's CLASSPATH on every host).

    Args:
        prefix_path: ``hdfs://[host[:port]]/path`` or a path (``/path``) on the default name node.
        host, port: the name node (str, int) when the URL does not name one; default
            ``'default'`` and ``0`` (the client's configuration decides).
        user, kerb_ticket, extra_conf: passed to ``HadoopFileSystem``.
        driver: accepted for upstream's scripts; only ``'libhdfs'`` exists.
        *args: further positional arguments of :class:`FilesystemStore`, after ``extra_conf``
            (``train_path``, ``val_path``, ``test_path``, ...).
        **kwargs: further keyword arguments of :class:`FilesystemStore` (``train_path``,
            ``val_path``, ``test_path``, ``runs_path``, ``save_runs``, ``storage_options``,
            ``checkpoint_filename``).

    Raises:
        ValueError: a prefix with another scheme, or ``driver`` other than ``'libhdfs'``.
    """

    def __init__(self, prefix_path, host=None, port=None, user=None, kerb_ticket=None, driver="libhdfs",
                 extra_conf=None, *args, **kwargs):
        if driver != "libhdfs":
            raise ValueError("HDFSStore reaches HDFS through libhdfs only (pyarrow.fs.HadoopFileSystem); "
                             "driver=%r is not supported" % (driver,))
        url_host, url_port, path = self.parse_url(prefix_path)
        self._hdfs_kwargs = {"host": url_host or host or "default", "port": url_port or port or 0,
                             "user": user, "kerb_ticket": kerb_ticket, "extra_conf": extra_conf}
        self._url_prefix = "hdfs://%s" % (url_host if url_port is None else "%s:%d" % (url_host, url_port)) \
            if url_host else "hdfs://"
        super().__init__(self._url_prefix + path, *args, **kwargs)

    @staticmethod
    def matches(prefix_path):
        """Whether ``prefix_path`` (str) is an ``hdfs://`` URL, the prefixes
        :meth:`Store.create` gives to this class."""
        return prefix_path.startswith(_HDFS_URL_PREFIX)

    @staticmethod
    def parse_url(url):
        """The parts of ``url`` (str): an ``hdfs://[host[:port]]/path`` URL or a bare path.

        Returns:
            ``(host, port, path)``: the host (str) or None when the URL names none, the port
            (int) or None, and the path (str).

        Raises:
            ValueError: ``url`` has a scheme other than ``hdfs``.
        """
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("", "hdfs"):
            raise ValueError("HDFSStore takes an hdfs:// URL or an absolute path, got %r" % (url,))
        return parsed.hostname or None, parsed.port, parsed.path

    def _normalize(self, prefix_path):
        return prefix_path.rstrip("/")

    def _get_filesystem_fn(self):
        """A function of no arguments that connects to HDFS (``pyarrow.fs.HadoopFileSystem``
        with :attr:`_hdfs_kwargs`); it travels to the ranks, which connect themselves."""
        kwargs = dict(self._hdfs_kwargs)

        def connect():
            import pyarrow.fs
            return pyarrow.fs.HadoopFileSystem(**kwargs)

        return connect

    def get_filesystem(self):
        """The fsspec file system of the store: a ``pyarrow.fs.HadoopFileSystem`` connected with
        the store's host, port, user, Kerberos ticket and ``extra_conf``, wrapped in fsspec's
        ``ArrowFSWrapper`` (connected on the first call, once per process)."""
        if self._fs is None:
            import fsspec.implementations.arrow
            self._fs = fsspec.implementations.arrow.ArrowFSWrapper(self._get_filesystem_fn()())
        return self._fs

    def get_arrow_filesystem(self):
        """``(pyarrow.fs.HadoopFileSystem, path_of)``: a new connection to HDFS for
        ``pyarrow.dataset``, and the function that turns one of this store's ``hdfs://`` URLs into
        a path on it (the URL's path part)."""
        return self._get_filesystem_fn()(), lambda url: urllib.parse.urlparse(url).path

