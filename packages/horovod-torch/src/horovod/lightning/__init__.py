"""Horovod for Lightning 2.x: ``Trainer(strategy=HorovodStrategy())`` and
``Fabric(strategy=HorovodFabricStrategy())``, one process per device, started by ``horovodrun``
(or ``horovod.ray`` / ``horovod.spark.run``). See docs/lightning.md.

Needs ``lightning>=2.4``: ``pip install "horovod-torch[lightning]"``.
"""

try:
    import lightning  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("horovod.lightning needs Lightning 2.4 or later: pip install 'horovod-torch[lightning]' "
                      f"({e})") from e

from horovod.lightning.environment import HorovodEnvironment
from horovod.lightning.fabric import HorovodFabricStrategy
from horovod.lightning.strategy import HorovodStrategy

__all__ = ["HorovodEnvironment", "HorovodFabricStrategy", "HorovodStrategy"]
