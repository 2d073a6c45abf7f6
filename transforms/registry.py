"""One row per transform: its class, the input fields it reads (in element order), and its
bounds with their defaults. Config validation (`pipelines.config`), element parsing
(`pipelines.io`) and the config reference (docs/operations.md) are derived from these rows, so
adding a statistic touches one row here, its truncation in `transforms.truncations` (a
`Problem` of `streams/units.py`) and a class naming the row in `transforms.statistics`.
Imports no Beam (classes and truncations are loaded on first use).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Dict, FrozenSet, Optional, Tuple

REQUIRED = "<required>"

# capabilities a row declares (`TransformSpec.can`)
SELECT_KEYS = "select_keys"  # keys selected privately when `public_keys` is left out
CAPS = "caps"                # `pipelines.caps` explores its contribution caps
CHECKPOINT = "checkpoint"    # a streaming release checkpointed, continued with --continue
CAPABILITIES = (SELECT_KEYS, CAPS, CHECKPOINT)
_ALL = frozenset((SELECT_KEYS, CAPS, CHECKPOINT))


@dataclasses.dataclass(frozen=True)
class TransformSpec:
    name: str
    class_name: str                 # in `module`
    shape: Tuple[Any, ...]          # element shape: role names, nested tuples for pairs
    bounds: Dict[str, Any]          # bound -> default (REQUIRED: must be given)
    numeric: Tuple[str, ...] = ()   # roles parsed as numbers
    single_key: Optional[str] = None  # the one public key of a transform without key lists
    summary: str = ""
    unit: str = ""                  # the protected unit (what one individual is)
    module: str = "transforms.statistics"  # where the class lives
    derived: Dict[str, str] = dataclasses.field(default_factory=dict)  # a default derived
    # what the drivers may do with it (`CAPABILITIES`); `pipelines/` asks here, nowhere else
    can: FrozenSet[str] = frozenset()
    # the roles naming the unit of a record (the input gate votes per unit); () = no gate
    unit_roles: Tuple[str, ...] = ()
    # the roles naming the key(s) a record falls on (the input gate's off-key votes); () = the
    # one key of a transform without key lists
    key_roles: Tuple[str, ...] = ("key",)
    # a truncation counter's reason (`truncated_by_<reason>`) -> the bound that sets it, where
    # the bound is not named as the reason (`pipelines.run.truncation_warning`)
    cut_by: Dict[str, str] = dataclasses.field(default_factory=dict)
    # its truncation: a function of `transforms.truncations` (default: the row's name) taking
    # the bounds (and the noise kind) -> a `Truncation`
    truncation: str = ""

    @property
    def roles(self) -> Tuple[str, ...]:
        """The input fields: the timestamp, then the shape's roles in order."""
        def flat(shape):
            for part in shape:
                yield from (flat(part) if isinstance(part, tuple) else (part,))
        return ("timestamp",) + tuple(flat(self.shape))

    def element(self, values: Dict[str, Any]):
        """Role values -> the transform's element, e.g. (op, (a, b))."""
        def build(shape):
            return tuple(build(p) if isinstance(p, tuple) else values[p] for p in shape)
        return build(self.shape)

    def transform_class(self):
        return getattr(importlib.import_module(self.module), self.class_name)

    def truncate(self, bounds: Dict[str, Any], noise: str):
        """The statistic's `Truncation` for `bounds` (refused: a bound it does not take)."""
        unknown = sorted(set(bounds) - set(self.bounds))
        if unknown:
            raise TypeError(f"`{unknown[0]}` must be a bound of {self.class_name} "
                            f"({', '.join(self.bounds) or 'none'}); got {bounds[unknown[0]]!r}.")
        missing = [name for name, default in self.bounds.items()
                   if default == REQUIRED and name not in bounds]
        if missing:
            raise TypeError(f"`{missing[0]}` must be given to {self.class_name} (a required "
                            f"bound); got nothing.")
        factory = getattr(importlib.import_module("transforms.truncations"),
                          self.truncation or self.name)
        return factory(noise=noise, **bounds)


_COUNT_BOUNDS = {"max_contributions": 1, "max_contributions_per_step": None,
                 "max_keys_per_unit": 1}

_GRID = "max(|min_value|, max_value) / 100 with discrete noise"
_LEAST = "0; negative for signed values"

