"""A tiny Hugging Face tokenizer built locally (no download) and conversations for Megatron's SFT path.

The tokenizer is a ``tokenizers`` WordLevel model (whitespace split, one id per word) wrapped in
``transformers.PreTrainedTokenizerFast`` and saved to a folder: what ``--tokenizer-type SFTTokenizer
--tokenizer-model DIR`` loads with ``AutoTokenizer``. Megatron's ``nemotron-h-aligned`` prompt format
brings its own chat template and marks turns with ``<SPECIAL_10>`` (system) and ``<SPECIAL_11>``
(user, assistant); ``<SPECIAL_233>`` is its pad token.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("<unk>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>", "</s>",
         "System", "User", "Assistant", "be", "brief", "hi", "hello", "what", "is", "two", "plus", "four",
         "thanks", "bye", "one", "three", "yes", "no", "maybe", "ok")
"""The vocabulary: word ``WORDS[i]`` has id ``i``."""
PROMPT_FORMAT = "nemotron-h-aligned"


def build_tokenizer_folder(folder: Path) -> Path:
    """Save the tiny tokenizer to ``folder``; returns it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", eos_token="</s>",
                                   additional_special_tokens=["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>",
                                                              "<SPECIAL_233>"])
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(str(folder))
    return folder


def sft_args(folder: Path):
    """The flags Megatron's ``build_tokenizer`` reads for ``--tokenizer-type SFTTokenizer``."""
    from types import SimpleNamespace

    return SimpleNamespace(tokenizer_type="SFTTokenizer", tokenizer_model=str(folder),
                           sft_tokenizer_prompt_format=PROMPT_FORMAT, metadata_path=None, pad_vocab_size=False)


KNOWN = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus two"},
         {"role": "assistant", "content": "four"}, {"role": "user", "content": "thanks"},
         {"role": "assistant", "content": "bye"}]
"""A two-turn conversation whose tokens and mask the tests write out by hand."""
KNOWN_TOKENS = ["<SPECIAL_10>", "System", "be", "brief", "<SPECIAL_11>", "User", "what", "is", "two", "plus",
                "two", "<SPECIAL_11>", "Assistant", "four", "<SPECIAL_11>", "User", "thanks", "<SPECIAL_11>",
                "Assistant", "bye"]
"""What the nemotron-h-aligned template makes of ``KNOWN`` (the user turn ends with the assistant prefix)."""
KNOWN_MASK = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
"""Per position (input ``KNOWN_TOKENS[j]`` predicting ``KNOWN_TOKENS[j + 1]``): trained only where the next
token is the assistant's answer: ``four`` (after ``Assistant``, position 12) and ``bye`` (position 18)."""

_ANSWERS = ("yes", "no", "maybe", "ok four", "one two three", "hello hi")
_QUESTIONS = ("hi", "what is one plus one", "is two four", "what is three", "hello", "thanks")


def conversation(i: int) -> list[dict[str, str]]:
    """Conversation ``i`` of a deterministic set: a system turn and one to three question/answer turns."""
    turns = [{"role": "system", "content": "be brief" if i % 2 else "ok"}]
    for turn in range(1 + i % 3):
        turns.append({"role": "user", "content": _QUESTIONS[(i + turn) % len(_QUESTIONS)]})
        turns.append({"role": "assistant", "content": _ANSWERS[(2 * i + turn) % len(_ANSWERS)]})
    return turns


def write_conversations(path: Path, count: int, *, per_line: int = 1) -> Path:
    """``count`` conversations, ``per_line`` of them packed into each line's ``messages`` (as Megatron allows)."""
    lines = []
    for start in range(0, count, per_line):
        messages = [m for i in range(start, min(start + per_line, count)) for m in conversation(i)]
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines) + "\n")
    return path


def expected_mask(conv: list[dict[str, str]]) -> list[int]:
    """The mask of a conversation written out from the template's rule, word by word (independent of Megatron):
    a position is trained when the word it predicts belongs to an assistant answer."""
    trained = []
    for message in conv:
        words = message["content"].split()
        if message["role"] == "system":
            trained += [0] * (2 + len(words))                    # <SPECIAL_10> System words
        elif message["role"] == "user":
            trained += [0] * (2 + len(words) + 2)                # <SPECIAL_11> User words <SPECIAL_11> Assistant
        else:
            trained += [1] * len(words)
    return trained[1:]
