"""horovod.spark.run across the multi-host test bed: a Spark standalone cluster whose master
runs here on the bed's bridge (198.18.0.254) and whose two workers run on hosts hvd-h1 and hvd-h2
(network namespaces at 198.18.0.1 and .2, ci/testbed.sh), each worker and its executors bound to
its host's address. The digits example (docs/examples/spark) runs at 2 and 4 ranks: the ranks
meet over the bed's network, grouped into hosts by where Spark placed their tasks.

Every file goes under the test's tmp_path; every daemon is stopped by PID at the test's end (the
bed's fixture then checks that nothing is left on its hosts). Run by ``nox -s tests-spark``.
"""

import os
import socket
import sys

import cloudpickle
import pytest

pyspark = pytest.importorskip("pyspark")

import horovod.spark  # noqa: E402
from test_spark import WORKERS, Cluster, _load_digits_example, check_digits, spark_context  # noqa: E402

# The ranks' functions travel by value: the executors cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
BRIDGE = "198.18.0.254"


def _where():
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    return hvd.rank(), hvd.local_rank(), socket.gethostname(), os.environ["HOROVOD_GLOO_IFACE"]


def test_digits_on_testbed_hosts(testbed, tmp_path):
    bed = testbed
    addresses = [bed.host(k)[1] for k in range(1, WORKERS + 1)]
    cluster = Cluster(tmp_path / "spark", host=BRIDGE)
    try:
        cluster.start_master()
        for k, address in enumerate(addresses, 1):
            cluster.start_worker(k, host=address, prefix=bed.command(k, []))
    except BaseException:
        cluster.stop()
        raise
    digits = _load_digits_example()
    with spark_context(cluster, WORKERS, driver_host=BRIDGE):
        # The ranks run on the bed's hosts and meet over its bridge.
        where = horovod.spark.run(_where, num_proc=4, start_timeout=90, verbose=0)
        assert sorted(host for _, _, host, _ in where) == ["hvd-h1", "hvd-h1", "hvd-h2", "hvd-h2"], where
        assert {iface for _, _, _, iface in where} == {"hvdbr0"}, where
        assert [local_rank for _, local_rank, _, _ in where] == [0, 1, 0, 1], where
        for num_proc in (2, 4):
            results = horovod.spark.run(digits.train, num_proc=num_proc, start_timeout=90, verbose=0)
            by_host = check_digits(results, num_proc)
            if num_proc == 4:
                # Two executors on two bed hosts, two task slots each: two hosts of two ranks,
                # named by host hashes of hvd-h1 and hvd-h2.
                assert sorted(len(members) for members in by_host.values()) == [2, 2], results
