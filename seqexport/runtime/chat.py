"""A checkpoint's chat template (the Jinja template in its tokenizer_config.json or
chat_template.jinja): a conversation -> the prompt text the model was trained on, rendered as
transformers' `apply_chat_template` renders it, without transformers or torch.

    chat = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"}, where="…/chat_template.jinja")
    text = chat.render([{"role": "user", "content": "Hi"}])   # with the assistant's opening

The template runs in Jinja's immutable sandbox (a template from the Hub is untrusted code),
with what transformers gives it: `messages`, `add_generation_prompt`, the special tokens'
strings, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII, the loop
controls, and `{% generation %}` blocks. A conversation the template refuses
(`raise_exception`, e.g. roles out of order) is an InputError carrying its message.
"""

import json
from datetime import datetime
from pathlib import Path

from seqexport.errors import ArtifactError, InputError, shown

MAX_MESSAGES = 4096


def check_messages(messages) -> list[dict]:
    """OpenAI's chat messages, checked: a non-empty list of objects, each with a non-empty string
    `role` and `content` a string or a list of text parts (joined with newlines, as vLLM does
    for a template that reads strings). InputError naming the message and field."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"messages: expected a non-empty list of {{role, content}} objects, got {shown(messages)}")
    if len(messages) > MAX_MESSAGES:
        raise InputError(f"messages: {len(messages)} messages; at most {MAX_MESSAGES}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}]: expected an object with role and content, got {shown(m)}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise InputError(f"messages[{i}].role: expected a non-empty string (system, user, assistant, ...), "
                             f"got {shown(role)}")
        out.append({**m, "content": _content(m.get("content"), i)})
    return out


RESERVED = ("messages", "add_generation_prompt", "tools", "documents")


def check_variables(variables) -> dict:
    """A template's extra variables: an object of names to JSON values, none of RESERVED."""
    if variables is None:
        return {}
    if not isinstance(variables, dict) or not all(isinstance(k, str) and k.isidentifier() for k in variables):
        raise InputError(f"chat_template_kwargs: expected an object of variable names to values, got {shown(variables)}")
    taken = sorted(set(variables) & set(RESERVED))
    if taken:
        raise InputError(f"chat_template_kwargs: {taken} are set by the request itself; expected other names")
    return variables


def _content(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else None
                raise InputError(f"messages[{i}].content[{k}]: expected a text part {{\"type\": \"text\", \"text\": "
                                 f"...}}, got {shown(kind) if kind else shown(part)} (this model reads text only)")
            texts.append(part["text"])
        return "\n".join(texts)
    raise InputError(f"messages[{i}].content: expected a string or a list of text parts, got {shown(content)}")


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str], where: str):
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Generation(Extension):
            """`{% generation %}…{% endgeneration %}`: transformers marks the assistant's tokens
            with it (for training masks); rendering keeps the body as it is."""

            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

            def _body(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._errors = (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError,
                        AttributeError, ZeroDivisionError, RecursionError)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ArtifactError(f"chat template {where}: line {e.lineno}: {e.message}") from None
        self.source, self.special_tokens, self.where = source, dict(special_tokens), where

    def render(self, messages, add_generation_prompt: bool = True, variables: dict | None = None) -> str:
        """The prompt text of `messages` (checked by `check_messages`), ending with the
        assistant's opening where `add_generation_prompt`. `variables`: more for the template
        (transformers' `apply_chat_template(**kwargs)`, vLLM's `chat_template_kwargs`, e.g.
        {"enable_thinking": false}); they may not replace the messages or the opening."""
        messages = check_messages(messages)
        variables = check_variables(variables)
        try:
            return self._template.render(**{**self.special_tokens, **variables}, messages=messages, tools=None,
                                         documents=None, add_generation_prompt=add_generation_prompt)
        except self._errors as e:
            raise InputError(f"messages: the model's chat template refused them: {e}") from None


def load_chat_template(record: dict | None, folder) -> "ChatTemplate | None":
    """The chat template a manifest's tokenizer record names ("chat_template": {file,
    special_tokens}), or None (a checkpoint without one, or an export from before them)."""
    chat = (record or {}).get("chat_template")
    if chat is None:
        return None
    path = Path(folder) / chat["file"]
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"chat template {path}: cannot read it ({e})") from None
    return ChatTemplate(source, chat.get("special_tokens") or {}, where=str(path))
