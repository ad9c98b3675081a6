"""Shared by the checks of the documentation site (run by `nox -s docs`, after it built the site)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SITE = ROOT / "build" / "docs"


@pytest.fixture(scope="session")
def site() -> pathlib.Path:
    """The built site, build/docs/ (nox -s docs builds it before running these tests)."""
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no site in {SITE}: build it with `nox -s docs` (these tests check the built site)")
    return SITE
