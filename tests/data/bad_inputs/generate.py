"""Writes the bad-input corpus (*.jsonl beside this file) that tests/test_bad_inputs.py runs.

    python tests/data/bad_inputs/generate.py

The JSONL files are the corpus (edit them by hand or here); this script only saves typing the
combinations: every numeric option x {zero, negative, NaN, infinity, text, huge}, every config.json
field x wrong types and ranges, broken input files for every command that reads one.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

HERE = Path(__file__).parent
B64 = lambda b: "b64:" + base64.b64encode(b).decode()      # noqa: E731

BAD_INT = {"zero": "0", "negative": "-1", "text": "abc", "float": "1.5", "huge": "99999999999999999999",
           "empty": "", "nan": "nan"}
BAD_FLOAT = {"nan": "nan", "inf": "inf", "-inf": "-inf", "text": "abc", "empty": ""}

# Input files that are not texts: for every command reading a text / JSONL input.
BAD_TEXT_INPUTS = {
    "missing-file": (None, "no such file|does not exist"),
    "a-directory": ("DIR", "directory"),
    "empty-file": ("", "empty|no input"),
    "only-blank-lines": ("\n\n   \n", "empty|no input"),
    "invalid-utf8": (B64(b"caf\xe9 au lait\n"), "UTF-8"),
    "utf16-with-bom": (B64("hello world\n".encode("utf-16")), "UTF-8"),
    "binary-garbage": (B64(bytes(range(256)) * 4), "UTF-8"),
    "nul-bytes-only": (B64(b"\x00\x00\x00\n"), "EXIT0"),      # cleaned to an empty text: [CLS] [SEP]
}
BAD_JSONL = {
    "jsonl-not-json": ('{"text": "a"\n', "not valid JSON"),
    "jsonl-array-line": ('["text", "a"]\n', "object|text"),
    "jsonl-number-line": ("42\n", "object|text"),
    "jsonl-no-text": ('{"sentence": "a"}\n', "text"),
    "jsonl-text-null": ('{"text": null}\n', "text"),
    "jsonl-text-number": ('{"text": 5}\n', "text"),
    "jsonl-text-list": ('{"text": ["a", "b"]}\n', "text"),
    "jsonl-pair-number": ('{"text": "a", "text_pair": 3}\n', "text_pair"),
    "jsonl-pair-object": ('{"text": "a", "text_pair": {"x": 1}}\n', "text_pair"),
    "jsonl-second-line-bad": ('{"text": "a"}\n{"text": \n', ":2"),
    "jsonl-nan-literal": ('{"text": NaN}\n', "text|JSON"),
    "jsonl-lone-surrogate": ('{"text": "\\ud800"}\n', "surrogate|UTF|text"),
    "jsonl-deep-nesting": ('{"text": ' + "[" * 5000 + "]" * 5000 + "}\n", "text|JSON|deep"),
}

# config.json fields: (field, bad value, what the error must name)
CONFIG_FIELDS_INT = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"]
CONFIG_BAD_INT = {"string": "32", "float": 32.5, "bool": True, "zero": 0, "negative": -4, "list": [32],
                  "null": None, "huge": 10 ** 12}
CONFIG_FIELDS_FLOAT = ["hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "initializer_range",
                       "classifier_dropout"]
CONFIG_BAD_FLOAT = {"string": "0.1", "negative": -0.5, "bool": True, "list": [0.1], "above-one": 1.5}


def cases_cli() -> list[dict]:
    out = [
        {"id": "cli-no-arguments", "args": [], "exit": 2},
        {"id": "cli-unknown-command", "args": ["frobnicate"], "match": "invalid choice"},
        {"id": "cli-unknown-command-close", "args": ["fil-mask"], "match": "invalid choice"},
        {"id": "cli-only-verbose", "args": ["-v"], "exit": 2},
        {"id": "cli-unknown-global-flag", "args": ["--frobnicate", "info", "{model}"], "match": "unrecognized"},
        {"id": "cli-version", "args": ["--version"], "exit": 0},
        {"id": "cli-help", "args": ["--help"], "exit": 0},
        {"id": "cli-command-help", "args": ["embed", "--help"], "exit": 0},
        {"id": "cli-empty-string-command", "args": [""], "match": "invalid choice"},
        {"id": "cli-dash-command", "args": ["-"], "match": "invalid choice"},
        {"id": "cli-unicode-command", "args": ["ïnfo"], "match": "invalid choice"},
        {"id": "cli-double-dash", "args": ["--", "info"], "match": "invalid choice"},
    ]
    for cmd in ("info", "tokenize", "embed", "fill-mask", "score"):
        out.append({"id": f"cli-{cmd}-missing-required", "args": [cmd], "match": "required|arguments"})
        out.append({"id": f"cli-{cmd}-unknown-option", "args": [cmd, "--no-such-option", "1"],
                    "match": "unrecognized|required"})
    return out


def cases_info() -> list[dict]:
    out = [
        {"id": "info-missing-folder", "args": ["info", "{tmp}/nope"], "match": "no such directory"},
        {"id": "info-file-not-folder", "args": ["info", "{tmp}/f.txt"], "files": {"f.txt": "x"},
         "match": "not a directory"},
        {"id": "info-empty-folder", "args": ["info", "{tmp}/d"], "files": {"d/.keep": ""}, "match": "config.json"},
        {"id": "info-no-weights", "args": ["info", "{m}"], "model": {"delete": ["model.safetensors"]},
         "match": "model.safetensors|pytorch_model.bin"},
        {"id": "info-no-config", "args": ["info", "{m}"], "model": {"delete": ["config.json"]}, "match": "config.json"},
        {"id": "info-config-not-json", "args": ["info", "{m}"], "model": {"files": {"config.json": "{hidden_size: 3"}},
         "match": "config.json"},
        {"id": "info-config-empty", "args": ["info", "{m}"], "model": {"files": {"config.json": ""}},
         "match": "config.json"},
        {"id": "info-config-a-list", "args": ["info", "{m}"], "model": {"files": {"config.json": [1, 2]}},
         "match": "config.json"},
        {"id": "info-config-a-string", "args": ["info", "{m}"], "model": {"files": {"config.json": "\"bert\""}},
         "match": "config.json"},
        {"id": "info-config-null", "args": ["info", "{m}"], "model": {"files": {"config.json": "null"}},
         "match": "config.json"},
        {"id": "info-config-binary", "args": ["info", "{m}"], "model": {"files": {"config.json": B64(b"\xff\xfe\x00")}},
         "match": "config.json"},
        {"id": "info-config-deep", "args": ["info", "{m}"],
         "model": {"files": {"config.json": "[" * 5000 + "]" * 5000}}, "match": "config.json"},
        {"id": "info-weights-truncated", "args": ["info", "{m}"], "model": {"files": {"model.safetensors": B64(b"\x08\x00")}},
         "match": "model.safetensors"},
        {"id": "info-weights-empty", "args": ["info", "{m}"], "model": {"files": {"model.safetensors": ""}},
         "match": "model.safetensors"},
        {"id": "info-weights-text", "args": ["info", "{m}"], "model": {"files": {"model.safetensors": "hello"}},
         "match": "model.safetensors"},
        {"id": "info-weights-bin-garbage", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"], "files": {"pytorch_model.bin": "not a zip"}},
         "match": "pytorch_model.bin"},
        {"id": "info-index-not-json", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"], "files": {"model.safetensors.index.json": "{"}},
         "match": "index"},
        {"id": "info-index-no-weight-map", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"], "files": {"model.safetensors.index.json": {"metadata": {}}}},
         "match": "index"},
        {"id": "info-index-names-missing-shard", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"],
                   "files": {"model.safetensors.index.json": {"weight_map": {"a": "model-00001.safetensors"}}}},
         "match": "model-00001"},
        {"id": "info-index-path-escape", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"],
                   "files": {"model.safetensors.index.json": {"weight_map": {"a": "../../etc/passwd"}}}},
         "match": "index"},
        {"id": "info-index-weight-map-list", "args": ["info", "{m}"],
         "model": {"delete": ["model.safetensors"], "files": {"model.safetensors.index.json": {"weight_map": [1]}}},
         "match": "index"},
        {"id": "info-model-type-roberta", "args": ["info", "{m}"], "model": {"config": {"model_type": "roberta"}},
         "match": "model_type"},
        {"id": "info-model-type-number", "args": ["info", "{m}"], "model": {"config": {"model_type": 3}},
         "match": "model_type"},
        {"id": "info-position-embedding-relative", "args": ["info", "{m}"],
         "model": {"config": {"position_embedding_type": "relative_key"}}, "match": "position_embedding_type"},
        {"id": "info-is-decoder", "args": ["info", "{m}"], "model": {"config": {"is_decoder": True}},
         "match": "decoder"},
        {"id": "info-hidden-act-bogus", "args": ["info", "{m}"], "model": {"config": {"hidden_act": "swishy"}},
         "match": "hidden_act"},
        {"id": "info-hidden-act-number", "args": ["info", "{m}"], "model": {"config": {"hidden_act": 1}},
         "match": "hidden_act"},
        {"id": "info-hidden-act-dict", "args": ["info", "{m}"], "model": {"config": {"hidden_act": {"a": 1}}},
         "match": "hidden_act"},
        {"id": "info-heads-not-dividing", "args": ["info", "{m}"], "model": {"config": {"num_attention_heads": 3}},
         "match": "num_attention_heads|num_heads|divisible"},
        {"id": "info-architectures-string", "args": ["info", "{m}"],
         "model": {"config": {"architectures": "BertForMaskedLM"}}, "match": "architectures"},
        {"id": "info-architectures-numbers", "args": ["info", "{m}"], "model": {"config": {"architectures": [1]}},
         "match": "architectures"},
        {"id": "info-id2label-list", "args": ["info", "{m}"], "model": {"config": {"id2label": ["a", "b"]}},
         "match": "id2label"},
        {"id": "info-id2label-bad-keys", "args": ["info", "{m}"], "model": {"config": {"id2label": {"x": "a"}}},
         "match": "id2label"},
        {"id": "info-id2label-bad-values", "args": ["info", "{m}"], "model": {"config": {"id2label": {"0": 5}}},
         "match": "id2label"},
        {"id": "info-tie-word-embeddings-string", "args": ["info", "{m}"],
         "model": {"config": {"tie_word_embeddings": "yes"}}, "match": "tie_word_embeddings"},
        {"id": "info-bertkit-causal-string", "args": ["info", "{m}"], "model": {"config": {"bertkit_causal": "no"}},
         "match": "bertkit_causal"},
        {"id": "info-norm-position-bogus", "args": ["info", "{m}"],
         "model": {"config": {"bertkit_norm_position": "middle"}}, "match": "norm_position"},
        {"id": "info-pad-token-id-negative", "args": ["info", "{m}"], "model": {"config": {"pad_token_id": -3}},
         "match": "pad_token_id"},
        {"id": "info-pad-token-id-beyond-vocab", "args": ["info", "{m}"], "model": {"config": {"pad_token_id": 10 ** 6}},
         "match": "pad_token_id"},
        {"id": "info-pad-token-id-string", "args": ["info", "{m}"], "model": {"config": {"pad_token_id": "0"}},
         "match": "pad_token_id"},
        {"id": "info-problem-type-bogus", "args": ["info", "{m}"], "model": {"config": {"problem_type": "ranking"}},
         "match": "problem_type"},
        {"id": "info-vocab-size-mismatch", "args": ["info", "{m}"], "model": {"config": {"vocab_size": 500}},
         "match": "vocab_size"},
        {"id": "info-hidden-size-mismatch", "args": ["info", "{m}"],
         "model": {"config": {"hidden_size": 64, "intermediate_size": 64}}, "match": "shape|hidden"},
        {"id": "info-layers-more-than-weights", "args": ["info", "{m}"], "model": {"config": {"num_hidden_layers": 3}},
         "match": "missing|layer"},
        {"id": "info-layers-fewer-than-weights", "args": ["info", "{m}"], "model": {"config": {"num_hidden_layers": 1}},
         "match": "unexpected|layer|weights"},
        {"id": "info-json-flag-missing-model", "args": ["info", "--json", "{tmp}/nope"], "match": "no such"},
    ]
    for fld in CONFIG_FIELDS_INT:
        for name, value in CONFIG_BAD_INT.items():
            out.append({"id": f"info-config-{fld}-{name}", "args": ["info", "{m}"], "model": {"config": {fld: value}},
                        "match": fld})
    for fld in CONFIG_FIELDS_FLOAT:
        for name, value in CONFIG_BAD_FLOAT.items():
            if fld in ("layer_norm_eps", "initializer_range") and name == "above-one":
                continue                                   # large but legal
            out.append({"id": f"info-config-{fld}-{name}", "args": ["info", "{m}"], "model": {"config": {fld: value}},
                        "match": fld})
    out += [
        {"id": "info-config-layer_norm_eps-zero", "args": ["info", "{m}"], "model": {"config": {"layer_norm_eps": 0}},
         "match": "layer_norm_eps"},
        {"id": "info-config-dropout-nan-literal", "args": ["info", "{m}"],
         "model": {"files": {"config.json": '{"model_type": "bert", "vocab_size": 400, "hidden_dropout_prob": NaN}'}},
         "match": "hidden_dropout_prob"},
        {"id": "info-config-eps-infinity-literal", "args": ["info", "{m}"],
         "model": {"files": {"config.json": '{"model_type": "bert", "vocab_size": 400, "layer_norm_eps": Infinity}'}},
         "match": "layer_norm_eps"},
    ]
    # tokenizer files inside a checkpoint
    out += tokenizer_file_cases("info", ["info", "{m}"])
    return out


def tokenizer_file_cases(prefix: str, args: list[str]) -> list[dict]:
    """Broken tokenizer files in the model folder {m}. `info` describes such a checkpoint (exit 0)
    and names the problem on its tokenizer line, but refuses one with no tokenizer at all (what an
    interrupted save leaves); every other command stops with the error."""
    cases = _tokenizer_file_cases(prefix, args)
    if prefix == "info":
        for c in cases:
            if c["id"].endswith("no-tokenizer-at-all"):
                c["match"] = "no vocab.txt or tokenizer.json"
                continue
            c["exit"] = 0
            c["out_match"] = ("warning .*tokenizer has" if c["id"].endswith("bigger-than-model")
                              else "tokenizer +.*(" + c.pop("match") + ")")
            c.pop("match", None)
    if prefix == "tokenize":              # a tokenizer alone: the model's size does not matter
        for c in cases:
            if c["id"].endswith("bigger-than-model"):
                c["exit"] = 0
                c.pop("match")
    return cases


def _tokenizer_file_cases(prefix: str, args: list[str]) -> list[dict]:
    return [
        {"id": f"{prefix}-vocab-empty", "args": args, "model": {"files": {"vocab.txt": ""}}, "match": "vocab"},
        {"id": f"{prefix}-vocab-binary", "args": args, "model": {"files": {"vocab.txt": B64(b"\xff\xfe\x80abc\n")}},
         "match": "vocab.txt"},
        {"id": f"{prefix}-vocab-no-specials", "args": args, "model": {"files": {"vocab.txt": "a\nb\nc\n"}},
         "match": "special"},
        {"id": f"{prefix}-no-tokenizer-at-all", "args": args,
         "model": {"delete": ["vocab.txt", "tokenizer.json"]}, "match": "vocab.txt|tokenizer"},
        {"id": f"{prefix}-tokenizer-json-broken", "args": args,
         "model": {"delete": ["vocab.txt"], "files": {"tokenizer.json": "{"}}, "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-list", "args": args,
         "model": {"delete": ["vocab.txt"], "files": {"tokenizer.json": [1]}}, "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-model-list", "args": args,
         "model": {"delete": ["vocab.txt"], "files": {"tokenizer.json": {"model": [1]}}}, "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-bpe", "args": args,
         "model": {"delete": ["vocab.txt"], "files": {"tokenizer.json": {"model": {"type": "BPE", "vocab": {}}}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-vocab-string-ids", "args": args,
         "model": {"delete": ["vocab.txt"], "tokenizer": {"model.vocab": {"[PAD]": "zero", "[UNK]": 1, "[CLS]": 2,
                                                                          "[SEP]": 3, "[MASK]": 4}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-vocab-negative-id", "args": args,
         "model": {"delete": ["vocab.txt"], "tokenizer": {"model.vocab": {"[PAD]": -1, "[UNK]": 1, "[CLS]": 2,
                                                                          "[SEP]": 3, "[MASK]": 4}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-vocab-duplicate-ids", "args": args,
         "model": {"delete": ["vocab.txt"], "tokenizer": {"model.vocab": {"[PAD]": 0, "[UNK]": 0, "[CLS]": 2,
                                                                          "[SEP]": 3, "[MASK]": 4}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-vocab-float-ids", "args": args,
         "model": {"delete": ["vocab.txt"], "tokenizer": {"model.vocab": {"[PAD]": 0.5, "[UNK]": 1, "[CLS]": 2,
                                                                          "[SEP]": 3, "[MASK]": 4}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-vocab-huge-id", "args": args,
         "model": {"delete": ["vocab.txt"], "tokenizer": {"model.vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2,
                                                                          "[SEP]": 3, "[MASK]": 10 ** 12}}},
         "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-lowercase-string", "args": args,
         "tokenizer_note": "normalizer flags must be booleans",
         "model": {"tokenizer": {"normalizer.lowercase": "no"}}, "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-json-strip-accents-number", "args": args,
         "model": {"tokenizer": {"normalizer.strip_accents": 3}}, "match": "tokenizer.json"},
        {"id": f"{prefix}-tokenizer-config-broken", "args": args,
         "model": {"files": {"tokenizer_config.json": "{"}}, "match": "tokenizer_config.json"},
        {"id": f"{prefix}-tokenizer-config-list", "args": args,
         "model": {"files": {"tokenizer_config.json": [1]}}, "match": "tokenizer_config.json"},
        {"id": f"{prefix}-tokenizer-config-lower-string", "args": args,
         "model": {"files": {"tokenizer_config.json": {"do_lower_case": "false"}}}, "match": "do_lower_case"},
        {"id": f"{prefix}-tokenizer-config-accents-string", "args": args,
         "model": {"files": {"tokenizer_config.json": {"strip_accents": "yes"}}}, "match": "strip_accents"},
        {"id": f"{prefix}-tokenizer-config-chinese-number", "args": args,
         "model": {"files": {"tokenizer_config.json": {"tokenize_chinese_chars": 2}}},
         "match": "tokenize_chinese_chars"},
        {"id": f"{prefix}-tokenizer-bigger-than-model", "args": args,
         "model": {"files": {"vocab.txt": "".join(f"t{i}\n" for i in range(1000)) + "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"}},
         "match": "vocab|tokenizer"},
    ]


def cases_text_inputs(cmd: str, model_key: str = "model") -> list[dict]:
    """The text-file and JSONL inputs of tokenize / embed."""
    out = []
    base = [cmd, "--model", "{" + model_key + "}"]
    for name, (content, match) in BAD_TEXT_INPUTS.items():
        case = {"id": f"{cmd}-input-{name}", "args": [*base, "{tmp}/in.txt"], "match": match}
        if content == "DIR":
            case["files"] = {"in.txt/.keep": ""}
        elif content is not None:
            case["files"] = {"in.txt": content}
        if match == "EXIT0":
            case.pop("match")
            case["exit"] = 0
        out.append(case)
    for name, (content, match) in BAD_JSONL.items():
        out.append({"id": f"{cmd}-{name}", "args": [*base, "{tmp}/in.jsonl"], "files": {"in.jsonl": content},
                    "match": match})
    out += [
        {"id": f"{cmd}-stdin-empty", "args": [*base, "-"], "stdin": "", "match": "empty|no input"},
        {"id": f"{cmd}-stdin-invalid-utf8", "args": [*base, "-"], "stdin": B64(b"\xff\xfe\xfd\n"), "match": "UTF-8"},
        {"id": f"{cmd}-model-missing", "args": [cmd, "--model", "{tmp}/nope", "{texts}"], "match": "nope"},
        {"id": f"{cmd}-model-is-a-file", "args": [cmd, "--model", "{texts}", "{texts}"], "match": "texts.txt"},
        {"id": f"{cmd}-model-empty-folder", "args": [cmd, "--model", "{tmp}/d", "{texts}"], "files": {"d/.keep": ""},
         "match": "vocab.txt|config.json|tokenizer"},
    ]
    for name, value in BAD_INT.items():
        case = {"id": f"{cmd}-max-length-{name}", "args": [*base, "--max-length", value, "{texts}"],
                "match": "max-length|max_length"}
        if name == "huge" and cmd == "tokenize":     # a tokenizer alone has no length limit
            case = {**case, "exit": 0}
            case.pop("match")
        out.append(case)
    out.append({"id": f"{cmd}-max-length-two", "args": [*base, "--max-length", "2", "{texts}"], "match": "max.length"})
    return out


def cases_tokenize() -> list[dict]:
    out = cases_text_inputs("tokenize", "tok")
    out += [
        {"id": "tokenize-jsonl-flag-on-text", "args": ["tokenize", "--model", "{tok}", "--jsonl", "{texts}"],
         "match": "JSON"},
        {"id": "tokenize-vocab-file-missing-specials", "args": ["tokenize", "--model", "{tmp}/v/vocab.txt", "{texts}"],
         "files": {"v/vocab.txt": "a\nb\n"}, "match": "special"},
    ]
    out += tokenizer_file_cases("tokenize", ["tokenize", "--model", "{m}", "{texts}"])
    return out


def cases_embed() -> list[dict]:
    out = cases_text_inputs("embed")
    base = ["embed", "--model", "{model}", "{texts}"]
    for name, value in BAD_INT.items():
        out.append({"id": f"embed-batch-size-{name}", "args": [*base, "--batch-size", value], "match": "batch.size"}
                   if name != "huge" else {"id": "embed-batch-size-huge", "args": [*base, "--batch-size", value],
                                           "exit": 0})
        if name != "zero":                              # --threads 0 = torch's default
            out.append({"id": f"embed-threads-{name}", "args": [*base, "--threads", value], "match": "threads"})
    out += [
        {"id": "embed-max-length-above-positions", "args": [*base, "--max-length", "100000"],
         "match": "max-length.*64|positions"},
        {"id": "embed-max-length-65", "args": [*base, "--max-length", "65"], "match": "max-length.*64|positions"},
        {"id": "embed-pooling-bogus", "args": [*base, "--pooling", "max"], "match": "pooling"},
        {"id": "embed-output-bad-suffix", "args": [*base, "--output", "{tmp}/out.csv"], "match": "output"},
        {"id": "embed-output-no-suffix", "args": [*base, "--output", "{tmp}/out"], "match": "output"},
        {"id": "embed-output-missing-folder", "args": [*base, "--output", "{tmp}/no/such/dir/out.jsonl"],
         "match": "out.jsonl|no/such|directory"},
        {"id": "embed-output-is-a-directory", "args": [*base, "--output", "{tmp}/o.jsonl"],
         "files": {"o.jsonl/.keep": ""}, "match": "o.jsonl"},
        {"id": "embed-output-npy-is-a-directory", "args": [*base, "--output", "{tmp}/o.npy"],
         "files": {"o.npy/.keep": ""}, "match": "o.npy"},
        {"id": "embed-pooling-none-npy", "args": [*base, "--pooling", "none", "--output", "{tmp}/o.npy"],
         "match": "pooling"},
        {"id": "embed-device-bogus", "args": [*base, "--device", "tpu"], "match": "device"},
        {"id": "embed-device-empty", "args": [*base, "--device", ""], "match": "device"},
        {"id": "embed-device-cuda-index-bogus", "args": [*base, "--device", "cuda:abc"], "match": "device"},
        {"id": "embed-device-negative-index", "args": [*base, "--device", "cpu:-1"], "match": "device"},
        {"id": "embed-output-left-on-bad-input",
         "args": ["embed", "--model", "{model}", "{tmp}/bad.jsonl", "--output", "{tmp}/o.jsonl"],
         "files": {"bad.jsonl": '{"text": "a"}\n{"text": 1}\n'}, "match": "bad.jsonl:2"},
        {"id": "embed-npy-left-on-bad-input",
         "args": ["embed", "--model", "{model}", "{tmp}/bad.jsonl", "--output", "{tmp}/o.npy"],
         "files": {"bad.jsonl": '{"text": "a"}\n{"text": 1}\n'}, "match": "bad.jsonl:2"},
        {"id": "embed-npy-on-missing-model",
         "args": ["embed", "--model", "{tmp}/nope", "{texts}", "--output", "{tmp}/o.npy"], "match": "nope"},
        {"id": "embed-model-config-heads-bad", "args": ["embed", "--model", "{m}", "{texts}"],
         "model": {"config": {"num_attention_heads": 0}}, "match": "num_attention_heads|num_heads"},
        {"id": "embed-model-weights-truncated", "args": ["embed", "--model", "{m}", "{texts}"],
         "model": {"files": {"model.safetensors": B64(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")}},
         "match": "model.safetensors"},
    ]
    out += tokenizer_file_cases("embed", ["embed", "--model", "{m}", "{texts}"])
    return out


def cases_fill_mask() -> list[dict]:
    base = ["fill-mask", "--model", "{model}"]
    out = [
        {"id": "fill-mask-no-mask", "args": [*base, "no mask here"], "match": "MASK"},
        {"id": "fill-mask-empty-text", "args": [*base, ""], "match": "MASK|empty"},
        {"id": "fill-mask-lowercase-mask", "args": [*base, "the [mask] of it"], "match": "MASK"},
        {"id": "fill-mask-mask-cut-by-length", "args": [*base, "word " * 200 + "[MASK]"], "match": "MASK|trunc"},
        {"id": "fill-mask-encoder-only", "args": ["fill-mask", "--model", "{encoder}", "a [MASK] b"],
         "match": "masked-LM|mlm|head"},
        {"id": "fill-mask-model-missing", "args": ["fill-mask", "--model", "{tmp}/nope", "a [MASK]"], "match": "nope"},
        {"id": "fill-mask-device-bogus", "args": [*base, "--device", "quantum", "a [MASK]"], "match": "device"},
        {"id": "fill-mask-device-cuda-unavailable", "args": [*base, "--device", "cuda:7", "a [MASK]"],
         "match": "cuda|device"},
        {"id": "fill-mask-no-text", "args": [*base], "match": "TEXT|required|arguments"},
        {"id": "fill-mask-second-text-no-mask", "args": [*base, "a [MASK]", "none here"], "match": "MASK"},
        {"id": "fill-mask-lone-surrogate", "args": [*base, "a [MASK] \udcff"], "match": "UTF|surrogate|text"},
    ]
    for name, value in BAD_INT.items():
        out.append({"id": f"fill-mask-top-k-{name}", "args": [*base, "--top-k", value, "a [MASK] b"],
                    "match": "top-k|top_k"} if name != "huge" else   # capped at the vocabulary
                   {"id": "fill-mask-top-k-huge", "args": [*base, "--top-k", value, "a [MASK] b"], "exit": 0,
                    "out_match": r"\[MASK\] 1: "})
    out += tokenizer_file_cases("fill-mask", ["fill-mask", "--model", "{m}", "a [MASK] b"])
    return out


SST2_REF = "sentence\tlabel\ngood film\t1\nbad film\t0\n"
SST2_PRED = '{"id": "0", "prediction": 1}\n{"id": "1", "prediction": 0}\n'
SQUAD_REF = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
    {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}


def cases_score() -> list[dict]:
    ok = {"ref.tsv": SST2_REF, "pred.jsonl": SST2_PRED}
    base = ["score", "--task", "sst2", "--references", "{tmp}/ref.tsv", "--predictions", "{tmp}/pred.jsonl"]
    out = [
        {"id": "score-task-unknown", "args": ["score", "--task", "imagenet", "--references", "{tmp}/ref.tsv",
                                              "--predictions", "{tmp}/pred.jsonl"], "files": ok, "match": "imagenet"},
        {"id": "score-predictions-missing", "args": base, "files": {"ref.tsv": SST2_REF}, "match": "pred.jsonl"},
        {"id": "score-references-missing", "args": base, "files": {"pred.jsonl": SST2_PRED}, "match": "ref.tsv"},
        {"id": "score-predictions-dir", "args": base, "files": {"ref.tsv": SST2_REF, "pred.jsonl/.keep": ""},
         "match": "pred.jsonl"},
        {"id": "score-references-dir", "args": base, "files": {"pred.jsonl": SST2_PRED, "ref.tsv/.keep": ""},
         "match": "ref.tsv"},
        {"id": "score-predictions-empty", "args": base, "files": {"ref.tsv": SST2_REF, "pred.jsonl": ""},
         "match": "pred.jsonl"},
        {"id": "score-references-empty", "args": base, "files": {"ref.tsv": "", "pred.jsonl": SST2_PRED},
         "match": "ref.tsv"},
        {"id": "score-references-header-only", "args": base, "files": {"ref.tsv": "sentence\tlabel\n",
                                                                       "pred.jsonl": SST2_PRED}, "match": "ref.tsv"},
        {"id": "score-predictions-not-json", "args": base, "files": {"ref.tsv": SST2_REF, "pred.jsonl": "{\n"},
         "match": "pred.jsonl"},
        {"id": "score-predictions-nested-100000-deep", "args": base, "match": "pred.jsonl:1.*nested too deeply",
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0", "prediction": ' + "[" * 100000 + "]" * 100000 + "}\n"}},
        {"id": "score-null-odds-nested-100000-deep", "args": [*base, "--null-odds", "{tmp}/odds.json"],
         "match": "odds.json.*nested too deeply|null-odds",
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": SST2_PRED, "odds.json": "[" * 100000 + "]" * 100000}},
        {"id": "score-predictions-binary", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": B64(b"\xff\xfe\x00\x01")}, "match": "pred.jsonl"},
        {"id": "score-references-binary", "args": base,
         "files": {"ref.tsv": B64(b"\xff\xfe\x00\x01"), "pred.jsonl": SST2_PRED}, "match": "ref.tsv"},
        {"id": "score-predictions-no-id", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"prediction": 1}\n'}, "match": "pred.jsonl"},
        {"id": "score-predictions-no-prediction", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0"}\n'}, "match": "pred.jsonl"},
        {"id": "score-predictions-label-unknown", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0", "prediction": 7}\n{"id": "1", "prediction": 0}\n'},
         "match": "pred.jsonl|label"},
        {"id": "score-predictions-label-list", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0", "prediction": [1]}\n{"id": "1", "prediction": 0}\n'},
         "match": "pred.jsonl|prediction"},
        {"id": "score-predictions-missing-one", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0", "prediction": 1}\n'}, "match": "no prediction"},
        {"id": "score-predictions-ids-unknown", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "x", "prediction": 1}\n'}, "match": "id"},
        {"id": "score-predictions-duplicate-ids", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": SST2_PRED + '{"id": "0", "prediction": 0}\n'},
         "match": "duplicate|twice|again|more than once"},
        {"id": "score-predictions-nan", "args": base,
         "files": {"ref.tsv": SST2_REF, "pred.jsonl": '{"id": "0", "prediction": NaN}\n{"id": "1", "prediction": 0}\n'},
         "match": "pred.jsonl|NaN|prediction"},
        {"id": "score-references-missing-label-column", "args": base,
         "files": {"ref.tsv": "sentence\nx\ny\n", "pred.jsonl": SST2_PRED}, "match": "ref.tsv|label"},
        {"id": "score-references-bad-label", "args": base,
         "files": {"ref.tsv": "sentence\tlabel\ngood\tmaybe\nbad\t0\n", "pred.jsonl": SST2_PRED}, "match": "ref.tsv"},
        {"id": "score-references-short-row", "args": base,
         "files": {"ref.tsv": "sentence\tlabel\ngood\nbad\t0\n", "pred.jsonl": SST2_PRED}, "match": "ref.tsv"},
        {"id": "score-references-gz-not-gzip", "args": ["score", "--task", "sst2", "--references", "{tmp}/ref.tsv.gz",
                                                        "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.tsv.gz": SST2_REF, "pred.jsonl": SST2_PRED}, "match": "ref.tsv.gz"},
        {"id": "score-predictions-gz-not-gzip", "args": ["score", "--task", "sst2", "--references", "{tmp}/ref.tsv",
                                                         "--predictions", "{tmp}/pred.jsonl.gz"],
         "files": {"ref.tsv": SST2_REF, "pred.jsonl.gz": SST2_PRED}, "match": "pred.jsonl.gz"},
        {"id": "score-stsb-prediction-string", "args": ["score", "--task", "stsb", "--references", "{tmp}/ref.tsv",
                                                        "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.tsv": "index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.0\n1\tc\td\t1.0\n",
                   "pred.jsonl": '{"id": "0", "prediction": "high"}\n{"id": "1", "prediction": 1.0}\n'},
         "match": "pred.jsonl|prediction|number"},
        {"id": "score-stsb-prediction-inf", "args": ["score", "--task", "stsb", "--references", "{tmp}/ref.tsv",
                                                     "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.tsv": "index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.0\n1\tc\td\t1.0\n",
                   "pred.jsonl": '{"id": "0", "prediction": Infinity}\n{"id": "1", "prediction": 1.0}\n'},
         "match": "pred.jsonl|prediction|finite"},
        {"id": "score-squad-refs-not-json", "args": ["score", "--task", "squad", "--references", "{tmp}/dev.json",
                                                     "--predictions", "{tmp}/p.json"],
         "files": {"dev.json": "{", "p.json": {"q1": "France"}}, "match": "dev.json"},
        {"id": "score-squad-refs-no-data", "args": ["score", "--task", "squad", "--references", "{tmp}/dev.json",
                                                    "--predictions", "{tmp}/p.json"],
         "files": {"dev.json": {"version": "1.1"}, "p.json": {"q1": "France"}}, "match": "dev.json"},
        {"id": "score-squad-refs-data-string", "args": ["score", "--task", "squad", "--references", "{tmp}/dev.json",
                                                        "--predictions", "{tmp}/p.json"],
         "files": {"dev.json": {"data": "x"}, "p.json": {"q1": "France"}}, "match": "dev.json"},
        {"id": "score-squad-prediction-number", "args": ["score", "--task", "squad", "--references", "{tmp}/dev.json",
                                                         "--predictions", "{tmp}/p.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"q1": 5}}, "match": "p.json"},
        {"id": "score-squad-no-matching-id", "args": ["score", "--task", "squad", "--references", "{tmp}/dev.json",
                                                      "--predictions", "{tmp}/p.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"zz": "France"}}, "match": "p.json|id"},
        {"id": "score-squad2-null-odds-missing", "args": ["score", "--task", "squad2", "--references",
                                                          "{tmp}/dev.json", "--predictions", "{tmp}/p.json",
                                                          "--null-odds", "{tmp}/odds.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"q1": "France"}}, "match": "odds.json"},
        {"id": "score-squad2-null-odds-not-json", "args": ["score", "--task", "squad2", "--references",
                                                           "{tmp}/dev.json", "--predictions", "{tmp}/p.json",
                                                           "--null-odds", "{tmp}/odds.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"q1": "France"}, "odds.json": "{"}, "match": "odds.json"},
        {"id": "score-squad2-null-odds-strings", "args": ["score", "--task", "squad2", "--references",
                                                          "{tmp}/dev.json", "--predictions", "{tmp}/p.json",
                                                          "--null-odds", "{tmp}/odds.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"q1": "France"}, "odds.json": {"q1": "high"}},
         "match": "odds.json"},
        {"id": "score-squad2-null-odds-list", "args": ["score", "--task", "squad2", "--references",
                                                       "{tmp}/dev.json", "--predictions", "{tmp}/p.json",
                                                       "--null-odds", "{tmp}/odds.json"],
         "files": {"dev.json": SQUAD_REF, "p.json": {"q1": "France"}, "odds.json": [0.5]}, "match": "odds.json"},
        {"id": "score-conll-refs-garbage", "args": ["score", "--task", "conll2003", "--references", "{tmp}/ref.txt",
                                                    "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.txt": "EU B-ORG\nrejects\n", "pred.jsonl": '{"id": "0", "prediction": ["B-ORG", "O"]}\n'},
         "match": "ref.txt"},
        {"id": "score-conll-pred-wrong-length", "args": ["score", "--task", "conll2003", "--references",
                                                         "{tmp}/ref.txt", "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.txt": "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n",
                   "pred.jsonl": '{"id": "0", "prediction": ["B-ORG"]}\n'}, "match": "pred.jsonl|tags|length"},
        {"id": "score-conll-pred-bad-tag", "args": ["score", "--task", "conll2003", "--references",
                                                    "{tmp}/ref.txt", "--predictions", "{tmp}/pred.jsonl"],
         "files": {"ref.txt": "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n",
                   "pred.jsonl": '{"id": "0", "prediction": [1, 2]}\n'}, "match": "pred.jsonl|tag"},
    ]
    for name, value in BAD_FLOAT.items():
        out.append({"id": f"score-na-prob-thresh-{name}", "args": [*base, "--na-prob-thresh", value], "files": ok,
                    "match": "na.prob.thresh"})
    return out


# ---- pretrain: config values (PretrainConfig.__post_init__ / _coerce) --------------------------------
PRETRAIN_KEYS_INT_POSITIVE = ["train.max_steps", "train.batch_size", "train.grad_accum", "train.keep_checkpoints",
                              "train.log_every", "train.max_bad_steps", "model.max_position_embeddings",
                              "model.num_layers", "model.hidden_size", "model.num_heads", "model.intermediate_size",
                              "train.long_batch_size"]
PRETRAIN_KEYS_INT_NONNEG = ["train.eval_every", "train.checkpoint_every", "train.threads", "train.seed"]
PRETRAIN_KEYS_FLOAT_UNIT = ["model.hidden_dropout", "model.attention_dropout"]      # [0, 1)
PRETRAIN_KEYS_FLOAT_NONNEG = ["optim.weight_decay", "optim.warmup", "optim.end_lr", "train.clip_norm",
                              "train.eval_minutes", "train.checkpoint_minutes"]
PRETRAIN_KEYS_FLOAT_POSITIVE = ["optim.lr", "optim.eps"]


def cases_pretrain() -> list[dict]:
    base = ["pretrain", "--out={tmp}/run", "--data.path={tmp}/no-data", "--train.progress=false"]

    def case(name, overrides, match, **kw):
        return {"id": f"pretrain-{name}", "args": [*base, *overrides], "match": match, **kw}

    out = []
    for key in PRETRAIN_KEYS_INT_POSITIVE:
        for name, value in {"zero": "0", "negative": "-3", "text": "abc", "float": "1.5", "bool": "true",
                            "list": "[1]", "null": "null"}.items():
            if name == "null" and key in ("model.num_layers", "model.hidden_size", "model.num_heads",
                                          "model.intermediate_size", "train.long_batch_size"):
                continue                                   # null = the preset's / the default rule
            out.append(case(f"{key}-{name}", [f"--{key}={value}"], key.replace(".", r"\.")))
    for key in PRETRAIN_KEYS_INT_NONNEG:
        for name, value in {"negative": "-1", "text": "abc", "float": "2.5", "nan": ".nan"}.items():
            out.append(case(f"{key}-{name}", [f"--{key}={value}"], key.replace(".", r"\.")))
    out.append(case("train.seed-huge", ["--train.seed=99999999999999999999"], r"train\.seed"))
    for key in PRETRAIN_KEYS_FLOAT_UNIT:
        for name, value in {"negative": "-0.1", "one": "1.0", "above": "1.5", "nan": "nan", "inf": "inf",
                            "text": "abc"}.items():
            out.append(case(f"{key}-{name}", [f"--{key}={value}"], key.replace(".", r"\.")))
    for key in PRETRAIN_KEYS_FLOAT_NONNEG:
        for name, value in {"negative": "-0.5", "nan": "nan", "inf": "inf", "-inf": "-inf", "text": "abc"}.items():
            out.append(case(f"{key}-{name}", [f"--{key}={value}"], key.replace(".", r"\.")))
    for key in PRETRAIN_KEYS_FLOAT_POSITIVE:
        for name, value in {"zero": "0", "negative": "-1e-4", "nan": "nan", "inf": "inf", "yaml-nan": ".nan",
                            "yaml-inf": ".inf", "text": "fast", "list": "[1e-4]"}.items():
            out.append(case(f"{key}-{name}", [f"--{key}={value}"], key.replace(".", r"\.")))
    out += [
        case("optim.betas-one", ["--optim.betas=[0.9, 1.0]"], r"optim\.betas"),
        case("optim.betas-negative", ["--optim.betas=[-0.1, 0.999]"], r"optim\.betas"),
        case("optim.betas-nan", ["--optim.betas=[.nan, 0.999]"], r"optim\.betas"),
        case("optim.betas-three", ["--optim.betas=[0.9, 0.99, 0.999]"], r"optim\.betas"),
        case("optim.betas-scalar", ["--optim.betas=0.9"], r"optim\.betas"),
        case("optim.betas-strings", ["--optim.betas=[a, b]"], r"optim\.betas"),
        case("optim.decay_fraction-above", ["--optim.decay_fraction=1.5"], r"optim\.decay_fraction"),
        case("optim.decay_fraction-negative", ["--optim.decay_fraction=-0.1"], r"optim\.decay_fraction"),
        case("optim.decay_fraction-nan", ["--optim.decay_fraction=nan"], r"optim\.decay_fraction"),
        case("optim.end_lr-above-lr", ["--optim.lr=1e-4", "--optim.end_lr=1e-3"], r"optim\.end_lr"),
        case("optim.optimizer-bogus", ["--optim.optimizer=sgd"], r"optim\.optimizer"),
        case("optim.schedule-bogus", ["--optim.schedule=step"], r"optim\.schedule"),
        case("optim.warmup-steps-beyond-run", ["--optim.warmup=5000", "--train.max_steps=100"], r"optim\.warmup"),
        case("model.preset-bogus", ["--model.preset=gigantic"], r"model\.preset|gigantic"),
        case("model.hidden_act-bogus", ["--model.hidden_act=swishy"], r"model\.hidden_act|swishy"),
        case("model.heads-not-dividing", ["--model.hidden_size=100", "--model.num_heads=3"],
             r"model\.(hidden_size|num_heads)|divisible"),
        case("model.norm_position-bogus", ["--model.norm_position=middle"], r"model\.norm_position"),
        case("model.causal-string", ["--model.causal=maybe"], r"model\.causal"),
        case("train.precision-bogus", ["--train.precision=fp8"], r"train\.precision"),
        case("train.packed-bogus", ["--train.packed=maybe"], r"train\.packed"),
        case("train.distributed-bogus", ["--train.distributed=horovod"], r"train\.distributed"),
        case("train.objective-bogus", ["--train.objective=t5"], r"train\.objective"),
        case("train.budget-text", ["--train.budget=soon"], r"train\.budget"),
        case("train.budget-negative", ["--train.budget=-5m"], r"train\.budget"),
        case("train.budget-zero", ["--train.budget=0s"], r"train\.budget"),
        case("train.budget-nan", ["--train.budget=nan"], r"train\.budget"),
        case("train.budget-number-negative", ["--train.budget=-30"], r"train\.budget"),
        case("train.long_fraction-one", ["--train.long_fraction=1"], r"train\.long_fraction"),
        case("train.long_fraction-nan", ["--train.long_fraction=nan"], r"train\.long_fraction"),
        case("train.nsp-string", ["--train.nsp=sometimes"], r"train\.nsp"),
        case("train.compile-number", ["--train.compile=2"], r"train\.compile"),
        case("unknown-key", ["--train.max_step=3"], r"train\.max_step"),
        case("unknown-section", ["--trian.max_steps=3"], r"trian"),
        case("section-as-value", ["--train=3"], r"train"),
        case("value-as-section", ["--out.x=3"], r"out"),
        case("override-without-value", ["--optim.lr"], r"optim\.lr"),
        case("override-not-a-key", ["--=3"], r"--=3|option"),
        case("config-file-missing", ["{tmp}/nope.yaml"], r"nope\.yaml"),
        case("config-file-not-yaml", ["{tmp}/c.yaml"], r"c\.yaml", files={"c.yaml": "train: [\n"}),
        case("config-file-a-list", ["{tmp}/c.yaml"], r"c\.yaml", files={"c.yaml": "- 1\n- 2\n"}),
        case("config-file-binary", ["{tmp}/c.yaml"], r"c\.yaml", files={"c.yaml": B64(b"\xff\xfe\x00\x01")}),
        case("config-file-a-directory", ["{tmp}/c.yaml"], r"c\.yaml", files={"c.yaml/.keep": ""}),
        case("config-file-python-tag", ["{tmp}/c.yaml"], r"c\.yaml",
             files={"c.yaml": "train: !!python/object/apply:os.getcwd []\n"}),
        case("config-file-unknown-key", ["{tmp}/c.yaml"], r"c\.yaml.*optim\.lrr",
             files={"c.yaml": "optim:\n  lrr: 0.1\n"}),
        case("config-file-lr-nan", ["{tmp}/c.yaml"], r"optim\.lr", files={"c.yaml": "optim:\n  lr: .nan\n"}),
        case("config-file-dropout-negative", ["{tmp}/c.yaml"], r"model\.hidden_dropout",
             files={"c.yaml": "model:\n  hidden_dropout: -0.2\n"}),
        case("config-file-section-a-list", ["{tmp}/c.yaml"], r"train", files={"c.yaml": "train: [1, 2]\n"}),
        case("config-file-deep", ["{tmp}/c.yaml"], r"c\.yaml", files={"c.yaml": "a: " + "[" * 10000 + "]" * 10000 + "\n"}),
        case("out-is-a-file", ["--out={tmp}/f"], r"f|out", files={"f": "x"}),
        {"id": "pretrain-out-is-a-file-real-data", "args": ["pretrain", "--out={tmp}/f", "--data.path={prep}",
                                                            "--train.progress=false"], "files": {"f": "x"},
         "match": "out .*f: a file"},
        {"id": "pretrain-positions-shorter-than-the-data", "match": r"max_position_embeddings is 32.*64 tokens",
         "args": ["pretrain", "--out={tmp}/run", "--data.path={prep}", "--model.preset=tiny",
                  "--model.max_position_embeddings=32", "--train.progress=false"]},
        {"id": "pretrain-model-larger-than-memory", "match": r"B parameters: ~[\d,.]+ GiB .* free",
         "args": ["pretrain", "{tmp}/big.yaml", "--out={tmp}/run", "--data.path={prep}", "--train.progress=false"],
         "files": {"big.yaml": "model: {preset: large, num_layers: 2000, hidden_size: 4096, num_heads: 16, "
                               "intermediate_size: 16384}\n"}},
        case("data-path-missing", [], r"no-data"),
    ]
    return out


# finetune: every number out of range, before anything is read or written
FINETUNE_BAD = {
    "train-limit": {"zero": "0", "negative": "-1"}, "dev-limit": {"zero": "0", "negative": "-1"},
    "lr": {"nan": "nan", "inf": "inf", "zero": "0", "negative": "-1e-3"}, "epochs": {"zero": "0", "inf": "inf"},
    "threads": {"negative": "-1", "huge": "99999"}, "seed": {"negative": "-1", "huge": str(2 ** 32)},
    "weight-decay": {"negative": "-1", "nan": "nan"}, "warmup": {"negative": "-1", "nan": "nan"},
    "eval-every": {"negative": "-1"}, "stride": {"zero": "0", "negative": "-2"},
    "max-length": {"zero": "0", "huge": "100000", "over-positions": "65"}, "batch-size": {"zero": "0"},
    "eval-batch-size": {"negative": "-4"}, "clip-norm": {"negative": "-1", "nan": "nan"},
    "dropout": {"one": "1", "negative": "-0.1"}, "layer-lr-decay": {"zero": "0"}, "log-every": {"zero": "0"},
    "device": {"bogus": "bogus", "cuda-text-index": "cuda:x"},
}
FINETUNE_YAML_BAD = {
    "train_limit-mapping": ("train_limit: {a: 1}\n", "train_limit"), "train_limit-list": ("train_limit: [1]\n", "train_limit"),
    "train_limit-zero": ("train_limit: 0\n", "train_limit"), "lr-text": ("lr: fast\n", "lr"),
    "section-list": ("train: [1, 2]\n", "train"), "seed-negative": ("seed: -1\n", "seed"),
}
BIG_VOCAB = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "".join(f"w{i}\n" for i in range(600))


def cases_finetune() -> list[dict]:
    base = ["finetune", "--task", "sst2", "--data", "{sst}", "--model", "{model}", "--out", "{tmp}/run",
            "--no-progress", "--threads", "1"]
    out = []
    for option, values in FINETUNE_BAD.items():
        for name, value in values.items():
            out.append({"id": f"finetune-{option}-{name}", "args": [*base, f"--{option}", value],
                        "match": option.replace("-", "[_-]")})
    for name, (text, match) in FINETUNE_YAML_BAD.items():
        out.append({"id": f"finetune-yaml-{name}", "args": ["finetune", "{tmp}/ft.yaml", *base[1:]],
                    "files": {"ft.yaml": text}, "match": match})
    out += [
        {"id": "finetune-tokenizer-larger-than-vocab", "args": [*base[:5], "--model", "{m}", *base[7:]],
         "model": {"delete": ["tokenizer.json"], "files": {"vocab.txt": BIG_VOCAB}}, "match": "605 ids.*400 embedding"},
        {"id": "finetune-data-missing-local-folder", "args": [*base[:4], "{tmp}/sts", *base[5:]], "match": "sts"},
        {"id": "finetune-data-missing-relative-folder", "args": [*base[:4], "glue/SST-2x", *base[5:]],
         "match": "SST-2x"},
        {"id": "finetune-model-missing", "args": [*base[:5], "--model", "{tmp}/nomodel", *base[7:]], "match": "nomodel"},
        {"id": "finetune-task-unknown", "args": ["finetune", "--task", "sst3", *base[3:]], "match": "did you mean 'sst2'"},
    ]
    seeds = {"text": ("a,b", "--seeds: 'a' is not an integer"), "float": ("0,1.5", "'1.5' is not an integer"),
             "duplicate": ("0,1,0", "seed 0 is given twice"), "empty": ("", "no seeds"), "commas": (",,", "no seeds"),
             "negative": ("0,-1", "--seeds: each seed must be an integer"), "huge": (str(2 ** 32), "integer in")}
    out += [{"id": f"finetune-seeds-{name}", "args": [*base, "--seeds", value], "match": match}
            for name, (value, match) in seeds.items()]
    out += [
        {"id": "finetune-seeds-and-seed", "args": [*base, "--seeds", "0,1", "--seed", "3"],
         "match": "give --seeds or --seed, not both"},
        {"id": "finetune-seeds-and-grid", "args": [*base, "--grid", "--seeds", "0,1"],
         "match": "give --seeds or --grid, not both"},
        {"id": "finetune-seeds-no-dev-file", "args": [*base[:3], "--train-file", "{sst}/train.tsv", *base[5:],
                                                      "--seeds", "0,1"], "match": "best seed on dev.*--dev-file"},
        {"id": "finetune-seeds-data-without-dev", "args": [*base[:4], "{tmp}/d", *base[5:], "--seeds", "0,1"],
         "files": {"d/train.tsv": "sentence\tlabel\na good speech\t1\na bad speech\t0\n"},
         "match": "best seed on dev.*dev.tsv"},
        {"id": "finetune-seeds-task-embedding", "args": [*base[:2], "embedding", *base[3:], "--seeds", "0,1"],
         "match": "--seeds: task embedding"},
        {"id": "finetune-seeds-out-holds-other-files", "args": [*base[:8], "{tmp}/other", *base[9:], "--seeds", "0"],
         "files": {"other/notes.txt": "mine"}, "match": "other: the folder holds other files"},
    ]
    return out


def cases_predict() -> list[dict]:
    """evaluate and predict on a fine-tuned checkpoint ({cls}) and a masked LM ({model})."""
    out = []
    bad = {"batch-size": {"zero": "0", "negative": "-1"}, "max-length": {"zero": "0", "negative": "-5",
           "huge": "100000", "over-positions": "65"}, "stride": {"zero": "0"}, "threads": {"negative": "-1"}}
    inputs = {"in.jsonl": '{"text": "a good speech"}\n', "mask.jsonl": '{"text": "the [MASK] of the people"}\n'}
    runs = {"evaluate": ["evaluate", "--model", "{cls}", "--data", "{sst}"],
            "predict": ["predict", "{tmp}/in.jsonl", "--model", "{cls}"],
            "predict-mlm": ["predict", "{tmp}/mask.jsonl", "--model", "{model}"]}
    for cmd, args in runs.items():
        for option, values in bad.items():
            for name, value in values.items():
                out.append({"id": f"{cmd}-{option}-{name}", "args": [*args, f"--{option}", value], "files": inputs,
                            "match": option.replace("-", ".")})       # the field's name, either spelling
    deep = '{"text": ' + "[" * 100000 + "]" * 100000 + "}\n"
    out += [
        {"id": "predict-top-k-zero", "args": [*runs["predict-mlm"], "--top-k", "0"], "files": inputs, "match": "top.k"},
        {"id": "predict-jsonl-nested-100000-deep", "args": ["predict", "{tmp}/deep.jsonl", "--model", "{cls}"],
         "files": {"deep.jsonl": deep}, "match": "deep.jsonl:1.*nested too deeply"},
        {"id": "predict-mlm-tokenizer-larger-than-vocab", "args": ["predict", "{tmp}/mask.jsonl", "--model", "{m}"],
         "files": inputs, "model": {"delete": ["tokenizer.json"], "files": {"vocab.txt": BIG_VOCAB}},
         "match": "605 ids.*400 embedding"},
        {"id": "evaluate-jsonl-nested-100000-deep", "args": ["evaluate", "--model", "{cls}", "--task", "classify",
                                                              "--data", "{tmp}/deep.jsonl"],
         "files": {"deep.jsonl": deep}, "match": "deep.jsonl:1.*nested too deeply"},
    ]
    return out


def cases_quickstart() -> list[dict]:
    """Every option checked before the vocabulary is trained: no folder is left behind."""
    base = ["quickstart", "--out", "{tmp}/qs"]
    bad = {"minutes": {"zero": "0", "negative": "-1", "tiny": "0.001", "nan": "nan", "inf": "inf", "text": "abc"},
           "seed": {"negative": "-1", "huge": str(2 ** 32)}, "threads": {"negative": "-1"},
           "updates": {"zero": "0", "negative": "-5"}, "precision": {"unknown": "fp64"}}
    out = [{"id": f"quickstart-{option}-{name}", "args": [*base, f"--{option}", value], "match": option}
           for option, values in bad.items() for name, value in values.items()]
    out += [{"id": "quickstart-unknown-option-did-you-mean", "args": [*base, "--minuts", "3"],
             "match": "did you mean --minutes"},
            {"id": "quickstart-out-is-a-file", "args": ["quickstart", "--out", "{tmp}/f"], "files": {"f": "x"},
             "match": "--out .*f: a file"}]
    return out


def cases_serve_export() -> list[dict]:
    """Options refused before a model loads or a file is written."""
    serve = ["serve", "--model", "{model}", "--port", "1"]
    export = ["export", "onnx", "--model", "{model}", "--out", "{tmp}/m.onnx"]
    return [
        {"id": "serve-device-bogus", "args": [*serve, "--device", "bogus"], "match": "--device 'bogus'"},
        {"id": "serve-device-bad-index", "args": [*serve, "--device", "cuda:x"], "match": "--device 'cuda:x'"},
        {"id": "serve-device-unknown-type", "args": [*serve, "--device", "tpu"], "match": "--device 'tpu'"},
        {"id": "export-opset-is-fixed", "args": [*export, "--opset", "17"], "match": "--opset is gone: the file is always ONNX opset 20"},
        {"id": "export-threads-negative", "args": [*export, "--threads", "-1"], "match": "threads"},
        {"id": "export-min-cosine-nan", "args": [*export, "--min-cosine", "nan"], "match": "min.cosine"},
        {"id": "export-min-cosine-above-one", "args": [*export, "--min-cosine", "2"], "match": "min.cosine"},
        {"id": "export-max-abs-diff-negative", "args": [*export, "--max-abs-diff", "-1"], "match": "max.abs.diff"},
        {"id": "export-tokenizer-larger-than-vocab", "args": ["export", "onnx", "--model", "{m}", "--out", "{tmp}/o/m.onnx"],
         "model": {"delete": ["tokenizer.json"], "files": {"vocab.txt": BIG_VOCAB}}, "match": "605 ids.*400 embedding"},
    ]


def cases_tokenizer() -> list[dict]:
    """tokenizer train / stats on text with no words (a 5-piece vocabulary, or zeros, before), and their numbers."""
    empty = {"empty": "", "blank-lines": "\n\n   \n"}
    out = []
    for name, text in empty.items():
        out.append({"id": f"tokenizer-train-{name}", "args": ["tokenizer", "train", "{tmp}/in.txt", "--out",
                                                               "{tmp}/tok", "--vocab-size", "100"],
                    "files": {"in.txt": text}, "match": "in.txt: no words to learn a vocabulary from"})
        out.append({"id": f"tokenizer-stats-{name}", "args": ["tokenizer", "stats", "--model", "{tok}", "{tmp}/in.txt"],
                    "files": {"in.txt": text}, "match": "in.txt: no text to measure"})
    for option, value in (("--vocab-size", "0"), ("--vocab-size", "5"), ("--min-frequency", "-1")):
        out.append({"id": f"tokenizer-train{option}{value}", "match": option[2:].replace("-", "."),
                    "args": ["tokenizer", "train", "{texts}", "--out", "{tmp}/tok", option, value]})
    for option, value in (("--max-length", "0"), ("--max-sentences", "0"), ("--max-sentences", "-1")):
        out.append({"id": f"tokenizer-stats{option}{value}", "match": option[2:].replace("-", "."),
                    "args": ["tokenizer", "stats", "--model", "{tok}", "{texts}", option, value]})
    out.append({"id": "data-show-start-beyond-the-data", "args": ["data", "show", "{prep}", "--start", "99999999"],
                "match": r"--start 99999999: .*prep holds \d+ instances"})          # printed nothing, exit 0
    return out


def groups() -> dict[str, list[dict]]:
    """Each JSONL file's cases, by file name (tests/test_bad_inputs.py checks the files are these)."""
    return {"cli": cases_cli(), "info": cases_info(), "tokenize": cases_tokenize(), "embed": cases_embed(),
            "fill_mask": cases_fill_mask(), "score": cases_score(), "pretrain_config": cases_pretrain(),
            "finetune": cases_finetune(), "predict": cases_predict(), "quickstart": cases_quickstart(),
            "serve_export": cases_serve_export(), "tokenizer": cases_tokenizer()}


def main() -> None:
    total = 0
    for name, cases in groups().items():
        lines = [json.dumps(c) for c in cases]
        (HERE / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        total += len(cases)
        print(f"{name}: {len(cases)} cases")
    print(f"total {total}")


if __name__ == "__main__":
    main()
