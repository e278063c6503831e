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


def test_names_in_any_case_are_the_registered_spelling():
    assert ALGORITHMS.canonical("erm") == "ERM" and ALGORITHMS.canonical("irm+MODREG") == "IRM+ModReg"
    assert DATASETS.canonical("coloredmnist") == "ColoredMNIST" and DATASETS.get("pacs") is DATASETS.get("PACS")
    table: Registry[type] = Registry("widget")
    table.register("Ab")(type("Ab", (), {}))
    table.register("AB")(type("AB", (), {}))
    with pytest.raises(UnknownNameError):  # two names differ only in case: "ab" is neither
        table.canonical("ab")


def test_unknown_name_suggests_the_closest_and_plugins():
    with pytest.raises(UnknownNameError) as info:
        DATASETS.get("CMNIST")
    assert str(info.value).startswith("unknown dataset 'CMNIST'; did you mean 'ColoredMNIST'? valid datasets: "
                                      "ColoredMNIST, IRMColoredMNIST, RotatedMNIST, PACS")
    with pytest.raises(UnknownNameError) as info:
        ALGORITHMS.get("Zyzzyva")  # nothing close: no guess, but how to bring one's own
    assert str(info.value) == ("unknown algorithm 'Zyzzyva'; valid algorithms: "
                               f"{', '.join(ALGORITHMS.names())}; and X+EMA, X+SWAD, X+ModReg for any of them "
                               "(one of your own: load its module with --plugins MODULE)")
