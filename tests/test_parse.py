from sage_rl.agent.parse import CodeSource, parse_reply


def test_single_fenced_block_with_prose():
    r = parse_reply("Let me log in first.\n```python\nx = 1\nprint(x)\n```\nThat should work.")
    assert r.code == "x = 1\nprint(x)"
    assert r.source is CodeSource.FENCED


def test_several_blocks_are_joined_in_order():
    r = parse_reply("```python\na = 1\n```\nand then\n```py\nprint(a)\n```")
    assert r.code == "a = 1\n\nprint(a)"


def test_unclosed_fence_takes_the_rest():
    r = parse_reply("```python\ndef f():\n    return 2\nprint(f())")
    assert r.code == "def f():\n    return 2\nprint(f())"


def test_non_python_fences_are_ignored():
    r = parse_reply('```json\n{"a": 1}\n```\n```python\nprint(1)\n```')
    assert r.code == "print(1)"


def test_code_tags_including_unclosed():
    assert parse_reply("<code>print(3)</code>").code == "print(3)"
    assert parse_reply("Sure: <code>\nprint(4)\n").source is CodeSource.TAG


def test_bare_code_needs_a_call_or_definition():
    assert parse_reply("print(apis.supervisor.show_profile())").source is CodeSource.BARE
    assert parse_reply("Hello").code is None
    assert parse_reply("I will now solve the task.").code is None
    assert parse_reply("").source is CodeSource.NONE


def test_empty_fence_is_no_code():
    assert parse_reply("```python\n\n```").code is None
