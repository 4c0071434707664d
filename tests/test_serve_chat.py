"""Chat: a checkpoint's chat template goes into the export and renders a conversation as
transformers' own `apply_chat_template` does (text and ids), and `seqexport serve` answers
POST /v1/chat/completions to the `openai` client (whole and streamed) with the tokens
generate() gives those ids. Bad conversations are 400s naming the field."""

import json
import re
import shutil

import openai
import pytest
import requests
import torch
import transformers
from click.testing import CliRunner
from tokenizers import processors

import seqexport.runtime as rt
from seqexport.cli import cli
from seqexport.errors import ArtifactError, InputError, UsageError
from seqexport.runtime.chat import ChatTemplate
from seqexport.runtime.tokenizer import HFTokenizer
from seqexport.serve.protocol import CHAT_MAX_TOKENS
from tests.test_serve import plain_server
from tests.test_web import byte_level_bpe

BOS = "<|endoftext|>"
MAX_PROMPT = 256
# ChatML (Qwen, Bamba's instruct models), refusing roles it does not know; Qwen3's switch for
# its thinking block, a variable the request may set (chat_template_kwargs)
CHATML = (
    "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' + m['role'] + ' is not one of system, user, assistant') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
# Llama 3's shape: bos, a default system message through a namespace, loop controls, trim
LLAMA3 = (
    "{{ bos_token }}{% set ns = namespace(system='You are helpful.') %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% set ns.system = m.content | trim %}{% endif %}{% endfor %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{{ ns.system }}<|eot_id|>"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# a template that writes JSON (tools' schemas, here the messages) and marks the assistant's turns
JSONISH = (
    "{% for m in messages %}{{ m | tojson }}\n{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{{ eos_token }}{% endgeneration %}{% endif %}{% endfor %}{% if add_generation_prompt %}>>> {% endif %}"
)
# written over lines and indented, as most Hub templates are: block tags' own lines and indents
# vanish (transformers renders with trim_blocks and lstrip_blocks); today's date, as Llama 3.1's
# template writes it
MULTILINE = """{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
Today is {{ date_string }}.
{% for m in messages %}
    {% if m.role == 'user' %}
User: {{ m.content }}
    {% else %}
{{ m.role | capitalize }}: {{ m.content }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
Assistant:
{% endif %}"""
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "jsonish": JSONISH, "multiline": MULTILINE}
CONVERSATION = [{"role": "system", "content": "  Answer with a date.  "},
                {"role": "user", "content": "Friday, 5 März 2021 — 日本語"},
                {"role": "assistant", "content": "2021-03-05"},
                {"role": "user", "content": "and the next day?"}]


def tokenizer_file(folder):
    """A byte-level BPE whose post-processor puts bos first (as Llama's does): a chat template's
    text carries its own, so encoding it must not add a second."""
    tok = byte_level_bpe()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def transformers_tokenizer(folder, template):
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token=BOS,
                                                eos_token=BOS, chat_template=template)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_a_conversation_renders_and_encodes_as_transformers_apply_chat_template(tmp_path, name):
    tokenizer_file(tmp_path)
    theirs = transformers_tokenizer(tmp_path, TEMPLATES[name])
    ours = ChatTemplate(TEMPLATES[name], {"bos_token": BOS, "eos_token": BOS}, where=name)
    tok = HFTokenizer(tmp_path / "tokenizer.json")
    for messages in (CONVERSATION, CONVERSATION[1:2]):
        for opening in (True, False):
            text = theirs.apply_chat_template(messages, add_generation_prompt=opening, tokenize=False)
            ids = theirs.apply_chat_template(messages, add_generation_prompt=opening, tokenize=True)["input_ids"]
            assert ours.render(messages, add_generation_prompt=opening) == text
            assert tok.encode(text, special=False) == ids
    assert ids[:1] != [0, 0]  # (no bos twice)
    # a variable for the template, as transformers' apply_chat_template(**kwargs) passes it
    for variables in ({"enable_thinking": False}, {"enable_thinking": True, "date_string": "5 Mar 2021"}):
        text = theirs.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False, **variables)
        assert ours.render(CONVERSATION, variables=variables) == text


