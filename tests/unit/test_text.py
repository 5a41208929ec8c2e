"""Prompts as text: tokenizer.json through the tokenizers library, Kimi's tiktoken.model through
tiktoken with Kimi's pattern and special tokens, and a run's tokens with their texts."""

import sys

import pytest
import tiktoken
from helpers.tokenizer_files import KIMI_SPECIALS, kimi_ranks, write_tiktoken_model, write_tokenizer_json

from stepper import text
from stepper.errors import StepperError
from stepper.text import HfTokenizer, KimiTiktoken, Tokens, label, load_tokenizer, runs_cut

TEXTS = ["hello world, the fox", "中文English混合 你好世界", "naïve café 🙂\n\ttabs and  spaces ",
         "I'm 12345 OK\n\n  x"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    write_tokenizer_json(folder)
    return folder


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kimi")
    write_tiktoken_model(folder)
    return folder


# ---------------------------------------------------------------------------------------------
# tokenizer.json


@pytest.mark.parametrize("prompt", TEXTS)
def test_tokenizer_json_round_trips_after_its_bos(hf_dir, prompt):
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, HfTokenizer)
    ids = tok.encode(prompt)
    assert ids[0] == 0 and tok.piece(0) == "<bos>"  # the post-processor's BOS
    assert tok.decode(ids[1:]) == prompt
    assert b"".join(piece_bytes(tok, i) for i in ids[1:]) == prompt.encode()


def piece_bytes(tok, i: int) -> bytes:
    """A piece back to its bytes: \\xNN escapes (part of a character) are single bytes."""
    piece = tok.piece(i)
    return piece.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1") \
        if "\\x" in piece else piece.encode()


def test_a_byte_level_token_inside_a_character_shows_its_byte(hf_dir):
    tok = load_tokenizer(hf_dir)
    ids = tok.encode("\u4e59")  # a character the training text never had: three byte tokens
    assert [tok.piece(i) for i in ids[1:]] == ["\\xe4", "\\xb9", "\\x99"]  # 乙 is e4 b9 99 in UTF-8
    assert tok.piece(10_000) == "<unknown>"


def test_a_bad_tokenizer_json_is_one_line_naming_it(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(StepperError, match=r"tokenizer.json: not a tokenizer.json the tokenizers library can read"):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------------------------------------
# Kimi's tiktoken.model


def test_kimis_pattern_splits_as_its_tokenizer_code_does():
    import regex  # an independent engine (set intersection needs its V1 mode)

    splits = {  # worked out by hand from the pattern's alternatives
        "中文English混合": ["中文", "English", "混合"],
        "北京市 Pascal": ["北京市", " Pascal"],
        "I'm 12345 OK\n\n  x": ["I'm", " ", "123", "45", " OK", "\n\n", " ", " x"],
        "HELLO world!!\n": ["HELLO", " world", "!!\n"],
    }
    for prompt, expected in splits.items():
        assert regex.findall("(?V1)" + text.KIMI_PATTERN, prompt) == expected


def test_tiktoken_is_given_kimis_pattern(tmp_path):
    """Ranks trained on whole lines: without Kimi's pattern a token crosses from 文 to E."""
    prompt = "中文English混合"
    ranks = kimi_ranks(256 + 16, [prompt] * 10)  # 16 of the 18 merges that make the line one token
    write_tiktoken_model(tmp_path, ranks)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, KimiTiktoken)
    unsplit = tiktoken.Encoding("unsplit", pat_str=r"[^\n]+", mergeable_ranks=ranks, special_tokens={})
    assert boundaries(unsplit, unsplit.encode(prompt)).isdisjoint({len("中文".encode())})
    assert {len("中文".encode()), len("中文English".encode())} <= boundaries(tok.model, tok.encode(prompt))


def boundaries(encoding, ids) -> set[int]:
    ends, at = set(), 0
    for i in ids:
        at += len(encoding.decode_single_token_bytes(i))
        ends.add(at)
    return ends


