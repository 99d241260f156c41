#!/usr/bin/env python3
"""Writes the model folders of this directory with transformers' own save_pretrained,
and expected.json: what transformers renders and tokenizes from each folder once it has
read it back with AutoTokenizer. The Rust side (infera-prompt, the engine sidecar that
serves the files, the gateway that fetches them) must read each layout as transformers
does.

The tokenizer is a small byte-level BPE built here (256 byte tokens, a few merges, the
ChatML special tokens), so every folder is a few kilobytes; the layouts are what matter:

  jinja/         one chat template, saved as chat_template.jinja (transformers >= 4.50)
  named/         named templates: default in chat_template.jinja, tool_use in
                 additional_chat_templates/tool_use.jinja
  config_list/   the older layout: named templates as a list in tokenizer_config.json
                 (save_pretrained(save_jinja_files=False))
  tiktoken/      no tokenizer.json: a tiktoken vocabulary (tiktoken.model, byte ranks),
                 as Kimi-style models ship, with tokenizer_config.json and
                 chat_template.jinja; written by this script (transformers has no writer
                 for it), rendered nowhere: the router cannot read it

    python3 make_layouts.py   # in a virtualenv of requirements.txt:
                              # testenv/venv layouts -r prompt/testdata/layouts/requirements.txt
"""

import base64
import json
import os
import shutil

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The default template: ChatML with a marker naming it, so a test tells which one rendered.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# transformers picks it for requests with tools (get_chat_template).
TOOL_USE_TEMPLATE = (
    "<|im_start|>system\n"
    "fixture tools: {{ tools | tojson }}<|im_end|>\n"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "fixture_lookup",
        "description": "Looks a fixture word up — «quoted», 東京 too",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}
CASES = {
    "plain": {
        "messages": [
            {"role": "system", "content": "You answer fixture questions."},
            {"role": "user", "content": "Name the fixture, please. 你好"},
        ]
    },
    "with_tools": {
        "messages": [{"role": "user", "content": "Look the fixture word up."}],
        "tools": [LOOKUP_TOOL],
    },
}


def byte_level_bpe() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "x"), ("f", "ix"), ("t", "u"),
                 ("r", "e"), ("tu", "re"), ("fix", "ture"), ("Ġ", "fixture")]:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    return tok


def wrapped(chat_template) -> PreTrainedTokenizerFast:
    t = PreTrainedTokenizerFast(
        tokenizer_object=byte_level_bpe(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    t.chat_template = chat_template
    return t


def fresh(name: str) -> str:
    path = os.path.join(HERE, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def files_of(path: str) -> list:
    out = []
    for root, _, names in os.walk(path):
        for n in names:
            out.append(os.path.relpath(os.path.join(root, n), path))
    return sorted(out)


def main() -> None:
    layouts = {}
    wrapped(DEFAULT_TEMPLATE).save_pretrained(fresh("jinja"))
    named = {"default": DEFAULT_TEMPLATE, "tool_use": TOOL_USE_TEMPLATE}
    wrapped(named).save_pretrained(fresh("named"))
    wrapped(named).save_pretrained(fresh("config_list"), save_jinja_files=False)

    for name in ("jinja", "named", "config_list"):
        path = os.path.join(HERE, name)
        tok = AutoTokenizer.from_pretrained(path)
        rendered = {}
        for case, body in CASES.items():
            text = tok.apply_chat_template(
                body["messages"], tools=body.get("tools"), tokenize=False, add_generation_prompt=True
            )
            rendered[case] = {"text": text, "ids": tok.encode(text, add_special_tokens=False)}
        layouts[name] = {"files": files_of(path), "cases": rendered}

    # tiktoken: byte ranks, base64 token then rank per line (tiktoken's load_tiktoken_bpe).
    path = fresh("tiktoken")
    with open(os.path.join(path, "tiktoken.model"), "w", encoding="ascii") as f:
        for rank in range(256):
            f.write(f"{base64.b64encode(bytes([rank])).decode()} {rank}\n")
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "model_max_length": 4096}, f, indent=2)
        f.write("\n")
    with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(DEFAULT_TEMPLATE)
    layouts["tiktoken"] = {"files": files_of(path), "cases": {}}

    import tokenizers
    import transformers

    out = {
        "generator": "prompt/testdata/layouts/make_layouts.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cases": CASES,
        "layouts": layouts,
    }
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
