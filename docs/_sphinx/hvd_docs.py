"""What the documentation site adds to Sphinx (docs/conf.py loads it as the extension ``hvd_docs``).

- ``hvd-api``: the API reference of one public module, a directive that writes the autodoc
  directives for the names docs/tests/api_surface.py lists (the same listing the docstring test
  checks), so a name added to a module's ``__all__`` appears on the site without editing a page.
- Links from the guides to Markdown files of the repository outside docs/
  (``../benchmarks/results/x.md``) become downloads of those files; a link to a file that does not
  exist stays a warning (a failed build).
- The performance page's plots, drawn from benchmarks/results/*.json with matplotlib into
  docs/_sphinx/plots/ before the pages are read (plots.py).
- The site's navigation: docs/index.md stays the page GitHub shows, and the build appends to it
  the (hidden) tables of contents of the guides and the API reference (``source-read``).
- The external links of every page, listed in build/docs/external-links.txt and not fetched.
"""

from __future__ import annotations

import ast
import logging as logging_module
import pathlib
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

import api_surface
import plots

logger = logging.getLogger(__name__)

REPO = pathlib.Path(__file__).resolve().parents[2]

REDUCE_OPS = {
    "Average": "Reduce op: the sum divided by the number of ranks (integers truncate).",
    "Sum": "Reduce op: the element-wise sum.",
    "Adasum": "Reduce op: adaptive summation (Maleki et al., MLSys 2021); float tensors, the global "
              "set, a power-of-2 number of ranks.",
    "Min": "Reduce op: the element-wise minimum.",
    "Max": "Reduce op: the element-wise maximum.",
    "Product": "Reduce op: the element-wise product.",
}

AUTODOC = {"function": "autofunction", "class": "autoclass", "instance": "autodata", "value": "autodata"}


# The guides in the order of the navigation; a guide added to docs/ and missing here comes after
# them, alphabetically, so no page is left out of the site.
GUIDES = ["running", "elastic", "ray", "spark", "slurm", "lsf", "docker", "kubernetes", "tensorflow", "keras",
          "mxnet", "lightning", "compression", "gpu", "hierarchical", "engine", "timeline", "autotune", "performance"]


def guides(srcdir: pathlib.Path) -> list[str]:
    present = {path.stem for path in srcdir.glob("*.md")} - {"index"}
    return [name for name in GUIDES if name in present] + sorted(present - set(GUIDES))


