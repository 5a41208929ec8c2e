"""A run's peak memory, estimated before it starts from the config and the run, against the memory
the machine has: a run that would not fit is refused with the option that lowers it, instead of
failing minutes later with an allocation error.

The estimate adds what is alive at the worst moment: the attention scores of the longest step
([B, H, T, S] float32 where they are small enough to be made whole: the raw products, the masked
scores and the weights; past that, one tile per core, the scores never held), one layer's named
tensors (the embedding rows, queries, keys, the MoE's activations), the cache of every layer run,
the logits, the largest weight decoded at once, the weight cache, the float64 chunks a view's
statistics gather, and the tensors a view keeps until the end (the debugger's history, a dump;
attention made in tiles keeps only its operands). A tensor the model makes only when a view looks
at it (catalogue `made`: a delta rule's state after every token) counts only where one does, and
one made when read from less than itself as what it holds (catalogue `holds`: that state, one
per chunk). A tensor's size comes from its catalogue dims: the config's fields, the step's
positions, and the dims a family sizes itself per layer and step (Family.runtime_sizes:
DeepSeek-V4's window keys, compressed entries and the keys each query sees).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from stepper import catalog, families
from stepper.errors import StepperError
from stepper.kernels import attention, parallel
from stepper.kernels.weight_cache import CachedWeights
from stepper.seams.trace import unphased
from stepper.session import Plan, Spell, cache_bytes, command_line, step_attn, takes, why_not
from stepper.sizes import gib
from stepper.tensors.statistics import CHUNK
from stepper.weights.names import layer_shapes
from stepper.weights.seeded import KEPT_BYTES, SyntheticWeights

FLOAT32 = 4
VALUE_BYTES = {"float32": 4, "int64": 8}  # a catalogue entry's dtype: the bytes of one value
SCORE_ARRAYS = 3  # the products q.k, the scaled and masked scores, the softmax
# a view's statistics: float64 chunks of statistics.CHUNK values, their squares, their parts
STATS_CHUNKS = 6 * 8 * CHUNK
STATS_PER_BYTE = 12  # ... of a smaller tensor: six float64 copies of its float32 values
TILE_ARRAYS = 4  # a tile of scores, its exponentials, the products with the values, the mask
PROMPT_BYTES = 56  # a prompt position, held whole even in chunks: its id as a Python int in the plan's tuple
# (about 32 B and an 8 B slot), and as int64 in the ids and positions arrays
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
ON_DEMAND = "when looked at"  # a catalogue entry's `made`: the model makes it only when a sink asks (emit.wants_key)
Looked = frozenset[tuple[int | None, str]] | None  # (layer, catalogue key) of the tensors a view looks at; None: all


@dataclass(frozen=True)
class Need:
    what: str
    bytes: int
    lower: str  # the option that lowers it


def step_shapes(plan: Plan) -> list[tuple[int, int]]:
    """(T, S) of each step: the prefill's new positions and the positions attended (a synthetic
    cache's too), then one per decode step."""
    t, c = plan.prompt_len, plan.spec.cache_len
    return [(t, c + t)] + [(1, c + t + k + 1) for k in range(plan.spec.decode)]


def worked_shapes(plan: Plan) -> list[tuple[int, int]]:
    """(T, S) of each step as the layers work on it: a prefill in chunks (--chunk) makes the
    tensors of one chunk at a time."""
    shapes = step_shapes(plan)
    t, s = shapes[0]
    return [(min(t, plan.spec.chunk or t), s), *shapes[1:]]


def widest_steps(plan: Plan, layer: int | None = None) -> list[tuple[int, tuple[int, int]]]:
    """(step, (T, S)) of the steps whose tensors of `layer` are the largest: the prefill as the layers
    work on it, the last decode step and those where a family's own dims peak. A decode step's tensors
    are sized by what it attends (positions, compressed entries, an indexer's kept positions), which only
    grows, but for what a family makes at some steps alone (Family.decode_peaks: DeepSeek-V4's compressors
    close a window every m positions): no need to go through a thousand decode steps one by one."""
    shapes = worked_shapes(plan)
    if len(shapes) == 1:
        return [(0, shapes[0])]
    first, last = shapes[1][1], shapes[-1][1]
    peaks = families.family_for(plan.config).decode_peaks(plan.config, layer, first, last)
    steps = sorted({len(shapes) - 1, *(len(shapes) - 1 - (last - s) for s in peaks)})
    return [(0, shapes[0])] + [(k, shapes[k]) for k in steps]


