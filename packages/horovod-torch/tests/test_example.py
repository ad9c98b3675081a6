"""The digits example (docs/examples/pytorch/pytorch_digits.py) trains to at least 95% test
accuracy on two ranks, which end with bitwise-identical parameters; a short run with
SyncBatchNorm and two backward passes per step gets past 85%."""

import pathlib
import re
import shutil
import subprocess
import sys

from horovod_testing import run_ranks, run_script

EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'pytorch' /
           'pytorch_digits.py')


def run_example(script, checkpoint, *options):
    """Runs the script as ``__main__`` in this worker; returns what it printed."""
    return run_script(script, '--checkpoint', checkpoint, *options)


def check_output(text, min_accuracy=0.95):
    # The last line rank 0 prints is the test accuracy.
    match = re.fullmatch(r'test accuracy: (\d\.\d{4})', text.strip().splitlines()[-1])
    assert match, text
    assert float(match.group(1)) >= min_accuracy, text
    assert 'parameters identical on all 2 ranks' in text, text


def run_np2(checkpoint, *options):
    """Runs the example on two ranks (under horovodrun when installed); returns rank 0's
    output."""
    horovodrun = shutil.which('horovodrun')
    if horovodrun:
        done = subprocess.run([horovodrun, '-np', '2', '-H', 'localhost:2', sys.executable,
                               str(EXAMPLE), '--checkpoint', checkpoint, *options],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        # horovodrun prefixes each worker line with "[rank]<stdout>:" (Gloo) or Open MPI's
        # "[job,rank]<stdout>:" (MPI, the default when the core has it).
        return '\n'.join(re.sub(r'^\[(?:\d+,)?\d+\]<stdout>:', '', line)
                         for line in done.stdout.splitlines())
    outputs = run_ranks(2, run_example, str(EXAMPLE), checkpoint, *options, timeout=180)
    assert 'test accuracy' not in outputs[1], 'only rank 0 prints'
    return outputs[0]


def test_digits_example_np2(tmp_path):
    check_output(run_np2(str(tmp_path / 'digits.pt')))
    assert (tmp_path / 'digits.pt').is_file()


def test_digits_example_sync_bn_accumulated(tmp_path):
    text = run_np2(str(tmp_path / 'digits.pt'), '--sync-bn', '--backward-passes-per-step', '2',
                   '--epochs', '3')
    check_output(text, min_accuracy=0.85)
