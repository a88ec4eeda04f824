"""A sweep's search space: each knob a dotted key into the trial config with one distribution.

The distributions are frozen dataclasses (``Grid``, ``Choice``, ``Uniform``, ``LogUniform``,
``IntRange``, ``Expr``; as Optuna's ``distributions.py``), each knowing its YAML form (``parse``),
its Ray Tune form (``tune()``, Ray imported only there) and its corners: the values validation
builds a trial config for. ``SearchSpace`` holds the knobs and the seeds and enumerates the grid;
:func:`eval_expr` is the bounded arithmetic of an ``expr`` knob. Torch- and Ray-free at import.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from moe_core.configio import coerce_number, unknown_key
from moe_core.errors import SearchSpaceError, shown

_err = SearchSpaceError  # the one-line refusals below


def _ray_tune() -> Any:
    from ray import tune  # noqa: PLC0415 (Ray: only when a sweep runs)

    return tune


@dataclass(frozen=True, slots=True)
class Distribution:
    """One searched knob: a dotted key into the base config and its distribution."""

    key: str
    """Dotted key into the trial config (``base``) the knob sets."""
    values: tuple[Any, ...] = ()
    """grid/choice values; (low, high) for uniform/loguniform/int."""
    expr: str | None = None
    """expr: arithmetic over other knobs, e.g. ``2 * moe.granularity``."""
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Conditional: the knob applies only when every (key, allowed values) holds."""

    kind: ClassVar[str] = ""
    """The YAML name: grid | choice | uniform | loguniform | int | expr."""
    sampled: ClassVar[bool] = False
    """Drawn at run time by the searcher (random, optuna), not enumerated as a grid."""
    tune_fn: ClassVar[str] = ""
    """The ``ray.tune`` function that makes its Tune form (``tune()``)."""

    def applies(self, config: dict[str, Any]) -> bool:
        return all(get_dotted(config, k) in allowed for k, allowed in self.when)

    def tune(self) -> Any:
        """The Ray Tune form of the distribution (None: resolved per trial, not searched)."""
        return getattr(_ray_tune(), self.tune_fn)(*self.values)

    def corners(self) -> tuple[Any, ...]:
        """The values validation builds a trial config for."""
        return self.values

    @classmethod
    def parse(cls, key: str, v: Any, when: tuple) -> Distribution:
        """The knob ``search.<key>: {<kind>: v}`` of this distribution, validated."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _Listed(Distribution):
    def tune(self) -> Any:
        return getattr(_ray_tune(), self.tune_fn)(list(self.values))

    @classmethod
    def parse(cls, key: str, v: Any, when: tuple) -> Distribution:
        if not isinstance(v, list) or not v:
            raise _err(f"search.{key}.{cls.kind} must be a non-empty list of values")
        return cls(key=key, values=tuple(coerce_number(x, key) for x in v), when=when)


@dataclass(frozen=True, slots=True)
class Grid(_Listed):
    """Every value, each a trial (``tune.grid_search``)."""

    kind: ClassVar[str] = "grid"
    tune_fn: ClassVar[str] = "grid_search"


@dataclass(frozen=True, slots=True)
class Choice(_Listed):
    """One of the values, drawn per sample (``tune.choice``)."""

    kind: ClassVar[str] = "choice"
    sampled: ClassVar[bool] = True
    tune_fn: ClassVar[str] = "choice"


@dataclass(frozen=True, slots=True)
class _Range(Distribution):
    sampled: ClassVar[bool] = True

    @classmethod
    def parse(cls, key: str, v: Any, when: tuple) -> Distribution:
        kind = cls.kind
        if not isinstance(v, list) or len(v) != 2:
            raise _err(f"search.{key}.{kind} must be [low, high]")
        lo, hi = (coerce_number(x, key) for x in v)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)):
            raise _err(f"search.{key}.{kind}={v} must be two numbers")
        if not lo < hi:
            raise _err(f"search.{key}.{kind}: low={lo} must be < high={hi}")
        cls.check_bounds(key, v, lo, hi)
        return cls(key=key, values=(lo, hi), when=when)

    @classmethod
    def check_bounds(cls, key: str, v: Any, lo: float, hi: float) -> None:
        """Rules of this range's bounds beyond low < high."""


@dataclass(frozen=True, slots=True)
class Uniform(_Range):
    """A float drawn uniformly in [low, high] (``tune.uniform``)."""

    kind: ClassVar[str] = "uniform"
    tune_fn: ClassVar[str] = "uniform"


@dataclass(frozen=True, slots=True)
class LogUniform(_Range):
    """A float drawn uniformly in log space over [low, high], low > 0 (``tune.loguniform``)."""

    kind: ClassVar[str] = "loguniform"
    tune_fn: ClassVar[str] = "loguniform"

    @classmethod
    def check_bounds(cls, key: str, v: Any, lo: float, hi: float) -> None:
        if lo <= 0:
            raise _err(f"search.{key}.loguniform needs low > 0, got {lo}")


