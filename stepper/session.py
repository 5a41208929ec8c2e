"""The interpreter's driver: resolve what the user asked for, then run prefill and decode steps.

A run is described by a `RunSpec` and reports every named tensor to the given sinks. Two shapes
of run:

- the model (default, or `layers=(A, B)`): embedding, layers 0..B-1 (showing A..B-1), and, when
  every layer runs, the final norm and logits. Decode steps feed the greedy (argmax) token.
- one layer alone (`layer=N`): layer N on a given residual stream (`input`, a safetensors file)
  or on the prompt's token embeddings. Nothing produces logits, so decode steps feed tokens drawn
  from the seed. `cache_len=N` starts its cache with N synthetic positions (start_pos on; the
  prompt follows them), so a decode step over a long cache needs no long prefill.

With decode steps, the prefill's names are prefixed `prefill.` and step k's `decode{k}.`.
With `chunk=N` the prefill runs N positions at a time (stepper.prefill), each tensor still shown
once over every position.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from stepper import families, prefill
from stepper.config import Config
from stepper.errors import StepperError
from stepper.families import derive
from stepper.kernels import parallel
from stepper.kernels.weight_cache import CachedWeights
from stepper.model.options import LayerOptions
from stepper.model.stack import Model
from stepper.presets import PRESETS, V4_PRESETS
from stepper.seams.trace import Emitter, Sink
from stepper.text import Tokens, load_tokenizer
from stepper.untrusted import cut, said
from stepper.untrusted.paths import found
from stepper.weights import remote
from stepper.weights.checkpoint import INDEX, Checkpoint
from stepper.weights.names import EMBED
from stepper.weights.safetensors_reader import SafetensorsFile
from stepper.weights.source import WeightSource


@dataclass(frozen=True)
class RunSpec:
    model: str = "tiny"
    layer: int | None = None  # run this layer alone
    layers: tuple[int, int | None] | None = None  # [first, stop) of the model run; stop None = the end
    ids: tuple[int, ...] | None = None  # None = `prompt_len` ids drawn from the seed
    prompt: str | None = None  # the prompt as text, for the checkpoint's tokenizer (instead of ids)
    prompt_len: int = 7
    start_pos: int = 0
    decode: int = 0
    seed: int = 0
    input: Path | None = None  # the residual stream for a lone layer
    attn: str = "auto"  # naive | absorb | auto (naive for the prefill, absorbed for decode steps)
    weight_cache_mb: int = 0  # keep up to this many MB of decoded weights between steps
    cache_len: int = 0  # a lone layer's cache starts with this many synthetic positions (model.synthetic_cache)
    index_scoring: str = "exact"  # DeepSeek-V3.2's indexer: exact (float32) or fp8 (DeepSeek's kernel)
    chunk: int = 0  # the prefill runs this many positions at a time (stepper.prefill); 0: the whole prompt at once


DEFAULT_SPEC = RunSpec()
ATTN_CHOICES = ("auto", "naive", "absorb")
INDEX_SCORING_CHOICES = ("exact", "fp8")
SAMPLE_TOKENS = 64  # real tokens whose latents give a synthetic cache its statistics


def step_attn(spec: RunSpec, step: int) -> str:
    """The attn of a step, "naive" or "absorb": absorbed attention pays off when attending over a cache."""
    if spec.attn != "auto":
        return spec.attn
    return "naive" if step == 0 else "absorb"


def phase_name(spec: RunSpec, step: int) -> str | None:
    """The prefix of a step's names: none without decode steps, else `prefill` and `decode{k}`."""
    if spec.decode == 0:
        return None
    return "prefill" if step == 0 else f"decode{step - 1}"


@dataclass(frozen=True)
class RunResult:
    config: Config
    prompt: tuple[int, ...]
    generated: tuple[int, ...]


