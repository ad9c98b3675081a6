"""Messages of the elastic launcher.

Each one starts with upstream Horovod's sentence, which job wrappers and tests match on; the
details this launcher adds (hosts, ranks, exit statuses) come after it.
"""

RESET_LIMIT_EXCEEDED_MESSAGE = (
    "Job has been shutdown, as the number of elastic resets exceeded the --reset-limit of {}.")

# The job ended because its workers exited non-zero (every worker failed, or every host of the
# job is blacklisted): the first of them to exit, by exit time.
WORKER_FAILED_MESSAGE = (
    "Horovod detected that one or more processes exited with non-zero status, thus causing the "
    "job to be terminated. The first process to do so was:\nProcess name: {name}\n"
    "Exit code: {code}\n")

SHUTDOWN_MESSAGE = "Job has been shutdown, see above error messages for details."

MIN_SLOTS_TIMEOUT_MESSAGE = (
    "Timed out waiting for minimum number of slots to become available. Please check that you "
    "have enough resources to run at least {} Horovod processes.")

NO_PREVIOUS_HOSTS_MESSAGE = "No hosts from previous set remaining, unable to broadcast state."
