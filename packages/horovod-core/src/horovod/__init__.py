"""Horovod: distributed training for PyTorch, TensorFlow, Keras and MXNet.

This file is shipped by ``horovod-core``; the framework packages (``horovod-torch``, ...) and the
launcher (``horovod-run``) add subpackages to the same ``horovod`` import package. The ``__path__``
extension lets those subpackages live in different folders (for example several editable installs).
"""

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)

# The upstream Horovod release whose API this project reproduces, which is what scripts written for
# upstream compare against (`horovodrun --version` prints it too). It is not the version of any of
# this project's distributions: importlib.metadata.version("horovod-core") (0.29.0, ...) gives those,
# and each package's CHANGELOG.md says what changed. It moves only when the API follows a newer
# upstream release.
__version__ = "0.28.1"


def __getattr__(name):
    # `horovod.run` is `horovod.runner.run`, resolved lazily so that the core does not depend on
    # the launcher package.
    if name == "run":
        try:
            from horovod.runner import run
        except ImportError as e:
            raise ImportError("horovod.run needs the horovod-run package: pip install horovod-run") from e
        return run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")
