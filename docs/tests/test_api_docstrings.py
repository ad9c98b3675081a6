"""Every public name of the packages has a docstring that meets the rule of api_surface.py.

The public API is listed from the sources (api_surface.public_api); the gaps still open are listed
in api_known_gaps.txt, each with the reason it is not filled here. A gap not in that file fails, and
so does an entry of that file that is no longer a gap (remove it).
"""

import pathlib
import textwrap

import api_surface

KNOWN_GAPS = pathlib.Path(__file__).with_name("api_known_gaps.txt")


def known_gaps() -> set[tuple[str, str]]:
    entries = set()
    for line in KNOWN_GAPS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            defined_at, problem = (part.strip() for part in line.split("|", 1))
            entries.add((defined_at, problem))
    return entries


def test_public_api_is_listed():
    api = api_surface.public_api()
    # Every module of the reference, and the names users reach for first.
    for name in api_surface.PUBLIC_MODULES:
        assert api[name] is not None and api[name].kind == "module"
    for name in ("horovod.torch.allreduce", "horovod.torch.DistributedOptimizer", "horovod.tensorflow.allreduce",
                 "horovod.keras.callbacks", "horovod.mxnet.DistributedTrainer", "horovod.runner.run",
                 "horovod.ray.RayExecutor", "horovod.spark.run", "horovod.common.process_sets.ProcessSet",
                 "horovod.torch.size", "horovod.tensorflow.keras.allreduce"):
        assert api.get(name) is not None, f"{name} is not listed, or its definition was not found"
    assert len(api) > 250


def test_every_public_name_is_documented():
    found = {(gap.defined_at, gap.problem): gap for gap in api_surface.gaps()}
    allowed = known_gaps()
    new = [found[key] for key in sorted(found) if key not in allowed]
    fixed = sorted(key for key in allowed if key not in found)
    message = []
    if new:
        message.append("public names whose docstring misses part of the rule (api_surface.py):\n" + "\n".join(
            f"  {gap.public_name} ({gap.path}, {gap.defined_at}): {gap.problem}" for gap in new))
    if fixed:
        message.append(f"entries of {KNOWN_GAPS.name} that are no longer gaps; remove them:\n"
                       + "\n".join(f"  {defined_at} | {problem}" for defined_at, problem in fixed))
    assert not message, "\n".join(message)


def test_the_rule_finds_each_kind_of_gap(tmp_path, monkeypatch):
    """The checker on a small package of its own: it must report what is missing, and only that."""
    package = tmp_path / "src" / "horovod" / "docs_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent('''
        """A probe."""
        from horovod.docs_probe.impl import documented, undocumented, no_args_doc, raises_quietly, Thing
        __all__ = ["documented", "undocumented", "no_args_doc", "raises_quietly", "Thing", "alias"]
        alias = Thing().method
    '''))
    (package / "impl.py").write_text(textwrap.dedent('''
        def documented(tensor, name=None):
            """Sums ``tensor`` (any shape, float32).

            Args:
                tensor: the input.
                name: a name.

            Raises:
                ValueError: when the tensor is empty.
            """
            if not tensor:
                raise ValueError("empty")

        def undocumented(x):
            return x

        def no_args_doc(tensor, root_rank):
            """Broadcasts from the first process."""

        def raises_quietly(x):
            """Checks ``x``."""
            if x:
                raise TypeError("no")

        class Thing:
            """A thing."""

            def __init__(self, size):
                self._size = size

            def method(self):
                return 1
    '''))
    monkeypatch.setattr(api_surface, "SOURCES", [tmp_path / "src"])
    monkeypatch.setattr(api_surface.Module, "_cache", {})
    module = api_surface.Module.get("horovod.docs_probe")
    problems = set()
    for name in module.public_names():
        for gap in api_surface.check_definition(f"horovod.docs_probe.{name}", module.resolve(name)):
            problems.add((gap.defined_at, gap.problem))
    assert problems == {
        ("horovod.docs_probe.impl.undocumented", "no docstring"),
        ("horovod.docs_probe.impl.no_args_doc", "arguments not documented: tensor, root_rank"),
        ("horovod.docs_probe.impl.raises_quietly", "raises, but does not say so: TypeError"),
        ("horovod.docs_probe.impl.Thing", "arguments not documented: size"),
        ("horovod.docs_probe.impl.Thing.method", "no docstring"),
    }
