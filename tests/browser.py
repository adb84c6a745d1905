"""A real headless Chromium for the tests that look at what a user sees (the report, the dashboard).

It drives the system's Chromium (Debian package ``chromium``) through the ``playwright`` package and
never downloads a browser; a test that needs it is skipped, with the reason, when either is missing.

    with browser_page(offline=True) as (page, errors):
        page.goto(path.as_uri())
        ...
        assert not errors
"""
from __future__ import annotations

import contextlib
import importlib.util
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_or_skip() -> str:
    """The path of the system's Chromium, or skip the test saying what is missing."""
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("the playwright package is not installed (pip install 'knobtune[test]')")
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}; Debian: apt-get install chromium)")


def _blocked(errors: list[str]) -> Any:
    def handler(route: Any) -> None:
        errors.append(f"network request blocked (the page must work offline): {route.request.url}")
        route.abort()
    return handler


@contextlib.contextmanager
def browser_page(offline: bool = False, width: int = 1280, height: int = 900) -> Iterator[tuple[Any, list[str]]]:
    """A fresh page in headless Chromium and the list its errors go to as they happen: console
    errors, uncaught exceptions, failed requests and, when ``offline``, any request that leaves
    ``file://`` / ``data:`` / ``blob:`` (it is aborted)."""
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"uncaught exception: {exc}"))
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} ({req.failure})"))
            if offline:
                page.route("http://**/*", _blocked(errors))
                page.route("https://**/*", _blocked(errors))
            yield page, errors
        finally:
            browser.close()


def rendered_plots(page: Any) -> dict[str, int]:
    """For every plotly chart on the page (``.js-plotly-plot``), keyed by its id: how many drawn
    SVG layers (``.main-svg``) it holds; 0 means plotly.js did not render it."""
    return page.eval_on_selector_all(
        ".js-plotly-plot",
        "els => Object.fromEntries(els.map(e => [e.id || e.parentElement.id, e.querySelectorAll('.main-svg').length]))",
    )
