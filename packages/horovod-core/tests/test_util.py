"""horovod.common.util's helpers that upstream's tests and framework packages import
(spec/compat_internals.md §1)."""

import os

import pytest

import horovod.common
from horovod.common import util
from horovod.common.exceptions import HorovodVersionMismatchError


@pytest.mark.parametrize('ver, target, expected', [
    ('2.15.0', '2.15.0', True),
    ('2.15.1', '2.15.0', True),
    ('2.16', '2.15.9', True),
    ('2.9.0', '2.15.0', False),   # numbers, not strings: 9 < 15
    ('1.13.1+cpu', '1.13.0', True),
    ('2.16.0rc1', '2.16.0', False),
    ('2.16.0rc1', '2.15.9', True),
    ('2.16.0.post1', '2.16.0', True),
    ('2.16.0.dev20240101', '2.16.0', False),
    ('3', '2.99.99', True),
])
def test_is_version_greater_equal_than(ver, target, expected):
    assert util.is_version_greater_equal_than(ver, target) is expected


@pytest.mark.parametrize('ver, target', [(2, '1.0.0'), ('1.0.0', 1.0), (None, '1.0.0')])
def test_is_version_greater_equal_than_wants_str(ver, target):
    with pytest.raises(ValueError, match='str'):
        util.is_version_greater_equal_than(ver, target)


@pytest.mark.parametrize('target', ['1.0', '1', '1.0.0.0', 'x.y.z', '1.0.0rc1'])
def test_is_version_greater_equal_than_wants_three_numbers(target):
    with pytest.raises(ValueError, match='major.minor.patch'):
        util.is_version_greater_equal_than('1.0.0', target)


def test_is_version_greater_equal_than_rejects_non_version():
    with pytest.raises(ValueError, match='not a version'):
        util.is_version_greater_equal_than('abc', '1.0.0')


def test_is_version_greater_equal_than_is_memoised():
    assert util.is_version_greater_equal_than.__wrapped__ is not None
    assert util.is_version_greater_equal_than('1.2.3', '1.2.3')


def test_check_installed_version():
    installed = __import__('importlib.metadata').metadata.version('pytest')
    util.check_installed_version('pytest', installed)  # agrees: nothing
    with pytest.raises(HorovodVersionMismatchError) as info:
        util.check_installed_version('pytest', '0.0.1')
    assert (info.value.name, info.value.version, info.value.installed_version) == ('pytest', '0.0.1', installed)
    assert installed in str(info.value) and '0.0.1' in str(info.value)
    cause = OSError('undefined symbol')
    with pytest.raises(OSError, match='undefined symbol'):
        util.check_installed_version('pytest', installed, cause)
    with pytest.raises(HorovodVersionMismatchError) as info:
        util.check_installed_version('pytest', '0.0.1', cause)
    assert info.value.__cause__ is cause
    util.check_installed_version('no-such-framework-xyz', '1.0.0')


def test_extension_paths():
    suffix = util.get_ext_suffix()
    assert suffix.endswith('.so') and suffix.startswith('.')
    core = util.get_extension_full_path(horovod.common.__file__, '_core')
    assert os.path.exists(core), core
    assert util.get_extension_full_path('/a/b/mod.py', 'sub', 'ext') == '/a/b/sub/ext' + suffix
    assert util.check_extension('horovod.common', 'HOROVOD_WITH_GLOO', horovod.common.__file__, '_core') is None
    with pytest.raises(ImportError, match='HOROVOD_WITH_PYTORCH=1'):
        util.check_extension('horovod.torch', 'HOROVOD_WITH_PYTORCH', horovod.common.__file__, 'missing')
    with pytest.raises(ValueError):
        util.get_extension_full_path(horovod.common.__file__)


def test_compat_table_names():
    """Every name of the §1 table of horovod.common.util is there."""
    names = ('_cache extension_available gloo_built mpi_built nccl_built ddl_built ccl_built gpu_available env '
             'is_version_greater_equal_than split_list num_rank_is_power_2 is_iterable '
             'get_average_backwards_compatibility_fun check_installed_version get_ext_suffix '
             'get_extension_full_path check_extension EXTENSIONS').split()
    assert [n for n in names if not hasattr(util, n)] == []
    assert util.EXTENSIONS == ['tensorflow', 'torch', 'mxnet']
