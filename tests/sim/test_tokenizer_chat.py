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


def _whole(sections, every):
    from soak.sim.prefix_cache import block_hashes

    pieces = tokenizer.pieces("".join(sections))
    full = len(pieces) - len(pieces) % every
    bounds = [len("".join(pieces[:k])) for k in range(0, full + 1, every)] if full else [0]
    return len(pieces), "".join(sections), bounds, block_hashes(pieces, every)


def test_the_simulators_memo_cuts_a_prompt_exactly_as_the_whole_text_is_cut():
    """The simulator cuts a chat turn section by section, remembering the
    sections it has seen: the token count, block boundaries and block hashes
    must be those of the whole text, whatever the sections hold (newlines
    inside, none at the end, non-ASCII, CRLF)."""
    import random

    from soak.sim.prefix_cache import text_block_hashes

    rng = random.Random(7)
    words = ["alpha", " beta", "\t", "x" * 9, "é", "日本", "  ", "\n", "a\nb", "\r\n", "end\n", ""]
    memo = tokenizer.SectionMemo(max_bytes=2000)  # small: evictions happen
    for _ in range(2000):
        sections = ["".join(rng.choice(words) for _ in range(rng.randint(0, 10))) for _ in range(rng.randint(0, 6))]
        every = rng.choice([1, 2, 3, 7, 16])
        tokens, text, bounds = memo.cut(sections, every=every)
        expected_tokens, expected_text, expected_bounds, expected_hashes = _whole(sections, every)
        assert (tokens, text, bounds) == (expected_tokens, expected_text, expected_bounds), sections
        assert text_block_hashes(text, bounds) == expected_hashes
    assert 0 < memo._held <= 2000


def test_a_growing_chat_reads_the_same_through_the_memo_turn_after_turn():
    from soak.sim.prefix_cache import text_block_hashes

    memo = tokenizer.SectionMemo()
    messages = [{"role": "system", "content": "You are terse."}]
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {}}}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"turn {turn}: " + "word " * (50 * turn)})
        sections = chat.render_sections(messages, tools)
        assert "".join(sections) == chat.render_chat(messages, tools)
        tokens, text, bounds = memo.cut(sections, every=16)
        expected = _whole(sections, 16)
        assert (tokens, text, bounds) == expected[:3] and text_block_hashes(text, bounds) == expected[3]
        messages.append({"role": "assistant", "content": "ok", "tool_calls": [{"id": f"c{turn}"}]})
