"""The digits example (docs/examples/pytorch/pytorch_digits.py) trains to at least 95% test
accuracy on two ranks, which end with bitwise-identical parameters."""

import contextlib
import io
import pathlib
import re
import runpy
import shutil
import subprocess
import sys

from horovod_testing import run_ranks

EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'pytorch' /
           'pytorch_digits.py')


def run_example(script, checkpoint):
    """Runs the script as ``__main__`` in this worker; returns what it printed."""
    output = io.StringIO()
    argv = sys.argv
    sys.argv = [script, '--checkpoint', checkpoint]
    try:
        with contextlib.redirect_stdout(output):
            runpy.run_path(script, run_name='__main__')
    finally:
        sys.argv = argv
    return output.getvalue()


def check_output(text):
    # The last line rank 0 prints is the test accuracy.
    match = re.fullmatch(r'test accuracy: (\d\.\d{4})', text.strip().splitlines()[-1])
    assert match, text
    assert float(match.group(1)) >= 0.95, text
    assert 'parameters identical on all 2 ranks' in text, text


def test_digits_example_np2(tmp_path):
    checkpoint = str(tmp_path / 'digits.pt')
    horovodrun = shutil.which('horovodrun')
    if horovodrun:
        done = subprocess.run([horovodrun, '-np', '2', '-H', 'localhost:2', sys.executable,
                               str(EXAMPLE), '--checkpoint', checkpoint],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        # horovodrun prefixes each worker line with "[rank]<stdout>:".
        text = '\n'.join(re.sub(r'^\[\d+\]<stdout>:', '', line)
                         for line in done.stdout.splitlines())
    else:
        outputs = run_ranks(2, run_example, str(EXAMPLE), checkpoint, timeout=180)
        text = outputs[0]
        assert 'test accuracy' not in outputs[1], 'only rank 0 prints'
    check_output(text)
    assert (tmp_path / 'digits.pt').is_file()
