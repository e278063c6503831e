"""The algorithm table. Importing this package imports every module in it, and so
registers every built-in algorithm: a new algorithm is one new module here."""

import importlib
import pkgutil

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm", "FeaturizerClassifier"]
