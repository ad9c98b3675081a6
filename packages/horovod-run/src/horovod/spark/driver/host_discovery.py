"""Host discovery of :func:`horovod.spark.run_elastic`: the hosts are the Spark tasks."""

from horovod.runner.elastic.discovery import HostDiscovery


class SparkDriverHostDiscovery(HostDiscovery):
    """Each live Spark task attempt registered with ``driver`` (a
    :class:`~horovod.spark.driver.elastic_service.SparkElasticDriverService`) is a host of one
    slot, named by its host hash; hosts are listed in task index order."""

    def __init__(self, driver):
        self._driver = driver

    def find_available_hosts_and_slots(self):
        """``{host hash: 1}`` of the tasks that are registered and alive."""
        return {host: 1 for host in self._driver.available_hosts() if host}