def load_model(model: str, seed: int) -> WeightSource:
    """A preset (synthetic weights), a checkpoint directory, a remote checkpoint (hf://ORG/NAME,
    https://HOST/PATH/), or a bare config.json (synthetic)."""
    if model in PRESETS or model in V4_PRESETS:
        return synthetic(preset_config(model), seed)
    if remote.is_remote(model):
        return open_checkpoint(model)
    path = Path(model)
    if found(path) == "folder":
        if found(path / "config.json") and not any(path.glob("*.safetensors")) and not found(path / INDEX):
            pickled = sorted(path.glob("pytorch_model*.bin"))  # older releases (MiniCPM3's era)
            if pickled:
                raise StepperError(f"{path}: holds {pickled[0].name} (PyTorch pickle), which stepper does not read "
                                   "(unpickling runs code); convert the weights to safetensors")
            return synthetic(families.load_config(path / "config.json"), seed)
        return open_checkpoint(path)
    if found(path) is not None:
        return synthetic(families.load_config(path), seed)
    if os.sep in model or model.startswith((".", "~")):  # a path that is not there, not a misspelt preset
        raise StepperError(f"model '{model}': no such checkpoint directory or config.json")
    near = difflib.get_close_matches(model, [*PRESETS, *V4_PRESETS], n=3, cutoff=0.6)
    raise StepperError(
        f"unknown model '{model}'" + (f" (did you mean {', '.join(near)}?)" if near else "")
        + f": expected one of {', '.join([*PRESETS, *V4_PRESETS])}, a checkpoint directory or a config.json")


def synthetic(cfg, seed: int) -> WeightSource:
    """Seeded weights of a config, as its family makes them."""
    return families.family_for(cfg).synthetic(cfg, seed)


def preset_config(name: str) -> Config:
    """A preset's config, read by the reader of the family its model_type names (presets.preset
    reads the MLA family's alone; DeepSeek-V4's are stepper.presets.V4_PRESETS)."""
    return families.read_config({**PRESETS, **V4_PRESETS}[name], f"preset {name}")


def open_checkpoint(where: str | Path) -> Checkpoint:
    """A checkpoint directory or a remote checkpoint (from its headers alone), its config.json read
    by the reader of the family its model_type names (inspect, fixtures)."""
    if isinstance(where, str) and remote.is_remote(where):  # its config.json first (fetched once into the cache)
        own = families.family_for(families.load_config(remote.config_folder(where)[0] / "config.json")).checkpoint
        return own(where) if own is not None else remote.open_remote(where, read_config=families.load_config)
    path = Path(where)
    if found(path / "config.json") == "file":  # a family that reads its checkpoints its own way (DeepSeek-V4's layout)
        family = families.family_for(families.load_config(path / "config.json"))
        if family.checkpoint is not None:
            return family.checkpoint(path)
    return Checkpoint(path, families.load_config)


Spell = Callable[..., str]  # (an option's keyword, a value) -> the option as the caller writes it


def command_line(keyword: str, value: object = "") -> str:
    """An option as `stepper run` takes it: cache_len -> `--cache-len`, layer N -> `--layer N`."""
    return f"--{keyword.replace('_', '-')} {value}".rstrip()


def api_keyword(keyword: str, value: object = "") -> str:
    """An option as `stepper.run` takes it: cache_len -> `cache_len=`, layer N -> `layer=N`."""
    return f"{keyword}={value}"


def prompt_ids(spec: RunSpec, cfg: Config, spell: Spell = command_line) -> tuple[int, ...]:
    if spec.ids is None:
        if spec.prompt_len < 1:
            raise StepperError(f"{spell('prompt_len')} must be at least 1, got {spec.prompt_len}")
        return seeded_tokens(spec.seed, cfg, spec.prompt_len)
    if not spec.ids:
        raise StepperError(f"{spell('ids')} is empty: give at least one token id")
    bad = [i for i in spec.ids if not 0 <= i < cfg.vocab_size]
    if bad:
        raise StepperError(f"token id {bad[0]} out of range: model {cfg.name} has vocab_size {cfg.vocab_size}")
    return spec.ids


def text_prompt_ids(model: str, text: str, seed: int = 0) -> tuple[int, ...]:
    """A text prompt as the token ids of the model's tokenizer (for runs described by ids)."""
    return tuple(prompt_tokens(RunSpec(model=model, prompt=text), load_model(model, seed).config).ids)


