"""horovodrun with two host names of this machine (``-H localhost:2,127.0.0.1:2``): the workers get
one HOROVOD_HOSTNAME per host and the matching local/cross ranks, the engine groups them into two
hosts, and ``--hierarchical-allreduce`` / ``--hierarchical-allgather`` switch its hierarchical
collectives on (spec runner.md §2.2; core.md §7). One host name everywhere keeps the one-host
shared-memory transport.

Needs the built horovod-core and numpy.
"""

import json
import subprocess
import sys
import textwrap

LAUNCH_TIMEOUT_S = 180

WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for n in (1, 7, 100_003):
        x = np.arange(n, dtype=np.int64) * (rank + 1)
        ops.wait(ops.allreduce_async([x], [x], ["x%d" % n], hvd.Sum))
        assert np.array_equal(x, np.arange(n, dtype=np.int64) * (size * (size + 1) // 2)), (n, x)
    rows = rank % 3
    y = np.full((rows, 2), rank, dtype=np.float32)
    g = np.asarray(ops.wait(ops.allgather_async([y], ["y"]))[0])
    expected = np.concatenate([np.full((r % 3, 2), r, dtype=np.float32) for r in range(size)])
    assert np.array_equal(g, expected), g
    print("RESULT " + json.dumps({
        "host": os.environ["HOROVOD_HOSTNAME"], "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "stats": dict(_core.engine_stats())}))
    hvd.shutdown()
""")


def _run(tmp_path, args):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo"] + args +
                         [sys.executable, str(worker)], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {}
    for line in run.stdout.splitlines():
        prefix, _, rest = line.partition(":")
        if rest.startswith("RESULT "):
            results[int(prefix.split("]")[0].lstrip("["))] = json.loads(rest[len("RESULT "):])
    assert sorted(results) == [0, 1, 2, 3], run.stdout + run.stderr
    return results


def test_two_host_names_make_two_hosts_and_hierarchical_allreduce_runs(tmp_path):
    results = _run(tmp_path, ["-np", "4", "-H", "localhost:2,127.0.0.1:2", "--hierarchical-allreduce"])
    for rank, r in results.items():
        assert r["host"] == ("localhost" if rank < 2 else "127.0.0.1")
        assert (r["local_rank"], r["local_size"]) == (rank % 2, 2)
        assert (r["cross_rank"], r["cross_size"]) == (rank // 2, 2)
        stats = r["stats"]
        assert stats["hosts"] == 2 and not stats["shared_memory"]
        assert stats["hierarchical"] and stats["hierarchical_allreduce"] and not stats["hierarchical_allgather"]
        assert stats["hierarchical_allreduces"] == 3 and stats["hierarchical_allgathers"] == 0


def test_hierarchical_allgather_flag(tmp_path):
    results = _run(tmp_path, ["-np", "4", "-H", "localhost:2,127.0.0.1:2", "--hierarchical-allgather"])
    for r in results.values():
        stats = r["stats"]
        assert stats["hierarchical"] and stats["hierarchical_allgather"] and not stats["hierarchical_allreduce"]
        assert stats["hierarchical_allgathers"] == 1 and stats["hierarchical_allreduces"] == 0


def test_two_hosts_without_the_flags_stay_flat(tmp_path):
    results = _run(tmp_path, ["-np", "4", "-H", "localhost:2,127.0.0.1:2"])
    for r in results.values():
        stats = r["stats"]
        assert stats["hosts"] == 2 and not stats["shared_memory"] and not stats["hierarchical"]


def test_one_host_name_keeps_shared_memory(tmp_path):
    results = _run(tmp_path, ["-np", "4", "-H", "localhost:4", "--hierarchical-allreduce"])
    for r in results.values():
        stats = r["stats"]
        assert stats["hosts"] == 1 and stats["shared_memory"] and not stats["hierarchical"]
