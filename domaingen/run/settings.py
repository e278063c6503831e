"""Every setting of a run, declared once.

`TrainConfig` (in run.training) declares each setting as a dataclass field made by
`setting()`: its type and default are the field's, and the field's metadata holds the
rest (help, the kind of value, validation, whether it is part of the run's identity,
whether a sweep spec may set it). From that one declaration come:

- `domaingen train`'s flags (`add_train_flags`) and the config built from them (`config_kwargs`);
- `sweep launch`'s flags and the sweep spec's keys for the settings a sweep may set
  (`add_sweep_flags`, `sweep_setting_fields`, `check_spec_value`);
- the job arguments a sweep hashes into a job's directory (`job_identity`) and the
  `domaingen train` command line that runs a job (`train_flags`);
- args.json, written from the resolved config (run.training).

A value of the wrong type names the setting, the type expected and where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from domaingen.errors import DomaingenError

# what `identity` can be:
ALWAYS = "always"  # part of the run's identity and of a sweep job's id
UNLESS = "unless"  # part of both, except at its value `id_unless` (so adding one leaves existing job ids unchanged)
NEVER = "never"  # changes nothing the run computes: a resumed or relaunched run may differ in it


class SettingError(DomaingenError):
    """A setting's value of the wrong type or out of range."""


@dataclass(frozen=True)
class Kind:
    """A kind of value: how it is read from a flag's text and checked when it comes from a file."""

    name: str  # for messages: "an integer"
    from_text: Callable[[str], Any]
    accepts: Callable[[Any], bool]
    normalize: Callable[[Any], Any] = lambda value: value
    many: bool = False  # a flag of several tokens (nargs="+"), each read by from_text


def _int_text(text: str) -> int:
    return int(text.strip())