def prompt_length(spec: RunSpec) -> int:
    return spec.prompt_len if spec.ids is None else len(spec.ids)


def prompt_tokens(spec: RunSpec, cfg: Config) -> Tokens | None:
    """The text prompt's tokens, through the tokenizer of the checkpoint directory `spec.model`."""
    if spec.prompt is None:
        return None
    if spec.ids is not None:
        raise StepperError("give --prompt or --ids, not both")
    if not spec.prompt:
        raise StepperError("--prompt is empty: give some text")
    if not Path(spec.model).is_dir():
        raise StepperError(f"--prompt needs a tokenizer, and model {spec.model} (synthetic weights) has none: "
                           "give token ids with --ids, or a checkpoint directory with its tokenizer")
    tokenizer = load_tokenizer(Path(spec.model))
    ids = tokenizer.encode(spec.prompt)
    if not ids:
        raise StepperError(f"--prompt {spec.prompt!r} makes no tokens with {tokenizer.file}: give some text")
    bad = [i for i in ids if not 0 <= i < cfg.vocab_size]
    if bad:
        raise StepperError(f"{tokenizer.file}: token {bad[0]} ({tokenizer.piece(bad[0])!r}) of the prompt is past the "
                           f"vocab_size {cfg.vocab_size} of model {cfg.name}")
    return Tokens(tokenizer, list(ids))


def seeded_tokens(seed: int, cfg: Config, n: int, stream: int = 1) -> tuple[int, ...]:
    rng = np.random.default_rng([seed, stream])
    return tuple(int(i) for i in rng.integers(0, cfg.vocab_size, n))


def check_layer(layer: int, cfg: Config, what: str = "layer") -> None:
    if not 0 <= layer < cfg.num_hidden_layers:
        raise StepperError(f"{what} {layer} out of range: model {cfg.name} has layers 0..{cfg.num_hidden_layers - 1}")


def layers_shown(spec: RunSpec, cfg: Config) -> range:
    n = cfg.num_hidden_layers
    if spec.layer is not None:
        check_layer(spec.layer, cfg)
        if getattr(cfg, "index_reused", lambda layer: False)(spec.layer):  # GLM-5's shared layer
            raise StepperError(f"layer {spec.layer} runs no indexer: it attends where layer {spec.layer - 1} chose, so "
                               f"it runs only after that layer (--layers 0:{spec.layer + 1}, not --layer {spec.layer})")
        if getattr(cfg, "kv_shared", lambda layer: False)(spec.layer):  # Mistral Large 4's kv_source_layers
            source = cfg.kv_source(spec.layer)
            raise StepperError(f"layer {spec.layer} reads the latent of layer {source} (kv_source_layers), so it "
                               f"runs only after that layer (--layers {spec.layer}:{spec.layer + 1}, not --layer "
                               f"{spec.layer})")
        return range(spec.layer, spec.layer + 1)
    if spec.layers is None:
        return range(n)
    first, given = spec.layers
    stop = n if given is None else given
    if not (0 <= first < stop <= n):
        asked = f"{first}:{'' if given is None else given}"  # as given: 3: is not 3:3
        raise StepperError(f"layers {asked} out of range: model {cfg.name} has layers 0..{n - 1}")
    return range(first, stop)


MAX_POSITIONS = 1 << 24  # a prompt, a cache or a decode: 16 times the longest context published (1,048,576)


