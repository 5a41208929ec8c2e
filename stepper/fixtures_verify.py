"""`stepper fixtures verify`: compare another implementation's dump with a fixture, tensor by tensor.

The candidate is a .safetensors or .npz file of tensors named canonically (`decode0.layers.1.self_attn.k_pe`)
or by another implementation's names, derived from the catalogue's aliases (see `alias_patterns`):
HF module paths (`model.layers.1.self_attn.kv_a_proj_with_mqa`), DeepSeek inference/model.py
variables (`layers.1.attn.kv#1`), llama.cpp callback names (`kv_cmpr-1#1`), plus a user map.

Each fixture tensor is found, arranged like the reference (axes of size 1, heads after positions,
heads merged, rotary pairs interleaved: the arrangements that fit are tried in turn), and checked
with its tolerance from the manifest. The result lists every tensor in execution order, the first
that diverges, and what that tensor is computed from, so the step where a port goes wrong is named.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import catalog
from .errors import StepperError
from .fixtures import MASKED_BELOW, PAIRED_KEYS, ROPE_LAYOUT, Fixture
from .safetensors_reader import SafetensorsFile

SYSTEMS = ("hf_module", "inference", "llama.cpp")
REPORT_FORMAT = "stepper-verify-report"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# DeepSeek inference/model.py: Transformer.layers[i] is a Block with .attn (MLA) and .ffn (MLP or
# MoE, whose router is .gate). A variable of a catalogue block lives in that module.
INFERENCE_SCOPE = {"attention": "attn.", "router": "ffn.gate.", "moe": "ffn.", "mlp": "ffn.", "residual": "", "norm": ""}


# ---------------------------------------------------------------------------------------------
# Names


def hf_module_name(alias: str) -> str | None:
    """'X (output)' -> X; 'X (output[k], ...)' -> X[k]; 'X (input; ...)' -> X:input; a slice of an
    output ('X (output, first kv_lora_rank columns)') has no name of its own."""
    ident, _, rest = alias.partition(" ")
    qualifier = rest.strip()[1:-1] if rest.strip().startswith("(") else ""
    head = re.split(r"[,;]", qualifier)[0].strip()
    if head == "output":
        return None if "columns" in qualifier else ident
    indexed = re.fullmatch(r"output\[(\d+)\]", head)
    if indexed:
        return f"{ident}[{indexed.group(1)}]"
    if head.startswith("input"):
        return f"{ident}:input"
    return None


def plain_identifier(alias: str) -> str | None:
    """The alias's leading variable name, if it is a plain identifier (not `self.w1(x)`)."""
    ident = alias.split(" ")[0]
    return ident if IDENTIFIER.fullmatch(ident) else None


@cache
def alias_patterns() -> dict[str, dict[str, str]]:
    """catalogue name -> {system: name pattern with {i} for the layer}.

    When several tensors of one scope share a name in a system (llama.cpp's three `q` callbacks,
    inference/model.py's reassigned `kv`), each gets `#n`, n counting from 1 in execution order,
    and the bare name is not accepted.
    """
    raw: dict[str, dict[str, str]] = {}
    for entry in catalog.load().entries:
        key, aliases, layer = entry["name"], entry["aliases"], entry["scope"] == "layer"
        names: dict[str, str] = {}
        if aliases.get("hf_module"):
            name = hf_module_name(aliases["hf_module"])
            if name:
                names["hf_module"] = name
        if aliases.get("inference"):
            ident = plain_identifier(aliases["inference"])
            if ident:
                names["inference"] = (f"layers.{{i}}.{INFERENCE_SCOPE.get(entry['block'], '')}{ident}" if layer else ident)
        if aliases.get("llama.cpp") and "of layer" not in aliases["llama.cpp"]:
            ident = plain_identifier(aliases["llama.cpp"])
            if ident:
                names["llama.cpp"] = f"{ident}-{{i}}" if layer else ident
        raw[key] = names
    patterns: dict[str, dict[str, str]] = {key: {} for key in raw}
    for system in SYSTEMS:
        counts: dict[str, int] = {}
        for names in raw.values():
            if system in names:
                counts[names[system]] = counts.get(names[system], 0) + 1
        seen: dict[str, int] = {}
        for key, names in raw.items():
            if system not in names:
                continue
            name = names[system]
            if counts[name] > 1:
                seen[name] = seen.get(name, 0) + 1
                name = f"{name}#{seen[name]}"
            patterns[key][system] = name
    return patterns


