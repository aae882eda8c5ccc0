"""Mutation fuzzing of ``mdsl-opt`` and ``mdsl-run``, in process (issue 13 item 3).

The seeds are the std models (``modeldsl/std/**/*.module``), the FileCheck
inputs (``tests/filecheck/**/*.mlir`` and ``*.module``), the DSL blocks of
the spec (``docs/spec/module-dsl.txt``) and the tiny checkpoint
(``examples/tiny_llama``). A :class:`Case` is one seed with a few mutations
(lines, characters, tokens, numbers, splices from other seeds, truncation,
byte flips; for JSON: types, keys, values, nesting; for safetensors: the
header's length, entries, shapes, offsets, NaN/Inf weights, extra shards),
or a seed with random pass pipelines or tool flags, written to a folder of
its own and run through the tool's ``main`` with stdout and stderr captured,
a SIGALRM time bound and a cap on the address space. An :class:`Outcome`
says whether the run reached the catch-all (``internal``: ``MDSL_DEBUG=1``
makes the tools re-raise, so the exception and where it came from are kept),
hung (``hang``), failed without a coded diagnostic (``uncoded``), let a numpy
RuntimeWarning through (``leak``), failed with a coded diagnostic
(``coded``) or succeeded (``ok``).

Cases are determined by ``(seed, index)`` and the seed files of the tree (a
new FileCheck input changes the draw); a campaign and a reproduction::

    nice -n 10 python tests/unit/fuzz_inputs.py --seed 1 --count 2000 --save /tmp/fuzz
    python tests/unit/fuzz_inputs.py --seed 1 --only 117 --save /tmp/fuzz
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from spec_blocks import SPEC, spec_code_blocks

ROOT = Path(__file__).resolve().parents[2]
STD = ROOT / "modeldsl" / "std"
FILECHECK = ROOT / "tests" / "filecheck"
TINY_LLAMA = ROOT / "examples" / "tiny_llama"
LLAMA = STD / "models" / "llama.module"

OPT_KINDS = ("dsl", "mlir", "pipeline", "opt-hf", "lock")
DIR = object()  # a file replaced by a folder
FIFO = object()  # a file replaced by a named pipe nobody writes to
KINDS = ("dsl", "mlir", "checkpoint", "run-dsl", "pipeline", "run-flags", "opt-hf", "lock")
# and "values" (NaN/Inf weights and odd numeric config values only), "train" and "resume" (mdsl-run --train, slower)

# ---------------------------------------------------------------------------------------------------------------
# seeds


@dataclass(frozen=True)
class Seed:
    """One input file and the extra flags its FileCheck RUN line gives mdsl-opt."""

    path: Path
    text: str
    flags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


SKIPPED_FLAGS = {"--lock", "--locked"}


def run_line_flags(text: str) -> tuple[str, ...]:
    """The flags of the first ``mdsl-opt %s ...`` RUN line that names no other file."""
    for line in text.splitlines():
        found = re.search(r"RUN:\s*(?:not\s+)?mdsl-opt %s(\s[^|<>;&]*)?", line)  # up to a pipe or redirection
        if not found or "%S" in line or "%t" in line:
            continue
        try:
            words = shlex.split(re.sub(r"\s\d$", "", found.group(1) or ""))  # the 2 of 2>&1
        except ValueError:  # quotes that span lines
            continue
        return tuple(w for w in words if w not in SKIPPED_FLAGS and not w.startswith("--emit=memory-plot"))
    return ()


def read_seeds(paths: Iterator[Path]) -> list[Seed]:
    seeds = []
    for path in sorted(paths):
        text = path.read_text(encoding="utf-8")
        seeds.append(Seed(path, text, run_line_flags(text)))
    return seeds


def dsl_seeds() -> list[Seed]:
    """The std library and the FileCheck .module inputs."""
    return read_seeds(p for p in [*STD.rglob("*.module"), *FILECHECK.rglob("*.module")] if "Output" not in p.parts)


def spec_seeds() -> list[Seed]:
    """The fenced DSL blocks of the spec, each as a file named after its line."""
    return [Seed(SPEC.parent / f"module-dsl-line{line}.module", text) for line, text in spec_code_blocks()]


def mlir_seeds() -> list[Seed]:
    return read_seeds(p for p in [*FILECHECK.rglob("*.mlir"), ROOT / "examples" / "tiny_llama.mlir"]
                      if "Output" not in p.parts)


# ---------------------------------------------------------------------------------------------------------------
# text mutations

GRAMMAR_WORDS = sorted(set(re.findall(r'"([a-z_]+)"', (ROOT / "modeldsl/frontend/text/grammar.lark").read_text())))
DSL_WORDS = GRAMMAR_WORDS + ["params:", "forward:", "backward:", "graph:", "inputs:", "out:", "let:", "constraint:",
                             "save:", "recompute:", "hf_config:", "hf_mapping:", "None", "int", "float", "bool",
                             "fp32", "bf16", "fp16", "int32", "fp31", "tied_to", "x", "@hook", "@memory", "->", "=>",
                             # annotations, with odd arguments
                             "@memory(recompute)", "@memory(sometimes)", "@shard(column)", "@shard(row, tp_size=0)",
                             "@shard(tp_size=-1)", "@partition(99999999999999999999)", "@partition(stage=-1)",
                             "@checkpoint", "@fuse", "@nofuse", "@precision(compute=fp8_e4m3)", "@precision(fp31)",
                             "@adapter(lora, rank=0)", "@trainable(wd_scale=nan)", "@gradient(skip)", "@barrier",
                             "@hook(AfterEmbedding)", "@hook()", "@recipe(Nope)", "@comm(overlap=maybe)",
                             "@alias", "@noalias", "@trace", "@probe", "@dtype(int8)", "@unknown_annotation"]
MLIR_WORDS = ["{annotations = [#mdsl.graph.memory<recompute>]}", "#mdsl.graph.shard<column, tp_size = 0>",
              "#mdsl.graph.partition<-1>", "#mdsl.graph.hook<>", "loc(\"x.module\":1:2)", "loc(unknown)",
              "mdsl.graph.model", "mdsl.graph.param", "mdsl.sched.program", "func.func", "builtin.module", "%0",
              "%arg0", "^bb0", "!mdsl.graph.tensor", "i600", "i618446744073709551616", "f32", "index", "loc(", "#",
              "!", "@", "->", "=", "<", ">", "{", "}", "[", "]", "(", ")", ":", ",", "\"", "?", "*", "x"]
PUNCTUATION = list("()[]{}<>:,;.=-+*/%!@#?\"'`\\|&^~$") + ["->", "**", "//", "...", "\t", "\n", "\r", "\x00", "\u00e9",
                                                              "\u2028", "\ufeff", "\U0001f600"]
HUGE_DIGITS = "9" * 4400  # past Python's 4300-digit int <-> str limit
NUMBERS = ["0", "-1", "-0", "1", "2", "0.5", "1.5", "-3.25", "1e309", "-1e309", "1e-400", "nan", "inf", "-inf",
           "9223372036854775807", "9223372036854775808", "18446744073709551616", "4294967296", "-9223372036854775809",
           "99999999999999999999999999999999", "1000000000", "1000000000000", "0x10", "1_000", "00", "1.", ".5",
           HUGE_DIGITS]
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\S")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass
class TextMutator:
    """Mutations of a text input; ``words`` are the language's keywords, ``others`` the texts to splice from."""

    rng: random.Random
    words: list[str]
    others: list[str]

    def operators(self) -> list[Callable[[str], str]]:
        return [self.delete_lines, self.duplicate_line, self.swap_lines, self.reindent_line, self.delete_chars,
                self.insert_chars, self.replace_char, self.replace_token, self.delete_token, self.duplicate_token,
                self.replace_number, self.replace_number, self.splice, self.truncate, self.long_expression]

    def mutate(self, text: str, count: int) -> tuple[str, list[str]]:
        applied = []
        for _ in range(count):
            op = self.rng.choice(self.operators())
            text = op(text)
            applied.append(op.__name__)
        return text, applied

    def position(self, text: str) -> int:
        return self.rng.randrange(len(text) + 1)

    def line_index(self, lines: list[str]) -> int:
        return self.rng.randrange(max(len(lines), 1))

    def delete_lines(self, text: str) -> str:
        lines = text.split("\n")
        k = self.line_index(lines)
        del lines[k:k + self.rng.randint(1, 3)]
        return "\n".join(lines)

    def duplicate_line(self, text: str) -> str:
        lines = text.split("\n")
        k = self.line_index(lines)
        lines.insert(self.line_index(lines), lines[k] if lines else "")
        return "\n".join(lines)

    def swap_lines(self, text: str) -> str:
        lines = text.split("\n")
        i, j = self.line_index(lines), self.line_index(lines)
        if lines:
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)

    def reindent_line(self, text: str) -> str:
        lines = text.split("\n")
        k = self.line_index(lines)
        if lines:
            indent = self.rng.choice(["", " ", "   ", "\t", "  \t", " " * 40])
            lines[k] = indent + lines[k].lstrip(" \t")
        return "\n".join(lines)

    def delete_chars(self, text: str) -> str:
        k = self.position(text)
        return text[:k] + text[k + self.rng.randint(1, 20):]

    def insert_chars(self, text: str) -> str:
        k = self.position(text)
        pool = PUNCTUATION + self.words
        return text[:k] + "".join(self.rng.choice(pool) for _ in range(self.rng.randint(1, 3))) + text[k:]

    def replace_char(self, text: str) -> str:
        k = self.position(text)
        return text[:k] + self.rng.choice(PUNCTUATION) + text[k + 1:]

    def tokens(self, text: str) -> list[re.Match]:
        return list(TOKEN.finditer(text))

    def replace_at(self, text: str, match: re.Match, new: str) -> str:
        return text[:match.start()] + new + text[match.end():]

    def replace_token(self, text: str) -> str:
        tokens = self.tokens(text)
        if not tokens:
            return text
        pool = self.words + PUNCTUATION + NUMBERS + [t.group() for t in self.rng.sample(tokens, min(20, len(tokens)))]
        return self.replace_at(text, self.rng.choice(tokens), self.rng.choice(pool))

    def delete_token(self, text: str) -> str:
        tokens = self.tokens(text)
        return self.replace_at(text, self.rng.choice(tokens), "") if tokens else text

    def duplicate_token(self, text: str) -> str:
        tokens = self.tokens(text)
        if not tokens:
            return text
        token = self.rng.choice(tokens)
        return self.replace_at(text, token, token.group() + self.rng.choice(["", " ", ", "]) + token.group())

    def replace_number(self, text: str) -> str:
        numbers = list(NUMBER.finditer(text))  # also the digits inside i32, fp32, d_64, ...
        return self.replace_at(text, self.rng.choice(numbers), self.rng.choice(NUMBERS)) if numbers else text

    def splice(self, text: str) -> str:
        donor = self.rng.choice(self.others).split("\n")
        k = self.line_index(donor)
        fragment = donor[k:k + self.rng.randint(1, 8)]
        lines = text.split("\n")
        at = self.line_index(lines)
        return "\n".join(lines[:at] + fragment + lines[at:])

    def truncate(self, text: str) -> str:
        return text[:self.position(text)]

    def long_expression(self, text: str) -> str:
        """A token replaced by thousands of terms, a deep unary chain or deeply nested brackets."""
        tokens = [t for t in self.tokens(text) if t.group()[0].isalnum() or t.group()[0] == "_"]
        if not tokens:
            return text
        token = self.rng.choice(tokens)
        word, n = token.group(), self.rng.choice([200, 3000, 20000])
        shape = self.rng.randrange(4)
        if shape == 0:
            new = " + ".join([word] * n)
        elif shape == 1:
            new = "-" * n + word
        elif shape == 2:
            new = "(" * n + word + ")" * n
        else:
            new = "[" * n + word + "]" * n
        return self.replace_at(text, token, new)