def check_positions(spec: RunSpec, cfg: Config, prompt_len: int, spell: Spell = command_line) -> None:
    for keyword in ("start_pos", "decode", "cache_len"):
        if getattr(spec, keyword) < 0:
            raise StepperError(f"{spell(keyword)} must be >= 0, got {getattr(spec, keyword)}")
    if spec.chunk < 0:
        raise StepperError(f"{spell('chunk')} must be >= 0 (0: the whole prompt at once), got {spec.chunk}")
    if spec.cache_len and spec.layer is None:
        raise StepperError(f"{spell('cache_len', spec.cache_len)} fills one layer's cache: use it with "
                           f"{spell('layer', 'N')}")
    why = families.family_for(cfg).no_seeded_cache(cfg, spec.layer) if spec.cache_len else ""
    if why:
        raise StepperError(f"{spell('cache_len', spec.cache_len)}: layer {spec.layer} of {cfg.name} {why}")
    end = spec.start_pos + spec.cache_len + prompt_len + spec.decode
    if end > cfg.max_position_embeddings:
        raise StepperError(
            f"positions up to {end - 1} exceed max_position_embeddings ({cfg.max_position_embeddings}) "
            f"of model {cfg.name}"
        )
    for keyword, value in (("prompt_len", prompt_len), ("cache_len", spec.cache_len), ("decode", spec.decode)):
        if value > MAX_POSITIONS:  # drawn as Python ints before the run's memory is estimated
            raise StepperError(f"{spell(keyword)} must be at most {MAX_POSITIONS:,} positions, got {value:,}")


INPUT_DTYPES = ("F32", "BF16", "F16", "F64", "F8_E4M3", "F8_E5M2")  # floats: what --input's stream may be


def read_input(path: Path, layer: int, cfg: Config) -> np.ndarray:
    """The stream a lone layer takes (its family's: MLA's residual [B, T, D], DeepSeek-V4's streams
    [1, T, n, D]), from a safetensors file: its only tensor, or the layer's input as `stepper run
    --dump` writes it (`layers.{N}.hidden_states`, V4's `layers.{N}.streams`: the first tensor the
    layer emits, with or without `prefill.`; for the residual stream, else `layers.{N-1}.output`)."""
    with SafetensorsFile(path) as f:
        names = f.names()
        first = derive.layer_keys(cfg, layer)[0]  # the layer's input, as it shows it
        wanted = [f"layers.{layer}.{first}", f"prefill.layers.{layer}.{first}"]
        if first == "hidden_states" and layer > 0:  # the residual stream: the layer before's output is the same
            wanted += [f"layers.{layer - 1}.output", f"prefill.layers.{layer - 1}.output"]
        name = names[0] if len(names) == 1 else next((n for n in wanted if n in names), None)
        if name is None:
            raise StepperError(f"{path}: no tensor named {wanted[0]} (found {len(names)} tensors)")
        dtype = f.info(name).dtype
        if dtype not in INPUT_DTYPES:  # integers or booleans would be taken as a stream of their values
            raise StepperError(f"{path}: tensor '{cut(name)}' is {dtype}, expected {', '.join(INPUT_DTYPES)}")
        array = np.array(f.get(name), dtype=np.float32)
    expected = families.family_for(cfg).stream(cfg)
    shape = ", ".join(str(e) if e is not None else "BT"[i] for i, e in enumerate(expected))  # None: B or T
    if array.ndim != len(expected) or any(e is not None and e != n for e, n in zip(expected, array.shape)):
        raise StepperError(f"{path}: tensor '{cut(name)}' has shape {list(array.shape)}, expected [{shape}]")
    if array.shape[1] == 0:
        raise StepperError(f"{path}: tensor '{cut(name)}' has shape {list(array.shape)}, expected [{shape}] with at "
                           "least one position (T)")
    return array


def takes(cfg: Config, keyword: str) -> bool:
    """Whether cfg's family has a path for the RunSpec option `keyword` (families.family.Family.refuses)."""
    return keyword not in dict(families.family_for(cfg).refuses)


def config_problem(raw: dict, source: str) -> str | None:
    """What a run would refuse in a config.json's fields (its family's reader), or None."""
    try:
        families.read_config(raw, source)
    except StepperError as e:
        return str(e)
    return None


def published_name(cfg: Config, name: str) -> str:
    """A parameter's name (as transformers names it) in the checkpoints cfg's family publishes."""
    return families.family_for(cfg).published_name(name)


