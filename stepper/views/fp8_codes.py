"""`stepper fp8`: the e4m3fn format on screen.

This module owns three views and their JSON forms: the table of all 256 codes (a 16x16 grid,
rows = high nibble, columns = low nibble), one byte taken apart bit by bit, and one 128x128
block of a stored FP8 weight next to its scale (the command line's CODE and --block are read by
`stepper.cli.checkpoint`). The arithmetic is `stepper.fp8`'s: values come
from `fp8.fields` and `fp8.E4M3_TABLE`; the only product taken here is code value x scale_inv
for the block shown, exactly as `fp8.dequantize` does it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.text import Text

from stepper import fp8
from stepper.errors import StepperError
from stepper.untrusted import shown
from stepper.views.sinks import line_width, print_fitted
from stepper.weights.stored import Stored

SIGN_STYLE, EXPONENT_STYLE, MANTISSA_STYLE = "bold red", "bold cyan", "bold green"
MAX_STYLE, NAN_STYLE, SUBNORMAL_STYLE = "bold yellow", "bold magenta", "dim"
MAX_CODES = (0x7E, 0xFE)  # ±448
CELL = 6  # characters per value in the 256-code table
CORNER = 8  # the block view shows the block's top-left CORNER x CORNER codes and values


# ---------------------------------------------------------------------------------------------
# The 256 codes


def code_record(code: int) -> dict[str, Any]:
    """One code as JSON: its fields, kind and value (null for NaN)."""
    f = fp8.fields(code)
    return {
        "code": code,
        "hex": f"0x{code:02X}",
        "bits": f.bits,
        "sign": f.sign,
        "exponent": f.exponent_bits,
        "mantissa": f.mantissa_bits,
        "kind": f.kind,
        "value": None if math.isnan(f.value) else f.value,
    }


def table_records() -> list[dict[str, Any]]:
    return [code_record(code) for code in range(256)]


def table_json() -> str:
    """The 256 records as one JSON list, one code per line."""
    return "[\n" + ",\n".join(json.dumps(r) for r in table_records()) + "\n]"


def compact(code: int) -> str:
    """A code's value in at most CELL characters: exact when it fits, else 3 significant digits.

    Subnormals are written as the exact fraction m/512 (= m/8 x 2^-6); a leading "0." loses
    its 0 (".375"). NaN is "NaN". Whether a value is rounded depends on its magnitude only, so
    a code and its negative (code ^ 0x80) always read alike.
    """
    f = fp8.fields(code)
    sign = "-" if f.sign else ""
    if f.kind == "nan":
        return "NaN"
    if f.kind == "subnormal":
        return f"{sign}{f.mantissa_bits}/512"
    magnitude = abs(f.value)
    text = _drop_leading_zero(f"{magnitude:.10g}")
    if len(text) > CELL - 1:
        text = _drop_leading_zero(f"{magnitude:.3g}")
    return sign + text


def _drop_leading_zero(text: str) -> str:
    return text[1:] if text.startswith("0.") else text


def cell_style(code: int) -> str:
    kind = fp8.fields(code).kind
    if kind == "nan":
        return NAN_STYLE
    if code in MAX_CODES:
        return MAX_STYLE
    return SUBNORMAL_STYLE if kind in ("subnormal", "zero") else ""


def render_table(console: Console) -> None:
    """The 16x16 grid of every code's value (two grids of 8 columns when 16 do not fit), then the legend."""
    console.print(Text("e4m3fn: the value of every byte (row = high nibble, column = low nibble)", style="bold"))
    width = line_width(console)
    halves = [range(16)] if width is None or width >= 8 + 16 * (CELL + 1) else [range(8), range(8, 16)]
    for i, lows in enumerate(halves):
        if i:
            console.print()
        for line in grid_lines(lows):
            console.print(line, soft_wrap=True)
    print_fitted(console, legend(), indent=0)


def grid_lines(lows: range) -> list[Text]:
    """The grid's header and 16 rows, for the low nibbles `lows`."""
    header = Text("      ")
    for low in lows:
        header.append(f" {'_' + format(low, 'X'):>{CELL}}", style="dim")
    lines = [header]
    for high in range(16):
        line = Text.assemble((f"0x{high:X}_ ", "dim"))
        line.append("-" if high >= 8 else "+", style=SIGN_STYLE if high >= 8 else "dim")
        line.append(" ")
        for low in lows:
            code = high << 4 | low
            line.append(" ")
            line.append(f"{compact(code):>{CELL}}", style=cell_style(code))
        lines.append(line)
    return lines


