"""A pytest plugin (tests/conftest.py loads it): each test that uses a module-scoped fixture (a
study run once, a PostgreSQL server, a browser's recorded storage) joins its module's xdist group,
so that under ``--dist loadgroup`` (the Makefile's) the fixture is built in one worker instead of
once in every worker that happens to draw one of its tests (test_warmstart's two sources alone
took 30 s a worker). The other tests are scheduled one by one, as under ``--dist load``.

Two things silently undo it, and tests/test_suite_groups.py runs pytest-xdist to catch both: the
groups must be marked before pytest-xdist's own collection hook reads them into the node ids (hence
``tryfirst``), and pytest 9.2 made the node id a value that hook no longer changes (pytest-xdist
3.8 then schedules every test alone: pyproject.toml keeps pytest under 9.2)."""
from __future__ import annotations

import pytest


def module_fixture_groups(items: list[pytest.Item]) -> None:
    """Mark each of ``items`` that uses a module-scoped fixture with its module's xdist group."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)  # (pytest's; without it nothing is grouped)
        defs = getattr(info, "name2fixturedefs", {}) or {}
        if any(d.scope == "module" for name in item.fixturenames for d in defs.get(name, ())):
            module = getattr(item, "module", None)
            item.add_marker(pytest.mark.xdist_group(module.__name__ if module else item.nodeid))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    module_fixture_groups(items)
