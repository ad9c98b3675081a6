"""Messages of the elastic launcher."""

RESET_LIMIT_EXCEEDED_MESSAGE = (
    "Job has been shutdown, as the number of elastic resets exceeded the --reset-limit of {}.")
