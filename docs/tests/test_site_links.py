"""Every link and image of the built site points to something: internal links to a file of the
site (and, with a fragment, to an element of that page with that id); external links are listed in
external-links.txt, never fetched."""

import html.parser
import pathlib
import urllib.parse

import pytest


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for attribute in ("href", "src"):
            if attrs.get(attribute) and tag in ("a", "img", "link", "script"):
                self.targets.append(attrs[attribute])


def parse(page: pathlib.Path) -> Links:
    links = Links()
    links.feed(page.read_text(encoding="utf-8"))
    return links


def pages(site: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path for path in site.rglob("*.html") if "_static" not in path.parts)


def test_internal_links_resolve(site):
    parsed = {page: parse(page) for page in pages(site)}
    assert len(parsed) > 20, f"only {len(parsed)} pages in {site}"
    broken = []
    for page, links in parsed.items():
        for target in links.targets:
            url = urllib.parse.urlsplit(target)
            if url.scheme or target.startswith("//"):
                continue
            path = (page.parent / urllib.parse.unquote(url.path)).resolve() if url.path else page
            if not path.is_file():
                broken.append(f"{page.relative_to(site)}: {target} (no file {path})")
            elif url.fragment and path.suffix == ".html":
                ids = parsed[path].ids if path in parsed else parse(path).ids
                if urllib.parse.unquote(url.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {target} (no id {url.fragment!r} there)")
    assert not broken, "broken links in the site:\n" + "\n".join(broken)


def test_external_links_are_listed(site):
    listing = site / "external-links.txt"
    listed = {line.split("\t")[0] for line in listing.read_text().splitlines() if line}
    found = {target for page in pages(site) if page.name not in ("genindex.html", "search.html")
             for target in parse(page).targets if target.startswith(("http://", "https://"))
             # The theme's own links (Sphinx, Furo) are not the guides'.
             and not any(host in target for host in ("sphinx-doc.org", "pradyunsg.me", "github.com/pradyunsg"))}
    assert found <= listed, f"external links missing from {listing.name}: {sorted(found - listed)}"


@pytest.mark.parametrize("page", ["index.html", "running.html", "api/torch.html", "performance.html"])
def test_page_is_built(site, page):
    assert (site / page).is_file()