@dataclass(frozen=True, slots=True)
class IntRange(_Range):
    """An integer drawn uniformly in [low, high], both included (``tune.randint(low,
    high + 1)``)."""

    kind: ClassVar[str] = "int"

    def tune(self) -> Any:
        return _ray_tune().randint(int(self.values[0]), int(self.values[1]) + 1)

    def corners(self) -> tuple[Any, ...]:
        return int(self.values[0]), int(self.values[1])

    @classmethod
    def check_bounds(cls, key: str, v: Any, lo: float, hi: float) -> None:
        if not (float(lo).is_integer() and float(hi).is_integer()):
            raise _err(f"search.{key}.int bounds must be integers, got {v}")


@dataclass(frozen=True, slots=True)
class Expr(Distribution):
    """Not searched: computed per trial from other knobs (``sweeps.spec.space.eval_expr``)."""

    kind: ClassVar[str] = "expr"

    def tune(self) -> Any:
        return None

    def corners(self) -> tuple[Any, ...]:
        return ()

    @classmethod
    def parse(cls, key: str, v: Any, when: tuple) -> Distribution:
        if not isinstance(v, str):
            raise _err(f"search.{key}.expr must be a string such as '2 * moe.granularity'")
        return cls(key=key, expr=v, when=when)


KINDS: dict[str, type[Distribution]] = {
    c.kind: c for c in (Grid, Choice, Uniform, LogUniform, IntRange, Expr)}
DISTRIBUTIONS = tuple(KINDS)
"""The YAML name of each distribution (``search: {KEY: {grid: [...]}}``)."""


def _parse_when(key: str, when_raw: Any, known: type) -> tuple:
    if not isinstance(when_raw, dict):
        raise _err(f"search.{key}.when must map config keys to allowed values")
    when = []
    for wk, wv in when_raw.items():
        problem = unknown_key(known, wk) if isinstance(wk, str) and all(wk.split(".")) \
            else f"{shown(wk, 100)} is not a dotted key"
        if problem is not None:
            raise _err(f"search.{key}.when: {problem}; a condition names a key of the trial "
                       "config (or another knob)")
        allowed = wv if isinstance(wv, list) else [wv]
        if not all(x is None or isinstance(x, (str, int, float)) for x in allowed):
            raise _err(f"search.{key}.when.{wk}={shown(wv, 100)} must be a value or a list of "
                       "values (numbers, strings, true/false, null)")
        when.append((wk, tuple(coerce_number(x, wk) for x in allowed)))
    return tuple(when)


def parse_param(key: Any, raw: Any, known: type) -> Distribution:
    """``search.<key>: raw`` as its distribution; ``known`` is the trial config's dataclass
    (``TrainConfig``) whose dotted keys a knob and its conditions may name."""
    if not isinstance(key, str) or not all(key.split(".")) or key != key.strip():
        raise _err(f"search key {shown(key, 100)} must be a dotted key of the trial config, "
                   "such as optim.lr")
    problem = unknown_key(known, key)
    if problem is not None:
        raise _err(f"search.{key}: {problem}")
    if isinstance(raw, list):  # shorthand: a list is a grid
        raw = {"grid": raw}
    if not isinstance(raw, dict):
        raise _err(f"search.{key} must be a mapping like {{grid: [...]}} or a list")
    kinds = [k for k in raw if k in DISTRIBUTIONS]
    unknown = [k for k in raw if k not in DISTRIBUTIONS and k != "when"]
    if unknown:
        raise _err(
            f"search.{key}.{unknown[0]} is not known; use one of {', '.join(DISTRIBUTIONS)} "
            "(and optionally when)"
        )
    if len(kinds) != 1:
        raise _err(f"search.{key} needs exactly one of {', '.join(DISTRIBUTIONS)}")
    when = _parse_when(key, raw.get("when", {}), known)
    return KINDS[kinds[0]].parse(key, raw[kinds[0]], when)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The knobs of a spec and its seeds: the grid they span and the Tune space they give."""

    params: tuple[Distribution, ...] = ()
    seeds: tuple[int, ...] = ()

    @classmethod
    def parse(cls, raw: Any, known: type, seeds: tuple[int, ...] = ()) -> SearchSpace:
        """The spec's ``search:`` mapping (null: no knobs)."""
        raw = raw or {}
        if not isinstance(raw, dict):
            raise _err("search must map dotted config keys to distributions")
        return cls(tuple(parse_param(k, v, known) for k, v in raw.items()), tuple(seeds))

    def __iter__(self) -> Iterator[Distribution]:
        return iter(self.params)

    def param(self, key: str) -> Distribution | None:
        return next((p for p in self.params if p.key == key), None)

    def grid(self) -> list[Distribution]:
        return [p for p in self.params if isinstance(p, Grid)]

    def sampled(self) -> list[Distribution]:
        return [p for p in self.params if p.sampled]

    def exprs(self) -> list[Distribution]:
        return [p for p in self.params if isinstance(p, Expr)]

    def grid_points(self) -> Iterator[dict[str, Any]]:
        """Every grid point (× seed) in order: the last knob varies fastest."""
        grid = self.grid()
        values = [p.values for p in grid] + ([self.seeds] if self.seeds else [])
        keys = [p.key for p in grid] + (["seed"] if self.seeds else [])
        for combo in itertools.product(*values):
            yield dict(zip(keys, combo))

    def tune_points(self) -> Iterator[dict[str, Any]]:
        """The grid points of :meth:`grid_points` in the order Ray Tune's variant generator
        makes (and so starts) them: the grids of :meth:`tune_space` sorted by key, ``seed``
        among them, the FIRST varying fastest (``ray.tune.search.variant_generator``:
        ``parse_spec_vars`` sorts them, ``_grid_search_generator`` steps index 0 first). Each
        point's keys stay in the spec's order. Ray-free; ``tests/sweeps/test_tune_order.py``
        checks it against Tune's generator."""
        keys = [p.key for p in self.grid()] + (["seed"] if self.seeds else [])
        values = {p.key: p.values for p in self.grid()} | (
            {"seed": self.seeds} if self.seeds else {})  # as tune_space: seeds win a "seed" knob
        slowest_first = sorted(values, reverse=True)
        for combo in itertools.product(*(values[k] for k in slowest_first)):
            got = dict(zip(slowest_first, combo))
            yield {k: got[k] for k in keys}

    def corner_points(self) -> list[dict[str, Any]]:
        """Grid points combined with every corner (choice value, range bound) of the sampled
        knobs: the points validation builds a trial config for."""
        sampled = self.sampled()
        corners = [p.corners() for p in sampled]  # none: product() is the one empty combo
        return [{**g, **{p.key: v for p, v in zip(sampled, combo)}}
                for g in self.grid_points() for combo in itertools.product(*corners)]

    def tune_space(self) -> dict[str, Any]:
        """Ray Tune's ``param_space``: each searched knob's Tune form, the seeds as a grid."""
        space = {p.key: p.tune() for p in self.params if not isinstance(p, Expr)}
        if self.seeds:
            space["seed"] = _ray_tune().grid_search(list(self.seeds))
        return space


