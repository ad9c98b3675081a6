"""mpirun's rsh agent under :func:`horovod.spark.run` with MPI:
``python -m horovod.spark.driver.mpirun_rsh <b64 driver addresses> <b64 settings> HOST COMMAND...``.

Open MPI calls it as it would call ssh, to start its ``orted`` daemon on ``HOST`` (a host hash).
The agent asks the driver service to have that host's first Spark task run ``COMMAND`` (joined
into one shell command line), waits for it to end and exits with its exit code: 255 when the
driver or the task is lost, as ssh does. The service key comes from ``_HOROVOD_SECRET_KEY``.
"""

import os
import sys
import time

from horovod.common.rendezvous import SECRET_ENV
from horovod.runner.common.util import codec
from horovod.spark.common import util

POLL_INTERVAL_S = 0.2
# Variables of mpirun's environment the daemon needs too (running as root).
PASSED_ON = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def main(argv):
    if len(argv) < 5:
        sys.stderr.write("usage: mpirun_rsh <driver addresses> <settings> HOST COMMAND...\n")
        return 2
    addresses, settings = codec.loads_base64(argv[1]), codec.loads_base64(argv[2])
    host, command = argv[3], " ".join(argv[4:])
    if ":" in host:
        sys.stderr.write("horovod.spark mpirun_rsh: host %r contains ':', which Open MPI 4 cannot take as a host "
                         "name\n" % host)
        return 1
    key = bytes.fromhex(os.environ[SECRET_ENV])
    env = {name: os.environ[name] for name in PASSED_ON if name in os.environ}
    try:
        client = util.DriverClient(addresses, key, verbose=settings.get("verbose", 0))
        command_id = client.send(util.RunCommand(host, command, env))
        if command_id is None:
            sys.stderr.write("horovod.spark mpirun_rsh: no Spark task of host %s\n" % host)
            return 255
        while True:
            code = client.send(util.CommandStatus(command_id))
            if code is not None:
                return code
            time.sleep(POLL_INTERVAL_S)
    except (ConnectionError, OSError) as e:
        sys.stderr.write("horovod.spark mpirun_rsh: the driver service cannot be reached: %s\n" % e)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv))
