"""`stepper fp8 --fp4`: DeepSeek-V4's FP4 on screen, beside e4m3fn and INT4.

Three views and their JSON forms: the 16 e2m1 codes (sign, exponent, mantissa, value and how it is
formed), one packed byte taken apart into its two codes (low nibble: the even input, high
nibble: the odd one), and one group of a stored FP4 weight: a row's 32 inputs sharing one E8M0
scale, its 16 bytes, each nibble, its code, its value and the weight it makes. The arithmetic is
`stepper.fp4`'s: `fp4.fields`, `fp4.nibbles`, and the weight exactly as `fp4.dequantize_fp4` takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.text import Text

from stepper import fp4
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.views.fp8_codes import EXPONENT_STYLE, MANTISSA_STYLE, SIGN_STYLE
from stepper.views.sinks import print_fitted
from stepper.weights.stored import FP4, Stored

NIBBLE_STYLE = ("bold cyan", "bold green")  # the low and the high nibble of a byte
BYTES_PER_GROUP = fp4.GROUP // 2  # 16


def colored_bits(f: fp4.Fp4Fields) -> Text:
    """The code as "1 11 1", each field in its colour."""
    sign, exponent, mantissa = f.bits.split(" ")
    return Text.assemble((sign, SIGN_STYLE), " ", (exponent, EXPONENT_STYLE), " ", (mantissa, MANTISSA_STYLE))


# ---------------------------------------------------------------------------------------------
# The 16 codes and one byte


def code_record(code: int) -> dict[str, Any]:
    f = fp4.fields(code)
    return {"code": code, "hex": f"0x{code:X}", "bits": f.bits, "sign": f.sign, "exponent": f.exponent_bits,
            "mantissa": f.mantissa_bits, "kind": f.kind, "value": f.value}


def code_records() -> list[dict[str, Any]]:
    return [code_record(c) for c in range(fp4.e2m1.CODES)]


def render_codes(console: Console) -> None:
    """The 16 e2m1 codes: bits (sign, exponent, mantissa), kind, value and the arithmetic."""
    console.print(Text("e2m1 (FP4): 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit", style="bold"))
    for code in range(fp4.e2m1.CODES):
        f = fp4.fields(code)
        line = Text(f"  0x{code:X}  ")
        line.append_text(colored_bits(f))
        line.append(f"  {f.kind:<9}  {f.value:>+5}   ")
        line.append(f.formula, style="dim")
        console.print(line, soft_wrap=True)
    print_fitted(console, Text("Two codes fill a byte, stored I8 [out, in/2]: input 2k in the low nibble (bits 3..0), "
                               "2k + 1 in the high one (bits 7..4); each weight is its value x 2^(s - 127), s its "
                               "group's F8_E8M0 scale byte, one per 32 inputs of a row.", style="dim"))


def byte_record(byte: int) -> dict[str, Any]:
    low, high = fp4.nibbles(byte)
    return {"byte": byte, "hex": f"0x{byte:02X}", "signed": byte - 256 if byte >= 128 else byte,
            "low": {**code_record(low), "input": "2k"}, "high": {**code_record(high), "input": "2k+1"}}


def render_byte(console: Console, byte: int) -> None:
    """One packed byte: its bits (high nibble on the left, as written) and its two codes, input by input."""
    low, high = fp4.nibbles(byte)
    head = Text(f"FP4 byte 0x{byte:02X} (I8 {byte - 256 if byte >= 128 else byte}): bits ", style="bold")
    head.append(f"{high:04b}", style=NIBBLE_STYLE[1])
    head.append(" ")
    head.append(f"{low:04b}", style=NIBBLE_STYLE[0])
    print_fitted(console, head)
    nibbles = ((0, low, "low nibble, input 2k:"), (1, high, "high nibble, input 2k+1:"))  # bits 3..0, 7..4
    for position, code, which in nibbles:
        f = fp4.fields(code)
        line = Text(f"  {which:<25}")
        line.append(f"{code:04b}", style=NIBBLE_STYLE[position])
        line.append(" = ")
        line.append_text(colored_bits(f))
        line.append(f"  {f.formula}")
        console.print(line, soft_wrap=True)


def parse_byte(text: str) -> int:
    """A packed byte given as hex (0x2F), decimal (47, or -105 as I8 stores it) or binary."""
    try:
        byte = int(text, 0)
    except ValueError:
        raise StepperError(f"CODE: expected one FP4 byte as hex 0x00..0xFF, decimal 0..255 (or -128..-1 as I8) or "
                           f"binary, e.g. 0x2F, got '{shown(text)}'") from None
    if not -128 <= byte <= 255:
        raise StepperError(f"CODE: {byte} is not one byte (0..255, or -128..-1 as I8)")
    return byte & 0xFF


# ---------------------------------------------------------------------------------------------
# One group of a stored weight


@dataclass(frozen=True)
class Group:
    """One row's group of 32 inputs of an FP4 weight, with what it takes to show it."""

    name: str
    source: str
    shape: tuple[int, int]  # the weight [out, in]
    row: int
    group: int  # inputs 32g .. 32g + 31
    scale_byte: int  # the group's E8M0 byte: scale 2^(byte - 127)
    packed: tuple[int, ...]  # the group's 16 bytes, unsigned
    values: np.ndarray  # float32 [32]: e2m1 value x scale

    @property
    def inputs(self) -> range:
        return range(self.group * fp4.GROUP, (self.group + 1) * fp4.GROUP)

    @property
    def scale(self) -> float:
        return fp4.e8m0.value_of(self.scale_byte)