def why_not(cfg: Config, keyword: str, spell: Spell = command_line) -> str:
    """Why cfg's family has no path for the RunSpec option `keyword`, the options it names
    (`{cache_len}`) spelled as the caller writes them."""
    why = dict(families.family_for(cfg).refuses)[keyword]
    return why.format_map({"layer": spell("layer", "L"), "cache_len": spell("cache_len", "N")})


def cache_bytes(cfg: Config, layers, positions: int, attn: str, index_scoring: str) -> int:
    """Bytes the caches of these layers hold over `positions`, as cfg's family keeps them."""
    return families.family_for(cfg).cache_bytes(cfg, layers, positions, attn, index_scoring)


def check_refused(spec: RunSpec, cfg: Config, spell: Spell) -> None:
    """Refuse an option the config's family has no path for (families.family.Family.refuses)."""
    for keyword, _ in families.family_for(cfg).refuses:
        value = getattr(spec, keyword)
        if value != getattr(DEFAULT_SPEC, keyword):
            raise StepperError(f"{spell(keyword, value)}: model {cfg.name} ({cfg.model_type}) takes no such option: "
                               f"{why_not(cfg, keyword, spell)}")


def check_choice(option: str, value: object, choices: tuple[str, ...]) -> str:
    """Refuse a value not among an option's choices, the option spelled as the caller's user
    writes it: `--attn` (the command line) or `attn=` (the API); a value that is no string (an
    array, whose `in` would compare it element by element) is refused alike."""
    if not isinstance(value, str) or value not in choices:
        verb = "expects" if option.endswith("=") else "must be"
        raise StepperError(f"{option} {verb} one of {', '.join(choices)}, got {said(value)}")
    return value


def check_index_scoring(scoring: str, cfg: Config, spell: Spell = command_line) -> None:
    """FP8 index scoring needs an indexer, and a head the Hadamard rotation and one scale fit."""
    check_choice(spell("index_scoring"), scoring, INDEX_SCORING_CHOICES)
    if scoring == "exact":
        return
    if not cfg.has_indexer:
        raise StepperError(f"{spell('index_scoring', 'fp8')} scores the Lightning Indexer, and model {cfg.name} "
                           f"({cfg.model_type}) has none: use a model with one (tiny-v32, tiny-glm5, tiny-axk2, "
                           "deepseek-v3.2, glm-5, a.x-k2)")
    dims = cfg.index_head_dim
    if dims & (dims - 1) or dims > 128:
        raise StepperError(f"{spell('index_scoring', 'fp8')} needs index_head_dim a power of two up to 128 "
                           f"(the Hadamard rotation, one FP8 scale per head), and model {cfg.name} has {dims}")


@dataclass(frozen=True)
class Plan:
    """A validated run: everything `execute` needs, checked before any computation."""

    spec: RunSpec
    weights: WeightSource
    layers_shown: range  # the layers whose tensors the run emits
    prompt: tuple[int, ...]
    hidden: np.ndarray | None  # the lone layer's given input
    needs_logits: bool
    tokens: Tokens | None = None  # the tokens' texts, with a text prompt; fed tokens are added as the run goes

    @property
    def config(self) -> Config:
        return self.weights.config

    @property
    def synthetic(self) -> bool:
        """Whether the weights are seeded ones, as the config's family makes them."""
        return isinstance(self.weights, families.family_for(self.config).synthetic)

    @property
    def alone(self) -> bool:
        return self.spec.layer is not None

    @property
    def computed(self) -> range:
        """The layers the run computes: the lone layer, or every layer up to the last shown (all of
        them where the logits are needed)."""
        if self.alone:
            return self.layers_shown
        return range(self.config.num_hidden_layers if self.needs_logits else self.layers_shown.stop)

    @property
    def whole(self) -> bool:
        """Whether the run shows the whole model: the embedding, rope tables, norm and logits too."""
        return not self.alone and self.layers_shown == range(self.config.num_hidden_layers)

    @property
    def prompt_len(self) -> int:
        """Positions of the prefill: the prompt's, or the given input's."""
        return len(self.prompt) if self.hidden is None else self.hidden.shape[1]

    @property
    def input_source(self) -> str:
        if not self.alone:
            return "token embeddings"
        if self.hidden is not None:
            return str(self.spec.input)
        if self.weights.has(EMBED):
            return "the prompt's token embeddings"
        return "seeded random vectors (no embedding table)"


