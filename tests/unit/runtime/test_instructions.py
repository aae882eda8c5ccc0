"""Instruction-tuning data: the formats, chat templates rendered as transformers renders them, loss masks,
padded and packed rows, resuming, and the diagnostics of malformed lines."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from modeldsl.diagnostics import DiagnosticError
from modeldsl.runtime.data import token_stream
from modeldsl.runtime.instructions import (
    IGNORE,
    Batch,
    ChatTemplate,
    Example,
    InstructionBatches,
    build_row,
    examples_fingerprint,
    label_count,
    offset_encoder,
    pad_token_id,
    read_examples,
    read_records,
    tokens_in_spans,
)
from modeldsl.tokenizer import Tokenizer

# Qwen2.5's chat template (ChatML, a default system message, tool calls through tojson)
QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided \
with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Llama-3's chat template (bos_token before the first message, contents trimmed)
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")
# ChatML with the assistant's text in generation blocks (transformers' return_assistant_tokens_mask)
CHATML_GENERATION = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                     "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
                     "{% endgeneration %}{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}"
                     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The other things a template may use: namespace, loop controls, tojson's options, strftime_now, raise_exception
FEATURES = """{{ {'é': [1, 2], 'a': none} | tojson(indent=1, sort_keys=True) }}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if loop.index0 > 0 and message.role == messages[loop.index0 - 1].role %}
        {{ raise_exception('roles must alternate') }}
    {% endif %}
    {% if message.role == 'system' %}
        {% continue %}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if ns.turns > 9 %}{% break %}{% endif %}
