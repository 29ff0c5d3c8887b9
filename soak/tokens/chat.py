"""The simulator's chat template: plain text, prefix-stable, tools counted.

``render_chat(msgs[:k], add_generation_prompt=True)`` is a prefix of
``render_chat(msgs[:k] + [assistant, ...])``: appending messages only appends
text, so a session's turns share their prefix block for block, as with real
templates. Tool schemas are rendered once at the top (sorted-key JSON), so they
count toward the prompt and are part of the shared prefix. Every section ends
with a newline, so the token count of the whole is the sum of the sections'.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

GENERATION_PROMPT = "<|assistant|>\n"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        out = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") == "text":
                    out.append(str(part.get("text", "")))
                else:
                    out.append(json.dumps(part, sort_keys=True, ensure_ascii=False))
            else:
                out.append(str(part))
        return "".join(out)
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


def render_message(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", "user"))
    body = _content_text(message.get("content"))
    extras = []
    if message.get("tool_calls"):
        extras.append("<|tool_calls|>" + json.dumps(message["tool_calls"], sort_keys=True, ensure_ascii=False))
    if message.get("tool_call_id"):
        extras.append(f"<|tool_call_id|>{message['tool_call_id']}")
    if extras:
        body = body + "\n" + "\n".join(extras) if body else "\n".join(extras)
    return f"<|{role}|>\n{body}\n<|end|>\n"


def render_tools(tools: Sequence[Any] | None) -> str:
    if not tools:
        return ""
    return "<|tools|>\n" + json.dumps(list(tools), sort_keys=True, ensure_ascii=False) + "\n<|end|>\n"


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    return "".join(render_sections(messages, tools, add_generation_prompt))


def render_sections(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[str]:
    """``render_chat``'s text as its sections (tools, each message, the
    generation prompt), each ending in a newline."""
    sections = [render_tools(tools)] if tools else []
    sections += [render_message(m) for m in messages]
    if add_generation_prompt:
        sections.append(GENERATION_PROMPT)
    return sections
