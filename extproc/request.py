"""The one module that knows the shape of an OpenAI request body.

Every helper here takes a payload that passed validation (`stages/validate.py`), yet none
trusts it: each is total over any JSON value, so a stage built on them cannot raise on
what a client sent.
"""

from __future__ import annotations

from typing import Any


def text_of(content: Any) -> str | None:
    """A message's text, or None when it holds anything but text parts (images, audio)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return " ".join(str(p.get("text", "")) for p in content)
    return None


def _any_text(content: Any) -> str:
    """The text parts of a message's content, whatever else it holds."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
            and isinstance(p.get("text"), str)
        )
    return ""


def prompt_texts(payload: dict[str, Any]) -> list[str]:
    """Every piece of text in the prompt, one per message (or per prompt string)."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        return [_any_text(m.get("content")) for m in messages if isinstance(m, dict)]
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return []


def text_slots(payload: dict[str, Any]) -> list[tuple[Any, Any, str]]:
    """Where the prompt's text lives, for a stage that rewrites it: (container, key, path),
    with `container[key]` a string. Every message's string content and text parts, and the
    completions prompt (a string or a list of strings)."""
    slots: list[tuple[Any, Any, str]] = []
    messages = payload.get("messages")
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                slots.append((m, "content", f"messages[{i}].content"))
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    if isinstance(part, dict) and part.get("type") == "text" and isinstance(
                        part.get("text"), str
                    ):
                        slots.append((part, "text", f"messages[{i}].content[{j}].text"))
        return slots
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        slots.append((payload, "prompt", "prompt"))
    elif isinstance(prompt, list):
        slots.extend((prompt, j, f"prompt[{j}]") for j, p in enumerate(prompt) if isinstance(p, str))
    return slots


def token_array_count(payload: dict[str, Any]) -> int:
    """Tokens sent as token ids (legacy completions' `prompt: [[1, 2], ...]` or `[1, 2]`)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
        return sum(len(p) if isinstance(p, list) else 1 for p in prompt)
    return 0


def last_user_text(payload: dict[str, Any]) -> str:
    """The newest user message's text (urgency words, logs); the prompt for completions."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _any_text(message.get("content"))
        return ""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return " ".join(p for p in prompt if isinstance(p, str)) if isinstance(prompt, list) else ""


OVERRIDING_ROLES = ("system", "developer")


def screened_texts(payload: dict[str, Any]) -> list[str]:
    """What the injection screen reads, newest first: every user message's text, and every
    system or developer message but a leading one (a system prompt that arrives mid-conversation
    tries to override the one the application set); for completions, each prompt of the batch."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        return [_any_text(m.get("content")) for i, m in reversed(list(enumerate(messages)))
                if isinstance(m, dict) and (m.get("role") == "user"
                                            or (i > 0 and m.get("role") in OVERRIDING_ROLES))]
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return [prompt] if isinstance(prompt, str) and prompt else []


def split_last(payload: dict[str, Any]) -> tuple[Any, str | None]:
    """(the part of the prompt that goes into the cache scope, the comparable last message).

    Only a plain last user message (role and text content, nothing else) is comparable.
    """
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "user" and set(last) <= {"role", "content"}:
            text = text_of(last.get("content"))
            if text is not None:
                return messages[:-1], text
        return messages, None
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return None, prompt
    return prompt, None


def max_output_tokens(payload: dict[str, Any], default: int) -> int:
    out = payload.get("max_completion_tokens") or payload.get("max_tokens") or default
    n = payload.get("n") or 1
    return int(out) * int(n)


def estimated_tokens(payload: dict[str, Any], prompt_tokens: int, default_max_tokens: int) -> int:
    """What a request may cost at most: its prompt plus every choice's output limit."""
    return prompt_tokens + max_output_tokens(payload, default_max_tokens)


def wants_stream(payload: dict[str, Any]) -> bool:
    return payload.get("stream") is True


def wants_usage(payload: dict[str, Any]) -> bool:
    """A stream that asked for its usage chunk (`stream_options.include_usage`)."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


CLIENT_TIMEOUT_HEADER = "x-stainless-read-timeout"  # OpenAI's SDKs send their read timeout


def client_timeout_s(headers: dict[str, str]) -> float | None:
    """The client's own read timeout in seconds, when it says one (a positive number)."""
    try:
        value = float(headers.get(CLIENT_TIMEOUT_HEADER, ""))
    except ValueError:
        return None
    return value if value > 0 and value != float("inf") else None  # NaN fails `> 0`
