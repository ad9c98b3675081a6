"""The complete programs in the guides run, so the guides cannot drift from the code.

A code block of a guide (docs/*.md) is a complete program when the line just before its opening
fence is the HTML comment ``<!-- docs-test: np=N -->`` (invisible on GitHub and on the site); it
is a ```python block that runs as it stands under ``horovodrun -np N`` and exits 0. Keep such
programs short (seconds) and N at 1 or 2. Other blocks are fragments and are not run.
"""

import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1]
MARKED = re.compile(r"^<!-- docs-test: np=(?P<np>\d+) -->\n```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.M | re.S)
MARKER = re.compile(r"<!-- docs-test:.*?-->")


def programs() -> list[tuple[str, int, str]]:
    found = []
    for guide in sorted(DOCS.glob("*.md")):
        text = guide.read_text()
        matches = list(MARKED.finditer(text))
        # A marker that is not directly followed by a fenced block is a mistake, not a fragment.
        assert len(matches) == len(MARKER.findall(text)), f"{guide.name}: a docs-test marker not followed by a block"
        for match in matches:
            line = text.count("\n", 0, match.start()) + 1
            assert match.group("lang") == "python", f"{guide.name}:{line}: a marked block must be ```python"
            found.append((f"{guide.name}:{line}", int(match.group("np")), match.group("code")))
    return found


PROGRAMS = programs()


def test_guides_have_complete_programs():
    assert len(PROGRAMS) >= 3, f"only {len(PROGRAMS)} marked programs in docs/*.md"


@pytest.mark.parametrize("where, np, code", PROGRAMS, ids=[where for where, _, _ in PROGRAMS])
def test_program_runs(where, np, code, tmp_path):
    assert 1 <= np <= 2, f"{where}: np={np}; the guides' programs run at np 1 or 2"
    program = tmp_path / "program.py"
    program.write_text(code)
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", str(np), "-H", f"localhost:{np}",
                          sys.executable, str(program)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{where} failed (exit {run.returncode}):\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
