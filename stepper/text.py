"""Prompts as text: a checkpoint's own tokenizer, and the text each token of a run stands for.

DeepSeek checkpoints ship `tokenizer.json`, read with the `tokenizers` library. Kimi's ship
`tiktoken.model` (one base64 token and its rank per line) with `tokenizer_config.json`; their
tokenizer code gives the rest, which `KimiTiktoken` restates: the pre-tokenizer pattern (runs of
Han characters split off first, then words, numbers of at most three digits, punctuation and
whitespace), 258 special token ids right after the ranked tokens (their names from
`added_tokens_decoder`, the others `<|reserved_token_N|>`), special tokens recognised in the
text, runs of more than 25,000 spaces or non-spaces cut (so the regex never recurses that deep),
text encoded 400,000 characters at a time, and no BOS added. The two libraries are the optional extra `stepper[text]`.

What the files say is bounded before it runs: a tokenizer file of at most MAX_FILE_BYTES, at most
MAX_VOCAB tokens, padding and truncation to at most MAX_TOKENS tokens
(a fixed padding of 10^8 would make 10^8 ids of any prompt), a truncation's stride at most half
its length (each overflowing piece repeats `stride` tokens: near the length, a long prompt would
make as many pieces as tokens); a prompt of at most MAX_PROMPT_CHARS characters. A call into
either library is guarded: what it raises, its panics too (pyo3's PanicException is a
BaseException, and the panic handler writes its own lines on file descriptor 2, silenced
meanwhile), is one line naming the file. The libraries' own regular expressions (a tokenizer.json
`Split` or `Replace` pattern) run in Oniguruma, whose retry limit bounds each search: past it,
that is one line.

A token's text comes from a file: `label` escapes it (and shows spaces as ␣) before any screen.
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stepper.errors import StepperError, Terminated
from stepper.untrusted import shown
from stepper.untrusted.jsonfile import read_json

INSTALL = 'pip install "stepper[text]"'
TOKENIZER_JSON = "tokenizer.json"
TIKTOKEN_MODEL = "tiktoken.model"
TOKENIZER_CONFIG = "tokenizer_config.json"

KIMI_ALTERNATIVES = (  # Kimi's pre-tokenizer pattern, alternative by alternative
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
)
KIMI_PATTERN = "|".join(KIMI_ALTERNATIVES)
KIMI_SPECIAL_IDS = 256 + 2  # special token ids after the ranked tokens
KIMI_MAX_RUN = 25_000  # longest run of spaces or non-spaces handed to the regex at once
KIMI_CHUNK = 400_000  # characters encoded at once
MAX_FILE_BYTES = 64 * 2**20  # a tokenizer file (DeepSeek-V3's tokenizer.json: 7.8 MB)
MAX_VOCAB = 2**20  # tokens of a file, added tokens included (Kimi K2: 163,840)
MAX_TOKENS = 2**20  # a padding or truncation length: past the longest context (262,144 positions)
MAX_PROMPT_CHARS = 2**22  # characters of a prompt: about 10^6 tokens


class Tokenizer(Protocol):
    file: Path

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def piece(self, token: int) -> str:
        """The text one token stands for (bytes that are not UTF-8 on their own as \\xNN)."""
        ...


def label(piece: str) -> str:
    """A token's text as shown: control characters escaped, spaces as ␣."""
    return shown(piece).replace(" ", "␣")


@dataclass
class Tokens:
    """A run's tokens with their texts: the prompt's, then each decode step's, as they are fed.
    A token's position counts from the prompt's first token (the attention's key axis s)."""

    tokenizer: Tokenizer
    ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.ids)

    def feed(self, token: int) -> None:
        self.ids.append(int(token))

    def labels(self, positions: Sequence[int] | None = None) -> list[str]:
        """The labels of the tokens at these positions (all fed so far by default)."""
        positions = range(len(self.ids)) if positions is None else positions
        return [label(self.tokenizer.piece(self.ids[p])) if 0 <= p < len(self.ids) else "?" for p in positions]

    def numbered(self, positions: Sequence[int]) -> list[str]:
        """labels, each after its position ('3 ␣world')."""
        return [f"{p} {text}" for p, text in zip(positions, self.labels(positions))]

    def of_step(self, phase: str | None, n: int) -> range:
        """The positions of a step's n tokens: the prompt's in the prefill, then decode k's one."""
        first = 0 if phase in (None, "prefill") else self.prompt_len + int(phase.removeprefix("decode"))
        return range(first, first + n)


