"""Config keys left at their defaults while the switch that reads them is off (layer 0).

A method's keys set while the method is disabled would change nothing; every section with an
``ENABLED`` (or ``KIND``) switch refuses them the same way, naming each key and its value."""
import math
from typing import Any, Iterable, List, Mapping

__all__ = ["changed_keys", "refuse_keys_while_off", "check_number"]


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
