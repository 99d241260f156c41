#!/usr/bin/env python3
"""Writes tokenizer_vectors.json: the tokenizer canary's UTF-8 bytes and the
tokenizer digest rule computed with hashlib, independently of the Rust code.

Digest of one file: sha256(bytes)[:16 hex]. Of a directory: sha256 over the
tokenizer files sorted by name, each contributing name || 0x00 || bytes || 0x00 0x00.
Run from this folder: python3 make_tokenizer_vectors.py
"""
import hashlib
import json

CANARY = "Hello, world!\n你好，世界！<|im_start|>system\n<|endoftext|><|im_end|>🦄"
TOKENIZER_FILES = {
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model",
    "vocab.json", "vocab.txt", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "spiece.model", "sentencepiece.bpe.model",
}


def is_tokenizer_file(name):
    n = name.lower()
    return n in TOKENIZER_FILES or n.endswith(".tiktoken") or (
        n.startswith("tokeniz") and n.endswith(".py"))


def directory_digest(files):
    h = hashlib.sha256()
    for name, content in sorted(f for f in files if is_tokenizer_file(f[0])):
        h.update(name.encode() + b"\x00" + content.encode() + b"\x00\x00")
    return h.hexdigest()[:16]


FILE = '{"version":"1.0","model":{"type":"BPE"}}'
DIR = [
    ["tokenizer.json", FILE],
    ["tokenizer_config.json", '{"chat_template":"{{ messages }}"}'],
    ["merges.txt", "a b\nab c\n"],
    ["config.json", '{"hidden_size": 8}'],
    ["tokenization_fixture.py", "# fixture\n"],
]

if __name__ == "__main__":
    out = {
        "canary_utf8_hex": CANARY.encode("utf-8").hex(),
        "file_digest": {"content": FILE, "digest": hashlib.sha256(FILE.encode()).hexdigest()[:16]},
        "directory_digest": {"files": DIR, "digest": directory_digest(DIR)},
    }
    with open("tokenizer_vectors.json", "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