def flip_bytes(rng: random.Random, data: bytes, count: int = 3) -> bytes:
    """Random bytes overwritten (often not UTF-8 any more)."""
    buf = bytearray(data)
    for _ in range(count):
        if buf:
            buf[rng.randrange(len(buf))] = rng.choice([0x00, 0xFF, 0xC3, 0x80, 0xE2, 0xFE, rng.randrange(256)])
    return bytes(buf)


def mutated_text(rng: random.Random, seed_text: str, words: list[str], others: list[str],
                 most: int = 4) -> tuple[bytes, str]:
    """A mutant of a text seed (1 to ``most`` operators, sometimes byte flips after) and its operators' names."""
    text, applied = TextMutator(rng, words, others).mutate(seed_text, rng.randint(1, most))
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:
        data, applied = flip_bytes(rng, data), applied + ["flip_bytes"]
    return data, "+".join(applied)


# ---------------------------------------------------------------------------------------------------------------
# JSON mutations

HUGE_SENTINEL = "\u0000huge\u0000"
DEEP_SENTINEL = "\u0000deep\u0000"
JSON_VALUES: list = [0, -1, 1, 2, 0.5, -0.5, 1.5, 10**9, 10**12, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308,
                     1e-320, HUGE_SENTINEL, DEEP_SENTINEL, None, True, False, "", "1", "llama", "x" * 1000, [], {},
                     [1, 2], {"a": 1}, float("nan"), float("inf"), -float("inf")]