def add_navigation(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname != app.config.root_doc:
        return
    listed = "\n".join(guides(pathlib.Path(app.srcdir)))
    source[0] += (f"\n\n```{{toctree}}\n:hidden:\n:caption: Guides\n\n{listed}\n```\n"
                  "\n```{toctree}\n:hidden:\n:caption: Reference\n\napi/index\n```\n")


_CLASS_HOMES: dict[tuple[str, str], str] = {}


def class_home(definition: api_surface.Definition) -> str:
    """The public name whose page indexes the class ``definition``: its first in
    api_surface.public_api()'s order (PUBLIC_MODULES, then each module's names)."""
    if not _CLASS_HOMES:
        for public_name, found in api_surface.public_api().items():
            if found is not None and found.kind == "class":
                _CLASS_HOMES.setdefault((found.module, found.qualname), public_name)
    return _CLASS_HOMES[(definition.module, definition.qualname)]


class PublicApi(SphinxDirective):
    """``hvd-api MODULE``: the module's docstring, then every public name of it, alphabetically."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        module = api_surface.Module.get(name)
        if module is None:
            raise self.error(f"hvd-api: no source for module {name} under packages/*/src")
        # autodoc writes reStructuredText: inside a MyST page it runs in an eval-rst block.
        lines = ["```{eval-rst}", f".. automodule:: {name}", ""]
        submodules = []
        for public in sorted(module.public_names(), key=lambda n: (n.lower(), n)):
            definition = module.resolve(public)
            if definition is None:
                raise self.error(f"hvd-api: cannot find the definition of {name}.{public}")
            if definition.kind == "module":
                submodules.append(definition.module)
            elif public in REDUCE_OPS and definition.kind == "value":
                # An int: autodoc would show int's own docstring.
                lines += [f".. py:data:: {public}", f"   :module: {name}", "",
                          f"   {REDUCE_OPS[public]} Pass it as ``op=`` to the reducing collectives.", ""]
            else:
                lines.append(f".. {AUTODOC[definition.kind]}:: {name}.{public}")
                # autodoc registers a class under its defining name too (``:canonical:``): a class
                # several modules re-export is indexed on the page of the first of them only.
                if definition.kind == "class" and class_home(definition) != f"{name}.{public}":
                    lines.append("   :no-index:")
                # A class of attributes only (``Compression.fp16 = FP16Compressor``) is described
                # by its docstring; its members would be aliases of undocumented classes.
                if definition.kind == "class" and any(isinstance(node, ast.FunctionDef)
                                                      for node in definition.node.body):
                    lines.append("   :members:")
                lines.append("")
        if submodules:
            listed = [f":mod:`{m}`" if m in api_surface.PUBLIC_MODULES else f"``{m}``" for m in submodules]
            lines.append(f"Submodules: {', '.join(listed)}.")
        lines.append("```")
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=f"<hvd-api {name}>"), self.content_offset, container)
        return container.children


def horovod_object_exists(target: str) -> bool:
    """Whether ``target`` (``horovod.ray.elastic_v2.RayHostDiscovery``) names a module or an object
    of the sources, read statically as api_surface reads them (Ray and MXNet are not installed)."""
    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        module = api_surface.Module.get(".".join(parts[:split]))
        if module is None:
            continue
        definition = api_surface.Definition("module", module.name, None, "")
        for attribute in parts[split:]:
            definition = api_surface.attribute_of(definition, attribute, frozenset())
            if definition is None:
                return False
        return True
    return False


def resolve_undocumented(app: Sphinx, env, node, contnode):
    """``missing-reference``: a reference to a horovod object the reference does not document (a
    private module, a helper class named in a signature) is shown as plain text; a reference to
    nothing (a typo, a removed name) stays a warning, which fails the build."""
    target = node.get("reftarget", "")
    if node.get("refdomain") == "py" and target.startswith("horovod.") and horovod_object_exists(target):
        return contnode
    return None


# A Markdown link's target: ](target) or ](target "title").
LINK = re.compile(r"\]\((?P<target>[^)\s#]+\.md)(?P<rest>[#\s][^)]*)?\)")


def link_repository_files(app: Sphinx, docname: str, source: list[str]) -> None:
    """``source-read``: a link from a guide to a Markdown file of the repository outside docs/
    (``../benchmarks/results/x.md``) becomes MyST's ``path:`` link, a download of that file copied
    into the site; MyST would look for it among the pages and fail. A link to a file that does not
    exist is left alone, so it still fails the build."""
    srcdir = pathlib.Path(app.srcdir).resolve()
    folder = (srcdir / docname).parent

    def rewrite(match: re.Match) -> str:
        target = match.group("target")
        if "://" in target or target.startswith(("path:", "project:", "/")):
            return match.group(0)
        path = (folder / target).resolve()
        if srcdir in path.parents or REPO not in path.parents or not path.is_file():
            return match.group(0)
        return f"](path:{target}{match.group('rest') or ''})"

    source[0] = LINK.sub(rewrite, source[0])


def collect_external_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    env = app.env
    links = getattr(env, "hvd_external_links", {})
    for reference in doctree.findall(nodes.reference):
        uri = reference.get("refuri", "")
        if uri.startswith(("http://", "https://", "mailto:")):
            links.setdefault(uri, set()).add(docname)
    env.hvd_external_links = links


def finish(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = pathlib.Path(app.outdir)
    links = getattr(app.env, "hvd_external_links", {})
    listing = out / "external-links.txt"
    listing.write_text("".join(f"{uri}\t{', '.join(sorted(pages))}\n" for uri, pages in sorted(links.items())))
    logger.info(f"hvd_docs: {len(links)} external links listed in {listing} (not fetched)")


def merge_env(app, env, docnames, other) -> None:
    for attribute in ("hvd_external_links",):
        mine, theirs = getattr(env, attribute, {}), getattr(other, attribute, {})
        for uri, pages in theirs.items():
            mine.setdefault(uri, set()).update(pages)
        setattr(env, attribute, mine)


def purge_doc(app, env, docname) -> None:
    for pages in getattr(env, "hvd_external_links", {}).values():
        pages.discard(docname)


def draw_plots(app: Sphinx) -> None:
    written = plots.draw_all(REPO / "benchmarks" / "results", pathlib.Path(app.srcdir) / "_sphinx" / "plots")
    logger.info(f"hvd_docs: drew {len(written)} benchmark plots")


class KnownDocstringErrors(logging_module.Filter):
    """Drops the docutils warnings of the docstrings listed in ``hvd_known_docstring_errors``
    (docs/conf.py: docstrings this change could not edit, each with the reason), and only those."""

    def __init__(self, app: Sphinx):
        super().__init__()
        self.app = app
        self.dropped: list[str] = []

    def filter(self, record) -> bool:
        location = str(getattr(record, "location", "") or "")
        for name in self.app.config.hvd_known_docstring_errors:
            if location.endswith(f"docstring of {name}") or f"docstring of {name}:" in location:
                self.dropped.append(f"{name}: {record.getMessage()}")
                return False
        return True


def install_known_errors_filter(app: Sphinx) -> None:
    app.hvd_known_errors = KnownDocstringErrors(app)
    logging_module.getLogger("sphinx").addFilter(app.hvd_known_errors)


def report_known_errors(app: Sphinx, exception) -> None:
    known = getattr(app, "hvd_known_errors", None)
    if known is not None:
        logging_module.getLogger("sphinx").removeFilter(known)
        for dropped in known.dropped:
            logger.info(f"hvd_docs: known docstring error (docs/conf.py hvd_known_docstring_errors): {dropped}")


def setup(app: Sphinx) -> dict:
    app.add_config_value("hvd_known_docstring_errors", {}, "env")
    app.connect("builder-inited", install_known_errors_filter)
    app.connect("build-finished", report_known_errors)
    app.add_directive("hvd-api", PublicApi)
    app.connect("builder-inited", draw_plots)
    app.connect("source-read", add_navigation)
    app.connect("source-read", link_repository_files)
    app.connect("missing-reference", resolve_undocumented)
    app.connect("doctree-resolved", collect_external_links)
    app.connect("env-merge-info", merge_env)
    app.connect("env-purge-doc", purge_doc)
    app.connect("build-finished", finish)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
