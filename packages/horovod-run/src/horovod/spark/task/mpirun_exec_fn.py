"""One Horovod rank of :func:`horovod.spark.run` with MPI:
``python -m horovod.spark.task.mpirun_exec_fn <b64 driver addresses> <b64 settings>``, started
by mpirun's ``orted`` daemon in a Spark task.

It changes into the task's working folder (``HOROVOD_SPARK_WORK_DIR``), takes its rank from
``OMPI_COMM_WORLD_RANK``, fetches the cloudpickled ``(fn, args, kwargs)`` from the driver service
(key in ``_HOROVOD_SECRET_KEY``, removed from the environment before ``fn`` runs), calls ``fn``
and sends the result, or the traceback, back. Exits 0, or 1 when ``fn`` raised (at once, without
Horovod's shutdown, so that mpirun stops the other ranks).
"""

import os
import sys
import traceback

import cloudpickle

from horovod.common.rendezvous import SECRET_ENV
from horovod.runner.common.util import codec
from horovod.spark.common import util
from horovod.runner.common.util import env_names


def main(argv):
    addresses, settings = codec.loads_base64(argv[1]), codec.loads_base64(argv[2])
    work_dir = os.environ.get(env_names.SPARK_WORK_DIR)
    if work_dir:
        os.chdir(work_dir)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    key = bytes.fromhex(os.environ.pop(SECRET_ENV))
    client = util.DriverClient(addresses, key, verbose=settings.get("verbose", 0))
    payload = client.send(util.GetPayload())
    result, error, code = None, None, 0
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = cloudpickle.dumps(fn(*args, **kwargs))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code == 0:
            result = cloudpickle.dumps(None)
        else:
            error = traceback.format_exc()
    except BaseException:
        error = traceback.format_exc()
        code = 1
    if error:
        sys.stderr.write(error)
    sys.stdout.flush()
    sys.stderr.flush()
    client.send(util.RankResult(rank, result, error))
    if code != 0:
        # Without MPI_Finalize (Horovod's shutdown at exit), mpirun takes the exit as a failure
        # and stops the other ranks at once; after it, mpirun would wait for them to end.
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
