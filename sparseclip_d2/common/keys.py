"""Config keys left at their defaults while the switch that reads them is off (layer 0).

A method's keys set while the method is disabled would change nothing; every section with an
``ENABLED`` (or ``KIND``) switch refuses them the same way, naming each key and its value.

A part's frozen settings dataclass is the one source of its section's keys: each field declares
its key and comment (:func:`key_field`), a :class:`Section` adds the switch and any key with no
field, and both ``add_sparseclip_config`` (:func:`build_section`) and the refusal
(:func:`changed_section_keys`) read that one table."""
import dataclasses
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["changed_keys", "refuse_keys_while_off", "key_field", "Key", "Section", "section_defaults",
           "key_defaults", "section_help", "build_section", "changed_section_keys", "switch_is_on", "check_number"]


def _differs(value: Any, default: Any) -> bool:
    # a yacs list comes back as a list or a tuple: compare as lists
    if isinstance(default, (list, tuple)):
        return not isinstance(value, (list, tuple)) or list(value) != list(default)
    return value != default


def changed_keys(node: Mapping, defaults: Mapping[str, Any], prefix: str) -> List[str]:
    """``"<prefix>.<KEY> = <value!r>"`` for every key of ``defaults`` whose value in ``node``
    differs from its default, in the order of ``defaults``."""
    return [f"{prefix}.{k} = {node[k]!r}" for k, v in defaults.items() if _differs(node[k], v)]


def refuse_keys_while_off(changed: Iterable[str], off: str, remedy: str) -> None:
    """``ValueError`` "<keys> changes nothing while <off>: <remedy>" when ``changed`` (from
    :func:`changed_keys`) is not empty."""
    changed = list(changed)
    if changed:
        raise ValueError(f"{', '.join(changed)} changes nothing while {off}: {remedy}")


# --- Each part's settings dataclass as the one source of its config section's keys ---------


def key_field(default: Any, key: str, help: str = "", *, index: Optional[int] = None):
    """A dataclass field read from config key ``key`` (``help``: the key's comment, as
    detectron2 writes one above each default). Fields sharing a ``key`` with ``index`` 0, 1, ...
    are the items of one list key (``CASS.SINGULAR_SCALE = [low, high]``)."""
    meta = {"key": key, "help": help}
    if index is not None:
        meta["index"] = index
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Key:
    """A section key with no field in the settings dataclass (a switch such as ``ENABLED``, or a
    key read elsewhere): its name, default and comment."""

    name: str
    default: Any
    help: str = ""


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section built from a frozen settings dataclass.

    Fields: settings (the dataclass; its fields with ``key_field`` metadata give the keys, in
    field order), switch (the key that turns the part on, whose other keys are refused while it
    is off; None = none), defaults (``{field: value}`` where the section's default differs from
    the dataclass's: stated here, never silently), before / after (:class:`Key` s with no
    field, placed before / after the fields' keys).
    """

    settings: type
    switch: Optional[str] = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    before: Tuple[Key, ...] = ()
    after: Tuple[Key, ...] = ()

    def __post_init__(self):
        names = {f.name for f in dataclasses.fields(self.settings)}
        unknown = sorted(set(self.defaults) - names)
        if unknown:
            raise ValueError(f"{self.settings.__name__} has no field {', '.join(unknown)}")


def _yacs(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value  # detectron2's configs hold lists


def section_defaults(section: Section) -> Dict[str, Any]:
    """``{KEY: default}`` of every key of ``section``, in section order (switch included)."""
    out: Dict[str, Any] = {k.name: _yacs(k.default) for k in section.before}
    for f in dataclasses.fields(section.settings):
        if "key" not in f.metadata:
            continue
        if f.name in section.defaults:
            value = section.defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        else:
            raise ValueError(f"{section.settings.__name__}.{f.name} has no default and the section gives none")
        key, index = f.metadata["key"], f.metadata.get("index")
        if index is None:
            out[key] = _yacs(value)
        else:
            items = out.setdefault(key, [])
            if len(items) != index:
                raise ValueError(f"{section.settings.__name__}.{f.name}: item {index} of {key} out of order")
            items.append(value)
    out.update((k.name, _yacs(k.default)) for k in section.after)
    return out


def key_defaults(section: Section) -> Dict[str, Any]:
    """``{KEY: default}`` of the keys that must keep their defaults while the switch is off
    (every key of ``section`` but the switch): the input of :func:`changed_keys`."""
    return {k: v for k, v in section_defaults(section).items() if k != section.switch}


def section_help(section: Section) -> Dict[str, str]:
    """``{KEY: comment}`` of every key of ``section`` (the first item's for a list key)."""
    out = {k.name: k.help for k in section.before}
    for f in dataclasses.fields(section.settings):
        if "key" in f.metadata:
            out.setdefault(f.metadata["key"], f.metadata.get("help", ""))
    out.update((k.name, k.help) for k in section.after)
    return out


def build_section(node_class: Callable[[], Any], section: Section):
    """A new ``node_class()`` (detectron2's ``CfgNode``) holding the defaults of ``section``."""
    node = node_class()
    for k, v in section_defaults(section).items():
        node[k] = v
    return node


def changed_section_keys(node: Mapping, section: Section, prefix: str) -> List[str]:
    """:func:`changed_keys` of ``node`` against ``section``'s defaults (its switch excluded)."""
    return changed_keys(node, key_defaults(section), prefix)


def switch_is_on(node: Mapping, section: Section, prefix: str) -> bool:
    """Whether ``section``'s switch (a bool key such as ``ENABLED``) is on in ``node``, the config
    node at ``prefix``. ``ValueError`` naming the key when the switch is not a bool, and, when it
    is off, naming every other key of the section set away from its default (it would change
    nothing)."""
    if section.switch is None:
        raise ValueError(f"the section at {prefix} has no switch")
    key = f"{prefix}.{section.switch}"
    value = node[section.switch]
    if not isinstance(value, bool):
        raise ValueError(f"{key} = {value!r} is invalid; valid: True, False")
    if not value:
        refuse_keys_while_off(changed_section_keys(node, section, prefix), f"{key} is False",
                              f"set {key} True or leave these keys at their defaults")
    return value


def check_number(key: str, value, low: float, high: float, *, integer: bool = False,
                  low_open: bool = False) -> None:
    """Raise ValueError naming ``key``, ``value`` and the valid range when out of it."""
    kind = "an integer" if integer else "a number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (float(value).is_integer() if integer else math.isfinite(float(value)))
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        hi = "inf)" if math.isinf(high) else f"{high:g}]"
        raise ValueError(f"{key} = {value!r} is invalid; valid: {kind} in {lo}{low:g}, {hi}")
