
import numpy as np
import pytest

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.hparams import (
    HParam,
    HParamError,
    apply_overrides,
    by_dataset,
    choice,
    draw_hparams,
    int_log_uniform,
    int_pow2_uniform,
    log_uniform,
    log_uniform_or_zero,
    parse_overrides,
    resolve_space,
    run_space,
    seed_hash,
    uniform,
)
from domaingen.errors import DomaingenError
from domaingen.run.training import TrainConfig, resolve


def space(algorithm="IRM", dataset="ColoredMNIST"):
    return {**DATASETS.get(dataset).hparam_space(), **ALGORITHMS.get(algorithm).hparam_space()}


def test_seed_zero_gives_defaults():
    s = space()
    assert draw_hparams(s, "ColoredMNIST", 0) == {k: hp.default for k, hp in s.items()}
    values = draw_hparams(s, "ColoredMNIST", 0)
    assert values["lr"] == 1e-3 and values["batch_size"] == 64 and values["irm_lambda"] == 1e2


def test_draws_are_deterministic_and_differ_between_seeds():
    s = space()
    a = draw_hparams(s, "ColoredMNIST", 3)
    assert a == draw_hparams(s, "ColoredMNIST", 3)
    assert a != draw_hparams(s, "ColoredMNIST", 4)
    assert a != draw_hparams(s, "RotatedMNIST", 3)


def test_draw_equals_independent_generator_per_name():
    s = space()
    drawn = draw_hparams(s, "ColoredMNIST", 7)
    rng = np.random.default_rng(seed_hash("ColoredMNIST", 7, "lr"))
    assert drawn["lr"] == pytest.approx(10 ** rng.uniform(-4.5, -2.5))
    rng = np.random.default_rng(seed_hash("ColoredMNIST", 7, "batch_size"))
    assert drawn["batch_size"] == int(2 ** rng.uniform(3, 9))


def test_adding_a_hyperparameter_changes_no_other_draw():
    s = space()
    extended = {"aaa_new": HParam(1.0, log_uniform(-1, 1)), **s, "zzz_new": HParam(2.0, log_uniform(-2, 2))}
    before = draw_hparams(s, "ColoredMNIST", 5)
    after = draw_hparams(extended, "ColoredMNIST", 5)
    assert {k: after[k] for k in before} == before


def test_draws_lie_in_their_ranges():
    s = space()
    for seed in range(1, 60):
        h = draw_hparams(s, "ColoredMNIST", seed)
        assert 10**-4.5 <= h["lr"] <= 10**-2.5
        assert 8 <= h["batch_size"] <= 512
        assert 1 <= h["irm_penalty_anneal_iters"] <= 10_000
        assert 0.1 <= h["irm_lambda"] <= 1e5


def test_samplers_describe_their_distribution():
    assert str(log_uniform(-4.5, -2.5)) == "10^U(-4.5,-2.5)"
    assert str(int_pow2_uniform(3, 9)) == "int(2^U(3,9))"


def test_hparams_do_not_depend_on_trial_seed(tmp_path):
    configs = [
        TrainConfig("ColoredMNIST", "VREx", str(tmp_path), hparams_seed=4, trial_seed=t, protocol="paired") for t in (0, 1, 2)
    ]
    drawn = [resolve(c).hparams for c in configs]
    assert drawn[0] == drawn[1] == drawn[2]
    seeds = [resolve(c).args["seed"] for c in configs]
    assert len(set(seeds)) == 3  # the trial still changes the run's own seed


def test_overrides_replace_values():
    s = space()
    merged = apply_overrides(draw_hparams(s, "ColoredMNIST", 0), parse_overrides('{"lr": 1e-4}'), s)
    assert merged["lr"] == 1e-4 and merged["batch_size"] == 64


def test_unknown_override_key_names_it():
    s = space()
    with pytest.raises(HParamError, match=r"unknown hyperparameter\(s\) lrr; valid names: .*lr"):
        apply_overrides({}, {"lrr": 1.0}, s)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"lr": 1e-4', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_malformed_overrides(text, message):
    with pytest.raises(HParamError, match=message):
        parse_overrides(text)


def test_non_numeric_override_for_numeric_hparam():
    s = space()
    with pytest.raises(HParamError, match="'lr' must be a finite number"):
        apply_overrides({}, {"lr": "fast"}, s)