@pytest.mark.parametrize("prompt", [*TEXTS, " " * 60_000 + "x", "y" * 30_000])
def test_tiktoken_model_round_trips(kimi_dir, prompt):
    tok = load_tokenizer(kimi_dir)
    ids = tok.encode(prompt)
    assert tok.decode(ids) == prompt
    assert all(0 <= i < 320 for i in ids)  # no BOS is added


def test_kimis_special_tokens_follow_the_ranks(kimi_dir):
    tok = load_tokenizer(kimi_dir)
    first = 320
    assert tok.encode("[BOS]hi<|im_end|>")[0] == first and tok.encode("[BOS]hi<|im_end|>")[-1] == first + 2
    assert [tok.piece(first + o) for o in KIMI_SPECIALS] == list(KIMI_SPECIALS.values())
    assert tok.encode(f"<|reserved_token_{first + 5}|>") == [first + 5]
    assert tok.model.n_vocab == first + 258 and tok.piece(first + 258) == "<unknown>"


def test_runs_are_cut_as_kimis_code_cuts_them():
    assert list(runs_cut("aaaaa   ", 2)) == ["aa", "aa", "a  ", " "]
    assert list(runs_cut("", 2)) == [""]
    pieces = list(runs_cut(" " * 60_000 + "x", text.KIMI_MAX_RUN))
    assert "".join(pieces) == " " * 60_000 + "x" and [len(p) for p in pieces] == [25_000, 25_000, 10_001]


@pytest.mark.parametrize("content, message", [
    ("aGVsbG8= 0\nnot-base64! 1\n", r"tiktoken.model: line 2: expected a base64 token and its rank"),
    ("aGVsbG8= 0\naGk= x\n", r"line 2: expected a base64 token and its rank"),
    ("aGVsbG8= 0\naGVsbG8= 1\n", r"line 2: token b'hello' is listed twice"),
    ("aGVsbG8= 0\naGk= 2\n", r"the ranks must be 0..1, each once"),
])
def test_a_bad_tiktoken_model_is_one_line_naming_the_line(tmp_path, content, message):
    (tmp_path / "tiktoken.model").write_text(content)
    with pytest.raises(StepperError, match=message):
        load_tokenizer(tmp_path)


def test_a_rewritten_tiktoken_model_is_read_afresh(tmp_path):
    """tiktoken's own loader would keep a copy by path; stepper reads the file each time."""
    write_tiktoken_model(tmp_path, kimi_ranks(300))
    assert load_tokenizer(tmp_path).model.n_vocab == 300 + 258
    write_tiktoken_model(tmp_path, kimi_ranks(280))
    assert load_tokenizer(tmp_path).model.n_vocab == 280 + 258


# ---------------------------------------------------------------------------------------------
# Missing pieces, and a run's tokens


def test_no_tokenizer_file_says_so(tmp_path):
    with pytest.raises(StepperError, match="no tokenizer.json or tiktoken.model, so --prompt cannot be tokenized"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("module, folder", [("tokenizers", "hf_dir"), ("tiktoken", "kimi_dir")])
def test_without_the_library_one_line_says_what_to_install(module, folder, request, monkeypatch):
    tokenizer_folder = request.getfixturevalue(folder)  # written with the library, whichever test asks first
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    with pytest.raises(StepperError, match=rf"needs the '{module}' library: pip install \"stepper\[text\]\""):
        load_tokenizer(tokenizer_folder)


def test_tokens_label_each_position_escaped(hf_dir):
    tok = load_tokenizer(hf_dir)
    tokens = Tokens(tok, tok.encode("hello world"))
    n = len(tokens.ids)
    tokens.feed(tok.encode("\n")[-1])
    assert tokens.labels()[0] == "<bos>" and tokens.labels()[-1] == "\\n"
    assert tokens.of_step("prefill", n) == range(n) and tokens.of_step("decode0", 1) == range(n, n + 1)
    assert tokens.numbered([n]) == [f"{n} \\n"]
    assert label(" a\x1b[2J") == "␣a\\x1b[2J"