def tensor_bytes(key: str, t: int, s: int, plan: Plan, held: bool = False, layer: int | None = None) -> int:
    """Bytes of one named tensor of `layer` (None: outside the layers) in a step with T new and S
    attended positions (from its catalogue dims); held: what the run holds of it, 0 for the
    attention scores and weights made in tiles, the catalogue's `holds` dims for one made when read
    from less than itself (a delta rule's states after every token: one state per chunk)."""
    entry = catalog.load().entry(key)
    if entry is None or (held and tiled(entry["dims"], t, s, plan)):
        return 0
    dims = entry.get("holds", entry["dims"]) if held else entry["dims"]
    return VALUE_BYTES.get(entry["dtype"], FLOAT32) * math.prod(dim_sizes(dims, t, s, plan, layer))


def dim_sizes(dims: list[str], t: int, s: int, plan: Plan, layer: int | None) -> list[int]:
    """The size of each dim in a step: the batch (1) and positions, the positions a sparse indexer
    keeps (min(index_topk, S)), the family's own runtime dims (families.family.Family.runtime_sizes:
    DeepSeek-V4's entries, windows, keys a query sees; Kimi Linear's chunks), else what the config
    gives it (1 where it gives none)."""
    cat, own = catalog.load(), families.family_for(plan.config).runtime_sizes(plan.config, layer, t, s)
    kept = {"Ki": min(plan.config.index_topk, s)} if getattr(plan.config, "index_topk", None) else {}
    runtime = {"B": 1, "T": t, "S": s, "N": t, **kept, **own}  # Ki: the positions a sparse indexer keeps
    return [runtime[d] if d in runtime else cat.expected_size(d, plan.config) or 1 for d in dims]


def layer_of(name: str) -> int | None:
    """The layer of an emitted name (`prefill.layers.2.attn.q` -> 2), None outside the layers."""
    found = LAYER.search(name)
    return int(found.group(1)) if found else None


def tiled(dims: list[str], t: int, s: int, plan: Plan) -> bool:
    """Whether a tensor of these dims is attention scores that the run makes in tiles."""
    return {"T", "S"} <= set(dims) and not attention.whole_fits(1, plan.config.num_attention_heads, t, s)


def shape_of_step(plan: Plan) -> Callable[[str], tuple[int, int]]:
    """(T, S) of the step a name is made in (names as `planned_names` gives them: `decode3.` the
    fourth decode step's, any other the prefill's)."""
    shapes = step_shapes(plan)
    phases = {f"decode{k}": k + 1 for k in range(plan.spec.decode)}
    return lambda name: shapes[phases.get(name.partition(".")[0], 0)]


def tiled_values(plan: Plan, names: list[str]) -> int:
    """How many values the named tensors made in tiles hold (the long attention scores and weights)."""
    step, total = shape_of_step(plan), 0
    for name in names:
        t, s = step(name)
        entry = catalog.load().entry(catalog.key_of(unphased(name)))
        if entry is not None and tiled(entry["dims"], t, s, plan):
            total += tensor_bytes(entry["name"], t, s, plan, layer=layer_of(name)) // FLOAT32
    return total


def shape_text(key: str, t: int, s: int, plan: Plan, layer: int | None = None) -> str:
    return str(dim_sizes(catalog.load().entry(key)["dims"], t, s, plan, layer))


