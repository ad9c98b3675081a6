"""A real Horovod job under horovodrun: the engine's Gloo rendezvous goes through our server.

Needs the built horovod-core (``horovod.common.basics`` and its compiled engine) and numpy.
"""

import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    x = np.full(4, hvd.rank() + 1, dtype=np.float32)
    handle = ops.allreduce_async([x], [x], ["allreduce.x"], hvd.Sum)
    ops.wait(handle)
    print("rank %d size %d local %d sum %s" % (hvd.rank(), hvd.size(), hvd.local_rank(),
                                               x.tolist()))
    hvd.shutdown()
""")


def test_allreduce_job(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "3",
                          sys.executable, str(worker)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(3):
        assert "[%d]<stdout>:rank %d size 3 local %d sum [6.0, 6.0, 6.0, 6.0]" % (
            rank, rank, rank) in run.stdout
