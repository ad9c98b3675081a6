"""The public API of the Horovod packages, listed from their sources, and the docstring rule it must meet.

The listing reads the sources under packages/*/src with ``ast`` instead of importing them, so that
every framework package is checked in one process without TensorFlow, MXNet, Ray or PySpark
installed: a module's public names are its ``__all__`` (list literals, ``+=`` of another module's
``__all__``) or, without one, the names it binds that do not start with ``_`` (its own functions
and classes, and what it imports from ``horovod``). Each name is followed through imports and
aliases (``size = basics.size``: the method of the class ``basics`` is an instance of) to the
``def`` or ``class`` that defines it.

The rule (STYLE.md: "public Python docstrings give argument shapes and dtypes, units, the errors
raised and when"), in the part a program can check:

1. every public module, function, class and public method has a docstring;
2. every argument of a function or method (of a class: of its ``__init__``, documented in the
   class's or ``__init__``'s docstring) is named in it, as a word: in an ``Args:`` section, a
   ``:param:`` line or the prose;
3. every exception class the function raises itself (``raise Name(...)``, outside nested
   functions) is named in it, in a ``Raises:`` section or the prose.

Shapes, dtypes and units are part of naming an argument well; whether the words say them is left to
review.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "packages").glob("*/src"))

# The modules whose API the documentation site describes (docs/api/).
PUBLIC_MODULES = [
    "horovod.common.process_sets",
    "horovod.common.elastic",
    "horovod.common.exceptions",
    "horovod.torch",
    "horovod.torch.elastic",
    "horovod.torch.compression",
    "horovod.tensorflow",
    "horovod.tensorflow.elastic",
    "horovod.tensorflow.compression",
    "horovod.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic",
    "horovod.keras",
    "horovod.keras.callbacks",
    "horovod.keras.elastic",
    "horovod.mxnet",
    "horovod.runner",
    "horovod.ray",
    "horovod.spark",
    "horovod.spark.common.store",
    "horovod.spark.common.backend",
    "horovod.spark.torch",
    "horovod.spark.keras",
    "horovod.spark.lightning",
]

# Aliases of an object chosen at run time (``init = _framework.init`` in horovod.keras, where
# ``_framework`` is horovod.torch or horovod.tensorflow by the Keras backend) resolve to the same
# name in this module, one of the possible choices.
RUNTIME_CHOICE = {
    "_framework": "horovod.torch",
    "_backend": "horovod._keras.backend.torch",
}

IGNORED_ARGUMENTS = {"self", "cls"}


@dataclasses.dataclass(frozen=True)
class Definition:
    """Where a public name is defined: ``kind`` is 'module', 'function', 'class' or 'value'."""

    kind: str
    module: str
    node: ast.AST | None
    qualname: str


@dataclasses.dataclass(frozen=True)
class Gap:
    """A public name whose docstring misses part of the rule."""

    public_name: str  # as a user writes it: horovod.torch.allreduce
    defined_at: str  # module.qualname of the definition
    path: str  # source file, relative to the repository
    problem: str


def module_path(module: str) -> pathlib.Path | None:
    parts = module.split(".")
    for source in SOURCES:
        for candidate in (source.joinpath(*parts).with_suffix(".py"), source.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


class Module:
    """One parsed module and its top-level bindings (name -> the expression that binds it)."""

    _cache: dict[str, Module] = {}

    def __init__(self, name: str, path: pathlib.Path):
        self.name = name
        self.path = path
        self.is_package = path.name == "__init__.py"
        self.tree = ast.parse(path.read_text(), str(path))
        self.bindings: dict[str, tuple] = {}
        self.all: list[str] | None = None
        self._bind(self.tree.body)

    @classmethod
    def get(cls, name: str) -> Module | None:
        if name not in cls._cache:
            path = module_path(name)
            if path is None:
                return None
            cls._cache[name] = Module(name, path)
        return cls._cache[name]

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module
        base = self.name.split(".")
        base = base[:len(base) - node.level + (1 if self.is_package else 0)]
        return ".".join(base + ([node.module] if node.module else []))

    def _bind(self, statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.bindings[node.name] = ("function", node)
            elif isinstance(node, ast.ClassDef):
                self.bindings[node.name] = ("class", node)
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(node)
                for alias in node.names:
                    if alias.name == "*":
                        imported = Module.get(source)
                        for name in (imported.public_names() if imported else []):
                            self.bindings[name] = ("from", source, name)
                    else:
                        self.bindings[alias.asname or alias.name] = ("from", source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bindings[alias.asname] = ("module", alias.name)
                    else:
                        top = alias.name.split(".")[0]
                        self.bindings[top] = ("module", top)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        if target.id == "__all__":
                            self.all = self._names(node.value)
                        else:
                            self.bindings[target.id] = ("expr", node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                    and node.target.id == "__all__":
                self.all = (self.all or []) + self._names(node.value)
            elif isinstance(node, ast.If):
                self._bind(node.body)
                self._bind(node.orelse)
            elif isinstance(node, ast.Try):
                self._bind(node.body)
                self._bind(node.orelse)
                self._bind(node.finalbody)
                # A fallback bound when the import fails (an optional package missing) does not
                # replace what the try body binds: the API is what a full installation has.
                fallback = Module.__new__(Module)
                fallback.name, fallback.is_package, fallback.bindings, fallback.all = \
                    self.name, self.is_package, {}, None
                for handler in node.handlers:
                    fallback._bind(handler.body)
                for name, binding in fallback.bindings.items():
                    self.bindings.setdefault(name, binding)

    def _names(self, value: ast.expr) -> list[str]:
        """The names of an ``__all__`` value: a list or tuple of strings, or ``module.__all__``."""
        if isinstance(value, (ast.List, ast.Tuple)):
            return [element.value for element in value.elts]
        if isinstance(value, ast.Attribute) and value.attr == "__all__" and isinstance(value.value, ast.Name):
            definition = self.resolve(value.value.id)
            other = Module.get(definition.module) if definition and definition.kind == "module" else None
            if other is not None and other.all is not None:
                return list(other.all)
        raise ValueError(f"{self.path}: cannot read __all__ from {ast.unparse(value)}")

    def public_names(self) -> list[str]:
        if self.all is not None:
            return list(self.all)
        names = []
        for name, binding in self.bindings.items():
            if name.startswith("_"):
                continue
            # What the module imports from outside horovod (tf, keras) is not its API.
            if binding[0] == "module" and not binding[1].startswith("horovod"):
                continue
            if binding[0] == "from" and not binding[1].startswith("horovod"):
                continue
            names.append(name)
        return names

    def resolve(self, name: str, seen: frozenset = frozenset()) -> Definition | None:
        """The definition ``name`` is bound to in this module, or None if it cannot be told."""
        key = (self.name, name)
        if key in seen:
            return None
        seen = seen | {key}
        binding = self.bindings.get(name)
        if binding is None:
            # A submodule of a package, imported elsewhere (``horovod.torch.elastic``).
            if self.is_package and Module.get(f"{self.name}.{name}"):
                return Definition("module", f"{self.name}.{name}", None, "")
            return None
        kind = binding[0]
        if kind in ("function", "class"):
            return Definition(kind, self.name, binding[1], binding[1].name)
        if kind == "module":
            return Definition("module", binding[1], None, "")
        if kind == "from":
            source, attribute = binding[1], binding[2]
            if Module.get(f"{source}.{attribute}") is not None:
                return Definition("module", f"{source}.{attribute}", None, "")
            other = Module.get(source)
            return other.resolve(attribute, seen) if other else None
        return self._resolve_expr(binding[1], seen)

    def _resolve_expr(self, value: ast.expr, seen: frozenset) -> Definition | None:
        if isinstance(value, ast.Name):
            if value.id in RUNTIME_CHOICE:
                return Definition("module", RUNTIME_CHOICE[value.id], None, "")
            return self.resolve(value.id, seen)
        if isinstance(value, ast.Attribute):
            base = self._resolve_expr(value.value, seen)
            return attribute_of(base, value.attr, seen)
        if isinstance(value, ast.Call):
            called = self._resolve_expr(value.func, seen)
            # An instance of a class: ``basics = HorovodBasics()``.
            if called is not None and called.kind == "class":
                return Definition("instance", called.module, called.node, called.qualname)
            # A function a factory defines and returns: ``f = make_f(...)``.
            if called is not None and called.kind == "function":
                returned = {node.value.id for node in ast.walk(called.node)
                            if isinstance(node, ast.Return) and isinstance(node.value, ast.Name)}
                for node in called.node.body:
                    if isinstance(node, ast.FunctionDef) and node.name in returned:
                        return Definition("function", called.module, node, f"{called.qualname}.{node.name}")
            return None
        return Definition("value", self.name, value, "")


def attribute_of(base: Definition | None, attribute: str, seen: frozenset) -> Definition | None:
    if base is None:
        return None
    if base.kind == "module":
        module = Module.get(base.module)
        return module.resolve(attribute, seen) if module else None
    if base.kind in ("class", "instance"):
        for node in base.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attribute:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                return Definition(kind, base.module, node, f"{base.qualname}.{attribute}")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attribute
                                                    for t in node.targets):
                return Definition("value", base.module, node.value, f"{base.qualname}.{attribute}")
        # Inherited from a base class defined in horovod.
        module = Module.get(base.module)
        for parent in base.node.bases:
            parent_definition = module._resolve_expr(parent, seen) if module else None
            if parent_definition is not None and parent_definition.kind == "class":
                found = attribute_of(parent_definition, attribute, seen)
                if found is not None:
                    return found
    return None


def arguments(function: ast.FunctionDef) -> list[str]:
    spec = function.args
    names = [a.arg for a in spec.posonlyargs + spec.args + spec.kwonlyargs]
    if spec.vararg:
        names.append(spec.vararg.arg)
    if spec.kwarg:
        names.append(spec.kwarg.arg)
    return [name for name in names if name not in IGNORED_ARGUMENTS and not name.startswith("_")]


def raised(function: ast.FunctionDef) -> list[str]:
    """The exception classes ``function`` raises itself (not in functions or classes nested in it)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exception = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                name = exception.attr if isinstance(exception, ast.Attribute) else getattr(exception, "id", None)
                # ``raise error`` of a caught or built exception object names no class.
                if name and name[:1].isupper() and name not in found:
                    found.append(name)
            visit(child)

    visit(function)
    return found