def sizes(plan: Plan, names: list[str]) -> list[tuple[str, str, int]]:
    """(name, shape, bytes) of each named tensor (names as `planned_names` gives them)."""
    step, result = shape_of_step(plan), []
    for name in names:
        t, s = step(name)
        key = catalog.key_of(unphased(name))
        if catalog.load().entry(key) is not None:
            layer = layer_of(name)
            result.append((name, shape_text(key, t, s, plan, layer), tensor_bytes(key, t, s, plan, layer=layer)))
    return result


def kept_bytes(plan: Plan, names: list[str]) -> int:
    """Bytes of the named tensors a view keeps to the end (names as `planned_names` gives them)."""
    step = shape_of_step(plan)
    return sum(tensor_bytes(catalog.key_of(unphased(name)), *step(name), plan, held=True, layer=layer_of(name))
               for name in names)


def looked_at(names: list[str] | None) -> Looked:
    """The (layer, catalogue key) of each name a view looks at (names as `planned_names` gives
    them); None for a view that looks at every one."""
    return None if names is None else frozenset((layer_of(n), catalog.key_of(unphased(n))) for n in names)


def on_demand(name: str) -> bool:
    """Whether the model makes a named tensor only when a sink looks at it (catalogue `made`)."""
    entry = catalog.load().entry(catalog.key_of(unphased(name)))
    return entry is not None and entry.get("made") == ON_DEMAND


def made(entry: dict, layer: int, looked: Looked) -> bool:
    """Whether the run makes a tensor of `layer`: every one, but one the model makes only when a
    view looks at it (catalogue `made`) only where one does."""
    return looked is None or entry.get("made") != ON_DEMAND or (layer, catalog.key_of(entry["name"])) in looked


def layer_bytes(plan: Plan, layers: list[int], looked: Looked = None) -> int:
    """The most one layer's named tensors take in any step (what the run holds of each), but for the
    attention scores and weights (counted with the scores) and those made only when looked at that
    no view looks at."""
    cat, spec = catalog.load(), plan.spec
    def sequence(layer: int, k: int) -> list[dict]:
        return cat.layer_sequence(plan.config, layer, step_attn(spec, k), spec.index_scoring)

    return max(sum(tensor_bytes(e["name"], t, s, plan, held=True, layer=layer) for e in sequence(layer, k)
                   if not {"T", "S"} <= set(e["dims"]) and made(e, layer, looked))
               for layer in layers for k, (t, s) in widest_steps(plan, layer))


def largest_held(plan: Plan, layers: list[int], looked: Looked = None) -> int:
    """Bytes of the largest named tensor of the run that is held (not made in tiles) and made."""
    cat, spec = catalog.load(), plan.spec
    held = [tensor_bytes(e["name"], t, s, plan, held=True, layer=layer)
            for layer in layers for k, (t, s) in widest_steps(plan, layer)
            for e in cat.layer_sequence(plan.config, layer, step_attn(spec, k), spec.index_scoring)
            if made(e, layer, looked)]
    logits = [tensor_bytes("logits", t, s, plan, held=True) for _, (t, s) in widest_steps(plan)]
    return max(held + (logits if plan.needs_logits else []))