def test_the_template_variables_a_request_may_set_are_checked():
    chat = ChatTemplate(CHATML, {}, where="chatml")
    assert "<think>" in chat.render(CONVERSATION, variables={"enable_thinking": False})
    assert "<think>" not in chat.render(CONVERSATION, variables={"enable_thinking": True})
    for variables, message in (([1], "expected an object of variable names to values, got [1]"),
                               ({"messages": []}, "['messages'] are set by the request itself"),
                               ({"not a name": 1}, "expected an object of variable names")):
        with pytest.raises(InputError, match=re.escape(message)):
            chat.render(CONVERSATION, variables=variables)


def checkpoint(folder, chat: dict | None):
    """A transformers Mamba checkpoint with its tokenizer and `chat` ({file: text}) beside it."""
    tok = tokenizer_file(folder)
    torch.manual_seed(0)
    hf = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, state_size=8, pad_token_id=1))
    with torch.no_grad():  # tokens that vary, and depend on the whole prompt (slow decays, small Δ)
        for layer in hf.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.5)
            layer.mixer.dt_proj.bias.uniform_(-6.0, -3.0)
            layer.mixer.out_proj.weight.mul_(5.0)
    hf.save_pretrained(folder)
    config = {"bos_token": BOS, "eos_token": {"content": BOS, "special": True}, "unk_token": "<unk>"}
    for file, text in (chat or {}).items():
        if file == "tokenizer_config.json":
            config["chat_template"] = text
        else:
            (folder / file).write_text(text)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def export(folder, out):
    result = CliRunner().invoke(cli, ["export", "mamba", "--checkpoint", str(folder), "--out", str(out)])
    return result


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    result = export(checkpoint(root / "ckpt", {"chat_template.jinja": CHATML}), root / "m")
    assert result.exit_code == 0, result.output
    return root / "ckpt", root / "m"


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json", "named"])
def test_the_export_keeps_the_checkpoints_chat_template_wherever_it_lies(tmp_path, where):
    chat = ({"tokenizer_config.json": [{"name": "tool_use", "template": JSONISH}, {"name": "default", "template": LLAMA3}]}
            if where == "named" else {where: LLAMA3})
    folder = checkpoint(tmp_path / "ckpt", chat)
    assert export(folder, tmp_path / "m").exit_code == 0
    model = rt.load(tmp_path / "m", provider="cpu")
    record = model.manifest["tokenizer"]["chat_template"]
    assert record["file"] == "chat_template.jinja" and (tmp_path / "m" / "chat_template.jinja").read_text() == LLAMA3
    assert record["special_tokens"] == {"bos_token": BOS, "eos_token": BOS, "unk_token": "<unk>"}
    shown = CliRunner().invoke(cli, ["inspect", str(tmp_path / "m")])
    assert "chat template: chat_template.jinja" in shown.output, shown.output
    want = transformers_tokenizer(folder, LLAMA3).apply_chat_template(CONVERSATION, add_generation_prompt=True,
                                                                      tokenize=True)["input_ids"]
    assert model.encode_chat(CONVERSATION) == want


def test_a_quantised_copy_keeps_the_chat_template_and_an_altered_one_is_refused(chat_export, tmp_path):
    ckpt, folder = chat_export
    result = CliRunner().invoke(cli, ["quantize", str(folder), "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    want = rt.load(folder, provider="cpu").encode_chat(CONVERSATION[1:])
    assert rt.load(tmp_path / "q", provider="cpu").encode_chat(CONVERSATION[1:]) == want
    shutil.copytree(folder, tmp_path / "altered")
    (tmp_path / "altered" / "chat_template.jinja").write_text(CHATML.replace("im_start|>assistant", "im_start|>Assistant"))
    with pytest.raises(ArtifactError, match=r"chat template: sha256 of .*chat_template.jinja .* \(file altered\)"):
        rt.load(tmp_path / "altered", provider="cpu")


def test_special_tokens_are_read_from_special_tokens_map_too(tmp_path):
    folder = checkpoint(tmp_path / "ckpt", {"chat_template.jinja": LLAMA3})
    (folder / "tokenizer_config.json").write_text(json.dumps({}))  # an older checkpoint: the strings elsewhere
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": BOS}, "eos_token": BOS}))
    assert export(folder, tmp_path / "m").exit_code == 0
    model = rt.load(tmp_path / "m", provider="cpu")
    assert model.manifest["tokenizer"]["chat_template"]["special_tokens"] == {"bos_token": BOS, "eos_token": BOS}
    assert model.encode_chat(CONVERSATION[1:2])[:1] == [0]  # the template's bos_token


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update(chat_template="chat_template.jinja"), "field 'tokenizer.chat_template'"),
    (lambda t: t["chat_template"].update(file="../chat_template.jinja"),
     "field 'tokenizer.chat_template.file' is '../chat_template.jinja'; expected a file name inside"),
    (lambda t: t["chat_template"].update(special_tokens={"bos_token": 0}), "'tokenizer.chat_template.special_tokens'"),
    (lambda t: t["chat_template"].pop("sha256"), "field 'tokenizer.chat_template.sha256' is missing"),
])
def test_a_malformed_chat_template_record_is_refused_naming_the_field(chat_export, tmp_path, change, message):
    folder = shutil.copytree(chat_export[1], tmp_path / "m")
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest["tokenizer"])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError) as caught:
        rt.load(folder, provider="cpu")
    assert message in str(caught.value)