CONFIG_FIELDS = {"num_hidden_layers": [10**9, 0, -2, 1.5, 3], "intermediate_size": [10**12, 0, -172, 171.5],
                 "hidden_size": [2**63, 0, 65, -64], "head_dim": [2**63, 0, 15, -16, 8.5],
                 "num_attention_heads": [0, 3, 2**40], "num_key_value_heads": [0, 3, 8, -2],
                 "vocab_size": [2**40, 0, 383, -1], "max_position_embeddings": [10**12, 0, 1, -5, 2**63],
                 "rms_norm_eps": [0.0, -1.0, 1e30, float("nan")], "rope_theta": [0.0, -10.0, float("inf")],
                 "rope_parameters": [[], "default", 3, None, {"rope_type": "yarn"}, {"rope_theta": "x"},
                                     {"rope_type": "llama3", "factor": 0}],
                 "rope_scaling": [{"rope_type": "dynamic", "factor": 2.0}, "linear", 0],
                 "architectures": [["GraniteForCausalLM"], [], "LlamaForCausalLM", [3], None],
                 "model_type": ["qwen2", "gemma2", "", 7], "tie_word_embeddings": [True, "yes", 1],
                 "attention_bias": [True], "mlp_bias": [True], "hidden_act": ["gelu", "relu", 3],
                 "partial_rotary_factor": [0.5], "attn_logit_softcapping": [50.0], "torch_dtype": ["bfloat16", "int8"],
                 "dtype": ["bfloat16", "float16", "int8", 3], "bos_token_id": [-1, 10**20],
                 "eos_token_id": [[1, 2], 10**6]}