def legend() -> Text:
    text = Text("\n")
    text.append("byte = ")
    text.append("s", style=SIGN_STYLE)
    text.append(" ")
    text.append("eeee", style=EXPONENT_STYLE)
    text.append(" ")
    text.append("mmm", style=MANTISSA_STYLE)
    text.append(": sign (bit 7), exponent (bits 6-3, bias 7), mantissa (bits 2-0); the rows 0x8_-0xF_ are "
                "the rows 0x0_-0x7_ with the sign bit set.\n")
    text.append("normal     exponent 1..15  (-1)^s * 2^(e-7) * (1 + m/8)\n")
    text.append("subnormal  exponent 0      (-1)^s * 2^-6 * m/8 = ±m/512", style=SUBNORMAL_STYLE)
    text.append(" (m = 0: 0x00 = +0, 0x80 = -0)\n")
    text.append("NaN", style=NAN_STYLE)
    text.append("        0x7F and 0xFF only  (exponent 1111 with mantissa 111)\n")
    text.append("no infinities: exponent 1111 holds numbers, up to ")
    text.append("±448", style=MAX_STYLE)
    text.append(" (0x7E, 0xFE), the largest magnitude.\n")
    text.append("Some values are rounded to 3 significant digits to fit: `stepper fp8 0x2B` shows one exactly, "
                "`stepper fp8 --json` lists all 256.", style="dim")
    return text


# ---------------------------------------------------------------------------------------------
# One byte, bit by bit


def render_code(console: Console, code: int) -> None:
    f = fp8.fields(code)
    head = Text.assemble((f"0x{code:02X} = {code} = 0b{code:08b}, read as e4m3fn: ", "bold"))
    head.append_text(colored_bits(f))
    head.append("  (sign exponent mantissa)", style="dim")
    print_fitted(console, head)
    console.print(bit_diagram(f), soft_wrap=True)
    for label, body in field_lines(f):
        line = Text.assemble((f"  {label:<12}", "dim"))
        line.append_text(body if isinstance(body, Text) else Text(body))
        print_fitted(console, line, indent=12)


def colored_bits(f: fp8.Fp8Fields) -> Text:
    """The byte as "1 1001 101", each field in its colour."""
    sign, exponent, mantissa = f.bits.split(" ")
    return Text.assemble((sign, SIGN_STYLE), " ", (exponent, EXPONENT_STYLE), " ", (mantissa, MANTISSA_STYLE))


def bit_diagram(f: fp8.Fp8Fields) -> Text:
    """Bit numbers over the bits over the field names, the fields separated by bars."""
    text = Text.assemble(("\n  bit   7 │ 6 5 4 3 │ 2 1 0\n", "dim"))
    text.append("        ")
    for i, bit in enumerate(f"{f.code:08b}"):
        style = SIGN_STYLE if i == 0 else EXPONENT_STYLE if i <= 4 else MANTISSA_STYLE
        text.append(bit, style=style)
        text.append(" │ " if i in (0, 4) else " " if i < 7 else "")
    text.append("\n      sign  exponent  mantissa\n", style="dim")
    return text


def field_lines(f: fp8.Fp8Fields) -> list[tuple[str, str | Text]]:
    e, m = f.exponent_bits, f.mantissa_bits
    lines: list[tuple[str, str | Text]] = [
        ("sign", f"{f.sign:<10}  {sign_meaning(f)}"),
        ("exponent", f"{f'{e:04b} = {e}':<10}  {exponent_meaning(f)}"),
        ("mantissa", f"{f'{m:03b} = {m}':<10}  {mantissa_meaning(f)}"),
        ("kind", kind_meaning(f)),
        ("value", Text("NaN" if f.kind == "nan" else repr(f.value), style="bold")),
        ("formula", f.formula),
    ]
    near = neighbours(f.code)
    if near:
        lines.append(("neighbours", near))
    return lines