def prepare(spec: RunSpec, weights: WeightSource | None = None, spell: Spell = command_line) -> Plan:
    """Resolve and check everything the user gave; raise StepperError on the first problem, naming
    the option as the caller writes it (`spell`: the command line's `--cache-len` or the API's
    `cache_len=`)."""
    check_choice(spell("attn"), spec.attn, ATTN_CHOICES)
    if spec.seed < 0:  # (a lesson file's; NumPy's generators take no negative seed)
        raise StepperError(f"{spell('seed')} must be >= 0, got {spec.seed}")
    weights = weights or load_model(spec.model, spec.seed)
    if spec.weight_cache_mb < 0:
        raise StepperError(f"{spell('weight_cache_mb')} must be >= 0, got {spec.weight_cache_mb}")
    if spec.weight_cache_mb:
        weights = CachedWeights(weights, spec.weight_cache_mb * 2**20)
    cfg = weights.config
    check_refused(spec, cfg, spell)
    check_index_scoring(spec.index_scoring, cfg, spell)
    layers = layers_shown(spec, cfg)
    if spec.input is not None and spec.layer is None:
        raise StepperError(f"{spell('input')} feeds one layer: use it with {spell('layer', 'N')}")
    if spec.input is not None and spec.prompt is not None:
        raise StepperError("give --input or --prompt, not both: the layer runs on one of them")
    hidden = read_input(spec.input, layers.start, cfg) if spec.input else None
    if hidden is not None and spec.ids is not None and len(spec.ids) != hidden.shape[1]:
        raise StepperError(f"{spell('ids')} gives {len(spec.ids)} tokens and {spell('input')} {spec.input} "
                           f"{hidden.shape[1]} positions: give as many ids as positions, or none")
    if hidden is not None:  # the tokens at the input's positions (a hash-routed layer routes by them)
        spec = replace(spec, prompt_len=hidden.shape[1])
    tokens = prompt_tokens(spec, cfg) if hidden is None else None
    length = hidden.shape[1] if hidden is not None else len(tokens.ids) if tokens else prompt_length(spec)
    check_positions(spec, cfg, length, spell)  # before drawing ids
    prompt = tuple(tokens.ids) if tokens else prompt_ids(spec, cfg, spell)
    alone = spec.layer is not None
    needs_logits = not alone and (spec.decode > 0 or layers.stop == cfg.num_hidden_layers)
    # a run from the prompt reads the embedding: without it, checked with the norm and lm_head, it is refused saying
    # what the checkpoint holds, before any compute
    globals_checked = needs_logits or (not alone and not weights.has(EMBED))
    weights.check(layers if alone else range(cfg.num_hidden_layers if needs_logits else layers.stop), globals_checked)
    return Plan(spec, weights, layers, prompt, hidden, needs_logits, tokens)


def run(spec: RunSpec, sinks: Iterable[Sink], weights: WeightSource | None = None) -> RunResult:
    """Prepare and execute."""
    return execute(prepare(spec, weights), sinks)


