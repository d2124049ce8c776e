"""Every remedy registers the same way: an instance of a Remedy subclass, listed in its module's
REMEDIES, the module listed in remedies.MODULES; what is not a remedy lives in helpers/."""
from __future__ import annotations

import importlib
import pathlib
import pkgutil

from gpusync import remedies
from gpusync.fix.engine import names
from gpusync.remedies.remedy import Remedy

PACKAGE = pathlib.Path(remedies.__file__).parent
NOT_REMEDIES = {"remedy", "helpers"}  # the protocol, and what the remedies share


def _remedy_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)])
                  if m.name not in NOT_REMEDIES)


def test_every_module_of_remedies_is_registered():
    registered = sorted(m.__name__.rpartition(".")[2] for m in remedies.MODULES)
    assert registered == _remedy_modules()
    assert {m.name for m in pkgutil.iter_modules([str(PACKAGE / "helpers")])} >= {
        "source", "syntax", "observe", "callsite", "constants"}


def test_each_module_lists_every_remedy_it_defines():
    for name in _remedy_modules():
        module = importlib.import_module(f"gpusync.remedies.{name}")
        defined = [v for v in vars(module).values() if isinstance(v, Remedy)]
        assert module.REMEDIES, name
        assert all(isinstance(r, Remedy) for r in module.REMEDIES), name
        assert {id(r) for r in defined} == {id(r) for r in module.REMEDIES}, name


def test_the_registry_is_the_modules_remedies_in_order():
    expected = [r for m in remedies.MODULES for r in m.REMEDIES]
    assert list(remedies.REMEDIES) == expected
    assert remedies.REMEDIES[0] is remedies.dataloader.PIN_MEMORY  # tried first, as before
    assert remedies.REMEDIES[-1] is remedies.tuned.SETTINGS
    every = [n for r in remedies.REMEDIES for n in names(r)]
    assert len(every) == len(set(every)), every  # --only names one remedy
    assert "tensor.pinned" in every and "one_hot.num_classes" in every