def sign_meaning(f: fp8.Fp8Fields) -> str:
    if f.kind == "nan":
        return "(a NaN's sign means nothing)"
    return f"{'negative' if f.sign else 'positive'}: (-1)^{f.sign} = {'-1' if f.sign else '1'}"


def exponent_meaning(f: fp8.Fp8Fields) -> str:
    e = f.exponent_bits
    if f.kind == "nan":
        return "all ones: with mantissa 111 this is NaN"
    if e == 0:
        return "zero exponent: subnormal, scale 2^(1-7) = 2^-6 (not 2^(0-7))"
    return f"scale 2^({e}-7) = 2^{e - fp8.EXPONENT_BIAS} = {2.0 ** (e - fp8.EXPONENT_BIAS):g}  (bias 7)"


def mantissa_meaning(f: fp8.Fp8Fields) -> str:
    m = f.mantissa_bits
    if f.kind == "nan":
        return "all ones: with exponent 1111 this is NaN"
    if f.exponent_bits == 0:
        return f"{m}/8 = {m / 8:g}  (no implicit leading 1)"
    return f"1 + {m}/8 = {1 + m / 8:g}  (the implicit leading 1 of a normal number)"


def kind_meaning(f: fp8.Fp8Fields) -> str:
    if f.kind == "nan":
        return "NaN: e4m3fn has only 0x7F and 0xFF as NaN, and no infinities"
    if f.code in MAX_CODES:
        return "normal, the largest magnitude e4m3fn holds (no infinity above it)"
    return {"zero": "zero (a subnormal with mantissa 0)", "subnormal": "subnormal", "normal": "normal"}[f.kind]


def neighbours(code: int) -> str:
    """The codes just below and above in magnitude (same sign), and the spacing between them."""
    if fp8.fields(code).kind == "nan":
        return ""
    magnitude = code & 0x7F
    parts = []
    if magnitude > 0:
        parts.append(f"0x{code - 1:02X} = {fp8.decode_bits(code - 1)!r}")
    parts.append(f"[0x{code:02X} = {fp8.decode_bits(code)!r}]")
    if magnitude < 0x7E:
        parts.append(f"0x{code + 1:02X} = {fp8.decode_bits(code + 1)!r}")
        step = abs(fp8.decode_bits(code + 1) - fp8.decode_bits(code))
        return "  ".join(parts) + f"   (next magnitude up is {step!r} away)"
    return "  ".join(parts) + "   (nothing above: the largest magnitude)"


# ---------------------------------------------------------------------------------------------
# One block of a stored weight


@dataclass(frozen=True)
class Block:
    """One block of an FP8 weight, with what it takes to show it."""

    name: str
    source: str  # where the weight came from, for the heading
    shape: tuple[int, int]  # the whole weight [out, in]
    grid: tuple[int, int]  # its scale_inv shape
    block_size: tuple[int, int]  # rows x cols per block (128 x 128)
    index: tuple[int, int]  # this block's place in the grid
    rows: range  # the weight rows it covers
    cols: range
    scale: float  # scale_inv[index], as float32
    scale_range: tuple[float, float]  # min and max over the whole grid
    codes: np.ndarray  # uint8 [len(rows), len(cols)]
    values: np.ndarray  # float32 [len(rows), len(cols)]: code value x scale
    e8m0: bool = False  # DeepSeek-V4's `.scale`: a power of two, the smallest bringing the block's amax within 448

    @property
    def partial(self) -> bool:
        return (len(self.rows), len(self.cols)) != self.block_size

    @property
    def absmax(self) -> float:
        return float(np.abs(self.values).max()) if self.values.size else 0.0

    def at_max(self) -> dict[str, int]:
        return {f"0x{c:02X}": int((self.codes == c).sum()) for c in MAX_CODES}


