"""The digits example (docs/examples/tensorflow2/tensorflow2_digits.py) trains under horovodrun on
two ranks to at least 95% test accuracy, and the ranks end with bitwise-identical weights. The run
starts with the session (conftest.example_process)."""

import pathlib
import re


def test_digits_example_np2(example_process):
    proc, out_path, err_path = example_process
    returncode = proc.wait(timeout=600)
    stdout = pathlib.Path(out_path).read_text(errors='replace')
    stderr = pathlib.Path(err_path).read_text(errors='replace')
    assert returncode == 0, stdout + stderr
    # horovodrun prefixes each worker line with "[rank]<stdout>:".
    text = '\n'.join(re.sub(r'^\[(?:\d+,)?\d+\]<stdout>:', '', line) for line in stdout.splitlines())
    match = re.search(r'^test accuracy: (\d\.\d{4})$', text, re.MULTILINE)
    assert match, stdout + stderr
    assert float(match.group(1)) >= 0.95, text
    assert 'weights identical on all 2 ranks' in text, text
    assert text.count('test accuracy') == 1, 'only rank 0 prints'
