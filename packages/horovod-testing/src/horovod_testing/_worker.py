"""Entry point of one rank started by run_ranks: python -m horovod_testing._worker PAYLOAD RESULT."""

import pickle
import sys
import traceback

import cloudpickle


def main(payload_path, result_path):
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    sys.path[:] = payload["sys_path"]
    try:
        fn, args = cloudpickle.loads(payload["call"])
        outcome = ("ok", fn(*args))
    except BaseException:  # noqa: B036 - every failure is reported to the parent
        outcome = ("error", traceback.format_exc())
    with open(result_path, "wb") as f:
        cloudpickle.dump(outcome, f)
    return 0 if outcome[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