def find_tokenizer(folder: Path) -> Path | None:
    """The tokenizer file of a checkpoint directory: tokenizer.json, else tiktoken.model."""
    for name in (TOKENIZER_JSON, TIKTOKEN_MODEL):
        if (folder / name).is_file():
            return folder / name
    return None


def load_tokenizer(folder: Path) -> Tokenizer:
    """The checkpoint's tokenizer, or one line saying what is missing."""
    path = find_tokenizer(folder)
    if path is None:
        raise StepperError(f"{folder}: no {TOKENIZER_JSON} or {TIKTOKEN_MODEL}, so --prompt cannot be tokenized; "
                           "give token ids with --ids")
    if path.name == TOKENIZER_JSON:
        return HfTokenizer(path)
    return KimiTiktoken(path, read_special_names(folder / TOKENIZER_CONFIG))


def need(module: str, path: Path):
    """Import one of the text extra's libraries, or say in one line how to install it."""
    try:
        return __import__(module)
    except ImportError:
        raise StepperError(f"{path}: reading it needs the '{module}' library: {INSTALL}") from None


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table): the printable Latin-1
    bytes stand for themselves, the others for U+0100 onwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


BYTE_OF = byte_level_alphabet()


class HfTokenizer:
    """A `tokenizer.json` through the `tokenizers` library: its own pre-tokenizer, model and
    post-processor (which adds a BOS token where the file says so)."""

    def __init__(self, path: Path):
        self.file = path
        tokenizers = need("tokenizers", path)
        text = utf8(path, read_bounded(path))
        with library_call(path, "not a tokenizer.json the tokenizers library can read"):
            self.model = tokenizers.Tokenizer.from_str(text)
        check_settings(path, self.model)

    def encode(self, text: str) -> list[int]:
        check_prompt(text)
        with library_call(self.file, "encoding the prompt failed"):
            return list(self.model.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        with library_call(self.file, "decoding failed"):
            known = [i for i in ids if self.model.id_to_token(i) is not None]
            return self.model.decode(known, skip_special_tokens=False)

    def piece(self, token: int) -> str:
        with library_call(self.file, f"decoding token {token} failed"):
            entry = self.model.id_to_token(token)
            if entry is None:
                return "<unknown>"
            text = self.model.decode([token], skip_special_tokens=False)
        if "\ufffd" in text and all(c in BYTE_OF for c in entry):  # a byte-level token, part of a character
            return bytes(BYTE_OF[c] for c in entry).decode("utf-8", errors="backslashreplace")
        return text


def read_bounded(path: Path) -> bytes:
    """A tokenizer file's bytes, if there are at most MAX_FILE_BYTES."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise StepperError(f"{path}: {size} bytes; a tokenizer file stepper reads is at most {MAX_FILE_BYTES}")
        return path.read_bytes()
    except OSError as e:
        raise StepperError(f"{path}: cannot be read ({e.strerror})") from None


def utf8(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StepperError(f"{path}: not UTF-8 text (byte {e.start})") from None


def check_settings(path: Path, model) -> None:
    """A tokenizer's sizes within bounds before it encodes anything: its tokens, its padding and
    truncation lengths (as the library read them from the file)."""
    tokens = model.get_vocab_size(with_added_tokens=True)
    if tokens > MAX_VOCAB:
        raise StepperError(f"{path}: {tokens} tokens; stepper reads at most {MAX_VOCAB}")
    padding, truncation = model.padding or {}, model.truncation or {}
    check_length(path, "padding.strategy.Fixed", padding.get("length"))
    check_length(path, "padding.pad_to_multiple_of", padding.get("pad_to_multiple_of"))
    if truncation:
        length, stride = truncation["max_length"], truncation["stride"]
        check_length(path, "truncation.max_length", length)
        if stride > length // 2:
            raise StepperError(f"{path}: truncation.stride is {stride}; at most half of max_length ({length}), "
                               "or a long prompt overflows into about as many pieces as it has tokens")


def check_length(path: Path, where: str, value: int | None) -> None:
    if value is not None and value > MAX_TOKENS:
        raise StepperError(f"{path}: {where} is {value} tokens; stepper takes at most {MAX_TOKENS} "
                           "(every prompt would be made that long)")


def check_prompt(text: str) -> None:
    if len(text) > MAX_PROMPT_CHARS:
        raise StepperError(f"the prompt has {len(text)} characters; stepper encodes at most {MAX_PROMPT_CHARS}")


@contextmanager
def library_call(path: Path, what: str) -> Iterator[None]:
    """A call into a tokenizer library: whatever it raises, a Rust panic too (a BaseException),
    is one line naming the file; the lines a panic handler writes on file descriptor 2 are
    silenced. Ctrl-C, exits and running out of memory pass through."""
    with stderr_silenced():
        try:
            yield
        except (StepperError, Terminated, KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError):
            raise
        except BaseException as e:  # noqa: BLE001 - a panic is a BaseException; the libraries raise bare Exceptions
            raise StepperError(f"{path}: {what} ({type(e).__name__}: {first_line(e)})") from None


@contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 on /dev/null inside the block (what Python writes to sys.stderr is flushed first)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class KimiTiktoken:
    """Kimi's `tiktoken.model` through `tiktoken`, with Kimi's pattern and special tokens."""

    def __init__(self, path: Path, names: dict[int, str]):
        self.file = path
        tiktoken = need("tiktoken", path)
        ranks = read_ranks(path)
        first = len(ranks)
        special = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(first, first + KIMI_SPECIAL_IDS)}
        with library_call(path, "tiktoken cannot use it"):
            self.model = tiktoken.Encoding(path.name, pat_str=KIMI_PATTERN, mergeable_ranks=ranks,
                                           special_tokens=special)

    def encode(self, text: str) -> list[int]:
        check_prompt(text)
        parts = (part for start in range(0, len(text), KIMI_CHUNK)
                 for part in runs_cut(text[start:start + KIMI_CHUNK], KIMI_MAX_RUN))
        with library_call(self.file, "encoding the prompt failed"):
            return [i for part in parts for i in self.model.encode(part, allowed_special="all")]

    def decode(self, ids: Sequence[int]) -> str:
        known = [i for i in ids if i < self.model.n_vocab]
        with library_call(self.file, "decoding failed"):
            return self.model.decode_bytes(known).decode("utf-8", errors="replace")

    def piece(self, token: int) -> str:
        if not 0 <= token < self.model.n_vocab:
            return "<unknown>"
        with library_call(self.file, f"decoding token {token} failed"):
            return self.model.decode_single_token_bytes(token).decode("utf-8", errors="backslashreplace")


def read_ranks(path: Path) -> dict[bytes, int]:
    """tiktoken.model: lines of a base64 token and its rank, the ranks 0..n-1 each once. Read
    here, not with tiktoken's loader, which keeps a copy of a file by its path and would go on
    using it after the file has changed."""
    ranks: dict[bytes, int] = {}
    lines = read_bounded(path).splitlines()
    if len(lines) > MAX_VOCAB:
        raise StepperError(f"{path}: {len(lines)} lines; stepper reads at most {MAX_VOCAB} tokens")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            if len(parts) != 2 or rank < 0:
                raise ValueError
        except (ValueError, IndexError, binascii.Error):
            raise StepperError(f"{path}: line {number}: expected a base64 token and its rank, got "
                               f"{shown(line[:60].decode('utf-8', 'backslashreplace'))!r}") from None
        if token in ranks:
            raise StepperError(f"{path}: line {number}: token {token!r} is listed twice")
        ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise StepperError(f"{path}: the ranks must be 0..{len(ranks) - 1}, each once (special token ids follow them)")
    return ranks


def read_special_names(path: Path) -> dict[int, str]:
    """The special tokens' names from tokenizer_config.json's added_tokens_decoder (id -> content)."""
    if not path.is_file():
        return {}
    raw = read_json(path, "a tokenizer_config.json")
    added = raw.get("added_tokens_decoder", {}) if isinstance(raw, dict) else None
    if not isinstance(added, dict):
        raise StepperError(f"{path}: 'added_tokens_decoder' must be an object of token id -> token")
    names = {}
    for key, token in added.items():
        content = token.get("content") if isinstance(token, dict) else None
        if not key.isdigit() or not isinstance(content, str):
            raise StepperError(f"{path}: added_tokens_decoder[{shown(key)!r}] must be a token id with a 'content' "
                               "string")
        names[int(key)] = content
    return names


def runs_cut(text: str, longest: int) -> Iterator[str]:
    """The text in pieces, none holding more than `longest` spaces or non-spaces in a row."""
    start, run, spaces = 0, 0, text[:1].isspace()
    for i, char in enumerate(text):
        if char.isspace() != spaces:
            spaces, run = char.isspace(), 1
        else:
            run += 1
            if run > longest:
                yield text[start:i]
                start, run = i, 1
    yield text[start:]


def first_line(error: BaseException) -> str:
    return shown(str(error).splitlines()[0] if str(error) else type(error).__name__)
