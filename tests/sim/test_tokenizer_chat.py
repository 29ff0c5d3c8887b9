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


def test_the_simulators_memo_cuts_a_prompt_exactly_as_the_whole_text_is_cut():
    """The simulator tokenizes a chat turn section by section, remembering the
    sections it has seen: the pieces must be those of the whole text, whatever
    the sections hold (newlines inside, none at the end, non-ASCII, CRLF)."""
    import random

    rng = random.Random(7)
    words = ["alpha", " beta", "\t", "x" * 9, "é", "日本", "  ", "\n", "a\nb", "\r\n", "end\n", ""]
    memo = tokenizer.PiecesMemo(max_pieces=300)  # small: evictions happen
    for _ in range(2000):
        sections = ["".join(rng.choice(words) for _ in range(rng.randint(0, 10))) for _ in range(rng.randint(0, 6))]
        assert memo.pieces(sections) == tokenizer.pieces("".join(sections)), sections
    assert 0 < memo._held <= 300


def test_a_growing_chat_reads_the_same_through_the_memo_turn_after_turn():
    memo = tokenizer.PiecesMemo()
    messages = [{"role": "system", "content": "You are terse."}]
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {}}}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"turn {turn}: " + "word " * (50 * turn)})
        sections = chat.render_sections(messages, tools)
        assert "".join(sections) == chat.render_chat(messages, tools)
        assert memo.pieces(sections) == tokenizer.pieces(chat.render_chat(messages, tools))
        messages.append({"role": "assistant", "content": "ok", "tool_calls": [{"id": f"c{turn}"}]})
