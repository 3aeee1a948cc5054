"""A character-level tokenizer with Qwen3's chat markers and ``<think>`` / ``</think>`` tokens.

The chat template ends the generation prompt with ``<think>`` (as Qwen3-2507 "Thinking" templates do), so
every response starts inside its chain of thought and closes it with ``</think>`` before the answer.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)

# the same model without thinking markers (an instruct-style template: the answer follows directly)
INSTRUCT_TEMPLATE = CHAT_TEMPLATE.replace("assistant\\n<think>\\n", "assistant\\n")

CHARACTERS = string.digits + string.ascii_letters + " \n+-*=?.,:()"


def build_tokenizer(with_think_tokens: bool = True) -> PreTrainedTokenizerFast:
    specials = [PAD, IM_START, IM_END] + ([THINK, END_THINK] if with_think_tokens else [])
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD, IM_START, IM_END])
    if with_think_tokens:
        tok.add_tokens([THINK, END_THINK])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token="[UNK]",
        chat_template=CHAT_TEMPLATE if with_think_tokens else INSTRUCT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
