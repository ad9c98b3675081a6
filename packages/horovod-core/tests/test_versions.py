"""Versions: horovod.__version__ is upstream's compatibility level, the distribution has its own;
a framework package whose declared horovod-core range excludes the installed core fails at import
with a message naming both and the pip command that fixes it."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

import horovod
from horovod.common.util import check_framework_package, core_requirement, version_satisfies


def test_version_is_upstream_compatibility_level():
    assert horovod.__version__ == "0.28.1"
    assert importlib.metadata.version("horovod-core") != horovod.__version__


@pytest.mark.parametrize("version, specifier, expected", [
    ("0.29.0", ">=0.29,<0.30", True),
    ("0.29.7", "<0.30,>=0.29", True),
    ("0.30.0", ">=0.29,<0.30", False),
    ("0.28.1", ">=0.29,<0.30", False),
    ("0.29", "==0.29.0", True),
    ("0.29.3", "==0.29.*", True),
    ("0.30.0", "==0.29.*", False),
    ("0.29.2", "~=0.29.0", True),
    ("0.30.0", "~=0.29.0", False),
    ("0.29.0", "!=0.29.0", False),
    ("0.29.0rc1", ">=0.29", True),
    ("0.29.0", "", True),
])
def test_version_satisfies(version, specifier, expected):
    assert version_satisfies(version, specifier) is expected


def fake_distribution(folder, name, version, core_requirement):
    """An installed-looking distribution: just its dist-info with METADATA."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"Requires-Dist: {core_requirement}\nRequires-Dist: numpy\n"
                                   "Requires-Dist: horovod-core[test]; extra == \"test\"\n")


def check_in_subprocess(folder, distribution):
    """check_framework_package(distribution) in a Python that sees the fake distributions first."""
    env = dict(os.environ, PYTHONPATH=str(folder))
    code = ("from horovod.common.util import check_framework_package\n"
            f"check_framework_package({distribution!r})\nprint('compatible')\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_mismatched_core_names_the_package_the_range_and_the_fix(tmp_path):
    fake_distribution(tmp_path, "horovod-torch", "9.1.0", "horovod-core<9.2,>=9.1")
    proc = check_in_subprocess(tmp_path, "horovod-torch")
    assert proc.returncode != 0
    core = importlib.metadata.version("horovod-core")
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: horovod-torch 9.1.0 needs horovod-core<9.2,>=9.1, but horovod-core {core} is "
                    "installed. Fix: pip install 'horovod-core<9.2,>=9.1'"), proc.stderr


def test_compatible_core_passes(tmp_path):
    core = importlib.metadata.version("horovod-core")
    fake_distribution(tmp_path, "horovod-tf", "1.0.0", f"horovod-core (=={core})")
    proc = check_in_subprocess(tmp_path, "horovod-tf")
    assert proc.returncode == 0 and proc.stdout.strip() == "compatible", proc.stderr


def test_core_requirement_reads_the_declared_range(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "horovod-mxnet", "0.29.0", "horovod-core>=0.29,<0.30")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert core_requirement("horovod-mxnet") == ">=0.29,<0.30"


def test_unknown_package_is_refused():
    with pytest.raises(ImportError, match="not a package this horovod-core knows"):
        check_framework_package("horovod-jax")


def test_not_installed_package_is_not_checked():
    # A framework package run from a source tree has no distribution metadata.
    assert core_requirement("horovod-run-not-installed-anywhere") is None
