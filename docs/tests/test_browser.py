"""The built site in headless Chromium (Debian's chromium and chromedriver, driven by selenium):
four pages rendered to PNG in build/docs-screenshots/, each with its title, the navigation, no
image that failed to load, and no error in the JavaScript console."""

import pathlib
import shutil
import tempfile
import urllib.parse

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMEDRIVER = pathlib.Path("/usr/bin/chromedriver")
SCREENSHOTS = pathlib.Path(__file__).resolve().parents[2] / "build" / "docs-screenshots"

# page -> what its title starts with, and how many images it must show at least
PAGES = {
    "index.html": ("Horovod, maintained", 0),
    "running.html": ("Running jobs with horovodrun", 0),
    "api/torch.html": ("horovod.torch", 0),
    "performance.html": ("Performance on CPUs", 3),
}


@pytest.fixture(scope="module")
def browser():
    for program in (CHROMIUM, CHROMEDRIVER):
        if not program.is_file():
            pytest.fail(f"{program} is missing: install Debian's chromium and chromium-driver "
                        "(ci/install-system-deps.sh)")
    # The profile lives in the session's TMPDIR and goes with the browser.
    profile = pathlib.Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", f"--user-data-dir={profile}", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                     f"--crash-dumps-dir={profile}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.parametrize("page", list(PAGES))
def test_page_renders(browser, site, page):
    title, images_at_least = PAGES[page]
    browser.get((site / page).as_uri())
    assert browser.title.startswith(title) and browser.title.endswith("Horovod, maintained"), \
        f"{page}: title {browser.title!r}"
    assert browser.execute_script("return document.readyState") == "complete"

    # The navigation: the sidebar's table of contents, with the guides and the API reference.
    navigation = browser.find_elements(By.CSS_SELECTOR, ".sidebar-tree a.reference")
    targets = {pathlib.Path(urllib.parse.urlsplit(link.get_attribute("href")).path).relative_to(site).as_posix()
               for link in navigation}
    expected = {"running.html", "performance.html", "api/index.html", "api/torch.html"}
    assert len(navigation) >= 15 and expected <= targets, \
        f"{page}: the navigation has {len(navigation)} links: {sorted(targets)}"

    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth]);")
    missing = [source for source, complete, width in images if not complete or width == 0]
    assert not missing, f"{page}: images that did not load: {missing}"
    assert len(images) >= images_at_least, f"{page}: {len(images)} images, expected at least {images_at_least}"

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, f"{page}: JavaScript console errors: {errors}"

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    screenshot = SCREENSHOTS / (page.replace("/", "-").removesuffix(".html") + ".png")
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
