"""Reading the autotune log (HOROVOD_AUTOTUNE_LOG, spec core.md §12) in tests."""

import csv
import math

HEADER = ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled", "cycle_time_ms",
          "tensor_fusion_threshold", "score"]


def read_log(path):
    """The log's rows after its header, each checked (the header, seven fields, 0/1 switches, a
    finite positive score) and returned as a dict: ``flags`` (the four switches, ints), ``cache``
    (flags[3]), ``cycle`` (ms), ``fusion`` (MiB) and ``score`` (bytes allreduced per second)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == HEADER
    parsed = []
    for row in rows[1:]:
        assert len(row) == len(HEADER), row
        flags = [int(v.strip()) for v in row[:4]]
        assert all(v in (0, 1) for v in flags), row
        cycle, fusion, score = (float(v.strip()) for v in row[4:])
        assert math.isfinite(score) and score > 0, row
        parsed.append({"flags": flags, "cache": flags[3], "cycle": cycle, "fusion": fusion, "score": score})
    return parsed