def needs(plan: Plan, kept: list[str], kept_lower: str, looked: list[str] | None = None) -> list[Need]:
    """What the run holds at its worst moment; `kept`: the names a view keeps to the end, `looked`:
    those a view looks at (None: every one)."""
    cfg, spec = plan.config, plan.spec
    heads = cfg.num_attention_heads
    t, s = worked_shapes(plan)[0]
    run = plan.computed
    cached = max(step_attn(spec, k) for k in range(spec.decode + 1))  # "naive" keeps per-head keys too
    positions = s + spec.decode
    seen = looked_at(looked)
    caches = cache_bytes(cfg, run, positions, cached, spec.index_scoring)
    largest = max(math.prod(shape) for layer in run for shape in layer_shapes(cfg, layer).values())
    result = [
        *([scores_need(heads, t, s)] if scores_over_positions(plan, list(run)) else []),
        Need("one layer's tensors", layer_bytes(plan, list(run), seen), "--prompt-len"),
        Need("a view's statistics (float64 chunks)",
             min(STATS_CHUNKS, STATS_PER_BYTE * largest_held(plan, list(run), seen)), "--prompt-len"),
        Need(f"the cache of {len(run)} layer{'s' if len(run) != 1 else ''}", caches,
             "--attn absorb" if cached == "naive" else "--prompt-len"),
        Need("the largest weight, decoded", largest * FLOAT32, "--layer N"),
        Need("the prompt's token ids and positions", plan.prompt_len * PROMPT_BYTES, "--prompt-len"),
    ]
    if plan.hidden is not None:
        result.append(Need("the --input stream", plan.hidden.nbytes, "a shorter --input"))
    if plan.needs_logits:
        result.append(Need(f"logits [1, {t}, {cfg.vocab_size}] float32", t * cfg.vocab_size * FLOAT32, "--prompt-len"))
    if spec.weight_cache_mb and spec.decode:  # a weight is kept from its second use on: in a later step
        weights = sum(math.prod(shape) for layer in run for shape in layer_shapes(cfg, layer).values())
        cached = min(spec.weight_cache_mb * 2**20, weights * FLOAT32)
        result.append(Need("the weight cache", cached, "--weight-cache-mb"))
    if seeded := seeded_weights(plan):
        result.append(Need("the seeded weights, kept once made", seeded.kept_bound(run), "--layer N"))
    if kept:
        result.append(Need(f"the {len(kept)} tensors kept", kept_bytes(plan, kept), kept_lower))
    return result


SEEDED_SHARE = 16  # seeded weights are kept made in at most this share of the memory available


def seeded_weights(plan: Plan) -> SyntheticWeights | None:
    """The run's seeded weights (under a --weight-cache-mb cache too), None for a checkpoint's."""
    seeded = plan.weights.source if isinstance(plan.weights, CachedWeights) else plan.weights
    return seeded if isinstance(seeded, SyntheticWeights) else None


