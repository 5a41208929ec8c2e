"""`stepper fp8 --int4`: the INT4 pack-quantized format on screen, beside e4m3fn.

Three views and their JSON forms: the 16 nibble codes and their values, one 32-bit word taken
apart nibble by nibble (which bits hold which input), and one group of a stored INT4 weight (a
row's 32 inputs sharing one scale: its four words, each nibble, its value and the weight it
makes). The arithmetic is `stepper.int4`'s: nibbles from `int4.nibble` / `int4.fields`, and the
weight (nibble - 8) x scale exactly as `int4.dequantize_int4` takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.text import Text

from stepper import int4
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.views.sinks import print_fitted
from stepper.weights.stored import INT4, Stored

NIBBLE_STYLE = ("bold cyan", "bold green")  # alternate nibbles, so a word's eight read apart
WORDS_PER_GROUP = int4.GROUP // int4.PER_WORD  # 4


# ---------------------------------------------------------------------------------------------
# The 16 codes and one word


def nibble_records() -> list[dict[str, Any]]:
    return [{"code": c, "bits": f"{c:04b}", "value": c - int4.OFFSET} for c in range(1 << int4.BITS)]


def render_nibbles(console: Console) -> None:
    """The 16 codes of a nibble and the values they stand for (code - 8)."""
    console.print(Text("INT4 (compressed-tensors pack-quantized): a 4-bit code c stands for c - 8", style="bold"))
    for records in (nibble_records()[:8], nibble_records()[8:]):
        line = Text("  ")
        for r in records:
            line.append(f"{r['bits']}", style="cyan")
            line.append(f" {r['value']:>+2d}   ")
        console.print(line)
    print_fitted(console,
                 Text("Eight codes fill an int32 word, input 8w + p at bits 4p..4p+3 (lowest bits first); each "
                               "weight is (c - 8) x its group's BF16 scale, one scale per 32 inputs of a row.",
                               style="dim"))


def word_record(word: int) -> dict[str, Any]:
    return {"word": word & 0xFFFF_FFFF, "hex": f"0x{word & 0xFFFF_FFFF:08X}", "bits": int4.word_bits(word),
            "nibbles": [{"position": f.position, "bits": f.bits, "code": f.code, "value": f.value}
                        for f in int4.fields(word)]}


def render_word(console: Console, word: int) -> None:
    """The word's 32 bits (nibble 7 on the left, as written) and its eight nibbles, input by input."""
    console.print(Text(f"INT4 word 0x{word & 0xFFFF_FFFF:08X}: eight 4-bit codes, lowest bits first", style="bold"))
    console.print(Text("  position " + "    ".join(str(p) for p in reversed(range(int4.PER_WORD))), style="dim"))
    bits = Text("  bits     ")
    for p, nibble in zip(reversed(range(int4.PER_WORD)), int4.word_bits(word).split()):
        bits.append(nibble + " ", style=NIBBLE_STYLE[p % 2])
    console.print(bits)
    for f in int4.fields(word):
        line = Text(f"  nibble {f.position} (bits {4 * f.position:>2}..{4 * f.position + 3:>2}, input "
                    f"8w+{f.position}): ")
        line.append(f.bits, style=NIBBLE_STYLE[f.position % 2])
        line.append(f" = {f.code:>2} -> {f.code} - 8 = {f.value:+d}")
        console.print(line)


def parse_word(text: str) -> int:
    """A 32-bit word given as hex (0x89ABCDEF), decimal (signed or not) or binary."""
    try:
        word = int(text, 0)
    except ValueError:
        raise StepperError(f"CODE: expected a 32-bit word as hex 0x00000000..0xFFFFFFFF, decimal or binary "
                           f"(e.g. 0x89ABCDEF), got '{shown(text)}'") from None
    if not -(1 << 31) <= word < 1 << 32:
        raise StepperError(f"CODE: {word} does not fit in 32 bits")
    return word & 0xFFFF_FFFF


# ---------------------------------------------------------------------------------------------
# One group of a stored weight


@dataclass(frozen=True)
class Group:
    """One row's group of 32 inputs of an INT4 weight, with what it takes to show it."""

    name: str
    source: str
    shape: tuple[int, int]  # the weight [out, in]
    row: int
    group: int  # the group's index along the row: inputs 32g .. 32g + 31
    scale: float  # the group's scale, as float32
    scale_dtype: str
    words: tuple[int, ...]  # the group's four words, as unsigned 32-bit numbers
    values: np.ndarray  # float32 [32]: (nibble - 8) x scale

    @property
    def inputs(self) -> range:
        return range(self.group * int4.GROUP, (self.group + 1) * int4.GROUP)


def load_group(stored: Stored, name: str, index: tuple[int, int], source: str) -> Group:
    """Group `index` = (row, group) of a stored INT4 weight; errors name the weight and its grid."""
    if stored.dtype != INT4:
        raise StepperError(f"'{name}' is {stored.dtype}, not an INT4 weight")
    weight = stored.matrix(name)  # checks the words, the scales and the shape
    row, g = index
    groups = weight.scales.shape[1]
    if not (0 <= row < weight.shape[0] and 0 <= g < groups):
        raise StepperError(f"--block {row},{g} is outside '{name}': INT4 {list(weight.shape)} has rows "
                           f"0..{weight.shape[0] - 1} "
                           f"and groups 0..{groups - 1} of {weight.group} inputs")
    words = weight.packed[row, g * WORDS_PER_GROUP : (g + 1) * WORDS_PER_GROUP]
    values = int4.dequantize_int4(words[None, :], weight.scales[row : row + 1, g : g + 1], int4.GROUP, name=name)[0]
    return Group(name, source, weight.shape, row, g, float(weight.scales[row, g]),
                 str(np.asarray(stored.scale_inv).dtype),
                 tuple(int(w) & 0xFFFF_FFFF for w in words), values)


def render_group(console: Console, group: Group) -> None:
    title = Text(shown(group.name), style="bold cyan")
    title.append(f"  INT4 [{group.shape[0]}, {group.shape[1]}]  groups of {int4.GROUP}  ")
    title.append(shown(group.source), style="dim")
    print_fitted(console, title)
    print_fitted(console,
                 Text(f"row {group.row}, group {group.group} (inputs {group.inputs.start}..{group.inputs.stop - 1}): "
                               f"scale {np.float32(group.scale)} ({group.scale_dtype}), "
                               f"weight = (code - 8) x {np.float32(group.scale)}"))
    for w, word in enumerate(group.words):
        first = group.inputs.start + w * int4.PER_WORD
        column = group.group * WORDS_PER_GROUP + w
        console.print(Text(f"  word {column} = 0x{word:08X}  {int4.word_bits(word)}", style="bold"), soft_wrap=True)
        for f in int4.fields(word):
            line = Text(f"    in {first + f.position:>5}  nibble {f.position}  ")
            line.append(f.bits, style=NIBBLE_STYLE[f.position % 2])
            line.append(f"  {f.code:>2} - 8 = {f.value:+d}  -> "
                        f"{np.float32(group.values[w * int4.PER_WORD + f.position])}")
            console.print(line, soft_wrap=True)


def group_record(group: Group) -> dict[str, Any]:
    return {"name": group.name, "source": group.source, "dtype": "INT4", "shape": list(group.shape), "row": group.row,
            "group": group.group, "inputs": [group.inputs.start, group.inputs.stop], "scale": group.scale,
            "scale_dtype": group.scale_dtype, "words": [word_record(w) for w in group.words],
            "values": [float(v) for v in group.values]}
