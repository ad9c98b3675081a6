"""Worker side of function mode: ``python -m horovod.runner.run_task <addr> <port>``.

Fetches the pickled function from the launcher's KV store (scope ``runfunc``, key ``func``),
calls it, and stores its return value under ``runfunc_result/<rank>``. The job secret comes from
``_HOROVOD_SECRET_KEY``; only authenticated data is unpickled.
"""

import os
import sys

from horovod.runner.common.util.env import get_env_rank_and_size
from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
from horovod.runner.common.util import env_names


def main(addr, port):
    """Run the job's function and publish its result; an exception in it is re-raised."""
    func = read_data_from_kvstore(addr, port, "runfunc", "func")
    try:
        result = func()
    except BaseException as e:
        print("The function run by horovod.run raised %s: %s" % (type(e).__name__, e),
              file=sys.stderr, flush=True)
        raise
    rank, _ = get_env_rank_and_size()
    put_data_into_kvstore(addr, port, "runfunc_result", str(rank), result)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m horovod.runner.run_task <addr> <port>")
    # "-": the launcher's address on the job's interface, as the launch gave it to the worker.
    address = sys.argv[1]
    if address == "-":
        address = os.environ[env_names.GLOO_RENDEZVOUS_ADDR]
    main(address, int(sys.argv[2]))
