"""The ssh command lines with which the launcher reaches remote hosts."""

import shlex

SSH_COMMAND_PREFIX = "ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no"
KUBEFLOW_MPI_EXEC = "/etc/mpi/kubexec.sh"


def ssh_argv(host, port=None, identity_file=None, timeout_s=None):
    """The ``ssh`` arguments (a list, without the remote command) that reach ``host``.

    Args:
        host: host name or address.
        port: ssh port (int) or None for ssh's default (22 or the user's ssh config).
        identity_file: private key file or None.
        timeout_s: connection timeout in seconds (ssh's ``ConnectTimeout``) or None.
    """
    argv = shlex.split(SSH_COMMAND_PREFIX) + [host]
    if port:
        argv += ["-p", str(port)]
    if identity_file:
        argv += ["-i", str(identity_file)]
    if timeout_s:
        argv += ["-o", "ConnectTimeout=%d" % int(timeout_s)]
    return argv


def get_ssh_command(local_command, host, port=None, identity_file=None, timeout_s=None):
    """``local_command`` (a shell string) run on ``host`` through ssh, as one shell string."""
    port_arg = "-p %s" % port if port else ""
    identity_arg = "-i %s" % shlex.quote(str(identity_file)) if identity_file else ""
    timeout_arg = "-o ConnectTimeout=%s" % timeout_s if timeout_s else ""
    return "%s %s %s %s %s %s" % (SSH_COMMAND_PREFIX, host, port_arg, identity_arg, timeout_arg,
                                  shlex.quote(local_command))


def get_remote_command(local_command, host, port=None, identity_file=None, timeout_s=None):
    """Like :func:`get_ssh_command`, or Kubeflow's exec helper when the MPI operator set it."""
    import os
    if os.environ.get("OMPI_MCA_plm_rsh_agent") == KUBEFLOW_MPI_EXEC:
        return "%s %s %s" % (KUBEFLOW_MPI_EXEC, host, shlex.quote(local_command))
    return get_ssh_command(local_command, host, port, identity_file, timeout_s)
