"""The catalogue's explanations are templates filled with the run's own config, so a tiny run reads
its own sizes and a full-size run the published ones.

A template field is `{expression}`: integers, `+ - * / **` and parentheses over the config's
numeric fields as config.json spells them (`qk_rope_head_dim`, `num_experts_per_tok`,
`rms_norm_eps`), its derived `qk_head_dim`, the YaRN block's `rope_scaling.factor`,
`rope_scaling.beta_fast`, ... and Mistral 4's query scale's `query_scale.beta`, ... E.g. "dims
i and i + {qk_rope_head_dim / 2} form the pair". Values
print as integers when whole, else with 4 significant digits; a field the config leaves unset
(`q_lora_rank` of a model without a query latent) prints as "(not set)".

A published model's own size is stated only where it teaches something, and then as such: in a
sentence that begins "In Kimi K2", "In DeepSeek-V2", "In DeepSeek-V3" (V3.2 too) or "In
DeepSeek's", or in a parenthesis that begins with those words in lower case ("(in Kimi K2: 8 of
384)"). Anywhere else a size is a field;
tests/reference/test_catalog_texts.py renders every text for two configs and checks that.
Descriptions and formulas are shown without a config (the debugger's stop line, the lesson walk):
they hold no fields and name sizes by their config names.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from functools import cache

from stepper.config import Config, QueryScale, Yarn

FIELD = re.compile(r"\{([^{}]*)\}")
NUMERIC = ("int", "float", "int | None", "float | None")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow}
UNSET = "(not set)"


def render(template: str, cfg: Config) -> str:
    """The template with every field replaced by its value for this config."""
    return FIELD.sub(lambda m: formatted(value(m.group(1), cfg)), template)


def unrendered(template: str) -> str:
    """The template with every field written as its expression (no config: `n_routed_experts`)."""
    return FIELD.sub(lambda m: m.group(1), template)


def fields(template: str) -> list[str]:
    """The expressions of a template's fields, in order."""
    return FIELD.findall(template)


@cache
def known_names() -> frozenset[str]:
    """Every name a field may use: the config's numeric fields, qk_head_dim, rope_scaling.*, query_scale.*."""
    own = {f.name for f in dataclasses.fields(Config) if f.type in NUMERIC}
    derived = {name for cls in Config.__mro__ for name, member in vars(cls).items() if isinstance(member, property)}
    blocks = {f"{block}.{f.name}" for block, kind in (("rope_scaling", Yarn), ("query_scale", QueryScale))
              for f in dataclasses.fields(kind) if f.type in NUMERIC}
    return frozenset(own | derived | blocks)


@cache
def own_numeric_fields(config_class: type) -> frozenset[str]:
    """The numeric fields of a family's own config class (Kimi Linear's linear_head_dim)."""
    if not dataclasses.is_dataclass(config_class):
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(config_class) if f.type in NUMERIC)


def names_in(expression: str) -> list[str]:
    """The config names an expression reads: 'kv_lora_rank + qk_rope_head_dim' -> both."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Name | ast.Attribute):
            found.append(dotted(node))
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(parse(expression))
    return found


def value(expression: str, cfg: Config) -> float | None:
    """An expression's value for a config; None when it reads a field the config leaves unset."""
    try:
        return evaluate(parse(expression).body, cfg)
    except TypeError:  # an unset field (None) in arithmetic
        return None


def evaluate(node: ast.expr, cfg: Config) -> float | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left, cfg), evaluate(node.right, cfg))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand, cfg)
    if isinstance(node, ast.Name | ast.Attribute):
        name = dotted(node)
        if name not in known_names() and name not in own_numeric_fields(type(cfg)):
            raise ValueError(f"template field '{name}' is not a config field")
        found: object = cfg
        for part in name.split("."):
            found = getattr(found, part, None)
        return found  # type: ignore[return-value]
    raise ValueError(f"template field holds '{ast.unparse(node)}': only numbers, config names and + - * / **")


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    raise ValueError(f"template field holds '{ast.unparse(node)}', not a config name")


@cache  # a run's memory estimate asks for the same few sizes for each tensor of each step
def parse(expression: str) -> ast.Expression:
    try:
        return ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"template field '{{{expression}}}' is not an expression") from None


def formatted(number: float | None) -> str:
    if number is None:
        return UNSET
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.4g}" if isinstance(number, float) else str(number)
