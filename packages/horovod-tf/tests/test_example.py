"""The digits example (docs/examples/tensorflow2/tensorflow2_digits.py) trains under horovodrun on
two ranks to at least 95% test accuracy, and the ranks end with bitwise-identical weights."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'tensorflow2' /
           'tensorflow2_digits.py')


def test_digits_example_np2():
    horovodrun = shutil.which('horovodrun') or str(pathlib.Path(sys.executable).parent / 'horovodrun')
    if not pathlib.Path(horovodrun).exists():
        pytest.fail('horovodrun is not installed (pip install horovod-run)')
    done = subprocess.run([horovodrun, '--gloo', '-np', '2', '-H', 'localhost:2', sys.executable, str(EXAMPLE)],
                          capture_output=True, text=True, timeout=400,
                          env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})
    assert done.returncode == 0, done.stdout + done.stderr
    # horovodrun prefixes each worker line with "[rank]<stdout>:".
    lines = [re.sub(r'^\[(?:\d+,)?\d+\]<stdout>:', '', line) for line in done.stdout.splitlines()]
    text = '\n'.join(lines)
    match = re.search(r'^test accuracy: (\d\.\d{4})$', text, re.MULTILINE)
    assert match, text
    assert float(match.group(1)) >= 0.95, text
    assert 'weights identical on all 2 ranks' in text, text
    assert text.count('test accuracy') == 1, 'only rank 0 prints'
