"""The algorithm table. Importing this package registers every built-in algorithm."""

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier
from domaingen.algorithms import erm, fish, irm, sandmask, vrex  # noqa: F401  (registration)

__all__ = ["ALGORITHMS", "Algorithm", "FeaturizerClassifier"]