def load_group(stored: Stored, name: str, index: tuple[int, int], source: str) -> Group:
    """Group `index` = (row, group) of a stored FP4 weight; errors name the weight and its grid."""
    if stored.dtype != FP4:
        raise StepperError(f"'{name}' is {stored.dtype}, not an FP4 weight")
    weight = stored.matrix(name)  # checks the bytes against the scales
    row, g = index
    groups = weight.scales.shape[1]
    if not (0 <= row < weight.shape[0] and 0 <= g < groups):
        raise StepperError(f"--block {row},{g} is outside '{name}': FP4 {list(weight.shape)} has rows "
                           f"0..{weight.shape[0] - 1} and groups 0..{groups - 1} of {fp4.GROUP} inputs")
    packed = weight.packed[row : row + 1, g * BYTES_PER_GROUP : (g + 1) * BYTES_PER_GROUP]  # [1, 16]
    scale = fp4.e8m0.as_bytes(stored.scale_inv)[row : row + 1, g : g + 1]  # [1, 1]
    values = fp4.dequantize_fp4(packed, scale, name=name)[0]  # [32]
    return Group(name, source, weight.shape, row, g, int(scale[0, 0]), tuple(int(b) for b in packed[0]), values)


def render_group(console: Console, group: Group) -> None:
    title = Text(shown(group.name), style="bold cyan")
    title.append(f"  FP4 e2m1 [{group.shape[0]}, {group.shape[1]}]  groups of {fp4.GROUP}  ")
    title.append(shown(group.source), style="dim")
    print_fitted(console, title)
    inputs = f"{group.inputs.start}..{group.inputs.stop - 1}"
    print_fitted(console, Text(f"row {group.row}, group {group.group} (inputs {inputs}): "
                               f"scale byte 0x{group.scale_byte:02X} = 2^({group.scale_byte} - 127) = "
                               f"{np.float32(group.scale)}, weight = e2m1 value x {np.float32(group.scale)}"))
    for k, byte in enumerate(group.packed):
        column = group.group * BYTES_PER_GROUP + k
        bits = f"{byte >> 4:04b} {byte & 0xF:04b}"
        console.print(Text(f"  byte {column} = 0x{byte:02X}  {bits}", style="bold"), soft_wrap=True)
        for position, code in enumerate(fp4.nibbles(byte)):
            f = fp4.fields(code)
            line = Text(f"    in {group.inputs.start + 2 * k + position:>5}  {('low ', 'high')[position]} ")
            line.append(f"{code:04b}", style=NIBBLE_STYLE[position])
            line.append(" = ")
            line.append_text(colored_bits(f))
            line.append(f"  {f.value:>+5}  -> {np.float32(group.values[2 * k + position])}")
            console.print(line, soft_wrap=True)


def group_record(group: Group) -> dict[str, Any]:
    return {"name": group.name, "source": group.source, "dtype": "FP4", "shape": list(group.shape), "row": group.row,
            "group": group.group, "inputs": [group.inputs.start, group.inputs.stop], "scale_byte": group.scale_byte,
            "scale": group.scale, "bytes": [byte_record(b) for b in group.packed],
            "values": [float(v) for v in group.values]}