def require_fp8(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    if dtype != "F8_E4M3":
        raise StepperError(
            f"'{name}' is {dtype} {list(shape)}, not an FP8 weight: only F8_E4M3 weights "
            "(the *_proj.weight matrices of the layers) have 128x128 blocks and a weight_scale_inv "
            "(and INT4 weights groups of 32)"
        )


def load_block(stored: Stored, name: str, index: tuple[int, int], block_size: tuple[int, int], source: str) -> Block:
    """Cut block `index` out of a stored FP8 weight; errors name the weight, its dtype and its grid."""
    require_fp8(name, stored.dtype, np.shape(stored.data))
    if stored.scale_inv is None:
        raise StepperError(f"'{name}' is F8_E4M3 but has no weight_scale_inv")
    codes = fp8.as_codes(stored.data, name)
    scale_inv = fp8.scales_as_f32(stored.scale_inv, name)
    fp8.check_block_shapes(codes, scale_inv, block_size, name)
    grid = scale_inv.shape
    r, c = index
    if not (0 <= r < grid[0] and 0 <= c < grid[1]):
        raise StepperError(
            f"--block {r},{c} is outside '{name}': F8_E4M3 {list(codes.shape)} has a {grid[0]}x{grid[1]} grid of "
            f"{block_size[0]}x{block_size[1]} blocks (rows 0..{grid[0] - 1}, columns 0..{grid[1] - 1})"
        )
    rows = range(r * block_size[0], min((r + 1) * block_size[0], codes.shape[0]))
    cols = range(c * block_size[1], min((c + 1) * block_size[1], codes.shape[1]))
    block_codes = np.ascontiguousarray(codes[rows.start:rows.stop, cols.start:cols.stop])
    scale = scale_inv[r, c]
    return Block(
        name=name, source=source, shape=codes.shape, grid=grid, block_size=block_size, index=index,
        rows=rows, cols=cols, scale=float(scale),
        scale_range=(float(scale_inv.min()), float(scale_inv.max())),
        codes=block_codes, values=fp8.decode(block_codes) * scale,
        e8m0=np.asarray(stored.scale_inv).dtype.name == "float8_e8m0fnu",
    )


def f32(x: float) -> str:
    """A float32 number in its shortest exact form."""
    return str(np.float32(x))


def render_block(console: Console, block: Block) -> None:
    for line in block_heading(block):
        print_fitted(console, line)
    n_cols = min(CORNER, len(block.cols))
    codes, values = corner_grid(block, codes=True), corner_grid(block, codes=False)
    left_width = max(line.cell_len for line in codes)
    width = line_width(console)
    if width is None or width >= left_width + 4 + max(line.cell_len for line in values):
        for left, right in zip(codes, values):
            console.print(Text.assemble(left, " " * (left_width - left.cell_len + 4), right), soft_wrap=True)
    else:  # the codes, then the values in as many column groups as it takes to fit
        fit = max(1, (width - LABEL) // (VALUE + 1))
        per_line = -(-n_cols // -(-n_cols // fit))  # as few groups as fit, of even sizes
        groups = [range(j, min(j + per_line, n_cols)) for j in range(0, n_cols, per_line)]
        for line in [*codes, *(line for g in groups for line in [Text(), *corner_grid(block, codes=False, columns=g)])]:
            console.print(line, soft_wrap=True)
    for line in block_summary(block):
        print_fitted(console, line)


def block_heading(block: Block) -> list[Text]:
    (h, w), (bh, bw), (r, c) = block.shape, block.block_size, block.index
    title = Text(shown(block.name), style="bold cyan")
    title.append(f"  F8_E4M3 [{h}, {w}]  scales [{block.grid[0]}, {block.grid[1]}] ({bh}x{bw} blocks)  ", style="")
    title.append(shown(block.source), style="dim")
    size = f"{len(block.rows)} x {len(block.cols)}"
    where = Text(f"block {r},{c}: rows {block.rows.start}..{block.rows.stop - 1}, "
                 f"columns {block.cols.start}..{block.cols.stop - 1}: ")
    where.append(f"partial, {size} of {bh} x {bw}" if block.partial else f"full, {size}",
                 style="yellow" if block.partial else "")
    scale = Text(f"{'scale (F8_E8M0)' if block.e8m0 else 'scale_inv'}[{r}, {c}] = ")
    scale.append(f32(block.scale) + (f" = 2^{int(np.log2(block.scale))}" if block.e8m0 else ""), style="bold")
    scale.append(f"   so value = code value x {f32(block.scale)}", style="dim")
    scale.append(f"   (the weight's scales run from {f32(block.scale_range[0])} to {f32(block.scale_range[1])})",
                 style="dim")
    return [title, where, scale, Text()]


LABEL, VALUE = 3, 10  # at least: characters of a row label, of a value in the block's grid


def corner_grid(block: Block, codes: bool, columns: range | None = None) -> list[Text]:
    """The block's top-left corner as lines: codes in hex, or values; weight row/column numbers as
    labels. `columns`: which of the corner's columns (all of them without it)."""
    n_rows = min(CORNER, len(block.rows))
    columns = range(min(CORNER, len(block.cols))) if columns is None else columns
    label = max(len(str(block.rows.start + n_rows - 1)), LABEL)
    width = max(2, len(str(block.cols.start + columns.stop - 1))) if codes else VALUE
    title = "codes (hex)" if codes else "values = code value x scale_inv"
    if len(columns) < min(CORNER, len(block.cols)):
        title += f" (columns {block.cols.start + columns.start}..{block.cols.start + columns.stop - 1})"
    lines = [Text(title, style="bold")]
    header = Text.assemble((" " * label, "dim"))
    for j in columns:
        header.append(f" {block.cols.start + j:>{width}}", style="dim")
    lines.append(header)
    for i in range(n_rows):
        line = Text.assemble((f"{block.rows.start + i:>{label}}", "dim"))
        for j in columns:
            code = int(block.codes[i, j])
            cell = f"{code:02X}" if codes else f"{float(block.values[i, j]):.4g}"
            line.append(" ")
            line.append(f"{cell:>{width}}", style=cell_style(code))
        lines.append(line)
    return lines


def block_summary(block: Block) -> list[Text]:
    v = block.values
    stats = Text("\nblock values:")
    for label, value in (("min", v.min()), ("max", v.max()), ("absmax", block.absmax)):
        stats.append(f"  {label} ", style="dim")
        stats.append(f"{float(value):.6g}")
    return [stats, *max_lines(block)]


def max_lines(block: Block) -> list[Text]:
    """Where ±448 is in the block, and why: scale_inv = amax / 448 maps the largest |value| there."""
    counts = block.at_max()
    total = sum(counts.values())
    found = Text("codes at ±448: ")
    found.append(str(total), style=MAX_STYLE if total else "bold")
    found.append(f" ({', '.join(f'{code} x{n}' for code, n in counts.items())})")
    rows, cols = np.nonzero(np.isin(block.codes, MAX_CODES))
    if total:
        places = [f"[{block.rows.start + r}, {block.cols.start + c}]" for r, c in zip(rows[:4], cols[:4])]
        found.append(f" at {', '.join(places)}{' ...' if total > 4 else ''}", style="dim")
        why = Text(f"absmax = 448 x {f32(block.scale)} = {f32(np.float32(448) * np.float32(block.scale))}: ")
        why.append("the block's largest |value| is stored as ±448, because its scale_inv is amax / 448", style="dim")
    elif not block.codes.any():
        why = Text("an all-zero block: its scale_inv does not matter", style="dim")
    elif block.e8m0:
        why = Text(f"absmax / scale = {block.absmax / block.scale:.6g}, within 448: an E8M0 scale is the smallest "
                   "power of two that brings the block's amax within 448, so its largest code lies in 224..448",
                   style="dim")
    else:
        why = Text(f"absmax / scale_inv = {block.absmax / block.scale:.6g}, below 448: "
                   "this block was not scaled to amax / 448", style="yellow")
    return [found, why]


def block_record(block: Block) -> dict[str, Any]:
    n_rows, n_cols = min(CORNER, len(block.rows)), min(CORNER, len(block.cols))
    return {
        "name": block.name,
        "source": block.source,
        "dtype": "F8_E4M3",
        "shape": list(block.shape),
        "scale_grid": list(block.grid),
        "block_size": list(block.block_size),
        "block": list(block.index),
        "rows": [block.rows.start, block.rows.stop],
        "cols": [block.cols.start, block.cols.stop],
        "size": [len(block.rows), len(block.cols)],
        "partial": block.partial,
        "scale_inv": block.scale,
        "scale_format": "F8_E8M0" if block.e8m0 else "float",
        "corner_codes": block.codes[:n_rows, :n_cols].tolist(),
        "corner_values": block.values[:n_rows, :n_cols].tolist(),
        "min": float(block.values.min()),
        "max": float(block.values.max()),
        "absmax": block.absmax,
        "codes_at_448": block.at_max(),
    }