[{{ ns.turns }} {{ message.role }} {{ strftime_now('%Y') | length }}] {{ message.content }}\
{{ eos_token if message.role == 'assistant' else '' }}
{% endfor %}
"""

SENTENCES = ["You are a helpful assistant.", "Hello there, how are you today?", "I am fine, thank you very much.",
             "What is two plus two?", "Two plus two is four.", "Tell me a joke about cats.",
             "Why did the cat sit on the computer? To keep an eye on the mouse!", "What is the weather in Paris?",
             "It is sunny in Paris.", "get_weather city temperature", "system user assistant tool"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHAT = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Two plus two is four."}]
SYSTEM_CHAT = [{"role": "system", "content": "You are a helpful assistant."}, *CHAT]
MULTI_TURN = [*SYSTEM_CHAT, {"role": "user", "content": "Tell me a joke about cats."},
              {"role": "assistant", "content": "  Why did the cat sit on the computer? To keep an eye on the mouse!\n"},
              {"role": "user", "content": "Hello there, how are you today?"},
              {"role": "assistant", "content": "I am fine, thank you very much."}]
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}
TOOL_CHAT = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": None,
              "tool_calls": [{"type": "function",
                              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "sunny, 21°C"}, {"role": "assistant", "content": "It is sunny in Paris."}]


def build_tokenizer(specials: list[str], bos: str | None = None, trim_offsets: bool = False) -> HFTokenizer:
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if bos is not None:  # the post-processor puts BOS first when special tokens are added (Llama-3's tokenizer)
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[
            (bos, tokenizer.token_to_id(bos))])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=trim_offsets)
    return tokenizer


def added_token(content: str) -> dict:
    return {"__type": "AddedToken", "content": content, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False, "special": True}


def make_checkpoint(folder, tokenizer: HFTokenizer, config: dict):
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    chatml = build_tokenizer(CHATML_SPECIALS, trim_offsets=True)
    llama = build_tokenizer(LLAMA3_SPECIALS, bos="<|begin_of_text|>")
    return {
        "qwen": make_checkpoint(root / "qwen", chatml, {"chat_template": QWEN, "eos_token": "<|im_end|>",
                                                        "pad_token": "<|endoftext|>"}),
        "llama3": make_checkpoint(root / "llama3", llama, {
            "chat_template": LLAMA3, "bos_token": added_token("<|begin_of_text|>"),
            "eos_token": added_token("<|eot_id|>")}),
        "generation": make_checkpoint(root / "generation", chatml, {"chat_template": CHATML_GENERATION,
                                                                    "eos_token": "<|im_end|>"}),
        "features": make_checkpoint(root / "features", chatml, {"chat_template": FEATURES, "eos_token": "<|im_end|>"}),
        "none": make_checkpoint(root / "none", chatml, {"eos_token": "<|im_end|>"}),
    }


def transformers_tokenizer(folder):
    transformers = pytest.importorskip("transformers")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    special = {key: value["content"] if isinstance(value, dict) else value for key, value in config.items()
               if key.endswith("_token")}
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                                chat_template=config.get("chat_template"), **special)


def write_jsonl(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def diagnostic_of(excinfo):
    (diagnostic,) = excinfo.value.diagnostics
    return diagnostic


# --- chat templates against transformers -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen", "llama3", "features"])
@pytest.mark.parametrize("chat", [CHAT, SYSTEM_CHAT, MULTI_TURN], ids=["one-turn", "system", "multi-turn"])
def test_chats_render_and_tokenize_as_transformers_apply_chat_template(checkpoints, name, chat):
    hf = transformers_tokenizer(checkpoints[name])
    template = ChatTemplate.from_folder(checkpoints[name])
    for prompt in (False, True):
        assert template.render(chat, add_generation_prompt=prompt) == hf.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=prompt)
    (example,) = read_examples(write_jsonl(checkpoints[name] / "chat.jsonl", [{"messages": chat}]),
                               checkpoints[name], Tokenizer(checkpoints[name]), eos=None)
    expected = hf.apply_chat_template(chat, tokenize=True)["input_ids"]
    assert example.ids.tolist() == expected and example.ids.dtype == np.int64
    if name == "llama3":  # the template writes the BOS; no second one is added
        assert expected.count(hf.convert_tokens_to_ids("<|begin_of_text|>")) == 1


def test_tool_calls_and_tools_render_as_transformers(checkpoints):
    hf = transformers_tokenizer(checkpoints["qwen"])
    (example,) = read_examples(write_jsonl(checkpoints["qwen"] / "tools.jsonl",
                                           [{"messages": TOOL_CHAT, "tools": [WEATHER_TOOL]}]),
                               checkpoints["qwen"], Tokenizer(checkpoints["qwen"]), eos=None)
    expected = hf.apply_chat_template(TOOL_CHAT, tools=[WEATHER_TOOL], tokenize=True)["input_ids"]
    assert example.ids.tolist() == expected
    decoded = hf.decode(example.ids[example.mask].tolist())
    assert decoded == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
                       "It is sunny in Paris.<|im_end|>\n")


@pytest.mark.parametrize("name, ends", [("qwen", "<|im_end|>\n"), ("llama3", "<|eot_id|>")])
def test_the_mask_holds_exactly_the_assistant_messages_and_their_end_of_turn(checkpoints, name, ends):
    hf = transformers_tokenizer(checkpoints[name])
    (example,) = read_examples(write_jsonl(checkpoints[name] / "multi.jsonl", [{"messages": MULTI_TURN}]),
                               checkpoints[name], Tokenizer(checkpoints[name]), eos=None)
    contents = [m["content"] if name == "qwen" else m["content"].strip()  # Llama-3's template trims
                for m in MULTI_TURN if m["role"] == "assistant"]
    # each run of targets decodes to one assistant message and its end of turn
    edges = np.flatnonzero(np.diff(np.concatenate([[0], example.mask.astype(int), [0]])))
    runs = [hf.decode(example.ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2])]
    assert runs == [content + ends for content in contents]


def test_generation_blocks_give_transformers_assistant_masks(checkpoints):
    hf = transformers_tokenizer(checkpoints["generation"])
    assert ChatTemplate.from_folder(checkpoints["generation"]).has_generation_blocks
    records = [{"messages": chat} for chat in (CHAT, SYSTEM_CHAT, MULTI_TURN)]
    examples = read_examples(write_jsonl(checkpoints["generation"] / "g.jsonl", records), checkpoints["generation"],
                             Tokenizer(checkpoints["generation"]), eos=None)
    for example, record in zip(examples, records):
        out = hf.apply_chat_template(record["messages"], tokenize=True, return_assistant_tokens_mask=True)
        assert example.ids.tolist() == out["input_ids"]
        assert example.mask.astype(int).tolist() == out["assistant_masks"] and example.mask.any()


def test_a_template_that_renders_earlier_turns_otherwise_is_e030(tmp_path, checkpoints):
    thinking = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}"
                "<think></think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    folder = make_checkpoint(tmp_path / "thinking", build_tokenizer(CHATML_SPECIALS), {"chat_template": thinking})
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}, {"messages": MULTI_TURN}]), folder,
                      Tokenizer(folder), eos=None)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and diagnostic.span.line == 2 and "message 3" in diagnostic.message
    assert "generation" in diagnostic.hint


def test_a_template_that_fails_is_e030_naming_the_line(tmp_path, checkpoints):
    two_users = [{"role": "user", "content": "Hello there"}, *CHAT]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}, {"messages": two_users}])
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(path, checkpoints["features"], Tokenizer(checkpoints["features"]), eos=None)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and "roles must alternate" in diagnostic.message and diagnostic.hint
    assert (diagnostic.span.line, diagnostic.span.column) == (2, len('{"messages": ') + 1)
    assert f"{path}:2:" in diagnostic.render()


def test_the_sandbox_keeps_templates_from_python(tmp_path):
    folder = make_checkpoint(tmp_path / "escape", build_tokenizer(CHATML_SPECIALS),
                             {"chat_template": "{{ ''.__class__.__mro__ }}{{ messages[0].content }}"})
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}]), folder, Tokenizer(folder), eos=None)
    assert diagnostic_of(excinfo).code == "E030" and "SecurityError" in diagnostic_of(excinfo).message


def test_templates_are_read_as_transformers_reads_them(tmp_path, checkpoints):
    chatml = build_tokenizer(CHATML_SPECIALS)
    named = make_checkpoint(tmp_path / "named", chatml, {"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}],
        "bos_token": added_token("<|im_start|>")})
    assert ChatTemplate.from_folder(named).render(CHAT) == "D<|im_start|>"
    (named / "chat_template.jinja").write_text("J{{ messages | length }}{{ eos_token }}")  # the file comes first
    template = ChatTemplate.from_folder(named)
    assert template.render(CHAT) == "J2" and template.special_tokens == {"bos_token": "<|im_start|>"}
    transformers = pytest.importorskip("transformers")
    assert transformers.PreTrainedTokenizerFast.from_pretrained(str(named)).apply_chat_template(
        CHAT, tokenize=False) == "J2"
    assert ChatTemplate.from_folder(checkpoints["none"]) is None and ChatTemplate.from_folder(tmp_path) is None
    nameless = make_checkpoint(tmp_path / "nameless", chatml, {"chat_template": [{"name": "a", "template": "A"}]})
    with pytest.raises(DiagnosticError) as excinfo:
        ChatTemplate.from_folder(nameless)
    assert diagnostic_of(excinfo).code == "E030" and "default" in diagnostic_of(excinfo).message


def test_a_template_that_is_no_jinja_is_e030(tmp_path):
    folder = make_checkpoint(tmp_path / "broken", build_tokenizer(CHATML_SPECIALS),
                             {"chat_template": "{% for m in messages %}{{ m.content }}"})
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}]), folder, Tokenizer(folder), eos=None)
    assert diagnostic_of(excinfo).code == "E030" and "tokenizer_config.json" in diagnostic_of(excinfo).message


def test_a_chat_file_for_a_checkpoint_without_a_template_is_e030_with_a_hint(tmp_path, checkpoints):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}])
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(path, checkpoints["none"], Tokenizer(checkpoints["none"]), eos=None)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and "no chat template" in diagnostic.message
    assert "chat_template.jinja" in diagnostic.hint and "prompt" in diagnostic.hint
    assert (diagnostic.span.line, diagnostic.span.column) == (1, len('{"messages": ') + 1)


# --- text and prompt/completion examples ---------------------------------------------------------------------------


def test_text_lines_are_tokenized_as_the_plain_pipeline_with_every_token_a_target(tmp_path, checkpoints):
    tokenizer = Tokenizer(checkpoints["llama3"])
    eos = tokenizer.inner.token_to_id("<|eot_id|>")
    texts = ["Hello there, how are you today?", "Two plus two is four."]
    examples = read_examples(write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts]),
                             checkpoints["llama3"], tokenizer, eos)
    assert np.concatenate([e.ids for e in examples]).tolist() == token_stream(texts, tokenizer.encode, eos).tolist()
    assert all(e.mask.all() for e in examples)
    (whole,) = read_examples(write_jsonl(tmp_path / "plain.txt", ["just text"]), checkpoints["llama3"], tokenizer, eos)
    assert whole.ids.tolist() == tokenizer.encode("just text\n") + [eos]


def test_prompt_completion_targets_only_the_completion_and_eos(tmp_path, checkpoints):
    tokenizer = Tokenizer(checkpoints["llama3"])
    eos = tokenizer.inner.token_to_id("<|eot_id|>")
    prompt, completion = "What is two plus two? ", "Two plus two is four."
    (example,) = read_examples(write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, "completion": completion}]),
                               checkpoints["llama3"], tokenizer, eos)
    assert example.ids.tolist() == tokenizer.encode(prompt + completion) + [eos]
    assert example.ids[0] == tokenizer.inner.token_to_id("<|begin_of_text|>") and not example.mask[0]
    decode = tokenizer.inner.decode
    assert decode(example.ids[~example.mask].tolist(), skip_special_tokens=False) == "<|begin_of_text|>" + prompt
    assert decode(example.ids[example.mask].tolist(), skip_special_tokens=False) == completion + "<|eot_id|>"


def test_prompt_completion_as_utf8_bytes_without_a_tokenizer(tmp_path):
    (example,) = read_examples(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "é?", "completion": "ü!"}]),
                               tmp_path, Tokenizer(tmp_path), eos=None)
    assert example.ids.tolist() == list("é?ü!".encode()) and example.mask.tolist() == [0, 0, 0, 1, 1, 1]
    assert offset_encoder(Tokenizer(tmp_path))("aé", False) == ([97, 0xC3, 0xA9], [(0, 1), (1, 2), (1, 2)])


def test_tokens_overlapping_a_span_are_in_it():
    offsets = [(0, 2), (2, 5), (5, 5), (5, 8), (8, 9)]
    assert tokens_in_spans(offsets, [(3, 5)]).tolist() == [False, True, False, False, False]
    assert tokens_in_spans(offsets, [(0, 1), (6, 9)]).tolist() == [True, False, False, True, True]
    assert tokens_in_spans([], [(0, 1)]).tolist() == []


def test_data_without_targets_is_e030(tmp_path, checkpoints):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hello", "completion": ""}])
    with pytest.raises(DiagnosticError) as excinfo:
        read_examples(path, checkpoints["qwen"], Tokenizer(checkpoints["qwen"]), eos=None)
    assert diagnostic_of(excinfo).code == "E030" and "no token to train on" in diagnostic_of(excinfo).message


def test_the_pad_id_is_the_tokenizers_else_eos_else_zero(tmp_path, checkpoints):
    qwen = Tokenizer(checkpoints["qwen"])
    assert pad_token_id(checkpoints["qwen"], qwen, eos=7) == qwen.inner.token_to_id("<|endoftext|>")
    assert pad_token_id(checkpoints["llama3"], Tokenizer(checkpoints["llama3"]), eos=7) == 7
    assert pad_token_id(tmp_path, Tokenizer(tmp_path), eos=None) == 0


# --- malformed lines ---------------------------------------------------------------------------------------------

BAD_LINES = [  # the line, the text the caret is under, words of the message
    ("[1, 2]", "[1, 2]", "a JSON list, not an object"),
    ('{"body": "x"}', '{"body": "x"}', 'no "text", "prompt"/"completion" or "messages"'),
    ('{"text": "a", "messages": []}', '{"text": "a", "messages": []}', 'both "text" and "messages"'),
    ('{"text": 5}', "5", '"text" is a int, not a string'),
    ('{"prompt": "a"}', '"a"', 'has "prompt" but no "completion"'),
    ('{"prompt": "a", "completion": ["b"]}', '["b"]', '"completion" is a list, not a string'),
    ('{"messages": []}', "[]", '"messages" is an empty list'),
    ('{"messages": "hi"}', '"hi"', '"messages" is a string, not a list'),
    ('{"messages": [{"role": "user", "content": "a"}, "b"]}', '"b"', "message 2 is a string, not an object"),
    ('{"messages": [{"content": "a"}]}', '{"content": "a"}', 'message 1 has no "role"'),
    ('{"messages": [{"role": 3, "content": "a"}]}', "3", 'message 1 has a "role" that is a int'),
    ('{"messages": [{"role": "", "content": "a"}]}', '""', "an empty string"),
    ('{"messages": [{"role": "user"}]}', '{"role": "user"}', 'message 1 (user) has no "content"'),
    ('{"messages": [{"role": "user", "content": {"a": 1}}]}', '{"a": 1}', 'has a "content" that is a object'),
    ('{"messages": [{"role": "user", "content": "a"}]}', '[{"role": "user", "content": "a"}]',
     'no "assistant" message'),
    ('{"messages": [{"role": "assistant", "content": "a"}], "tools": {}}', "{}", '"tools" is a object'),
    ('{"text": "a", "text": 1}', "1", '"text" is a int'),  # json.loads keeps the last of repeated keys
]


@pytest.mark.parametrize("line, under, words", BAD_LINES)
def test_malformed_lines_are_e030_with_the_caret_under_their_field(tmp_path, line, under, words):
    path = write_jsonl(tmp_path / "d.jsonl", [line])
    with pytest.raises(DiagnosticError) as excinfo:
        read_records(path)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and words in diagnostic.message and diagnostic.hint
    assert diagnostic.span.line == 1 and diagnostic.span.text == under
    assert f"{path}:1:{line.rindex(under) + 1}: error[E030]" in diagnostic.render()


def test_a_line_that_is_no_json_is_e030_at_the_column_json_stops(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ['{"text": "a"}', '{"text": "b" "c"}'])
    with pytest.raises(DiagnosticError) as excinfo:
        read_records(path)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and "not a JSON object" in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 14)


def test_a_malformed_line_is_named_after_good_and_blank_ones(tmp_path):
    good = json.dumps({"messages": CHAT})
    path = write_jsonl(tmp_path / "d.jsonl", [good, "", good, '{"messages": [{"role": "user", "content": null}]}'])
    with pytest.raises(DiagnosticError) as excinfo:
        read_records(path)
    diagnostic = diagnostic_of(excinfo)
    assert (diagnostic.span.line, diagnostic.span.column) == (4, 43) and diagnostic.span.text == "null"


def test_a_mix_of_kinds_is_e030_naming_the_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b"}, {"prompt": "c", "completion": "d"}])
    with pytest.raises(DiagnosticError) as excinfo:
        read_records(path)
    diagnostic = diagnostic_of(excinfo)
    assert diagnostic.code == "E030" and '"prompt" line among "text" lines' in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (3, len('{"prompt": ') + 1)


def test_unreadable_data_is_e028(tmp_path):
    with pytest.raises(DiagnosticError) as excinfo:
        read_records(tmp_path / "missing.jsonl")
    assert diagnostic_of(excinfo).code == "E028"


def test_tool_calls_may_stand_for_content_and_extra_fields_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": TOOL_CHAT, "id": 3}])
    (record,) = read_records(path)
    assert record.kind == "messages" and record.fields["id"] == 3 and record.span.line == 1


# --- rows and batches --------------------------------------------------------------------------------------------


def example(ids, mask=None) -> Example:
    return Example(ids, np.ones(len(ids), dtype=bool) if mask is None else mask)


def test_a_padded_row_holds_one_example_and_pads_with_ignored_labels():
    inputs, labels, segments, positions = build_row([example([10, 11, 12, 13], [0, 0, 1, 1])], seq=6, pad=0)
    assert inputs.tolist() == [10, 11, 12, 13, 0, 0]
    assert labels.tolist() == [IGNORE, 12, 13, IGNORE, IGNORE, IGNORE]
    assert segments.tolist() == [0, 0, 0, 0, 1, 1] and positions.tolist() == [0, 1, 2, 3, 0, 1]


def test_padded_batches_cut_long_examples_and_count_them():
    examples = [example([1, 2, 3]), example(list(range(20, 30))), example([4, 5])]
    batches = InstructionBatches(examples, seq=4, packing="padded", pad=9)
    assert batches.truncated == 1
    batch = batches.next_batch(3)
    assert isinstance(batch, Batch) and batch.inputs.shape == (3, 4) and batch.inputs.dtype == np.int64
    assert batch.inputs.tolist() == [[1, 2, 3, 9], [20, 21, 22, 23], [4, 5, 9, 9]]
    assert batch.labels.tolist() == [[2, 3, IGNORE, IGNORE], [21, 22, 23, 24], [5, IGNORE, IGNORE, IGNORE]]
    assert label_count(batch) == 7 and label_count(batch.labels[0]) == 2
    assert batches.state() == {"position": 0, "epoch": 1}


def test_packed_rows_keep_examples_whole_with_segments_and_positions():
    examples = [example([1, 2, 3], [1, 0, 1]), example([4, 5]), example([6, 7, 8, 9]), example([10])]
    batches = InstructionBatches(examples, seq=6)
    batch = batches.next_batch(2)
    # row 1: examples 0 and 1 (5 of 7 tokens; example 2 does not fit), row 2: examples 2 and 3
    assert batch.inputs.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 0]]
    assert batch.segments.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 1, 2]]
    assert batch.positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]
    # example 0's second token is no target; no label crosses from one example into the next
    assert batch.labels.tolist() == [[IGNORE, 3, IGNORE, 5, IGNORE, IGNORE], [7, 8, 9, IGNORE, IGNORE, IGNORE]]
    assert batches.state() == {"position": 0, "epoch": 1}


def test_packed_rows_end_an_example_on_its_own_eos_and_cut_long_ones():
    eos = 99
    examples = [example([1, 2, eos], [0, 1, 1]), example(list(range(20, 30)))]
    batches = InstructionBatches(examples, seq=4)
    assert batches.truncated == 1
    first, second = batches.next_row(), batches.next_row()
    assert first[0].tolist() == [1, 2, eos, 0] and first[1].tolist() == [2, eos, IGNORE, IGNORE]
    assert second[0].tolist() == [20, 21, 22, 23] and second[1].tolist() == [21, 22, 23, 24]
    assert second[2].tolist() == [0, 0, 0, 0]


def test_packing_continues_over_the_epoch_boundary():
    batches = InstructionBatches([example([1, 2]), example([3])], seq=6)
    inputs, _, segments, positions = batches.next_row()
    assert inputs.tolist() == [1, 2, 3, 1, 2, 3] and segments.tolist() == [0, 0, 1, 2, 2, 3]
    assert positions.tolist() == [0, 1, 0, 0, 1, 0] and batches.epoch == 2


def test_a_restored_state_reads_the_same_batches():
    rng = np.random.default_rng(0)
    examples = [example(rng.integers(0, 50, n), rng.random(n) < 0.7) for n in rng.integers(1, 12, 13)]
    for packing in ("packed", "padded"):
        first = InstructionBatches(examples, seq=8, packing=packing)
        first.micro_batches(3, 2)
        again = InstructionBatches.from_state(examples, 8, json.loads(json.dumps(first.state())), packing)
        for a, b in zip(first.micro_batches(3, 4), again.micro_batches(3, 4)):
            for field in ("inputs", "labels", "segments", "positions"):
                assert np.array_equal(getattr(a, field), getattr(b, field))
        assert first.state() == again.state() and first.epoch >= 1


def test_the_fingerprint_tells_examples_apart():
    a = [example([1, 2]), example([3])]
    assert examples_fingerprint(a) == InstructionBatches(a, seq=2).fingerprint
    assert examples_fingerprint(a) != examples_fingerprint([example([1]), example([2, 3])])
    assert examples_fingerprint(a) != examples_fingerprint([example([1, 2], [0, 1]), example([3])])


def test_bad_batch_settings_are_value_errors():
    with pytest.raises(ValueError):
        InstructionBatches([example([1])], seq=0)
    with pytest.raises(ValueError):
        InstructionBatches([example([1])], seq=2, packing="zipped")
    with pytest.raises(ValueError):
        InstructionBatches([], seq=2)
