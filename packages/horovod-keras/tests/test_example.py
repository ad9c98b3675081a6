"""The digits example (docs/examples/keras/keras_digits.py) under ``horovodrun -np 2`` on each
Keras backend: at least 95% test accuracy, bitwise-identical weights on both ranks, and a saved
model that hvd.load_model gives back with a distributed optimizer."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from horovod_testing import run_ranks, run_script
from jobs import THREADS_ENV

EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'keras' /
           'keras_digits.py')


def run_example(script, *options):
    """Runs the script as ``__main__`` in this worker; returns what it printed."""
    return run_script(script, *options)


def run_np2(backend, *options):
    """Runs the example on two ranks (under horovodrun when installed); returns rank 0's
    output."""
    env = {'KERAS_BACKEND': backend, **THREADS_ENV}
    horovodrun = shutil.which('horovodrun')
    if horovodrun:
        done = subprocess.run([horovodrun, '-np', '2', '-H', 'localhost:2', sys.executable,
                               str(EXAMPLE), *options], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        # horovodrun prefixes each worker line with "[rank]<stdout>:" (Gloo) or Open MPI's
        # "[job,rank]<stdout>:" (MPI).
        return '\n'.join(re.sub(r'^\[(?:\d+,)?\d+\]<stdout>:', '', line)
                         for line in done.stdout.splitlines())
    outputs = run_ranks(2, run_example, str(EXAMPLE), *options, env=env, timeout=300)
    assert 'test accuracy' not in outputs[1], 'only rank 0 prints'
    return outputs[0]


@pytest.mark.parametrize('backend', ['tensorflow', 'torch'])
def test_digits_example_np2(backend, tmp_path):
    checkpoint = tmp_path / 'digits.keras'
    text = run_np2(backend, '--checkpoint', str(checkpoint))
    match = re.fullmatch(r'test accuracy: (\d\.\d{4})', text.strip().splitlines()[-1])
    assert match, text
    print(f'{backend}: {match.group(0)}')
    assert float(match.group(1)) >= 0.95, text
    assert 'weights identical on all 2 ranks' in text, text
    assert 'loaded back with Adam (DistributedAdam)' in text, text
    assert checkpoint.is_file() and (tmp_path / 'digits-best.keras').is_file()
