"""Checks `sparrow serve` with the official `openai` Python client (run by openai_client.rs).

Usage: python openai_client.py BASE_URL MODEL CONTEXT
Exits non-zero (an AssertionError or an unexpected exception) on any failure.
"""

import json
import sys
import urllib.error
import urllib.request

import openai

base, model, context = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)

models = client.models.list()
assert [m.id for m in models.data] == [model], models

# Completion (greedy; the tiny model's end-of-sequence is ignored so the length is exact).
greedy = dict(model=model, temperature=0, extra_body={"ignore_eos": True})
c = client.completions.create(prompt="Once upon a time", max_tokens=24, **greedy)
full = c.choices[0].text
assert c.choices[0].finish_reason == "length", c
assert c.usage.completion_tokens == 24, c.usage
assert c.usage.total_tokens == c.usage.prompt_tokens + 24, c.usage

# Streaming gives the same text.
chunks = list(client.completions.create(prompt="Once upon a time", max_tokens=24, stream=True, **greedy))
assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == full
assert chunks[-1].choices[0].finish_reason == "length"

# Stop strings: the text before the first occurrence, finish_reason "stop".
stop = full[len(full) // 2 : len(full) // 2 + 2]
s = client.completions.create(prompt="Once upon a time", max_tokens=24, stop=[stop], **greedy)
assert s.choices[0].text == full[: full.index(stop)], (stop, full, s.choices[0].text)
assert s.choices[0].finish_reason == "stop"
streamed = client.completions.create(prompt="Once upon a time", max_tokens=24, stop=stop, stream=True, **greedy)
assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == full[: full.index(stop)]

# Chat, whole and streamed.
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
r = client.chat.completions.create(messages=msgs, max_tokens=12, **greedy)
assert r.choices[0].message.role == "assistant"
answer = r.choices[0].message.content
assert r.usage.completion_tokens == 12, r.usage
parts = []
roles = []
for ch in client.chat.completions.create(
    messages=msgs, max_tokens=12, stream=True, stream_options={"include_usage": True}, **greedy
):
    if ch.usage is not None:
        assert ch.usage.completion_tokens == 12, ch.usage
    for choice in ch.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            parts.append(choice.delta.content)
assert roles == ["assistant"], roles
assert "".join(parts) == answer, (parts, answer)

# n choices and a seed.
n = client.completions.create(model=model, prompt="abc", max_tokens=8, n=3, seed=5, temperature=1.0)
assert sorted(ch.index for ch in n.choices) == [0, 1, 2]

# Errors: unknown model (404), a prompt longer than the context (400 naming it), bad parameters (400).
try:
    client.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404 and "gpt-4o" in e.message, e
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "z" * (context * 2)}])
    raise AssertionError("prompt longer than the context accepted")
except openai.BadRequestError as e:
    assert str(context) in e.message and e.code == "context_length_exceeded", e
try:
    client.completions.create(model=model, prompt="hi", temperature=7)
    raise AssertionError("temperature 7 accepted")
except openai.BadRequestError as e:
    assert e.param == "temperature", e

# Bad JSON cannot be sent through the client; send it with urllib and check the error shape.
bad = urllib.request.Request(
    base + "/completions", data=b'{"prompt": ', headers={"Content-Type": "application/json"}
)
try:
    urllib.request.urlopen(bad, timeout=60)
    raise AssertionError("bad JSON accepted")
except urllib.error.HTTPError as e:
    assert e.code == 400, e
    assert json.load(e)["error"]["type"] == "invalid_request_error"

# Still serving.
again = client.completions.create(prompt="Once upon a time", max_tokens=24, **greedy)
assert again.choices[0].text == full
print("openai client: all checks passed")
