"""A local Hugging Face tokenizer for the peers, built at run time (no hub here).

guidellm and aiperf both insist on a Hugging Face tokenizer to size their
synthetic prompts. This trains a small byte-level BPE (8,000 tokens) on the
Python standard library's own sources with the ``tokenizers`` package and
writes ``tokenizer.json`` plus a ``tokenizer_config.json`` that
``transformers.AutoTokenizer`` loads as a ``PreTrainedTokenizerFast``. Nothing
binary is committed; a build takes a few seconds.

    python bench/client_overhead/tokenizer.py DIR
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>"]


def build_tokenizer(out: Path, *, vocab_size: int = 8000, files: int = 200) -> Path:
    """Train and save the tokenizer into ``out``; returns ``out``.

    Raises ImportError when the ``tokenizers`` package is missing.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [str(p) for p in sorted(stdlib.glob("*.py"))[:files]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train(sources, trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 1_000_000}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: tokenizer.py DIR", file=sys.stderr)
        sys.exit(2)
    print(build_tokenizer(Path(sys.argv[1])))