@pytest.mark.parametrize("hparams_seed", [0, 1, 6])
def test_shared_hyperparameters_draw_one_value_for_every_algorithm(hparams_seed):
    """lr, batch_size, widths... at draw k are the same for ERM, IRM, VREx, Fish, SANDMask, DMG, X+ModReg."""
    names = ALGORITHMS.names() + ["ERM+ModReg", "IRM+ModReg"]
    spaces = {name: run_space("ColoredMNIST", DATASETS.get("ColoredMNIST"), ALGORITHMS.get(name)) for name in names}
    draws = {name: draw_hparams(spaces[name], "ColoredMNIST", hparams_seed) for name in names}
    shared = set.intersection(*(set(d) for d in draws.values()))
    assert {"lr", "batch_size", "weight_decay"} <= shared
    for key in shared:
        # algorithms that declare the name alike draw one value; one with its own declaration (ADRMX's lr and
        # mlp_depth, RDM's batch_size: DomainBed's per-algorithm distributions) draws from it
        by_declaration: dict[str, dict] = {}
        for name, d in draws.items():
            hp = spaces[name][key]
            by_declaration.setdefault(f"{hp.default!r} {hp.sampler}", {})[name] = d[key]
        for values in by_declaration.values():
            assert len({repr(v) for v in values.values()}) == 1, (key, values)
    # and the value is the per-name generator's, seeded without any algorithm name
    if hparams_seed:
        rng = np.random.default_rng(seed_hash("ColoredMNIST", hparams_seed, "lr"))
        assert draws["ERM"]["lr"] == pytest.approx(10 ** rng.uniform(-4.5, -2.5))


def test_modreg_draws_the_base_draw_plus_its_own(tmp_path):
    """IRM+ModReg at draw k = IRM at draw k, plus the modreg_* names."""
    base = resolve(TrainConfig("ColoredMNIST", "IRM", str(tmp_path), hparams_seed=3, protocol="paired")).hparams
    composed = resolve(TrainConfig("ColoredMNIST", "IRM+ModReg", str(tmp_path), hparams_seed=3, protocol="paired")).hparams
    assert {k: composed[k] for k in base} == base
    assert all(k.startswith("modreg_") for k in set(composed) - set(base))


def test_modreg_runs_get_the_base_algorithms_training_seed(tmp_path):
    def seed(algorithm, **kw):
        return resolve(TrainConfig("ColoredMNIST", algorithm, str(tmp_path), test_envs=[2], protocol="paired", **kw)).args["seed"]

    for kw in ({}, {"hparams_seed": 4, "trial_seed": 1}):
        assert seed("ERM+ModReg", **kw) == seed("ERM", **kw)
        assert seed("IRM+ModReg", **kw) == seed("IRM", **kw)
        assert seed("IRM", **kw) != seed("ERM", **kw)
    # X's own seed is unchanged: the same hash of (dataset, X, test envs, hparams_seed, trial_seed) as before
    assert seed("ERM", hparams_seed=4, trial_seed=1) == seed_hash("ColoredMNIST", "ERM", [2], 4, 1)


# --- dataset-dependent declarations (DomainBed's per-dataset hyperparameters) ---

def _lr_like() -> HParam:
    return by_dataset(
        HParam(5e-5, log_uniform(-5, -3.5)),
        ("small_images", HParam(1e-3, log_uniform(-4.5, -2.5))),
        (("DomainNet", "PACS"), HParam(0.5, uniform(0.1, 1.0))),
    )


def test_a_dataset_dependent_hparam_resolves_by_name_then_group():
    hp = _lr_like()
    assert hp.for_dataset("ColoredMNIST", ("small_images",)).default == 1e-3
    assert hp.for_dataset("PACS").default == 0.5
    assert hp.for_dataset("DomainNet", ("small_images",)).default == 1e-3  # first matching variant wins
    other = hp.for_dataset("OfficeHome")
    assert other.default == 5e-5 and other.variants == ()


def test_a_dataset_dependent_draw_uses_that_datasets_distribution():
    space = {"x": _lr_like()}
    for seed in range(1, 20):
        small = draw_hparams(resolve_space(space, "ColoredMNIST", ("small_images",)), "ColoredMNIST", seed)["x"]
        big = draw_hparams(resolve_space(space, "OfficeHome"), "OfficeHome", seed)["x"]
        assert 10**-4.5 <= small <= 10**-2.5 and 10**-5 <= big <= 10**-3.5
        # the same generator as every other name: (dataset, seed, name)
        rng = np.random.default_rng(seed_hash("ColoredMNIST", seed, "x"))
        assert small == pytest.approx(10 ** rng.uniform(-4.5, -2.5))


def test_describe_lists_the_variants():
    text = _lr_like().describe()
    assert text.startswith("5e-05; 10^U(-5,-3.5)") and "[small_images: 0.001; 10^U(-4.5,-2.5)]" in text
    assert "[DomainNet/PACS: 0.5; U(0.1,1)]" in text


