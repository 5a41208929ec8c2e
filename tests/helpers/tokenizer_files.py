"""Small tokenizers written for the tests: a byte-level BPE tokenizer.json (tokenizers' own
trainer, with a BOS added by its post-processor) and a Kimi-style tiktoken.model (tiktoken's
educational trainer) with a tokenizer_config.json naming three special tokens."""

import base64
import json
from pathlib import Path

CORPUS = ["hello world, the fox jumps over the lazy dog", "the layer routes each token to a few experts",
          "attention over the latent cache", "中文English混合 你好世界"] * 20
KIMI_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>"}  # offsets after the ranked tokens


def write_tokenizer_json(folder: Path, vocab_size: int = 400) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def kimi_ranks(vocab_size: int = 320, corpus: list[str] = CORPUS) -> dict[bytes, int]:
    """Ranks trained without splitting a line (so merges cross what Kimi's pattern splits)."""
    from tiktoken._educational import bpe_train

    return bpe_train("\n".join(corpus), vocab_size, r"[^\n]+", visualise=None)


def write_tiktoken_model(folder: Path, ranks: dict[bytes, int] | None = None) -> Path:
    ranks = kimi_ranks() if ranks is None else ranks
    path = folder / "tiktoken.model"
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token,
             rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("\n".join(lines) + "\n")
    added = {str(len(ranks) + offset): {"content": name, "special": True} for offset, name in KIMI_SPECIALS.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added, "bos_token": "[BOS]"}))
    return path
