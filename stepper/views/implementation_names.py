"""Another implementation's name for a tensor, as `fixtures verify` prints it, read back.

The naming tables (stepper/fixtures/naming) give each name of transformers, DeepSeek's
inference/model.py and llama.cpp with {i} for the layer and #n for a variable's n-th value:
`layers.{i}.attn.kv#2`, `kv_cmpr-{i}`, `model.layers.{i}.mlp.gate[0]`. `explain` takes such a name
whole, as a dotted tail (`attn.kv#2`) or with its step's prefix (`prefill.`); one without its #n
(`attn.kv`) stands for each of the variable's values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stepper.fixtures.aliases import NAMINGS, Alias, tables
from stepper.seams.trace import unphased

NUMBERED = re.compile(r"#\d+$")


@dataclass(frozen=True)
class Named:
    """One implementation's name that a query is, and the table entry saying what it holds."""

    query: str
    alias: Alias

    def note(self) -> str:
        """'attn.kv#2 is inference's layers.{i}.attn.kv#2 (model.py:478): self_attn.compressed_kv'."""
        what = self.alias.tensor or f"no tensor of stepper's ({self.alias.reason})"
        whose = self.alias.naming + ("'" if self.alias.naming.endswith("s") else "'s")
        return f"{self.query} is {whose} {self.alias.name} ({self.alias.where}): {what}"


def implementation_names(query: str, model_type: str) -> list[Named]:
    """The names of this model family's naming tables that `query` is, in the tables' order."""
    name = unphased(query)
    found = []
    for naming in NAMINGS:
        for alias in tables()[naming]:
            if model_type in alias.model_types and any(matches(name, form) for form in forms(alias.name)):
                found.append(Named(query, alias))
    return found


def forms(name: str) -> list[str]:
    """A table's name and its dotted tails that do not start at the layer, each also without its
    #n: `layers.{i}.attn.kv#2` -> itself, `attn.kv#2`, `kv#2`, and the three without #2."""
    parts = name.split(".")
    tails = [".".join(parts[i:]) for i in range(len(parts)) if not parts[i].startswith("{i}")]
    return tails + [NUMBERED.sub("", t) for t in tails if NUMBERED.search(t)]


def matches(query: str, form: str) -> bool:
    """Whether the query is this form of a name, {i} any layer number."""
    return re.fullmatch(re.escape(form).replace(r"\{i\}", r"\d+"), query) is not None
