"""Lazy package exports (PEP 562), so that importing a TensorFlow-free part of the package
(crossover_tf.lease.segments, the node exporter) does not import TensorFlow and Horovod through
the package's __init__: `from crossover_tf import CrossoverStrategy` still works, and imports
the strategy only then.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """A module __getattr__ and __dir__ that import `exports[name]` (a module path) on first
    access of `name` and keep the value in the package's namespace. A submodule is imported
    on first access too (`crossover_tf.profiling.StepTimer` after `import crossover_tf`), as
    an eager __init__ that imported it would have made it an attribute."""
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")  # binds it in namespace
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
