from soak.tokens import chat, tokenizer


def test_roundtrip_and_newline_additivity():
    texts = ["Hello world, this is a test.\n", "  def f(x):\n\treturn x*2  # ünïcødé 日本語\n", "\n\n", "a" * 37 + "\n"]
    for a in texts:
        assert tokenizer.decode(tokenizer.encode(a)) == a
        for b in texts + ["tail without newline", " leading space"]:
            assert tokenizer.count(a + b) == tokenizer.count(a) + tokenizer.count(b)


def test_ids_fit_json_safe_integers():
    ids = tokenizer.encode("~~~~ zzzz \U0010ffff\u00a0\t\t\t\t")
    assert max(ids) < 2**53 and min(ids) > 0


def test_chat_is_prefix_stable_and_counts_tools():
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    first = chat.render_chat(msgs, tools)
    longer = chat.render_chat(msgs + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}], tools)
    assert longer.startswith(first)
    assert tokenizer.count(first) > tokenizer.count(chat.render_chat(msgs))
    parts = [{"type": "text", "text": "hi"}]
    assert chat.render_chat([{"role": "user", "content": parts}]) == chat.render_chat([{"role": "user", "content": "hi"}])