def json_paths(value, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path (tuple of keys and indices) into a JSON value, the root included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from json_paths(v, prefix + (i,))


def get_path(value, path: tuple):
    for key in path:
        value = value[key]
    return value


@dataclass
class JsonMutator:
    """Mutations of a JSON document: delete a key, change a value's type or number, add keys, nest deeply."""

    rng: random.Random
    fields: dict[str, list] = field(default_factory=dict)

    def mutate(self, doc, count: int) -> tuple[object, list[str]]:
        applied = []
        for _ in range(count):
            op = self.rng.choice([self.delete_key, self.replace_value, self.replace_value, self.replace_number,
                                  self.known_field, self.known_field, self.add_key, self.wrap_value])
            doc = op(doc)
            applied.append(op.__name__)
        return doc, applied

    def pick_path(self, doc, want: Callable[[object], bool] = lambda v: True) -> tuple | None:
        paths = [p for p in json_paths(doc) if p and want(get_path(doc, p))]
        return self.rng.choice(paths) if paths else None

    def set_path(self, doc, path: tuple, value):
        if not path:
            return value
        get_path(doc, path[:-1])[path[-1]] = value
        return doc

    def delete_key(self, doc):
        path = self.pick_path(doc)
        if path is not None:
            parent = get_path(doc, path[:-1])
            del parent[path[-1]]
        return doc

    def replace_value(self, doc):
        path = self.pick_path(doc)
        return self.set_path(doc, path or (), self.rng.choice(JSON_VALUES)) if path else doc

    def replace_number(self, doc):
        path = self.pick_path(doc, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
        return self.set_path(doc, path, self.rng.choice(JSON_VALUES[:17])) if path else doc

    def known_field(self, doc):
        if not self.fields or not isinstance(doc, dict):
            return self.replace_value(doc)
        name = self.rng.choice(sorted(self.fields))
        doc[name] = self.rng.choice(self.fields[name])
        return doc

    def add_key(self, doc):
        path = self.pick_path(doc, lambda v: isinstance(v, dict)) or ()
        target = get_path(doc, path)
        if isinstance(target, dict):
            target[self.rng.choice(["extra", "__metadata__", "", "rope_scaling", "quantization_config"])] = \
                self.rng.choice(JSON_VALUES)
        return doc

    def wrap_value(self, doc):
        path = self.pick_path(doc)
        if path is None:
            return doc
        value = get_path(doc, path)
        return self.set_path(doc, path, self.rng.choice([[value], {"value": value}, str(value)[:100]]))


def dump_json(doc) -> str:
    """JSON text with the sentinels expanded (an integer past 4300 digits, 100000 nested lists)."""
    text = json.dumps(doc, allow_nan=True)
    text = text.replace(json.dumps(HUGE_SENTINEL), HUGE_DIGITS)
    return text.replace(json.dumps(DEEP_SENTINEL), "[" * 100000 + "]" * 100000)


def mutated_json(rng: random.Random, text: str, fields: dict[str, list]) -> tuple[bytes, str]:
    """A structural JSON mutant (or, one time in five, a text mutant of the JSON)."""
    if rng.random() < 0.2:
        return mutated_text(rng, text, ['"', "{", "}", "[", "]", ",", ":", "null", "true", "1e999"], [text])
    doc, applied = JsonMutator(rng, fields).mutate(json.loads(text), rng.randint(1, 3))
    return dump_json(doc).encode(), "+".join(applied)


# ---------------------------------------------------------------------------------------------------------------
# safetensors mutations

SAFETENSORS_DTYPES = ["F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "C64", "X", "",
                      3, None]
NONFINITE_F32 = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff", b"\xff\xff\x7f\x7f"]


def split_safetensors(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header: dict, body: bytes) -> bytes:
    text = dump_json(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def tensor_names(header: dict) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


def mutate_entry(rng: random.Random, header: dict, body: bytes) -> tuple[dict, bytes, str]:
    name = rng.choice(tensor_names(header))
    entry = header[name]
    what = rng.randrange(7)
    if what == 0:
        entry["dtype"] = rng.choice(SAFETENSORS_DTYPES)
    elif what == 1 and entry["shape"]:
        entry["shape"][rng.randrange(len(entry["shape"]))] = rng.choice(JSON_VALUES[:17])
    elif what == 2:
        entry["shape"] = rng.choice([[], [0], entry["shape"] + [1], entry["shape"][:-1], [2**32, 2**32, 2**32],
                                     [-1, 64], "64", None, [[1]]])
    elif what == 3:
        entry["data_offsets"][rng.randrange(2)] = rng.choice(JSON_VALUES[:17])
    elif what == 4:
        entry["data_offsets"] = rng.choice([entry["data_offsets"][::-1], [0, 0], [0], [], None, [0, len(body) + 4]])
    elif what == 5:
        header[rng.choice(["model.layers.0.mlp.gate.weight", "model.layers.9.self_attn.q_proj.weight",
                           name + ".extra", "lm_head.bias", ""])] = dict(entry)
    else:
        del header[name]
    return header, body, f"entry{what}"


def nonfinite_weights(rng: random.Random, header: dict, body: bytes) -> tuple[dict, bytes, str]:
    buf = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        if len(buf) >= 4:
            k = rng.randrange(len(buf) // 4) * 4
            buf[k:k + 4] = rng.choice(NONFINITE_F32)
    return header, bytes(buf), "nonfinite"


def mutated_safetensors(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """A safetensors file with its header, length, body or weights mutated."""
    what = rng.randrange(6)
    if what == 0:
        return data[:rng.randrange(len(data))], "truncate"
    if what == 1:
        length = rng.choice([0, 1, 7, len(data), 2**63, 2**64 - 1, struct.unpack("<Q", data[:8])[0] + 1])
        return struct.pack("<Q", length) + data[8:], "length"
    if what == 2:
        n = struct.unpack("<Q", data[:8])[0]
        return data[:8] + flip_bytes(rng, data[8:8 + n], rng.randint(1, 3)) + data[8 + n:], "header_bytes"
    header, body = split_safetensors(data)
    if what == 3:
        header, body, how = nonfinite_weights(rng, header, body)
    elif what == 4:
        doc, applied = JsonMutator(rng).mutate(header, 1)
        return join_safetensors(doc, body), "header_json+" + applied[0]
    else:
        header, body, how = mutate_entry(rng, header, body)
    return join_safetensors(header, body), how


# ---------------------------------------------------------------------------------------------------------------
# training state mutations

STATE_FIELDS = {"step": [-1, 0, 1, 2, 10**9, 1.5, "1", None], "version": [0, 99, "1"], "format": ["x", None]}


def mutated_state(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """A training_state.npz with its bytes, its JSON ``state`` entry or its arrays mutated."""
    what = rng.randrange(4)
    if what == 0:
        return (data[:rng.randrange(len(data))], "truncate") if rng.random() < 0.5 else \
            (flip_bytes(rng, data, rng.randint(1, 8)), "flip_bytes")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    if what in (1, 2):
        header = json.loads(str(arrays["state"]))
        header, applied = JsonMutator(rng, STATE_FIELDS if what == 1 else {}).mutate(header, rng.randint(1, 2))
        arrays["state"] = np.array(dump_json(header))
        how = "state: " + "+".join(applied)
    else:
        name = rng.choice(sorted(k for k in arrays if k != "state"))
        change = rng.randrange(4)
        if change == 0:
            del arrays[name]
        elif change == 1:
            arrays[name] = arrays[name].reshape(-1)[:max(arrays[name].size - 1, 0)]
        elif change == 2:
            arrays[name] = arrays[name].astype(rng.choice([np.float16, np.int64, np.complex64, np.bool_]))
        else:
            arrays[name] = np.full_like(arrays[name], rng.choice([np.nan, np.inf, -1.0, 1e38]))
        how = f"array {name}: change {change}"
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue(), how


# ---------------------------------------------------------------------------------------------------------------
# pass pipelines and flags

OPTION_VALUES = ["0", "-1", "1", "2", "8", "64", "3.5", "true", "false", "x", "", "9223372036854775808", "1e309",
                 "nan", "forward", "forward_grad", "fp32", "bf16", "first-fit", "best-fit", HUGE_DIGITS[:30]]
INT_VALUES = ["1", "2", "8", "16", "64", "0", "-1", "3"]
PASS_OPTIONS = {  # each option with values of its type (the pipeline also draws OPTION_VALUES, of any type)
    "canonicalize": {}, "cse": {}, "dce": {},
    "mdsl-autodiff": {"func": ["forward", "forward_grad", "nope"], "loop": ["true", "false"]},
    "mdsl-recompute": {"mode": ["none", "annotated", "full", "auto", "x"], "budget": ["auto", "1", "0", "64MiB",
                                                                                      "1.5GB", "-1", "lots", "1e309"],
                       "finetune": ["auto", "full", "lora", "x"]},
    "mdsl-fuse": {"disable": ["residual_norm", "scalar_alpha", "residual_norm,scalar_alpha", "nope", ""]},
    "mdsl-specialize": {k: INT_VALUES for k in ("B", "T", "d", "n", "d_model", "n_layers", "vocab_size", "Q")}
    | {"hf": [str(TINY_LLAMA), "/nonexistent", str(LLAMA)]},
    "mdsl-lower-to-sched": {"func": ["forward", "forward_grad"], "storage": ["fp32", "bf16", "fp16", "x"],
                            "kv_cache": INT_VALUES, "split_gemms": ["true", "false"], "grads_arena": ["true", "false"]},
    "mdsl-plan-memory": {"strategy": ["first-fit", "best-fit", "worst-fit"], "alignment": INT_VALUES + ["3", "4096"],
                         "inplace": ["true", "false"]},
    "mdsl-optimizer-step": {"eps": ["1e-8", "0", "-1", "nan"], "weight_decay": ["0.1", "0", "-1", "inf"],
                            "clip_norm": ["1.0", "0", "-1"], "storage": ["fp32", "bf16", "x"],
                            "beta1": ["0.9", "1", "2", "-0.5"], "beta2": ["0.999", "1", "0"]},
}
OPT_FLAGS = [[], [], ["--split-input-file"], ["--emit=memory-report"], ["--emit=ast"], ["--print-op-generic"],
             ["--print-between-passes"], ["--diagnostics-format=json"], ["--top", "Linear"], ["--top", "Nope"],
             ["--verify-backward"], ["--verify-backward", "--verify-shapes", "B=1,T=2,d_model=8,n_layers=1"],
             ["--verify-shapes", "B=0"], ["--verify-backward", "--verify-tolerance", "nan"], ["--time-passes"],
             ["--print-debuginfo"], ["--no-implicit-module"], ["--disable-verify"], ["--hf", "/nonexistent"],
             ["--hf", str(TINY_LLAMA)], ["--print-ir-after-all"], ["--print-ir-before", "mdsl-plan-memory"],
             ["--print-ir-after", "mdsl-lower-to-sched,nope"], ["--print-ir-after-change"], ["--mlir-timing"],
             ["--list-passes"], ["-o", "{dir}/out.mlir"], ["-o", "{dir}"], ["-o", "{dir}/no/such/out.mlir"],
             ["--version"], ["--verify-diagnostics"], ["--split-input-file", "--verify-diagnostics"],
             ["--locked"], ["--emit=memory-plot", "{dir}/plot.png"]]


def random_pass(rng: random.Random) -> str:
    name = rng.choice(sorted(PASS_OPTIONS))
    known = PASS_OPTIONS[name]
    chosen = rng.sample(sorted(known), rng.randint(0, min(2, len(known))))
    options = [f"{o}={rng.choice(known[o] if rng.random() < 0.85 else OPTION_VALUES)}" for o in chosen]
    return name + ("{" + " ".join(options) + "}" if options else "")


def random_pipeline(rng: random.Random) -> str:
    """1-4 passes with random options; sometimes the pipeline text itself is mangled."""
    text = ",".join(random_pass(rng) for _ in range(rng.randint(1, 4)))
    if rng.random() < 0.2:
        text, _ = TextMutator(rng, sorted(PASS_OPTIONS), [text]).mutate(text, 1)
    elif rng.random() < 0.2:
        text = rng.choice(["mdsl-lower-to-sched", "mdsl-autodiff,mdsl-lower-to-sched{func=forward_grad}",
                           "mdsl-autodiff,mdsl-recompute{mode=full},mdsl-lower-to-sched{func=forward_grad}"]) + \
            ",mdsl-plan-memory" + ("," + text if rng.random() < 0.5 else "")
    return text


RUN_FLAGS = [["--max-new-tokens", v] for v in ("-1", "0", "1", "x", "1.5", "")] + \
    [["--temperature", v] for v in ("nan", "-1", "inf", "0.7", "1e308", "x")] + \
    [["--top-k", v] for v in ("0", "-1", "1", "99999999999999999999", "2.5")] + \
    [["--seed", v] for v in ("-1", "18446744073709551616", "7", "x")] + \
    [["--dtype", "bf16"], ["--dtype", "fp8"], ["--engine", "graph"], ["--no-cache"], ["--device", "cuda"],
     ["--logits", "{dir}/out/l.npy"], ["--logits", "{dir}/l"], ["--logits", "{dir}"], ["--top", "Nope"],
     ["--top", "Llama"], ["--diagnostics-format", "json"], ["--hf", "{dir}/missing"], ["--hf", str(LLAMA)],
     ["--tokens", "1,2,3"], ["--tokens", "383,384"], ["--tokens", "-1"], ["--tokens", ""], ["--tokens", ",,"],
     ["--tokens", "1," * 300], ["--prompt", "\udcff"], ["--unknown"], ["--resume", "{dir}"], ["--steps", "2"],
     ["--threads", "0"], ["--threads", "-1"], ["--threads", "1"], ["--threads", "100000"], ["--force-architecture"],
     ["--allow-unused-tensors"], ["--version"]]
TRAIN_FLAGS = [[flag, v] for flag, values in {
    "--steps": ["1", "2", "0", "-1", "x"], "--batch": ["1", "2", "0", "-3", "100000000"],
    "--seq": ["4", "8", "0", "1", "255", "256", "257", "1000000000"], "--lr": ["1e-3", "0", "-1", "nan", "inf", "1e30"],
    "--grad-accum": ["1", "2", "0", "-1"], "--warmup": ["0", "1", "5", "-1"], "--weight-decay": ["0.1", "-1", "nan"],
    "--clip": ["1.0", "0", "-1", "inf"], "--min-lr-ratio": ["0.1", "0", "2", "-1", "nan"],
    "--stop-after": ["1", "0", "-1"], "--save": ["{dir}/out", "{dir}", "{dir}/data.txt", "/proc/nope"],
    "--resume": ["{dir}/out", "{dir}/ckpt", "{dir}/missing"], "--loss-plot": ["{dir}/loss.png", "{dir}"],
    "--dtype": ["bf16"], "--max-new-tokens": ["3"], "--prompt": ["hi"],
    "--recompute": ["none", "full", "auto", "auto:1", "auto:64MiB", "auto:", "full:1",
                    "x", ""]}.items() for v in values]
CORPUS = ROOT / "examples" / "tiny_corpus.txt"
DEFAULT_TRAIN = {"--steps": "1", "--batch": "1", "--seq": "8", "--lr": "1e-3"}


# ---------------------------------------------------------------------------------------------------------------
# cases


@dataclass
class Case:
    """One mutated input: the files to write (bytes, DIR or FIFO) and the tool's argv ('{dir}' is their folder)."""

    kind: str
    index: int
    label: str
    files: dict[str, object]
    argv: list[str]

    def write(self, folder: Path) -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        for rel, content in self.files.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if content is DIR:
                path.mkdir()
            elif content is FIFO:
                os.mkfifo(path)
            else:
                path.write_bytes(content)
        return [a.replace("{dir}", str(folder)) for a in self.argv]

    def command(self, folder: Path) -> str:
        tool = "mdsl-opt" if self.kind in OPT_KINDS else "mdsl-run"
        return shlex.join([tool, *[a.replace("{dir}", str(folder)) for a in self.argv]])


CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")
# the last prompt is how Python passes byte 0xff of a non-UTF-8 argv
PROMPTS = ["hi", "Hello, world", "", " ", "\u00e9t\u00e9 \U0001f600", "a" * 300, "\x00\x01", "\udcff"]


class CaseMaker:
    """Draws the cases of one seed: the same (seed, index) is always the same case."""

    def __init__(self, seed: int):
        self.seed = seed
        self.dsl = dsl_seeds()
        self.mlir = mlir_seeds()
        self.checkpoint = {name: (TINY_LLAMA / name).read_bytes() for name in CHECKPOINT_FILES}
        self.spec = spec_seeds()
        self.texts = [s.text for s in self.dsl + self.mlir + self.spec]
        self.corpus = CORPUS.read_bytes()[:2000]
        self._trained: dict[str, bytes] | None = None
        self._locks: dict[Path, str] = {}

    def case(self, index: int, kind: str | None = None) -> Case:
        rng = random.Random(f"{self.seed}:{index}")
        kind = kind or KINDS[index % len(KINDS)]
        return getattr(self, "case_" + kind.replace("-", "_"))(rng, index)

    def case_dsl(self, rng: random.Random, index: int) -> Case:
        seed = rng.choice(self.spec if self.spec and rng.random() < 0.3 else self.dsl)
        data, how = mutated_text(rng, seed.text, DSL_WORDS, self.texts)
        flags = list(seed.flags)
        if not flags and rng.random() < 0.3:  # further down: specialize, schedule, plan
            flags = ["-p", "mdsl-specialize{B=1 T=2},mdsl-lower-to-sched,mdsl-plan-memory"]
            how += " (lowered to a planned schedule)"
        return Case("dsl", index, f"{seed.name}: {how}", {seed.path.name: data}, ["{dir}/" + seed.path.name, *flags])

    def case_opt_hf(self, rng: random.Random, index: int) -> Case:
        """``mdsl-opt llama.module --hf DIR`` (lowering with a checkpoint's config) on a mutated config.json."""
        files: dict[str, object] = {f"ckpt/{n}": data for n, data in self.checkpoint.items()}
        how = self.mutate_checkpoint_file(rng, files, "config.json")
        flags = rng.choice([[], [], ["-p", "mdsl-specialize{B=1 T=2},mdsl-lower-to-sched"], ["--emit=ast"]])
        return Case("opt-hf", index, f"config.json: {how}", files, [str(LLAMA), "--hf", "{dir}/ckpt", *flags])

    def case_mlir(self, rng: random.Random, index: int) -> Case:
        seed = rng.choice(self.mlir)
        data, how = mutated_text(rng, seed.text, MLIR_WORDS, self.texts)
        return Case("mlir", index, f"{seed.name}: {how}", {seed.path.name: data},
                    ["{dir}/" + seed.path.name, *seed.flags])

    def run_argv(self, rng: random.Random, model: str) -> list[str]:
        source = ["--prompt", rng.choice(PROMPTS)] if rng.random() < 0.9 else \
            ["--tokens", rng.choice(["1,2,3", "0", "383", "384", "-1", "1,,2", "99999999999999999999"])]
        return [model, "--hf", "{dir}/ckpt", *source, "--max-new-tokens", "2"]

    def case_checkpoint(self, rng: random.Random, index: int) -> Case:
        files: dict[str, object] = {f"ckpt/{n}": data for n, data in self.checkpoint.items()}
        name = rng.choice(["config.json", "config.json", "model.safetensors", "model.safetensors", "tokenizer.json"])
        how = self.mutate_checkpoint_file(rng, files, name)
        if rng.random() < 0.1:  # a second shard: the same tensors again, a mutant, nothing, a folder or a pipe
            shard = self.checkpoint["model.safetensors"]
            extra, what = rng.choice([(shard, "copy"), (b"", "empty"), (DIR, "folder"), (FIFO, "fifo"),
                                      (mutated_safetensors(rng, shard)[0], "mutant")])
            files["ckpt/model-00002-of-00002.safetensors"] = extra
            how += f" + a second shard ({what})"
        return Case("checkpoint", index, f"{name}: {how}", files, self.run_argv(rng, str(LLAMA)))

    def mutate_checkpoint_file(self, rng: random.Random, files: dict, name: str, folder: str = "ckpt") -> str:
        key, original = f"{folder}/{name}", files[f"{folder}/{name}"]
        roll = rng.random()
        if roll < 0.06:
            how, files[key] = rng.choice([("folder", DIR), ("fifo", FIFO), ("empty", b""), ("binary", b"\xff\xfe\x00")])
            return how
        if roll < 0.09:
            del files[key]
            return "missing"
        if name == "model.safetensors":
            files[key], how = mutated_safetensors(rng, original)
        else:
            fields = CONFIG_FIELDS if name == "config.json" else {}
            files[key], how = mutated_json(rng, original.decode(), fields)
        return how

    def case_values(self, rng: random.Random, index: int) -> Case:
        """The tiny checkpoint with NaN/Inf weights or odd numeric config values (the runs that could leak
        numpy's RuntimeWarnings)."""
        files: dict[str, object] = {f"ckpt/{n}": data for n, data in self.checkpoint.items()}
        if rng.random() < 0.5:
            header, body = split_safetensors(self.checkpoint["model.safetensors"])
            files["ckpt/model.safetensors"] = join_safetensors(*nonfinite_weights(rng, header, body)[:2])
            how = "model.safetensors: nonfinite"
        else:
            config = json.loads(self.checkpoint["config.json"])
            name = rng.choice(["rms_norm_eps", "rms_norm_eps", "rope_theta", "rope_parameters"])
            config[name] = rng.choice([0.0, -1.0, 1e30, 1e-300, float("nan"), float("inf"), -float("inf")])
            if name == "rope_parameters":
                config[name] = {"rope_type": "default", "rope_theta": config[name]}
            files["ckpt/config.json"] = dump_json(config).encode()
            how = f"config.json: {name}={config[name]}"
        return Case("values", index, how, files, [str(LLAMA), "--hf", "{dir}/ckpt", "--prompt", "hi",
                                                  "--max-new-tokens", "2"])

    def case_pipeline(self, rng: random.Random, index: int) -> Case:
        """A seed (sometimes lightly mutated) through a random pass pipeline and driver flags."""
        seed = rng.choice(self.mlir + self.dsl)
        data, how = seed.text.encode(), "as is"
        if rng.random() < 0.3:
            data, how = mutated_text(rng, seed.text, MLIR_WORDS + DSL_WORDS, self.texts, most=1)
        pipeline = random_pipeline(rng)
        flags = rng.choice(OPT_FLAGS)
        argv = ["{dir}/" + seed.path.name, "-p", pipeline, *flags]
        return Case("pipeline", index, f"{seed.name} ({how}): -p '{pipeline}' {' '.join(flags)}",
                    {seed.path.name: data}, argv)

    def lock_of(self, seed: Seed) -> str:
        """The lock file ``mdsl-opt FILE --lock`` writes for ``seed`` (made once per seed, in process)."""
        if seed.path not in self._locks:
            folder = Path(tempfile.mkdtemp(prefix="mdsl-fuzz-"))
            try:
                (folder / seed.path.name).write_text(seed.text, encoding="utf-8")
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    tool_main("dsl")([str(folder / seed.path.name), "--lock"])
                lock = folder / (seed.path.name + ".lock")
                self._locks[seed.path] = lock.read_text(encoding="utf-8") if lock.is_file() else ""
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        return self._locks[seed.path]

    def case_lock(self, rng: random.Random, index: int) -> Case:
        """``mdsl-opt FILE.module --locked`` with its lock file (or, sometimes, the module) mutated."""
        seed = rng.choice([s for s in self.dsl if re.search(r"^(from|import) ", s.text, re.MULTILINE)])
        lock = self.lock_of(seed)
        files: dict[str, object] = {seed.path.name: seed.text.encode()}
        if rng.random() < 0.2:
            files[seed.path.name], how = mutated_text(rng, seed.text, DSL_WORDS, self.texts, most=1)
            files[seed.path.name + ".lock"], how = lock.encode(), "module: " + how
        elif rng.random() < 0.1:
            how, files[seed.path.name + ".lock"] = rng.choice([("folder", DIR), ("fifo", FIFO), ("empty", b"")])
        else:
            words = ["std.", "latest", "std@", ":", "version:", "resolved_modules:", "000000000000", "local@", "- "]
            files[seed.path.name + ".lock"], how = mutated_text(rng, lock, words, [lock])
        return Case("lock", index, f"{seed.name} lock: {how}", files, ["{dir}/" + seed.path.name, "--locked"])

    def case_run_flags(self, rng: random.Random, index: int) -> Case:
        """The tiny checkpoint run with random mdsl-run flags."""
        files: dict[str, object] = {f"ckpt/{n}": d for n, d in self.checkpoint.items()}
        flags = [w for f in rng.sample(RUN_FLAGS, rng.randint(1, 3)) for w in f]
        argv = [str(LLAMA), "--hf", "{dir}/ckpt", *flags]
        if "--tokens" not in flags and "--prompt" not in flags:
            argv += ["--prompt", "hi"]
        if "--max-new-tokens" not in flags:
            argv += ["--max-new-tokens", "2"]
        return Case("run-flags", index, " ".join(flags), files, argv)

    def case_train(self, rng: random.Random, index: int) -> Case:
        """``mdsl-run --train DATA`` for a step or two: a mutated training text (or none, a folder, a pipe)
        and random training flags over --steps 1 --batch 1 --seq 8 --lr 1e-3."""
        files: dict[str, object] = {f"ckpt/{n}": d for n, d in self.checkpoint.items()}
        corpus = CORPUS.read_text(encoding="utf-8")[:2000]
        roll = rng.random()
        if roll < 0.1:
            how, files["data.txt"] = rng.choice([("folder", DIR), ("fifo", FIFO), ("empty", b""), ("one byte", b"a")])
        elif roll < 0.4:
            files["data.txt"], how = mutated_text(rng, corpus, PUNCTUATION, [corpus])
        else:
            files["data.txt"], how = corpus.encode(), "as is"
        given = dict(DEFAULT_TRAIN)
        for flag, value in rng.sample(TRAIN_FLAGS, rng.randint(1, 3)):
            given[flag] = value
        flags = [w for item in given.items() for w in item]
        return Case("train", index, f"data.txt {how}: {' '.join(flags)}", files,
                    [str(LLAMA), "--hf", "{dir}/ckpt", "--train", "{dir}/data.txt", *flags])

    def trained_run(self) -> dict[str, bytes]:
        """The folder a one-step ``--train ... --save OUT`` run writes (of two steps: it can be resumed),
        made once, in process."""
        if self._trained is None:
            folder = Path(tempfile.mkdtemp(prefix="mdsl-fuzz-"))
            try:
                (folder / "data.txt").write_bytes(self.corpus)
                argv = [str(LLAMA), "--hf", str(TINY_LLAMA), "--train", str(folder / "data.txt"), "--steps", "2",
                        "--stop-after", "1", "--batch", "1", "--seq", "8", "--lr", "1e-3",
                        "--save", str(folder / "out")]
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    assert tool_main("train")(argv) == 0, "the run to resume failed"
                self._trained = {f"out/{p.name}": p.read_bytes() for p in (folder / "out").iterdir()
                                 if p.is_file() and p.suffix != ".png"}
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        return self._trained

    def case_resume(self, rng: random.Random, index: int) -> Case:
        """``mdsl-run --train DATA --resume OUT`` on a saved run whose training_state.npz (its state header,
        arrays or bytes) or config.json is mutated."""
        files: dict[str, object] = {"data.txt": self.corpus, **self.trained_run()}
        if rng.random() < 0.25:
            how = "config.json: " + self.mutate_checkpoint_file(rng, files, "config.json", folder="out")
        else:
            files["out/training_state.npz"], how = mutated_state(rng, files["out/training_state.npz"])
        return Case("resume", index, how, files, [str(LLAMA), "--train", "{dir}/data.txt", "--resume", "{dir}/out"])

    def case_run_dsl(self, rng: random.Random, index: int) -> Case:
        seed = next(s for s in self.dsl if s.path == LLAMA)  # the model of the tiny checkpoint
        data, how = mutated_text(rng, seed.text, DSL_WORDS, self.texts, most=2)
        files: dict[str, object] = {f"ckpt/{n}": d for n, d in self.checkpoint.items()}
        files[seed.path.name] = data
        return Case("run-dsl", index, f"{seed.name}: {how}", files, self.run_argv(rng, "{dir}/" + seed.path.name))


# ---------------------------------------------------------------------------------------------------------------
# running


class FuzzTimeout(BaseException):
    """Raised by SIGALRM in the tool under test (a BaseException: the tools' catch-alls let it through)."""


@dataclass
class Outcome:
    """How one case ended: ``ok``, ``coded``, ``uncoded``, ``internal``, ``hang`` or ``leak`` (a numpy
    RuntimeWarning reached the caller); ``where`` is the
    innermost project or xDSL frame of an escaped exception (or where a hang was interrupted)."""

    case: Case
    status: str
    rc: int | None
    output: str
    seconds: float
    error: str = ""
    where: str = ""
    leaked_warnings: list[str] = field(default_factory=list)

    @property
    def signature(self) -> str:
        return f"{self.status} {self.error.split(':')[0]} at {self.where}" if self.where else self.status

    def summary(self) -> str:
        first = next((ln for ln in self.output.splitlines() if "error" in ln), self.output[:200])
        return (f"[{self.case.kind} #{self.case.index}] {self.signature}: {self.error or first[:300]}\n"
                f"    input: {self.case.label}")


def project_frame(tb) -> str:
    """The innermost frame of modeldsl or xDSL in a traceback, as ``path:line in function``."""
    frames = traceback.extract_tb(tb)
    mine = [f for f in frames if (f.filename.startswith(str(ROOT) + "/") and "/tests/" not in f.filename)
            or "/xdsl/" in f.filename or "/lark/" in f.filename]
    frame = (mine or frames)[-1]
    where = frame.filename.replace(str(ROOT) + "/", "")
    where = re.sub(r".*/site-packages/", "", where)
    return f"{where}:{frame.lineno} in {frame.name}"


def classify(rc: int | None, output: str) -> str:
    if re.search(r"^mdsl-(opt|run): internal error:", output, re.MULTILINE):
        return "internal"
    if rc == 0 or (rc == 1 and "above the tolerance" in output):  # --verify-backward's documented exit 1
        return "ok"
    return "coded" if re.search(r"error\[E\d{3}\]|\"code\": \"E\d{3}\"", output) else "uncoded"


@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise FuzzTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def address_space_limit(extra_bytes: int):
    """Cap the address space at its current size plus ``extra_bytes`` (a runaway allocation is a
    MemoryError to report, not an OOM kill of a shared machine)."""
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = current + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def debug_mode():
    """``MDSL_DEBUG=1``: the tools re-raise instead of printing the catch-all, so the harness sees the frame."""
    old = os.environ.get("MDSL_DEBUG")
    os.environ["MDSL_DEBUG"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MDSL_DEBUG"]
        else:
            os.environ["MDSL_DEBUG"] = old


def tool_main(kind: str):
    if kind in OPT_KINDS:
        from modeldsl.tools.opt import main
    else:
        from modeldsl.tools.run import main
    return main


def run_case(case: Case, folder: Path, timeout: float = 5.0, memory: int = 8 << 30) -> Outcome:
    """Write ``case`` under ``folder`` and run its tool in process; never raises for the tool's failures."""
    argv = case.write(folder)
    main = tool_main(case.kind)
    out = io.StringIO()
    rc, error, where = None, "", ""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, debug_mode():
        warnings.simplefilter("always")
        try:
            # in the case's folder: what a run writes where it was not told (./loss.png) stays there
            with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                    address_space_limit(memory), time_limit(timeout):
                rc = main(argv)
        except FuzzTimeout as err:
            error, where = f"no result after {timeout:g} s", project_frame(err.__traceback__)
        except SystemExit as err:
            rc = err.code if isinstance(err.code, int) else 1
        except BaseException as err:  # noqa: BLE001 - what reached the tool's catch-all
            error, where = f"{type(err).__name__}: {str(err)[:300]}", project_frame(err.__traceback__)
    seconds = time.perf_counter() - start
    text = out.getvalue()
    status = "hang" if error.startswith("no result") else "internal" if error else classify(rc, text)
    leaked = [f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})" for w in caught
              if issubclass(w.category, RuntimeWarning)]
    if leaked and status in ("ok", "coded"):  # numpy's RuntimeWarnings must become W011 or stay quiet
        status, error = "leak", leaked[0]
    return Outcome(case, status, rc, text, seconds, error, where, leaked)


def failures(outcomes: list[Outcome], allowed: set[str] = frozenset({"ok", "coded"})) -> list[Outcome]:
    return [o for o in outcomes if o.status not in allowed]


def report(outcomes: list[Outcome]) -> str:
    """One line per kind of failure (status, exception, frame) with its count and first example."""
    groups: dict[str, list[Outcome]] = {}
    for o in failures(outcomes):
        key = {"uncoded": f"uncoded: {first_error_line(o)}", "leak": f"leak: {o.error}"}.get(o.status, o.signature)
        groups.setdefault(key, []).append(o)
    lines = [f"{len(g)}x {sig}\n  e.g. {g[0].summary()}" for sig, g in sorted(groups.items(), key=lambda x: -len(x[1]))]
    return "\n".join(lines)


def first_error_line(o: Outcome) -> str:
    line = next((ln for ln in o.output.splitlines() if "error" in ln), o.output.strip()[:120])
    return re.sub(r"^\S*?:\d+:\d+: ", "", re.sub(r"'[^']*'", "'_'", line))[:120]


# ---------------------------------------------------------------------------------------------------------------
# campaigns


def campaign(seed: int, indices: list[int], root: Path, timeout: float, kinds: list[str] | None = None,
             log=None) -> list[Outcome]:
    maker = CaseMaker(seed)
    outcomes = []
    for index in indices:
        kind = kinds[index % len(kinds)] if kinds else None
        case = maker.case(index, kind)
        outcome = run_case(case, root / f"{case.kind}-{index}", timeout)
        outcomes.append(outcome)
        if log and outcome.status not in ("ok", "coded"):
            print(outcome.summary(), f"\n    run: {case.command(root / f'{case.kind}-{index}')}", file=log, flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--only", type=int, action="append", help="run just these case indices")
    p.add_argument("--kind", action="append", choices=[*KINDS, "values", "train", "resume"])
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--save", type=Path, default=Path("/tmp/fuzz"), help="where the mutated inputs are written")
    args = p.parse_args(argv)
    sys.stdout.reconfigure(errors="backslashreplace")
    indices = args.only or list(range(args.start, args.start + args.count))
    start = time.perf_counter()
    outcomes = campaign(args.seed, indices, args.save / f"seed{args.seed}", args.timeout, args.kind, log=sys.stdout)
    counts = Counter(o.status for o in outcomes)
    print(f"\n{len(outcomes)} cases in {time.perf_counter() - start:.1f} s: {dict(counts)}")
    print(report(outcomes))
    for o in sorted(outcomes, key=lambda o: -o.seconds)[:5]:
        print(f"slow: {o.seconds:.2f} s [{o.case.kind} #{o.case.index}] {o.status}: {o.case.label[:150]}")
    leaks = Counter(w for o in outcomes for w in o.leaked_warnings)
    for w, n in leaks.most_common(10):
        print(f"{n}x leaked {w}")
    return 1 if failures(outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