SPECS: Dict[str, TransformSpec] = {spec.name: spec for spec in (
    TransformSpec("count", "ContinualCount", ("unit", "key"), _COUNT_BOUNDS,
                  summary="running count of events per key (user-level)",
                  unit="user", can=_ALL, unit_roles=("unit",)),
    TransformSpec("sum", "ContinualSum", ("unit", "key", "value"),
                  {"max_value": REQUIRED, "min_value": None, **_COUNT_BOUNDS,
                   "value_resolution": None},
                  numeric=("value",), summary="running sum of clamped values per key",
                  unit="user", derived={"value_resolution": _GRID, "min_value": _LEAST},
                  can=_ALL,
                  unit_roles=("unit",), truncation="sum_"),
    TransformSpec("mean", "ContinualMean", ("unit", "key", "value"),
                  {"max_value": REQUIRED, "min_value": None, **_COUNT_BOUNDS,
                   "value_resolution": None, "sum_share": None},
                  numeric=("value",), summary="running mean of clamped values per key (noisy "
                                              "sum / noisy count, Fieller interval)",
                  unit="user", module="transforms.mean",
                  derived={"value_resolution": _GRID, "min_value": _LEAST,
                           "sum_share": "1/2: the worst-case optimum"},
                  unit_roles=("unit",)),
    TransformSpec("count_distinct", "ContinualCountDistinct", ("op", "item", "key"),
                  {"max_flips": REQUIRED, "max_keys_per_unit": 1, "semantics": "count"},
                  summary="distinct present items per key (item-level)",
                  unit="item", can=frozenset((SELECT_KEYS, CAPS)), unit_roles=("item",),
                  cut_by={"contribution_bound": "max_flips"}),
    TransformSpec("degree_count", "ContinualDegreeCount", ("op", ("a", "b")),
                  {"max_updates": REQUIRED}, summary="degree of every public node "
                                                      "(edge-level)",
                  unit="edge; each node key gets half the budget", can=frozenset((CAPS,)),
                  unit_roles=("a", "b"), key_roles=("a", "b"),
                  cut_by={"contribution_bound": "max_updates"}),
    TransformSpec("triangle_count", "ContinualTriangleCount", ("op", ("a", "b")),
                  {"max_degree": REQUIRED, "max_contribution": REQUIRED},
                  single_key="triangles", summary="triangle count of one graph (edge-level, "
                                                  "bounded-degree graphs)",
                  unit="edge (bounded-degree graphs only)", unit_roles=("a", "b"),
                  key_roles=()),
    TransformSpec("release", "ContinualRelease", ("key", "value"),
                  {"max_contributions": 1, "interval_bound": 1, "keys_per_unit": 1},
                  numeric=("value",), summary="already-computed differences with a declared "
                                              "bound",
                  unit="declared by the caller"),
)}

NAMES = tuple(SPECS)


def can(transform: str, capability: str) -> bool:
    """Whether the transform's row declares `capability` (one of `CAPABILITIES`)."""
    return capability in SPECS[transform].can


def able(capability: str) -> Tuple[str, ...]:
    """The transforms whose rows declare `capability`, in registry order (for messages)."""
    return tuple(name for name, spec in SPECS.items() if capability in spec.can)


def transform_table() -> str:
    """The README's table of the transforms (kept equal to it by a test)."""
    def shape(parts):
        return "(" + ", ".join(shape(p) if isinstance(p, tuple) else p for p in parts) + ")"
    lines = ["| transform | elements (with event time) | protected unit | releases |",
             "|---|---|---|---|"]
    for spec in SPECS.values():
        lines.append(f"| `{spec.class_name}` | `{shape(spec.shape)}` | {spec.unit} | "
                     f"{spec.summary} |")
    return "\n".join(lines)


def config_reference() -> str:
    """The per-transform config table of docs/operations.md (kept equal to it by a test;
    regenerate with `python3 -m pipelines.reference`)."""
    def default(spec, name, value):
        if name in spec.derived:
            return spec.derived[name]
        return "required" if value == REQUIRED else ("none" if value is None else repr(value))
    lines = ["| `transform` | `input.fields` roles | `bounds` (default) | releases |",
             "|---|---|---|---|"]
    for spec in SPECS.values():
        bounds = ", ".join(f"`{k}` ({default(spec, k, v)})" for k, v in spec.bounds.items())
        lines.append(f"| `{spec.name}` | {', '.join(spec.roles)} | {bounds} | {spec.summary} |")
    return "\n".join(lines)