def accepted_names(fixture: Fixture) -> dict[str, list[str]]:
    """Every name a candidate may use for each fixture tensor -> the fixture names it stands for
    (more than one: ambiguous, refused). Phased fixtures prefix every alias with `prefill.` /
    `decode{k}.`; HF module paths are also accepted without their leading `model.`."""
    table: dict[str, list[str]] = {}

    def add(name: str, target: str) -> None:
        targets = table.setdefault(name, [])
        if target not in targets:
            targets.append(target)

    patterns = alias_patterns()
    for entry in fixture.entries:
        target, layer, phase = entry["name"], entry["layer"], entry["phase"]
        add(target, target)
        prefix = f"{phase}." if phase else ""
        for system, pattern in patterns.get(entry["key"], {}).items():
            alias = pattern.replace("{i}", str(layer)) if layer is not None else pattern
            add(prefix + alias, target)
            if "#" in alias:  # the bare name: unique only if this fixture has one tensor of that name
                add(prefix + alias.partition("#")[0], target)
            if system == "hf_module" and alias.startswith("model."):
                add(prefix + alias[len("model."):], target)
    # a canonical name always means itself, even where an alias of another tensor spells it too
    for entry in fixture.entries:
        table[entry["name"]] = [entry["name"]]
    return table


def read_map(path: Path) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StepperError(f"--map {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepperError(f"--map {path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise StepperError(f"--map {path}: expected a JSON object of their name -> canonical name (strings)")
    return raw


# ---------------------------------------------------------------------------------------------
# Reading a candidate


def read_candidate(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors or .npz file (BF16, F16 and FP8 widened to float32)."""
    if path.is_dir():
        raise StepperError(f"{path}: is a folder; expected a .safetensors or .npz file")
    if path.suffix == ".safetensors":
        with SafetensorsFile(path) as f:
            return {name: widen(np.array(f.get(name)), path, name) for name in f.names()}
    if path.suffix == ".npz":
        return read_npz(path)
    raise StepperError(f"{path}: unknown file type; expected a .safetensors or .npz file")


def read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise StepperError(f"{path}: no such file")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise StepperError(f"{path}: a single array (.npy), not an .npz archive of named tensors")
        with z:
            return {name: widen(z[name], path, name) for name in z.files}
    except StepperError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise StepperError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def widen(array: np.ndarray, path: Path, name: str) -> np.ndarray:
    """Numbers as they are; BF16 and FP8 (ml_dtypes) as float32. NumPy saves a BF16 array into an
    .npz as raw 2-byte records, which are read back as BF16."""
    if array.dtype.kind in "biuf":
        return array
    if array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return array.astype(np.float32)
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.fields is None:
        return array.view(ml_dtypes.bfloat16).astype(np.float32)
    raise StepperError(f"{path}: tensor '{name}' has dtype {array.dtype}; expected integers or floats "
                       "(float32, float16, bfloat16)")


# ---------------------------------------------------------------------------------------------
# Arranging a candidate like the reference


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def arrangements(key: str, dims: list[str], ref_shape: tuple[int, ...], cand: np.ndarray,
                 rope_dims: int) -> list[tuple[str, np.ndarray]]:
    """The candidate in the reference's shape, each way that fits, most literal first."""
    found: list[tuple[str, np.ndarray]] = []
    if cand.shape == tuple(ref_shape):
        found.append(("as reference", cand))
    elif squeezed(cand.shape) == squeezed(ref_shape):
        found.append((f"reshaped {list(cand.shape)}", cand.reshape(ref_shape)))
    if len(dims) == 4 and dims[1] in ("H", "one") and dims[2] in ("T", "S") and dims[3] != "S":
        b, h, t, x = ref_shape
        for label, shape in (("positions before heads", (b, t, h, x)), ("heads merged", (b, t, h * x))):
            # with one head or one position the bytes are the reference's: only the shape is new
            new = squeezed(shape) != squeezed(ref_shape) or (h > 1 and t > 1)
            if new and squeezed(cand.shape) == squeezed(shape):
                found.append((f"{label} {list(cand.shape)}", cand.reshape(b, t, h, x).transpose(0, 2, 1, 3)))
        s = cand.size // (b * h * x) if b * h * x else 0
        if dims[2] == "T" and s > t and cand.size == b * s * h * x:
            # transformers 5.x runs kv_b_proj over every attended position; the new ones are last
            for label, shape in (("all positions", (b, s, h, x)), ("all positions, heads merged", (b, s, h * x))):
                if squeezed(cand.shape) == squeezed(shape):
                    found.append((f"{label} {list(cand.shape)}, last {t} taken",
                                  cand.reshape(b, s, h, x)[:, -t:].transpose(0, 2, 1, 3)))
    if key in ROPE_LAYOUT:
        found += [(f"{label}, rope pairs interleaved", deinterleave(a, ROPE_LAYOUT[key], rope_dims)) for label, a in found]
    if key == "mlp.gate.group_mask":
        found += [(f"{label}, inverted (1 = dropped)", 1 - a.astype(np.float32)) for label, a in found]
    return found


def deinterleave(array: np.ndarray, part: str, rope_dims: int) -> np.ndarray:
    """Rotary pairs side by side (x0 y0 x1 y1 ...) -> the reference's [x0 x1 ... | y0 y1 ...]."""
    out = np.array(array, copy=True)
    pe = out[..., -rope_dims:] if part == "tail" else out
    pe[...] = np.concatenate([pe[..., 0::2], pe[..., 1::2]], axis=-1)
    return out


# ---------------------------------------------------------------------------------------------
# Checking one tensor


@dataclass
class Check:
    """The outcome of one fixture tensor."""

    index: int
    name: str
    key: str
    status: str  # match | mismatch | missing
    candidate: str | None = None
    layout: str | None = None
    detail: str = ""
    max_abs_err: float | None = None
    rel_err: float | None = None  # max |err| / absmax(reference)
    nmse: float | None = None
    cosine: float | None = None
    outside: int | None = None  # entries outside the tolerance
    tolerance: dict[str, Any] = field(default_factory=dict)


def measure(cand: np.ndarray, ref: np.ndarray, tol: dict[str, Any]) -> dict[str, Any]:
    """Error figures over the finite reference entries, and whether the tensor is within tolerance."""
    c = cand.astype(np.float64)
    r = ref.astype(np.float64)
    finite = np.isfinite(r)
    c = np.where(~finite & (c <= MASKED_BELOW), -np.inf, c)  # a large negative masked score counts as -inf
    same_nonfinite = np.array_equal(np.isnan(r), np.isnan(c)) and np.array_equal(r[np.isinf(r)], c[np.isinf(r)])
    rf, cf = r[finite], c[finite]
    cand_finite = np.isfinite(cf).all()
    d = np.abs(cf - rf) if cand_finite else np.full(rf.shape, np.inf)
    absmax = float(np.abs(rf).max()) if rf.size else 0.0
    limit = tol["atol"] + tol["rtol"] * np.abs(rf)
    outside = int(np.count_nonzero(~(d <= limit)))
    energy = float(np.sum(rf * rf))
    err_energy = float(np.sum(d * d)) if cand_finite else math.inf
    norms = float(np.linalg.norm(cf)) * math.sqrt(energy) if cand_finite else 0.0
    worst = None
    if rf.size and outside:
        worst_flat = int(np.argmax(np.where(np.isfinite(d), d - limit, np.inf)))
        worst = [int(i) for i in np.unravel_index(np.flatnonzero(finite)[worst_flat], ref.shape)]
    return {
        "ok": same_nonfinite and outside == 0,
        "same_nonfinite": same_nonfinite,
        "max_abs_err": float(d.max()) if rf.size else 0.0,
        "rel_err": (float(d.max()) / absmax if absmax else float(d.max())) if rf.size else 0.0,
        "nmse": err_energy / energy if energy else err_energy,
        "cosine": float(np.dot(cf, rf)) / norms if norms else (1.0 if err_energy == 0 else 0.0),
        "outside": outside + (0 if same_nonfinite else 1),
        "worst": worst,
    }


def check_tensor(index: int, entry: dict[str, Any], ref: np.ndarray, cand_name: str, cand: np.ndarray,
                 rope_dims: int, tol: dict[str, Any], pair: tuple[np.ndarray, np.ndarray] | None = None) -> Check:
    """`pair`: for topk_weight, the candidate's and the reference's topk_idx (None: not available)."""
    key = entry["key"]
    base = Check(index, entry["name"], key, "mismatch", cand_name, tolerance=tol)
    options = arrangements(key, entry["dims"], ref.shape, cand, rope_dims)
    if not options:
        base.detail = f"shape {list(cand.shape)} cannot be arranged as {entry['named_shape']}"
        return base
    if tol["kind"] == "same-experts":
        return check_experts(base, ref, options)
    if tol["kind"] == "exact":
        for label, a in options:
            if a.shape == ref.shape and np.array_equal(a.astype(np.float32), ref):
                return Check(**{**asdict(base), "status": "match", "layout": label})
        base.layout, base.detail = options[0][0], "differs (compared exactly)"
        return base
    best: tuple[str, dict[str, Any]] | None = None
    for label, a in options:
        if key in PAIRED_KEYS:
            a, ref_sorted, how = paired(a, ref, pair)
        else:
            ref_sorted, how = ref, ""
        m = measure(a, ref_sorted, tol)
        label = label + how
        if m["ok"]:
            best = (label, m)
            break
        if best is None or m["nmse"] < best[1]["nmse"]:
            best = (label, m)
    label, m = best
    base.layout = label
    base.status = "match" if m["ok"] else "mismatch"
    base.max_abs_err, base.rel_err, base.nmse, base.cosine = m["max_abs_err"], m["rel_err"], m["nmse"], m["cosine"]
    base.outside = m["outside"]
    if not m["ok"]:
        where = f" (worst at {m['worst']})" if m["worst"] else ""
        masked = "" if m["same_nonfinite"] else "; non-finite (masked) entries differ"
        base.detail = f"{m['outside']} of {ref.size} entries outside tolerance{where}{masked}"
    return base


def check_experts(base: Check, ref: np.ndarray, options) -> Check:
    for label, a in options:
        if np.array_equal(np.sort(a.astype(np.int64), axis=-1), np.sort(ref, axis=-1)):
            return Check(**{**asdict(base), "status": "match", "layout": label})
    label, a = options[0]
    mine, theirs = np.sort(ref, axis=-1), np.sort(a.astype(np.int64), axis=-1)
    rows = [int(i) for i in np.flatnonzero(np.any(mine != theirs, axis=-1))]
    base.layout = label
    base.outside = len(rows)
    base.detail = (f"different experts for {len(rows)} of {ref.shape[0]} tokens; token {rows[0]}: fixture "
                   f"{mine[rows[0]].tolist()}, candidate {theirs[rows[0]].tolist()}")
    return base


def paired(cand: np.ndarray, ref: np.ndarray, pair) -> tuple[np.ndarray, np.ndarray, str]:
    """topk_weight compared per expert: each side sorted by its own topk_idx (or by value)."""
    if pair is None:
        return -np.sort(-cand, axis=-1), -np.sort(-ref, axis=-1), ", sorted by value (no candidate topk_idx)"
    cand_idx, ref_idx = pair
    return (np.take_along_axis(cand, np.argsort(cand_idx, axis=-1), -1),
            np.take_along_axis(ref, np.argsort(ref_idx, axis=-1), -1), ", paired by expert")


# ---------------------------------------------------------------------------------------------
# The whole comparison


@dataclass
class Verdict:
    fixture: str
    candidate: str
    checks: list[Check]
    unused: list[str]  # candidate tensors with a recognised name that no fixture tensor needed
    unknown: list[str]  # candidate names that are no name of this fixture
    absent: list[str]  # canonical names of tensors this fixture does not have (another path, layer, step)
    ambiguous: dict[str, list[str]]
    map_unknown: list[str]  # --map targets that are not fixture names
    strict: bool
    first: dict[str, Any] | None = None

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)

    @property
    def exit_code(self) -> int:
        if self.count("mismatch") or (self.strict and self.count("missing")):
            return 1
        return 0


def verify(fixture: Fixture, candidate_path: Path, mapping: dict[str, str] | None = None, strict: bool = False,
           rtol: float | None = None, atol: float | None = None) -> Verdict:
    candidate = read_candidate(candidate_path)
    table = accepted_names(fixture)
    names = set(fixture.tensors)
    resolved: dict[str, str] = {}  # fixture name -> candidate name
    unknown, absent, ambiguous, unused = [], [], {}, []
    map_unknown = sorted(v for v in (mapping or {}).values() if v not in names)
    for cand_name in candidate:
        if mapping and cand_name in mapping:
            targets = [mapping[cand_name]] if mapping[cand_name] in names else []
        else:
            targets = table.get(cand_name, [])
        if len(targets) > 1:
            ambiguous[cand_name] = targets
        elif not targets and catalog.load().entry(catalog.key_of(cand_name)):
            absent.append(cand_name)  # a canonical name, of a tensor this fixture does not have
        elif not targets:
            unknown.append(cand_name)
        elif targets[0] in resolved:
            # two names for one tensor: the canonical name wins, then the first seen
            if cand_name == targets[0]:
                unused.append(resolved[targets[0]])
                resolved[targets[0]] = cand_name
            else:
                unused.append(cand_name)
        else:
            resolved[targets[0]] = cand_name
    if not resolved:
        example = next(iter(candidate), None)
        raise StepperError(
            f"{candidate_path}: none of its {len(candidate)} tensor names is a name of fixture {fixture.path.name}"
            + (f" (e.g. '{example}')" if example else "")
            + "; expected canonical names like layers.1.self_attn.k_pe, HF module names, inference/model.py or "
              "llama.cpp names (stepper fixtures names), or pass --map FILE.json"
        )
    rope_dims = int(fixture.manifest["config"]["qk_rope_head_dim"])
    checks = []
    for index, entry in enumerate(fixture.entries):
        name = entry["name"]
        tol = dict(entry["tolerance"])
        if tol["kind"] == "allclose":
            tol["rtol"] = tol["rtol"] if rtol is None else rtol
            tol["atol"] = tol["atol"] if atol is None else atol
        if name not in resolved:
            checks.append(Check(index, name, entry["key"], "missing", tolerance=tol))
            continue
        cand_name = resolved[name]
        pair = None
        if entry["key"] in PAIRED_KEYS:
            idx_name = name[: -len(entry["key"])] + PAIRED_KEYS[entry["key"]]
            cand_idx = candidate.get(resolved.get(idx_name, ""))
            ref_idx = fixture.tensors.get(idx_name)
            if cand_idx is not None and ref_idx is not None and squeezed(cand_idx.shape) == squeezed(ref_idx.shape):
                pair = (cand_idx.reshape(ref_idx.shape), ref_idx)
        checks.append(check_tensor(index, entry, fixture.tensors[name], cand_name, candidate[cand_name],
                                   rope_dims, tol, pair))
    verdict = Verdict(str(fixture.path), str(candidate_path), checks, sorted(unused), unknown, absent, ambiguous,
                      map_unknown, strict)
    verdict.first = first_divergence(fixture, checks)
    return verdict


# ---------------------------------------------------------------------------------------------
# The first divergence and what it is computed from


def formula_inputs(fixture: Fixture, index: int) -> list[int]:
    """Indices of the tensors (earlier in execution order, same step) that this one is computed from,
    read from the catalogue formula; the layer input when the formula names none."""
    entries = fixture.entries
    entry = entries[index]
    if entry["key"] == "hidden_states":
        return [j for j in range(index) if entries[j]["phase"] == entry["phase"]
                and (entries[j]["key"] == "output" and entries[j]["layer"] == entry["layer"] - 1
                     or entries[j]["key"] == "embed")][-1:]
    cat_entry = catalog.load().entry(entry["key"]) or {}
    formula = cat_entry.get("formula", "")
    rhs = formula.split("=", 1)[1] if "=" in formula else formula
    words = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\b(?!\.weight)", rhs))
    same_step = [j for j in range(index) if entries[j]["phase"] == entry["phase"]]
    found: dict[str, int] = {}
    for j in same_step:
        other = entries[j]
        leaf = other["key"].rsplit(".", 1)[-1]
        if other["key"] == entry["key"] or leaf not in words:
            continue
        if other["layer"] == entry["layer"] or (other["layer"] is None and leaf not in found):
            found[leaf] = j
    if found:
        return sorted(found.values())
    earlier = [j for j in same_step if entries[j]["layer"] == entry["layer"]]
    return earlier[-1:]


def first_divergence(fixture: Fixture, checks: list[Check]) -> dict[str, Any] | None:
    bad = next((c for c in checks if c.status == "mismatch"), None)
    if bad is None:
        return None
    entry = fixture.entries[bad.index]
    cat_entry = catalog.load().entry(bad.key) or {}
    inputs = [{"name": checks[j].name, "status": checks[j].status} for j in formula_inputs(fixture, bad.index)]
    if not inputs:
        verdict = "it is the first tensor of the fixture"
    elif all(i["status"] == "match" for i in inputs):
        verdict = "its inputs match, so the difference starts in this step"
    elif any(i["status"] == "missing" for i in inputs):
        verdict = "some inputs are not in the candidate, so the difference may start earlier"
    else:
        verdict = "an input differs too (unexpected for the first divergence)"
    cache = entry["phase"] not in (None, "prefill") and "S" in entry["dims"]
    return {
        "name": bad.name,
        "formula": cat_entry.get("formula"),
        "inputs": inputs,
        "uses_cache": cache,
        "verdict": verdict + (" (it also reads the cache of earlier steps)" if cache else ""),
        "detail": bad.detail,
    }


# ---------------------------------------------------------------------------------------------
# Showing and writing the result


def fmt(x: float | None) -> str:
    if x is None:
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.2e}"


STYLE = {"match": "green", "mismatch": "bold red", "missing": "yellow"}


def render(console: Console, fixture: Fixture, verdict: Verdict, problems_only: bool = False) -> None:
    """A table in execution order, a summary line, then the first divergence and its inputs."""
    table = Table(title=f"{fixture.path.name} vs {Path(verdict.candidate).name}", title_justify="left",
                  show_edge=False, pad_edge=False, header_style="bold", box=None)
    for column, justify in (("#", "right"), ("tensor", "left"), ("status", "left"), ("max|err|/absmax", "right"),
                            ("NMSE", "right"), ("cosine", "right"), ("candidate name, layout", "left")):
        table.add_column(column, justify=justify, no_wrap=True)
    for c in verdict.checks:
        if problems_only and c.status == "match":
            continue
        cosine = "" if c.cosine is None else f"{c.cosine:.8f}"
        notes = [] if c.candidate in (None, c.name) else [c.candidate]
        notes += [] if c.layout in (None, "as reference") else [c.layout]
        notes += [c.detail] if c.detail else []
        table.add_row(str(c.index), c.name, Text(c.status, style=STYLE[c.status]), fmt(c.rel_err), fmt(c.nmse), cosine,
                      "; ".join(notes))
    if table.row_count:
        print_table(console, table)
    console.print(summary_line(verdict))
    for label, items in (("candidate tensors not needed (another name of a tensor already read)", verdict.unused),
                         ("candidate tensors this fixture does not have", verdict.absent),
                         ("candidate names not recognised", verdict.unknown),
                         ("--map targets not in the fixture", verdict.map_unknown)):
        if items:
            console.print(f"{len(items)} {label}: {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}",
                          style="dim")
    for name, targets in list(verdict.ambiguous.items())[:8]:
        console.print(f"ambiguous name {name}: could be {' or '.join(targets)}; use the #n form or --map", style="dim")
    first = verdict.first
    if first is not None:
        console.print(f"first divergence: {first['name']}: {first['detail']}", style="bold red")
        if first["formula"]:
            console.print(f"  computed as: {first['formula']}")
        for i in first["inputs"]:
            console.print(f"  input {i['name']}: {i['status']}")
        console.print(f"  {first['verdict']}")


def print_table(console: Console, table: Table) -> None:
    """On a terminal as Rich draws it; to a pipe or a file one line per row, never folded and
    without the cells' trailing padding, so it diffs and greps cleanly."""
    if console.is_terminal:
        console.print(table)
        return
    width, console.width = console.width, 1000
    with console.capture() as captured:
        console.print(table)
    console.width = width
    console.out("\n".join(line.rstrip() for line in captured.get().splitlines()), highlight=False)


def summary_line(verdict: Verdict) -> str:
    n = len(verdict.checks)
    missing = verdict.count("missing")
    strict = " (--strict: missing tensors fail)" if verdict.strict and missing else ""
    result = "MISMATCH" if verdict.exit_code else "match"
    return (f"{result}: {n} fixture tensors, {verdict.count('match')} match, {verdict.count('mismatch')} differ, "
            f"{missing} missing{strict}")


def report(verdict: Verdict) -> dict[str, Any]:
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    return {
        "format": REPORT_FORMAT,
        "version": 1,
        "fixture": verdict.fixture,
        "candidate": verdict.candidate,
        "result": "mismatch" if verdict.exit_code else "match",
        "exit_code": verdict.exit_code,
        "strict": verdict.strict,
        "counts": {s: verdict.count(s) for s in ("match", "mismatch", "missing")},
        "first_divergence": verdict.first,
        "tensors": [{k: clean(v) for k, v in asdict(c).items()} for c in verdict.checks],
        "unused": verdict.unused,
        "unrecognised": verdict.unknown,
        "not_in_fixture": verdict.absent,
        "ambiguous": verdict.ambiguous,
        "map_targets_not_in_fixture": verdict.map_unknown,
    }


def write_report(path: Path, verdict: Verdict) -> None:
    if not path.parent.is_dir():
        raise StepperError(f"--report {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report(verdict), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def names_table(system: str | None = None) -> list[dict[str, str]]:
    """Each catalogue name with the names other implementations may use for it."""
    rows = []
    for key, names in alias_patterns().items():
        row = {"canonical": key, **{s: names.get(s, "") for s in SYSTEMS}}
        if system is None or row[system]:
            rows.append(row)
    return rows