def test_run_space_resolves_for_the_datasets_groups():
    class Small:
        HPARAM_GROUPS = ("small_images",)

        @classmethod
        def hparam_space(cls):
            return {"lr": HParam(1e-3)}

    class Algo:
        @classmethod
        def hparam_space(cls):
            return {"d_lr": _lr_like()}

    space = run_space("MyDigits", Small, Algo)
    assert space["lr"].default == 1e-3 and space["d_lr"].default == 1e-3
    assert DATASETS.get("ColoredMNIST").HPARAM_GROUPS == ("small_images",)
    assert DATASETS.get("RotatedMNIST").HPARAM_GROUPS == ("small_images",)


def test_a_method_needing_two_training_domains_is_refused_before_anything_is_written(tmp_path):
    from domaingen.algorithms.erm import ERM
    from domaingen.errors import DomaingenError

    class TwoDomains(ERM):
        MIN_TRAIN_DOMAINS = 2

    ALGORITHMS.register("TwoDomainsTest")(TwoDomains)
    try:
        with pytest.raises(DomaingenError, match=r"^TwoDomainsTest needs at least 2 training domains, got 1; "
                                                 r"hold out fewer environments$"):
            resolve(TrainConfig(dataset="ColoredMNIST", algorithm="TwoDomainsTest", test_envs=[0, 1],
                                output_dir=str(tmp_path / "run"), data_dir="embedded"))
        assert not (tmp_path / "run").exists()
    finally:
        ALGORITHMS.unregister("TwoDomainsTest")


def test_a_method_undefined_for_one_logit_is_refused():
    from domaingen.algorithms.erm import ERM
    from domaingen.errors import DomaingenError

    class MultiClassOnly(ERM):
        NO_SINGLE_LOGIT = "it mixes softmax targets"

    with pytest.raises(DomaingenError, match=r"^MultiClassOnly is undefined for a one-logit classifier: it mixes"):
        MultiClassOnly.check_problem(2, {"single_logit": True})
    MultiClassOnly.check_problem(2, {"single_logit": False})


# ---- samplers: arguments a plugin author might misread ---------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda: log_uniform(1e-4, 1e-2), "log_uniform(0.0001, 0.01) takes exponents of 10, not values: 0.0001 and 0.01 "
                                      "would draw between 1 and 1.02; for values between 0.0001 and 0.01 write "
                                      "log_uniform(-4, -2)"),
    (lambda: log_uniform_or_zero(0.001, 0.5, 0.2), "log_uniform_or_zero(0.001, 0.5) takes exponents of 10"),
    (lambda: int_log_uniform(0.1, 0.9), "int_log_uniform(0.1, 0.9) takes exponents of 10"),
    (lambda: int_pow2_uniform(0.25, 0.5), "int_pow2_uniform(0.25, 0.5) takes exponents of 2, not values: 0.25 and "
                                          "0.5 would draw between 1.19 and 1.41; for values between 0.25 and 0.5 "
                                          "write int_pow2_uniform(-2, -1)"),
    (lambda: uniform(0.2, 0.1), "uniform(0.2, 0.1): low must not exceed high"),
    (lambda: log_uniform(-2, -4), "log_uniform(-2, -4): low must not exceed high"),
    (lambda: log_uniform_or_zero(-5, 0, 1.5), "log_uniform_or_zero: p_zero is a probability in [0, 1], got 1.5"),
    (lambda: choice([]), "choice([]): give at least one option"),
])
def test_misread_sampler_arguments_are_refused_in_one_line(make, message):
    with pytest.raises(DomaingenError) as info:
        make()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_exponent_samplers_draw_between_the_powers():
    rng = np.random.default_rng(0)
    draws = [log_uniform(-4, -2)(rng) for _ in range(200)]
    assert 1e-4 <= min(draws) and max(draws) <= 1e-2
    assert all(8 <= int_pow2_uniform(3, 9)(rng) < 512 for _ in range(200))
    assert str(log_uniform(0.5, 2)) == "10^U(0.5,2)"  # one bound outside (0, 1): exponents, accepted


def test_every_sampler_documents_its_arguments():
    for sampler in (log_uniform, log_uniform_or_zero, int_log_uniform, int_pow2_uniform, uniform, choice):
        assert "Args:" in sampler.__doc__, sampler.__name__


def test_a_plugin_with_value_bounds_stops_with_one_line(tmp_path, capsys):
    from domaingen.cli.main import main

    plugin = tmp_path / "bad_bounds.py"
    plugin.write_text(
        "from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier\n"
        "from domaingen.hparams import HParam, log_uniform\n"
        "@ALGORITHMS.register('BadBounds')\n"
        "class BadBounds(FeaturizerClassifier):\n"
        "    HPARAMS = {'scale': HParam(1e-3, log_uniform(1e-4, 1e-2))}\n")
    try:
        code = main(["--plugins", str(plugin), "list"])
    finally:
        ALGORITHMS.unregister("BadBounds")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "takes exponents of 10, not values" in err and "write log_uniform(-4, -2)" in err
