"""How the registries fill themselves: every module of a package (so adding a family edits no
core file), then the modules third parties declare under an entry-point group."""
from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points


def import_families(package: str, path, skip=(), group: str | None = None) -> None:
    """Import package.<module> for every module in `path` but `skip`, then load `group`."""
    for mod in pkgutil.iter_modules(list(path)):
        if mod.name not in skip and not mod.name.startswith("_"):
            importlib.import_module(f"{package}.{mod.name}")
    if group is not None:
        for ep in entry_points(group=group):
            ep.load()
