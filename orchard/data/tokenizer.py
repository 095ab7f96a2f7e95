"""Tokenizers from a ``tokenizer.json`` or from a GGUF file's metadata, on HF ``tokenizers``.

Special tokens (``<|im_start|>``...) are never produced from text: :meth:`Tokenizer.encode` treats
them as plain characters, so user or tool text cannot forge a turn boundary. Chat formats insert
special tokens by id.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from typing import TypeVar

from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

GGUF_CONTROL = 3  # llama.cpp token type of control (special) tokens
S = TypeVar("S")


class Tokenizer:
    def __init__(self, backend: HFTokenizer, eos_token: str, bos_token: str | None = None) -> None:
        backend.encode_special_tokens = True  # text never turns into special tokens
        self.backend = backend
        self.eos_token = eos_token
        self.eos_id = self.token_id(eos_token)
        self.bos_id = self.token_id(bos_token) if bos_token else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text; special-token strings inside it are not special."""
        return self.backend.encode(text, add_special_tokens=False, is_pretokenized=False).ids if text else []

    def encode_with_sources(self, pieces: Sequence[tuple[str, S]]) -> tuple[list[int], list[S]]:
        """Encode the pieces' concatenation in one pass, as a whole-string tokeniser would, and tag
        each token with the label of the piece its first character is in."""
        text = "".join(piece for piece, _ in pieces)
        if not text:
            return [], []
        encoding = self.backend.encode(text, add_special_tokens=False)
        ends = list(itertools.accumulate(len(piece) for piece, _ in pieces))
        labels = [pieces[min(bisect.bisect_right(ends, start), len(pieces) - 1)][1] for start, _ in encoding.offsets]
        return encoding.ids, labels

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @classmethod
    def from_file(cls, path: str, eos_token: str) -> Tokenizer:
        """Load a ``tokenizer.json``."""
        return cls(HFTokenizer.from_file(path), eos_token)

    @classmethod
    def from_pretrained(cls, path: str) -> Tokenizer:
        """The tokenizer of a model: a ``.gguf`` file, or an HF directory's ``tokenizer.json`` with
        the end-of-sequence token named in its ``tokenizer_config.json``."""
        if path.endswith(".gguf"):
            return cls.from_gguf(path)
        with open(os.path.join(path, "tokenizer_config.json")) as handle:
            eos = json.load(handle)["eos_token"]
        return cls.from_file(os.path.join(path, "tokenizer.json"), eos["content"] if isinstance(eos, dict) else eos)

    def save_pretrained(self, path: str) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` naming the end-of-sequence token,
        which is what :meth:`from_pretrained`, transformers and vLLM read."""
        os.makedirs(path, exist_ok=True)
        encode_special = self.backend.encode_special_tokens
        self.backend.encode_special_tokens = False  # the saved file keeps the library default
        try:
            self.backend.save(os.path.join(path, "tokenizer.json"))
        finally:
            self.backend.encode_special_tokens = encode_special
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token,
                  "bos_token": self.backend.id_to_token(self.bos_id) if self.bos_id is not None else None,
                  "add_bos_token": False, "clean_up_tokenization_spaces": False}
        with open(os.path.join(path, "tokenizer_config.json"), "w") as handle:
            json.dump(config, handle, indent=2)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int,
              special_tokens: Sequence[str] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
              eos_token: str = "<|im_end|>", split_digits: bool = False) -> Tokenizer:
        """A byte-level BPE of ``vocab_size`` tokens learnt from ``texts``, with GPT-2's
        pre-tokenisation (as SmolLM2 and Qwen use) and every byte in the base alphabet, so any text
        encodes. For models trained from scratch on a narrow domain: a 2K vocabulary makes the output
        layer, which dominates a tiny model's compute, 24x cheaper than SmolLM2's 49K.

        ``split_digits`` makes every digit its own token, as Llama's and Qwen's tokenizers do: a number
        is then copied digit by digit, and a constant the training text never held (``27``) is as
        writable as one it did, where a merged ``27`` would be a token the model never learnt."""
        backend = HFTokenizer(models.BPE())
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                                 if split_digits else byte_level)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(texts, trainer)
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special_tokens])
        return cls(backend, eos_token=eos_token)

    @classmethod
    def from_gguf(cls, path: str) -> Tokenizer:
        """Build a byte-level BPE tokenizer from GGUF metadata (``tokenizer.ggml.model == "gpt2"``)."""
        from orchard.models.gguf import read_gguf

        fields = read_gguf(path).fields

        def field(key: str):
            return fields[key].contents() if key in fields else None

        if field("tokenizer.ggml.model") != "gpt2":
            raise ValueError(f"GGUF tokenizer {field('tokenizer.ggml.model')!r} is not supported (only 'gpt2' BPE)")
        tokens: list[str] = field("tokenizer.ggml.tokens")
        merges = [tuple(merge.split(" ", 1)) for merge in field("tokenizer.ggml.merges")]
        backend = HFTokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        token_types = field("tokenizer.ggml.token_type") or []
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, kind in enumerate(token_types) if kind == GGUF_CONTROL])
        eos, bos = field("tokenizer.ggml.eos_token_id"), field("tokenizer.ggml.bos_token_id")
        return cls(backend, eos_token=tokens[eos], bos_token=tokens[bos] if bos is not None else None)
