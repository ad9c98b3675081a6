"""A small on-disk cache of the launcher's start-up checks (ssh reachability, interfaces)."""

import functools
import json
import os
import threading
import time


class Cache:
    """Values stored in ``<cache_folder>/cache.json`` for ``staleness_minutes`` minutes.

    ``parameters_hash`` (str) ties the entries to the job's parameters (hosts, ssh options,
    interfaces): a different hash starts with an empty cache. Values must be JSON-serialisable.
    A cache file that cannot be read or written is ignored (the checks just run again).
    """

    def __init__(self, cache_folder, cache_staleness_threshold_in_minutes, parameters_hash):
        self._folder = cache_folder
        self._file = os.path.join(cache_folder, "cache.json")
        self._staleness_s = cache_staleness_threshold_in_minutes * 60
        self._hash = parameters_hash
        self._lock = threading.Lock()

    def _load(self):
        try:
            with open(self._file) as f:
                content = json.load(f)
        except (OSError, ValueError):
            return {}
        if not isinstance(content, dict) or content.get("parameters_hash") != self._hash:
            return {}
        return content.get("entries", {})

    def get(self, key):
        """The value stored for ``key`` if it is fresh, else None."""
        with self._lock:
            entry = self._load().get(key)
        if not entry or time.time() - entry[0] > self._staleness_s:
            return None
        return entry[1]

    def put(self, key, val):
        with self._lock:
            entries = self._load()
            entries[key] = (time.time(), val)
            try:
                os.makedirs(self._folder, exist_ok=True)
                tmp = self._file + ".%d.tmp" % os.getpid()
                with open(tmp, "w") as f:
                    json.dump({"parameters_hash": self._hash, "entries": entries}, f)
                os.replace(tmp, self._file)
            except OSError:
                pass


def use_cache():
    """Decorator: the function gains an ``fn_cache=None`` keyword; with a :class:`Cache`, a
    truthy result is stored under the function's name and arguments and returned next time."""
    def wrap(func):
        @functools.wraps(func)
        def wrapped(*args, fn_cache=None, **kwargs):
            if fn_cache is None:
                return func(*args, **kwargs)
            key = json.dumps([func.__name__, [repr(a) for a in args],
                              sorted((k, repr(v)) for k, v in kwargs.items())])
            cached = fn_cache.get(key)
            if cached is not None:
                return cached
            result = func(*args, **kwargs)
            if result:
                fn_cache.put(key, result)
            return result
        return wrapped
    return wrap