def _float_text(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def environment_token(text: str) -> int | str:
    """One environment on the command line: an integer is an index, anything else a name."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def _environments_text(text: str) -> list[int | str]:
    """`--test_envs 0,1` (one held-out set, as `sweep launch` writes sets) or one token of `--test_envs 0 1`."""
    tokens = [t for t in text.split(",") if t.strip()]
    if not tokens:
        raise ValueError(text)
    return [environment_token(t) for t in tokens]


def _is_environment(value: Any) -> bool:
    return isinstance(value, str) or _is_int(value)


INT = Kind("an integer", _int_text, _is_int)
FLOAT = Kind("a number", _float_text, _is_number)
TEXT = Kind("a string", str, lambda v: isinstance(v, str))
BOOL = Kind("true or false", lambda t: {"true": True, "false": False, "1": True, "0": False}[t.strip().lower()],
            lambda v: isinstance(v, bool))
ENVIRONMENTS = Kind("a list of environment indices or names", _environments_text,
                    lambda v: isinstance(v, (list, tuple)) and all(_is_environment(e) for e in v), list, many=True)
NAMES = Kind("a list of names", str, lambda v: isinstance(v, (list, tuple)) and all(isinstance(e, str) for e in v),
             list, many=True)
# kept as text on the command line: hparams.parse_overrides reads it and says where JSON goes wrong
OVERRIDES = Kind("a JSON object of hyperparameter overrides", str, lambda v: isinstance(v, (dict, str)))


@dataclass(frozen=True)
class SettingInfo:
    """What the declaration of one setting says beyond its type and default."""

    help: str
    kind: Kind
    identity: str = ALWAYS
    id_unless: Any = None  # identity UNLESS: the value left out of a job's id
    sweep: bool = False  # a sweep spec key and a `sweep launch` flag
    launch: bool = False  # a `sweep launch` flag given to every job, not a spec key (it changes no job id)
    train: bool = True  # a `domaingen train` flag
    flag: str | None = None  # the flag's name when it is not --NAME
    required: bool = False
    optional: bool = False  # None is a valid value (the default, resolved later)
    choices: Callable[[], Sequence[str]] | None = None
    check: Callable[[Any], str | None] | None = None  # a problem with a value of the right kind, else None
    metavar: str | None = None
    recorded: bool = True  # written to args.json


def setting(default: Any = dataclasses.MISSING, *, help: str, kind: Kind, **info: Any) -> Any:
    """A dataclass field declaring one run setting (see the module docstring)."""
    meta = {"setting": SettingInfo(help=help, kind=kind, **info)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def as_field(item: "Setting") -> Any:
    """A new dataclass field declaring the same setting as `item` (for a class built from others' settings)."""
    info = {f.name: getattr(item.info, f.name) for f in dataclasses.fields(SettingInfo)}
    return setting(item.default if not item.info.required else dataclasses.MISSING, **info)


@dataclass(frozen=True)
class Setting:
    """One declared setting: its name, default and SettingInfo."""

    name: str
    default: Any
    info: SettingInfo

    @property
    def flag(self) -> str:
        return self.info.flag or f"--{self.name}"

    def choices(self) -> list[str] | None:
        return list(self.info.choices()) if self.info.choices else None

    def expected(self) -> str:
        """The kind of value, for messages ("an integer", "one of fp32, bf16, auto")."""
        choices = self.choices()
        if not choices:
            return self.info.kind.name
        return f"{'a list of' if self.info.kind.many else 'one of'} {', '.join(choices)}"

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` (already of a Python type, e.g. from TOML or JSON), or None."""
        if value is None:
            return None if self.info.optional or self.default is None else "a value (got none)"
        if not self.info.kind.accepts(value):
            return f"{self.expected()}, got {value!r}"
        choices = self.choices()
        outside = [v for v in (value if self.info.kind.many else [value]) if choices is not None and v not in choices]
        if outside:
            return f"{self.expected()}, got {outside[0]!r}"
        return self.info.check(value) if self.info.check else None


def declared(config_cls: type) -> list[Setting]:
    """The settings a dataclass declares with `setting()`, in its order."""
    out = []
    for f in dataclasses.fields(config_cls):
        info = f.metadata.get("setting")
        if info is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append(Setting(f.name, default, info))
    return out


def check_value(item: Setting, value: Any, source: str) -> Any:
    """`value` normalized, or a SettingError naming the setting, what it must be and `source`."""
    problem = item.problem(value)
    if problem:
        raise SettingError(f"{item.name} must be {problem} ({source})")
    return item.info.kind.normalize(value) if value is not None else None


# ---- the command line


def _flag_type(item: Setting) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = item.info.kind.from_text(text)
        except (ValueError, KeyError, json.JSONDecodeError):
            raise argparse.ArgumentTypeError(f"expected {item.expected()}, got {text!r}") from None
        problem = item.problem(value) if not item.info.kind.many else None
        if problem:
            raise argparse.ArgumentTypeError(f"expected {problem}")
        return value

    parse.__name__ = item.name
    return parse


def add_flag(parser: argparse.ArgumentParser, item: Setting, *, for_sweep: bool = False, **overrides: Any) -> None:
    """Add `item`'s flag to `parser`. A sweep's flags default to None: they override the spec only when given."""
    kwargs: dict[str, Any] = {"help": item.info.help, "dest": item.name}
    if item.info.kind is BOOL:
        kwargs.update(action=argparse.BooleanOptionalAction)
    elif item.info.kind.many:
        kwargs.update(type=_flag_type(item), nargs="+", action="extend", metavar=item.info.metavar or "NAME")
    else:
        kwargs.update(type=_flag_type(item), metavar=item.info.metavar or item.name.upper())
        if item.choices() is not None:
            kwargs.update(metavar="{" + ",".join(item.choices()) + "}")
    if for_sweep:
        kwargs["default"] = None
    elif item.info.required:
        kwargs["required"] = True
    else:
        kwargs["default"] = None if item.info.kind.many else item.default
    kwargs.update(overrides)
    parser.add_argument(item.flag, **kwargs)


def namespace_value(item: Setting, ns: argparse.Namespace) -> Any:
    """The setting's value from parsed flags: a list flag given in pieces is joined (`--test_envs 0,1`
    and `--test_envs 0 1` are the same set)."""
    value = getattr(ns, item.name, None)
    if item.info.kind is ENVIRONMENTS and value is not None:
        return [env for piece in value for env in (piece if isinstance(piece, list) else [piece])]
    return value


def flag_values(settings: Iterable[Setting], ns: argparse.Namespace) -> dict[str, Any]:
    """{name: value} of the settings whose flags `ns` holds (None where not given, for optional ones)."""
    out = {}
    for item in settings:
        if hasattr(ns, item.name):
            value = namespace_value(item, ns)
            if value is None and item.info.kind.many:
                value = item.default
            out[item.name] = value
    return out


def command_line(settings: Iterable[Setting], values: Mapping[str, Any]) -> list[str]:
    """The flags that give `values` (settings left at None are left out)."""
    parts: list[str] = []
    for item in settings:
        value = values.get(item.name)
        if value is None or not item.info.train or value == [] or value == {}:
            continue
        if item.info.kind is BOOL:
            parts.append(item.flag if value else f"--no-{item.flag[2:]}")
        elif item.info.kind.many:
            parts += [item.flag, *map(str, value)]
        elif item.info.kind is OVERRIDES:
            parts += [item.flag, value if isinstance(value, str) else json.dumps(value, sort_keys=True)]
        else:
            parts += [item.flag, str(value)]
    return parts


# ---- identity


def identity_names(settings: Iterable[Setting]) -> tuple[str, ...]:
    """The settings that decide what a run computes."""
    return tuple(s.name for s in settings if s.info.identity != NEVER)


def non_identity_names(settings: Iterable[Setting]) -> tuple[str, ...]:
    """The settings a rerun may change (where the data are, the device, the loggers, ...)."""
    return tuple(s.name for s in settings if s.info.identity == NEVER)


def left_out_of_id(item: Setting, value: Any) -> bool:
    """Whether a job's id leaves this value out: an UNLESS setting at its `id_unless` value (so adding
    such a setting leaves every existing job id unchanged)."""
    return item.info.identity == UNLESS and value == item.info.id_unless


def job_identity(settings: Iterable[Setting], values: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `values` hashed into a sweep job's id: the identity settings it holds, less
    those `left_out_of_id`."""
    return {item.name: values[item.name] for item in settings
            if item.name in values and item.info.identity != NEVER and not left_out_of_id(item, values[item.name])}


def closest(name: str, valid: Iterable[str]) -> str:
    """'; did you mean X?' for the valid name nearest `name`, else ''."""
    import difflib

    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""
