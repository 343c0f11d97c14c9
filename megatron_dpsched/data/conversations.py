"""Megatron's SFT conversation JSONL, one conversation per sample, masked as Megatron's ``SFTDataset`` masks it.

The file is what ``megatron.training.datasets.sft_dataset.SFTLowLevelDataset`` reads: one JSON object per
line with ``"messages"``, a list of ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``;
a line may hold several conversations back to back, each starting with a ``system`` message (split with
Megatron's own ``SFTDataset._split_conversations``). Each conversation is tokenized by Megatron's tokenizer
(``--tokenizer-type SFTTokenizer --tokenizer-model DIR --sft-tokenizer-prompt-format FORMAT``, built with
Megatron's ``build_tokenizer``) through its ``tokenize_conversation(..., return_target=True)``, the
function ``SFTDataset`` calls; the sample is ``tokens[:-1]`` predicting ``targets[1:]``, with
``loss_mask`` 0 where the target is ``-100`` (system and user turns, the assistant prefix) or the
tokenizer's pad id, exactly ``SFTDataset``'s rule. Unlike ``SFTDataset`` nothing is packed, padded or
truncated: the planner packs; a conversation longer than ``--seq-length`` is refused at start-up.

Lengths come from a cached length index (:mod:`.line_index`) whose kind names the prompt format and the
tokenizer files, so a changed tokenizer rebuilds it; building it tokenizes every conversation once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_dpsched.data.corpus import indexed_line_names, sample_tensors
from megatron_dpsched.data.line_index import IntArrayView, LineReader, line_number_at, open_index
from megatron_dpsched.data.no_loss import no_loss_notice
from megatron_dpsched.data.rows import trained_positions

SFT_TOKENIZER = "SFTTokenizer"
"""The ``--tokenizer-type`` whose ``tokenize_conversation`` masks prompts (Megatron 0.19)."""


@dataclass(frozen=True, kw_only=True)
class ConversationFormat:
    """How conversations become samples."""

    tokenizer: Any
    """Megatron's tokenizer (``build_tokenizer(args)`` with ``--tokenizer-type SFTTokenizer``)."""
    identity: str
    """What the token lengths depend on (prompt format, tokenizer files); part of the index's kind."""


def tokenizer_identity(tokenizer_model: str | Path, prompt_format: str) -> str:
    """The prompt format plus a hash of the tokenizer folder's file names, sizes and modification times."""
    folder = Path(tokenizer_model)
    files = sorted(folder.rglob("*")) if folder.is_dir() else [folder]
    digest = hashlib.sha1()
    for file in files:
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.relative_to(folder) if folder.is_dir() else file.name}:{stat.st_size}:"
                          f"{stat.st_mtime_ns};".encode())
    return f"{prompt_format}:{folder.resolve()}:{digest.hexdigest()[:16]}"


def sft_format_from_args(args: Any) -> ConversationFormat:
    """Megatron's tokenizer from its flags (``build_tokenizer``), for ``--sft`` conversation data."""
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    if args.tokenizer_type != SFT_TOKENIZER:
        raise ValueError(f"--sft conversation data needs --tokenizer-type {SFT_TOKENIZER} (Megatron's tokenizer "
                         f"that masks prompts by --sft-tokenizer-prompt-format); got {args.tokenizer_type}")
    if not args.tokenizer_model:
        raise ValueError("--sft conversation data needs --tokenizer-model (a Hugging Face tokenizer folder)")
    return ConversationFormat(tokenizer=build_tokenizer(args),
                              identity=tokenizer_identity(args.tokenizer_model, args.sft_tokenizer_prompt_format))


def split_conversations(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Megatron's ``SFTDataset._split_conversations`` (a new conversation at every system message)."""
    from megatron.training.datasets.sft_dataset import SFTDataset

    return SFTDataset._split_conversations(None, messages)


class ConversationJsonlDataset:
    """Map-style dataset of the conversations of a Megatron SFT JSONL file (see the module docstring)."""

    def __init__(self, path: str | Path, conversation_format: ConversationFormat) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"--data-path {self.path} does not exist")
        self.format = conversation_format
        tokenizer = conversation_format.tokenizer
        self.pad_ids = () if getattr(tokenizer, "pad", None) is None else (int(tokenizer.pad),)
        self.index = open_index(self.path, kind=f"sft-conversations-v1:{conversation_format.identity}",
                                measure=self._measure)
        if len(self.index) == 0:
            raise ValueError(f"--data-path {self.path} holds no conversations")
        self.lengths = IntArrayView(self.index.lengths)
        self.trained_tokens = IntArrayView(self.index.trained)
        """The loss tokens of each conversation (its assistant tokens; from the length index)."""
        self._reader = LineReader(self.path)

    def no_loss_notice(self) -> str | None:
        """The warning about the conversations with no loss token (no assistant turn), ``None`` if none."""
        return no_loss_notice(self.index.trained, source=str(self.path),
                              name=lambda ids: indexed_line_names(self.path, self.index, ids))

    def __len__(self) -> int:
        return len(self.index)

    def _conversations(self, line: bytes, number: int) -> list[list[dict[str, Any]]]:
        where = f"{self.path}:{number}"
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{where}: not a JSON object (truncated or corrupt line?): {error}") from None
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ValueError(f"{where}: expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}}")
        return split_conversations(messages)

    def _tokenize(self, conversation: list[dict[str, Any]], where: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            tokens, targets = self.format.tokenizer.tokenize_conversation(
                conversation, return_target=True, add_generation_prompt=False)
        except (ValueError, AssertionError, KeyError, IndexError) as error:
            raise ValueError(f"{where}: Megatron's tokenize_conversation refused it: {error}") from None
        tokens, targets = np.asarray(tokens, dtype=np.int64), np.asarray(targets, dtype=np.int64)
        if tokens.size < 2:
            raise ValueError(f"{where}: a conversation of {tokens.size} tokens has nothing to predict")
        return tokens, targets

    def _measure(self, line: bytes, number: int) -> list[tuple[int, int]]:
        measured = []
        for conversation in self._conversations(line, number):
            tokens, targets = self._tokenize(conversation, f"{self.path}:{number}")
            measured.append((tokens.size - 1, trained_positions(tokens, targets, pad_ids=self.pad_ids)))
        return measured

    def tokens_and_targets(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Megatron's ``(tokens, targets)`` of conversation ``index``."""
        offset, part = int(self.index.offsets[index]), int(self.index.parts[index])
        line = self._reader.read(offset)
        try:
            conversations = self._conversations(line, 0)
            return self._tokenize(conversations[part], f"{self.path}:0")
        except (ValueError, IndexError):
            number = line_number_at(self.path, offset)
            return self._tokenize(self._conversations(line, number)[part], f"{self.path}:{number}")

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, targets = self.tokens_and_targets(index)
        return sample_tensors(tokens, targets, pad_ids=self.pad_ids)