def test_no_template_no_chat_and_a_broken_one_stops_the_export(tmp_path):
    assert export(checkpoint(tmp_path / "none", None), tmp_path / "m").exit_code == 0
    model = rt.load(tmp_path / "m", provider="cpu")
    assert "chat_template" not in model.manifest["tokenizer"] and model.chat_template is None
    with pytest.raises(UsageError, match="has no chat template"):
        model.encode_chat(CONVERSATION)
    broken = checkpoint(tmp_path / "broken", {"chat_template.jinja": "{% for m in messages %}\n{{ m.content }"})
    result = export(broken, tmp_path / "b")
    assert result.exit_code == 2 and f"chat template {broken / 'chat_template.jinja'}: line 2: " in result.output
    assert not (tmp_path / "b").exists()
    unnamed = checkpoint(tmp_path / "unnamed", {"tokenizer_config.json": [{"name": "tool_use", "template": CHATML}]})
    result = export(unnamed, tmp_path / "u")
    assert result.exit_code == 2 and "no template named 'default' among ['tool_use']" in result.output


@pytest.mark.parametrize("messages, message", [
    ([], "messages: expected a non-empty list"),
    ([{"content": "hi"}], "messages[0].role: expected a non-empty string"),
    ([{"role": "user", "content": 3}], "messages[0].content: expected a string or a list of text parts, got 3"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     'messages[0].content[0]: expected a text part {"type": "text", "text": ...}, got "image_url"'),
    ([{"role": "tool", "content": "x"}], "the model's chat template refused them: role tool is not one of"),
])
def test_a_conversation_the_template_cannot_take_is_an_input_error(messages, message):
    with pytest.raises(InputError) as caught:
        ChatTemplate(CHATML, {}, where="chatml").render(messages)
    assert message in str(caught.value)


def test_text_parts_are_joined_as_one_content():
    parts = [{"role": "user", "content": [{"type": "text", "text": "5 May"}, {"type": "text", "text": "2021"}]}]
    chat = ChatTemplate(CHATML, {}, where="chatml")
    assert chat.render(parts) == chat.render([{"role": "user", "content": "5 May\n2021"}])


@pytest.fixture(scope="module")
def server(chat_export, tmp_path_factory):
    with plain_server(chat_export[1], tmp_path_factory, "--max-rows", "4", "--max-prompt-tokens", str(MAX_PROMPT)) as s:
        yield s


def expected(chat_export, messages, max_tokens):
    """What generate() gives the ids transformers' apply_chat_template makes of `messages`."""
    ckpt, folder = chat_export
    ids = transformers_tokenizer(ckpt, CHATML).apply_chat_template(messages, add_generation_prompt=True,
                                                                   tokenize=True)["input_ids"]
    model = rt.load(folder, provider="cpu")
    tokens = rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=max_tokens, eos_id=-1))[0]
    return ids, tokens, model.tokenizer.decode(tokens, stop_at_eos=False)