def limit_seeded(plan: Plan, available: int | None) -> None:
    """Keep the run's seeded weights made (SyntheticWeights.stored) in a share of the memory
    available: a cache, it gives way where memory is short rather than refuse the run."""
    if seeded := seeded_weights(plan):
        seeded.kept_limit = min(seeded.kept_limit, KEPT_BYTES if available is None else available // SEEDED_SHARE)


def scores_over_positions(plan: Plan, layers: list[int]) -> bool:
    """Whether the run's layers make attention scores over every attended position ([B, H, T, S]);
    DeepSeek-V4's are over the keys each query sees, counted with one layer's tensors."""
    cat, spec = catalog.load(), plan.spec
    return any({"T", "S"} <= set(e["dims"]) for layer in layers for k, _ in widest_steps(plan)
               for e in cat.layer_sequence(plan.config, layer, step_attn(spec, k), spec.index_scoring))


def scores_need(heads: int, t: int, s: int) -> Need:
    """The attention scores of the longest step: whole arrays where small, else one tile per core
    (the scores, their exponentials and the running sums; kernels.attention.held_or_tiled)."""
    if attention.whole_fits(1, heads, t, s):
        whole = SCORE_ARRAYS * heads * t * s * FLOAT32 + 2 * t * s
        return Need(f"attention scores [1, {heads}, {t}, {s}] float32", whole, "--prompt-len")
    tiles = TILE_ARRAYS * parallel.cores() * attention.TILE_SCORES * FLOAT32
    return Need(f"attention tiles on {parallel.cores()} cores", tiles, "--prompt-len")


COMFORT = 2  # --attn auto runs the naive prefill only where its estimate is at most 1/COMFORT of what is available


def choose_attn(plan: Plan, estimate: Callable[[Plan], list[Need]], available: int | None,
                spell: Spell = command_line) -> tuple[Plan, str | None]:
    """--attn auto: naive for the prefill and absorbed for decode steps, or absorbed throughout (its
    cache is one latent per position) where the prefill attends over a synthetic cache longer than
    its prompt (as a decode step does: the naive path would expand every cached position to
    per-head keys and values) or where the naive run's estimate is over half the memory available
    (the estimate is not exact and other programs grow too). The plan to run, and a line saying
    which and why (None unless auto, but a note where the path asked changes nothing; with one
    path, what the run needs); the memory available is named only where it decides, so that the
    same run prints the same wherever it fits. `spell`: the option as the caller writes it."""
    auto = spell("attn", "auto")
    if plan.spec.attn != "auto":
        lone_kda = takes(plan.config, "attn") and not two_paths(plan)
        return plan, (f"note: {spell('attn', plan.spec.attn)} changes nothing here: the layers this run computes "
                      "have one path (a delta rule), no naive or absorbed attention") if lone_kda else None
    usual = sum(n.bytes for n in estimate(plan))
    if not takes(plan.config, "attn") or not two_paths(plan):  # DeepSeek-V4, a KDA layer alone: one path
        return plan, f"memory: the run needs about {gib(usual)} (one attention path: nothing for {auto} to choose)"
    absorbed = replace(plan, spec=replace(plan.spec, attn="absorb"))
    lean = f"absorbed it needs about {gib(sum(n.bytes for n in estimate(absorbed)))}"
    cached, t = plan.spec.cache_len, plan.prompt_len
    if cached > t:
        attend = "positions attend" if t > 1 else "position attends"
        return absorbed, (f"{auto}: absorbed throughout: the prefill's {t:,} {attend} over a cache of "
                          f"{cached:,}, as a decode step does; naive it would need about {gib(usual)}, {lean}")
    if available is not None and usual * COMFORT > available:
        return absorbed, (f"{auto}: absorbed throughout: naive the run would need about {gib(usual)}, over half "
                          f"the {gib(available)} available; {lean}")
    paths = "naive prefill, absorbed decode" if plan.spec.decode else "naive prefill"
    room = "the memory available is not known" if available is None else "under half the memory available"
    return plan, f"{auto}: {paths} (the run needs about {gib(usual)}, {room})"


def two_paths(plan: Plan) -> bool:
    """Whether a layer the run computes has a naive and an absorbed attention (a Kimi Linear KDA layer
    run alone has neither: its delta rule is the same either way)."""
    cat, cfg, spec = catalog.load(), plan.config, plan.spec
    return any(cat.layer_sequence(cfg, layer, "naive", spec.index_scoring)
               != cat.layer_sequence(cfg, layer, "absorb", spec.index_scoring) for layer in plan.computed)


CHUNKS = (4096, 2048, 1024, 512, 256, 128)  # the chunks --chunk auto tries, largest first


def choose_chunk(plan: Plan, estimate: Callable[[Plan], list[Need]], available: int | None,
                 asked: int | None, spell: Spell = command_line) -> tuple[Plan, str | None]:
    """--chunk: the prefill's positions per chunk as asked, or (asked None, auto) the whole
    prompt where the run's estimate fits in the memory available, else the largest chunk of
    CHUNKS that fits (the smallest if none does); the plan to run, and a line saying so (None
    when the prompt runs whole). `spell`: the option as the caller writes it (`--chunk 4`, `chunk=4`)."""
    t = plan.prompt_len
    if not takes(plan.config, "chunk"):  # DeepSeek-V4: the prompt runs whole
        if asked:
            raise StepperError(f"{spell('chunk', asked)}: {why_not(plan.config, 'chunk', spell)}")
        return plan, None
    multiple = families.family_for(plan.config).chunk_multiple
    if asked and asked < t and asked % multiple:
        raise StepperError(f"{spell('chunk', asked)}: model {plan.config.name} runs its prefill in chunks of a whole "
                           f"number of its delta rule's {multiple}-position chunks (so the state after each lines up "
                           f"with the whole prompt's); try {' or '.join(map(str, nearest_multiples(asked, multiple)))}")
    if asked is not None:
        chunked = replace(plan, spec=replace(plan.spec, chunk=asked if 0 < asked < t else 0))
        return chunked, chunk_line(chunked, f"{spell('chunk', asked)}:") if chunked.spec.chunk else None
    usual = sum(n.bytes for n in estimate(plan))
    if available is None or usual <= available or t <= CHUNKS[-1]:
        return plan, None
    tried = [replace(plan, spec=replace(plan.spec, chunk=c)) for c in CHUNKS if c < t] or [plan]
    chunked = next((p for p in tried if sum(n.bytes for n in estimate(p)) <= available), tried[-1])
    return chunked, chunk_line(chunked, f"--chunk auto: the whole prompt would need about {gib(usual)} and "
                               f"{gib(available)} is available, so")


def chunk_line(plan: Plan, why: str) -> str:
    chunk, t = plan.spec.chunk, plan.prompt_len
    return (f"{why} the prefill runs {chunk:,} positions at a time ({-(-t // chunk)} chunks, each tensor still shown "
            f"whole over the {t:,} positions)")


def available_bytes() -> int | None:
    """Memory this process can still be given: the least of the machine's MemAvailable, the room
    left under its cgroup's memory limit and under its address-space limit (`ulimit -v`); None
    if none is known."""
    known = [room for room in (machine_room(), cgroup_room(), address_space_room()) if room is not None]
    return min(known) if known else None


def machine_room() -> int | None:
    """MemAvailable, or the free physical pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2^63
CGROUPS = (  # (folder under the mount, limit, usage, the page cache's reclaimable part in memory.stat)
    ("", "memory.max", "memory.current", "inactive_file"),  # cgroup v2
    ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),  # cgroup v1
)


def cgroup_room(mount: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int | None:
    """The room under this process's cgroup memory limit (v2, else v1): the limit less the usage,
    the reclaimable page cache counted as room; None without a limit."""
    for sub, limit_file, usage_file, reclaimable in CGROUPS:
        for folder in cgroup_folders(mount / sub, own, v2=not sub):
            limit, usage = read_number(folder / limit_file), read_number(folder / usage_file)
            if limit is not None and usage is not None:
                if limit >= UNLIMITED:
                    return None
                return max(0, limit - usage + stat_value(folder / "memory.stat", reclaimable))
    return None


def cgroup_folders(root: Path, own: Path, v2: bool) -> list[Path]:
    """The folder of this process's cgroup under root, as /proc/self/cgroup names it, then the
    root itself (inside a container the mount shows its own cgroup)."""
    try:
        lines = own.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    paths = [line.split(":", 2)[2] for line in lines if line.count(":") >= 2
             and (line.startswith("0::") if v2 else "memory" in line.split(":", 2)[1].split(","))]
    return [root / path.lstrip("/") for path in paths if path.strip("/")] + [root]


def read_number(path: Path) -> int | None:
    """A cgroup file's number; "max" is no limit."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text == "max":
        return UNLIMITED
    return int(text) if text.isdigit() else None


def stat_value(path: Path, key: str) -> int:
    """The number after `key` in a file of "key value" lines (memory.stat, /proc/self/status); 0 if absent."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return 0
    fields = [line.split() for line in lines]
    values = [f[1] for f in fields if len(f) >= 2 and f[0] == key]
    return int(values[0]) if values and values[0].isdigit() else 0


def address_space_room() -> int | None:
    """The room under RLIMIT_AS (`ulimit -v`): the limit less the address space already mapped."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - (stat_value(Path("/proc/self/status"), "VmSize:") * 1024))


def check_fits(items: list[Need], available: int | None) -> None:
    """Refuse a run whose estimate exceeds what is available, naming its largest part and the option that lowers it."""
    total = sum(n.bytes for n in items)
    if available is None or total <= available:
        return
    worst = max(items, key=lambda n: n.bytes)
    raise StepperError(
        f"this run would need about {gib(total)} of memory ({gib(worst.bytes)} for {worst.what}) and "
        f"{gib(available)} is available; lower it with {worst.lower}"
    )


def nearest_multiples(asked: int, multiple: int) -> list[int]:
    """The multiples of `multiple` either side of `asked` (one when they are the same: 8 of 64 -> 64)."""
    return sorted({max(multiple, asked // multiple * multiple), -(-asked // multiple) * multiple})
