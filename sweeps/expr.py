"""Dotted keys into nested config mappings and the bounded arithmetic of ``expr`` knobs.

``get_dotted`` / ``set_dotted`` read and write ``moe.router.order`` in a nested dict;
``eval_expr`` evaluates a knob's ``expr`` (numbers, + - * / // % **, min, max, round, int and
dotted config keys), bounded so that no spec can make it run long or overflow.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from moe_core.configio import coerce_number
from moe_core.errors import SearchSpaceError, shown

MAX_EXPR_CHARS = 500
EXPR_MAX_VALUE = 1e18
"""Largest magnitude an ``expr`` operand or result may have."""
EXPR_MAX_EXPONENT = 64
"""Largest magnitude of an exponent in ``expr`` (``9**9**9**9`` would never finish)."""


def _err(msg: str) -> SearchSpaceError:
    return SearchSpaceError(msg)


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
        if isinstance(node, ast.Expression):
            return ev(node.body)
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
        return ev(tree)
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:
        if isinstance(e, SearchSpaceError):
            raise
        raise _err(f"{where} cannot be evaluated: {type(e).__name__}: {shown(str(e), 80)[1:-1]}; "
                   "fix the expression") from None
