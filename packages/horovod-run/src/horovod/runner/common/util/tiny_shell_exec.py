"""Run a short command and capture its combined output (for probes such as ``mpirun --version``)."""

import subprocess


def execute(command, env=None):
    """Run ``command`` (a ``/bin/sh -c`` string) and return ``(output, exit_code)``.

    ``output`` is stdout and stderr interleaved, decoded as UTF-8 (undecodable bytes replaced).
    Returns None when the shell itself cannot be started.
    """
    try:
        proc = subprocess.run(command, shell=True, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError:
        return None
    return proc.stdout.decode("utf-8", errors="replace"), proc.returncode