def test_the_openai_clients_chat_call_gets_the_tokens_of_the_rendered_conversation(server, chat_export):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ids, tokens, text = expected(chat_export, CONVERSATION[1:], 12)
    answer = c.chat.completions.create(model="m", messages=CONVERSATION[1:], max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == text and len(set(tokens)) > 2
    assert choice.model_extra["token_ids"] == tokens and choice.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(ids), 12)
    stream = c.chat.completions.create(model="m", messages=CONVERSATION[1:], max_completion_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
    # a stop string ends the answer before it, as in /v1/completions
    stop = text[3:6]
    answer = c.chat.completions.create(model="m", messages=CONVERSATION[1:], max_tokens=12, temperature=0, stop=stop,
                                       extra_body={"ignore_eos": True})
    assert answer.choices[0].message.content == text[:text.index(stop)] and answer.choices[0].finish_reason == "stop"
    # text held back as a stop string's possible start, then let go when the answer ends: its delta
    held = text[-1:] + "\x00"  # (the last character may begin it: held until the end)
    stream = c.chat.completions.create(model="m", messages=CONVERSATION[1:], max_tokens=12, temperature=0, stop=held,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == text
    # no max_tokens: the answer runs to its end (here, eos ignored, CHAT_MAX_TOKENS), not to 16 tokens
    answer = c.chat.completions.create(model="m", messages=CONVERSATION[1:], temperature=0,
                                       extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == CHAT_MAX_TOKENS and answer.choices[0].finish_reason == "length"
    # vLLM's chat_template_kwargs: more variables for the template (Qwen3's enable_thinking)
    plain = transformers_tokenizer(chat_export[0], CHATML)
    thinking = plain.apply_chat_template(CONVERSATION[1:], add_generation_prompt=True, tokenize=True,
                                         enable_thinking=False)["input_ids"]
    answer = c.chat.completions.create(model="m", messages=CONVERSATION[1:], max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert answer.usage.prompt_tokens == len(thinking) > len(ids)


@pytest.mark.parametrize("body, param, message", [
    ({}, "messages", "messages: missing"),
    ({"messages": "hi"}, "messages", 'messages: expected a non-empty list of {role, content} objects, got "hi"'),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "role tool is not one of system, user, assistant"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "this model reads text only"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "max_completion_tokens": 2},
     "max_completion_tokens", "not both"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens",
     "expected an integer >= 1, got 0"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt", "unknown field"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs", "['add_generation_prompt'] are set by the request itself"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}, "chat_template_kwargs",
     "expected an object of variable names to values"),
    ({"messages": [{"role": "user", "content": "5 May 2021, " * 100}]}, "messages",
     f"tokens exceeds the limit of {MAX_PROMPT} (the conversation through the chat template)"),
])
def test_a_bad_chat_request_is_a_400_naming_the_field(server, body, param, message):
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and message in error["message"], r.text


# the system message last, just before the answer, where this tiny model's output depends on it
SYSTEM_LAST = ("{% for m in messages if m.role != 'system' %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
               "{% for m in messages if m.role == 'system' %}{{ m.content }}{% endfor %}")


def test_generate_chat_puts_the_text_through_the_template(tmp_path):
    folder = tmp_path / "m"
    assert export(checkpoint(tmp_path / "ckpt", {"chat_template.jinja": SYSTEM_LAST}), folder).exit_code == 0
    model = rt.load(folder, provider="cpu")
    ref = transformers_tokenizer(tmp_path / "ckpt", SYSTEM_LAST)

    def answer(messages):
        ids = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        return model.tokenizer.decode(rt.generate(model, [ids], rt.SearchOptions(max_new_tokens=8, eos_id=-1))[0],
                                      stop_at_eos=False)

    user = {"role": "user", "content": "5 März"}
    want = answer([{"role": "system", "content": "Be brief."}, user])
    assert want != answer([user])  # the system message matters to the answer
    result = CliRunner().invoke(cli, ["generate", str(folder), "--chat", "--system", "Be brief.", "--text", "5 März",
                                      "--max-new-tokens", "8", "--eos-id", "-1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip("\n") == want
    for args, message in ((["--system", "x", "--text", "a"], "--system is a chat's system message: add --chat"),
                          (["--chat", "--ids", "1 2"], "--chat takes the user's message as --text")):
        result = CliRunner().invoke(cli, ["generate", str(folder), *args])
        assert result.exit_code == 2 and message in result.output, result.output
