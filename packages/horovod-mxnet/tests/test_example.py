"""The digits example (docs/examples/mxnet/mxnet_digits.py) trains under horovodrun on two
ranks to at least 95% test accuracy, and the ranks end with bitwise-identical parameters."""

import pathlib
import re
import shutil
import subprocess
import sys

EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'mxnet' /
           'mxnet_digits.py')


def test_digits_example_np2_under_horovodrun(tmp_path):
    horovodrun = shutil.which('horovodrun') or str(pathlib.Path(sys.executable).parent /
                                                   'horovodrun')
    checkpoint = tmp_path / 'digits.params'
    done = subprocess.run([horovodrun, '--gloo', '-np', '2', '-H', 'localhost:2', sys.executable,
                           str(EXAMPLE), '--checkpoint', str(checkpoint)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    # horovodrun prefixes each worker line with "[rank]<stdout>:"; only rank 0 prints.
    lines = [re.sub(r'^\[\d+\]<stdout>:', '', line) for line in done.stdout.splitlines()
             if line.startswith('[')]
    assert all(line.startswith('[0]') for line in done.stdout.splitlines()
               if '<stdout>' in line), done.stdout
    match = re.fullmatch(r'test accuracy: (\d\.\d{4})', lines[-1].strip())
    assert match, done.stdout
    assert float(match.group(1)) >= 0.95, done.stdout
    assert 'parameters identical on all 2 ranks' in lines, done.stdout
    assert checkpoint.is_file()
