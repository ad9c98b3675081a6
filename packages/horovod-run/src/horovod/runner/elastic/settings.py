"""Settings of an elastic job."""

from horovod.runner.common.util.settings import BaseSettings


class ElasticSettings(BaseSettings):
    """:class:`BaseSettings` plus the elastic parameters.

    Args:
        discovery: a :class:`~horovod.runner.elastic.discovery.HostDiscovery` (not pickled).
        min_num_proc, max_num_proc: the fewest and the most workers (``min_num_proc`` defaults
            to ``num_proc``).
        elastic_timeout: seconds to wait for ``min_num_proc`` slots.
        reset_limit: the most resets, or None.
        cooldown_range: ``(lo, hi)`` seconds of blacklist cooldown, or None.
    """

    def __init__(self, discovery, min_num_proc, max_num_proc, elastic_timeout, reset_limit,
                 cooldown_range=None, **kwargs):
        super().__init__(elastic=True, **kwargs)
        self.discovery = discovery
        self.min_num_proc = min_num_proc if min_num_proc is not None else self.num_proc
        self.max_num_proc = max_num_proc
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.cooldown_range = cooldown_range

    def __getstate__(self):
        state = dict(self.__dict__)
        state["discovery"] = None
        return state