def mentions(docstring: str, word: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", docstring) is not None


def check_callable(public_name: str, definition: Definition, path: str, docstring: str,
                   function: ast.FunctionDef | None) -> list[Gap]:
    where = f"{definition.module}.{definition.qualname}"
    if not docstring.strip():
        return [Gap(public_name, where, path, "no docstring")]
    if function is None:
        return []
    gaps = []
    missing = [name for name in arguments(function) if not mentions(docstring, name)]
    if missing:
        gaps.append(Gap(public_name, where, path, f"arguments not documented: {', '.join(missing)}"))
    unnamed = [name for name in raised(function) if not mentions(docstring, name)]
    if unnamed:
        gaps.append(Gap(public_name, where, path, f"raises, but does not say so: {', '.join(unnamed)}"))
    return gaps


def is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in ("property", "cached_property")
               or isinstance(d, ast.Attribute) and d.attr in ("setter", "getter", "deleter")
               for d in node.decorator_list)


def relative(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def check_definition(public_name: str, definition: Definition) -> list[Gap]:
    path = relative(module_path(definition.module))
    if definition.kind == "module":
        module = Module.get(definition.module)
        docstring = ast.get_docstring(module.tree) or ""
        return [] if docstring.strip() else [Gap(public_name, definition.module, path, "no module docstring")]
    if definition.kind == "function":
        return check_callable(public_name, definition, path, ast.get_docstring(definition.node) or "",
                              definition.node)
    if definition.kind in ("class", "instance"):
        cls = definition.node
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        docstring = (ast.get_docstring(cls) or "") + "\n" + ((ast.get_docstring(init) or "") if init else "")
        gaps = check_callable(public_name, definition, path, docstring if (ast.get_docstring(cls) or "").strip()
                              else "", init)
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_") \
                    and not (is_property(node) and any(isinstance(d, ast.Attribute) for d in node.decorator_list)):
                method = Definition("function", definition.module, node, f"{cls.name}.{node.name}")
                gaps += check_callable(f"{public_name}.{node.name}", method, path,
                                       ast.get_docstring(node) or "", node)
        return gaps
    return []  # constants (``Average``) carry no docstring of their own


def public_api() -> dict[str, Definition | None]:
    """Every public name of PUBLIC_MODULES (``module.name``) -> its definition (None: not found)."""
    listed: dict[str, Definition | None] = {}
    for name in PUBLIC_MODULES:
        module = Module.get(name)
        if module is None:
            raise ValueError(f"public module {name} has no source under packages/*/src")
        listed[name] = Definition("module", name, None, "")
        for public in module.public_names():
            listed[f"{name}.{public}"] = module.resolve(public)
    return listed


def gaps() -> list[Gap]:
    """What the public API's docstrings miss, one entry per (definition, problem), sorted."""
    found: dict[tuple[str, str], Gap] = {}
    for public_name, definition in public_api().items():
        if definition is None:
            module = public_name.rsplit(".", 1)[0]
            found[(public_name, "unresolved")] = Gap(public_name, "?", relative(module_path(module)),
                                                     "cannot find its definition in the sources")
            continue
        for gap in check_definition(public_name, definition):
            # A function re-exported by several modules is one gap, reported under its first name.
            found.setdefault((gap.defined_at, gap.problem), gap)
    return sorted(found.values(), key=lambda gap: (gap.path, gap.defined_at, gap.problem))