@parallel.one_blas_thread()
def execute(plan: Plan, sinks: Iterable[Sink]) -> RunResult:
    """Run the prefill and `spec.decode` decode steps, emitting to `sinks` (BLAS on one thread
    meanwhile, as the command line runs it)."""
    spec, cfg = plan.spec, plan.config
    family = families.family_for(cfg)
    model = family.build(plan.weights, LayerOptions(index_scoring=spec.index_scoring))
    emit = Emitter(sinks)
    cache = family.cache(cfg)
    ids = np.array([plan.prompt], dtype=np.int64)  # [B=1, T]
    hidden = plan.hidden
    if spec.cache_len:
        fill_cache(plan, model, cache, emit)
    positions = spec.start_pos + spec.cache_len + np.arange(ids.shape[1] if hidden is None else hidden.shape[1])
    decode_tokens = seeded_tokens(spec.seed, cfg, spec.decode, stream=2)
    generated: list[int] = []
    if plan.tokens is not None:
        plan.tokens.ids[:] = plan.prompt  # a plan may run more than once
    for step in range(spec.decode + 1):
        emit.progress(STEPS, step, spec.decode + 1)
        phase = emit.phase(phase_name(spec, step))
        more = step < spec.decode
        chunk = spec.chunk if step == 0 and spec.chunk else len(positions)
        runs = chunked_model(plan, model) if chunk < len(positions) else model
        run_step = partial(one_step, plan, runs, ids, hidden, positions, step, step_attn(spec, step))
        masked = masked_future(plan, step_attn(spec, step)) if chunk < len(positions) else None
        logits = prefill.in_chunks(run_step, len(positions), chunk, cache, phase, masked)
        token = None if not more else decode_tokens[step] if plan.alone else int(np.argmax(logits[0, -1]))
        if token is not None:
            generated.append(token)
            if plan.tokens is not None:
                plan.tokens.feed(token)
            ids = np.array([[token]], dtype=np.int64)
            positions = positions[-1:] + 1
            hidden = None
    emit.progress(STEPS, spec.decode + 1, spec.decode + 1)
    return RunResult(cfg, plan.prompt, tuple(generated))


STEPS = "steps (the prefill, then each decode step)"


def masked_future(plan: Plan, attn: str) -> dict[str, float]:
    """What the run's layers' tensors over the attended positions hold at a masked future position,
    as their code makes it (families.derive): a chunked prefill widens each chunk's rows with it."""
    cfg = plan.config
    return {key: value for layer in range(cfg.num_hidden_layers)
            for key, value in derive.masked_future(cfg, layer, attn, plan.spec.index_scoring).items()}


def chunked_model(plan: Plan, model: Model) -> Model:
    """The model a chunked prefill runs: its chunks run again when a chunked tensor's values are
    read (prefill.Replay) and must make the same values, but past a weight's first use a weight
    cache multiplies by its decoded float32 copy, which rounds differently; so the prefill reads
    the weights as stored, as a whole prompt's prefill (every weight's first use) does."""
    if isinstance(plan.weights, CachedWeights):
        return families.family_for(plan.config).build(plan.weights.source, model.options)
    return model


def one_step(plan: Plan, model: Model, ids: np.ndarray, hidden: np.ndarray | None, positions: np.ndarray,
             step: int, attn: str, span: slice, cache, emit: Emitter) -> np.ndarray | None:
    """The step's positions `span` (all of them, or a chunk of the prefill's) through the lone
    layer (-> None) or the model (-> the logits [B, t, V], or None without them). The lone
    layer's input is the given one's rows, or made for the span alone: a chunk never holds the
    whole prompt's."""
    if plan.alone:
        start = span.start or 0
        rows = hidden[:, span] if hidden is not None else model.lone_input(ids[:, span], plan.spec.seed, step, start)
        context = model.context(ids[:, span], positions[span], emit)
        model.layer(plan.spec.layer, rows, context, cache, emit, attn)
        return None
    return model.forward(ids[:, span], positions[span], emit, cache, plan.layers_shown, plan.needs_logits, attn)


def fill_cache(plan: Plan, model: Model, cache, emit: Emitter | None = None) -> None:
    """The lone layer's cache: spec.cache_len synthetic positions from start_pos on, with the
    statistics of the layer's input for a few seeded tokens."""
    spec = plan.spec
    ids = np.array([seeded_tokens(spec.seed, plan.config, SAMPLE_TOKENS, stream=4)])
    sample = model.lone_input(ids, spec.seed, spec.decode + 1)  # a step number no step of the run has
    per_head = any(step_attn(spec, k) == "naive" for k in range(spec.decode + 1))
    positions = spec.start_pos + np.arange(spec.cache_len)
    model.seed_cache(cache, spec.layer, sample, positions, spec.seed, per_head, emit or Emitter())
