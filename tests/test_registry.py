import pytest

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.registry import Registry, UnknownNameError


def test_register_and_get_by_name():
    table: Registry[type] = Registry("widget")

    @table.register()
    class Gear:
        pass

    @table.register("Cog")
    class Other:
        pass

    assert table.get("Gear") is Gear
    assert table.get("Cog") is Other
    assert table.names() == ["Gear", "Cog"]
    assert "Cog" in table and "Gear" in table and len(table) == 2


def test_unknown_name_lists_valid_names():
    table: Registry[type] = Registry("widget")
    table.register("A")(type("A", (), {}))
    with pytest.raises(UnknownNameError, match=r"unknown widget 'B'; valid widgets: A"):
        table.get("B")


def test_same_name_twice_is_refused():
    table: Registry[type] = Registry("widget")
    table.register("A")(type("A", (), {}))
    with pytest.raises(ValueError, match="registered twice"):
        table.register("A")(type("A2", (), {}))


def test_builtin_tables():
    assert {"ERM", "IRM", "VREx", "Fish", "SANDMask"} <= set(ALGORITHMS.names())
    assert {"ColoredMNIST", "RotatedMNIST"} <= set(DATASETS.names())
