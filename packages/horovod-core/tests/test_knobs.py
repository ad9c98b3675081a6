"""horovod.common.knobs: the engine's knob table, read from the compiled core."""

import pytest

from horovod.common import knobs


def test_table_rows_and_lookup():
    table = knobs.table()
    # Names, defaults and docs as config.cc declares them, in its order (the topology first).
    assert list(table)[:2] == ["HOROVOD_RANK", "HOROVOD_SIZE"]
    assert table["HOROVOD_CYCLE_TIME"].default == "1"
    assert table["HOROVOD_DEADLOCK_TIMEOUT_SECONDS"].default == "5"
    assert all(name.startswith("HOROVOD_") and row.name == name and row.doc for name, row in table.items())
    assert knobs.knob("FUSION_THRESHOLD") == "HOROVOD_FUSION_THRESHOLD"


def test_unknown_knob_is_refused():
    with pytest.raises(ValueError, match="HOROVOD_FUSION_TRESHOLD.*HOROVOD_FUSION_THRESHOLD"):
        knobs.knob("FUSION_TRESHOLD")