# ---- dotted keys -------------------------------------------------------------------------------


def get_dotted(config: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = config
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


# ---- safe arithmetic for expr knobs -------------------------------------------------------------

MAX_EXPR_CHARS = 500
EXPR_MAX_VALUE = 1e18
"""Largest magnitude an ``expr`` operand or result may have."""
EXPR_MAX_EXPONENT = 64
"""Largest magnitude of an exponent in ``expr`` (``9**9**9**9`` would never finish)."""
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
    ast.Mod: operator.mod, ast.USub: operator.neg,
}


def eval_expr(expr: str, config: dict[str, Any], key: str) -> Any:
    """Evaluate ``expr`` (numbers, + - * / // % **, min, max, round, int and dotted config keys).

    Bounded: every operand and result is a finite number of magnitude at most
    ``EXPR_MAX_VALUE``, exponents at most ``EXPR_MAX_EXPONENT``; any error (division by zero,
    ``min()``, a key that holds text) is one ``SearchSpaceError`` naming ``search.<key>.expr``.
    """
    where = f"search.{key}.expr={shown(expr, 100)}"
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        raise _err(f"{where} must be a string of at most {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _err(f"{where} is not an arithmetic expression") from None

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            inner = name_of(node.value)
            return f"{inner}.{node.attr}" if inner else None
        return None

    def number(v: Any, what: str) -> Any:
        v = coerce_number(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _err(f"{where}: {what}={shown(v, 60)} is not a number")
        if not (math.isfinite(v) and abs(v) <= EXPR_MAX_VALUE):
            raise _err(f"{where}: {what} is {shown(v, 60)}, beyond ±{EXPR_MAX_VALUE:g}")
        return v

    def power(a: Any, b: Any) -> Any:
        if abs(b) > EXPR_MAX_EXPONENT:
            raise _err(f"{where}: the exponent {b} is beyond ±{EXPR_MAX_EXPONENT}")
        return a ** b

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return number(node.value, "a constant")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            op = power if isinstance(node.op, ast.Pow) else _OPS[type(node.op)]
            return number(op(ev(node.left), ev(node.right)), "a result")
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return number(_OPS[type(node.op)](ev(node.operand)), "a result")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("min", "max", "round", "int") and not node.keywords:
            args = [ev(a) for a in node.args]
            if node.func.id == "round" and len(args) == 2 and abs(args[1]) > EXPR_MAX_EXPONENT:
                raise _err(f"{where}: round to {args[1]} digits is beyond ±{EXPR_MAX_EXPONENT}")
            fn = {"min": min, "max": max, "round": round, "int": int}[node.func.id]
            return number(fn(*args), "a result")
        dotted = name_of(node)
        if dotted is not None:
            v = get_dotted(config, dotted)
            if v is None:
                raise _err(f"{where} refers to {dotted}, which is not set")
            return number(v, dotted)
        raise _err(f"{where}: only arithmetic on numbers and config keys")

    try:
        return ev(tree.body)  # mode="eval": an ast.Expression
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:
        if isinstance(e, SearchSpaceError):
            raise
        raise _err(f"{where} cannot be evaluated: {type(e).__name__}: {shown(str(e), 80)[1:-1]}; "
                   "fix the expression") from None
