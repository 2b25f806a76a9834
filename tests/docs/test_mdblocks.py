"""The doc-test collector itself: blocks, markers and the shape check."""

from __future__ import annotations

from mdblocks import blocks, same_shape

PAGE = """# A page

<!-- doctest: slow -->
<!-- doctest: setup
echo hi > a.txt
-->
```bash
attnlm data info --text a.txt
```

Some text.

```
$ attnlm params --preset x
module   parameters
tok_emb  1,024
...
total    2,048
$ attnlm eval --checkpoint r
loss: 1.5 nats/token
```

<!-- doctest: skip (an outline) -->
<!-- doctest: given
text = "abc"
-->
```python
print(text)
```

```json
{"not": "code"}
```
"""


def test_blocks_markers_and_transcripts(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(PAGE)
    found = blocks(page, "p.md")
    assert [b.kind for b in found] == ["bash", "transcript", "python"]
    bash, shown, py = found
    assert bash.mark("slow") and bash.setup.strip() == "echo hi > a.txt" and bash.line == 7
    assert [c for c, _ in shown.shown] == ["attnlm params --preset x", "attnlm eval --checkpoint r"]
    assert shown.shown[0][1] == ["module   parameters", "tok_emb  1,024", "...", "total    2,048"]
    assert py.mark("skip") == "skip (an outline)" and py.given.strip() == 'text = "abc"'
    assert not shown.marks  # markers belong to the next block only


SHOWN = ["module   parameters", "tok_emb  1,024", "...", "total    2,048"]


def test_same_shape_accepts_other_numbers_and_elided_lines():
    got = "module parameters\ntok_emb 9,999\nblocks 5\nln 7\ntotal 12\n"
    assert same_shape(SHOWN, got) == ""


def test_same_shape_rejects_other_words_missing_lines_and_extra_lines():
    assert same_shape(SHOWN, "module parameters\ntok_emb 1\ntotal 2\n") == ""
    assert "shown" in same_shape(SHOWN, "module parameters\nembedding 1\ntotal 2\n")
    assert same_shape(SHOWN, "module parameters\ntok_emb 1\n") != ""  # no total line
    assert same_shape(["a 1", "b 2"], "a 1\nb 2\nc 3\n") != ""  # a line the page lacks
    assert same_shape(["a 1"], "a x\n") != ""  # a word where a number is shown


def test_same_shape_tolerance_and_free_text():
    assert same_shape(["cos 0.755"], "cos 0.757\n", tol=0.01) == ""
    assert same_shape(["cos 0.755"], "cos 0.800\n", tol=0.01) != ""
    assert same_shape(["ROMEO: text"], "anything\nat all\n", free=True) == ""
    assert same_shape(["ROMEO: text"], "", free=True) != ""


def test_lines_marker_with_words_frees_only_those_commands(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- doctest: lines translate -->\n```\n$ attnlm eval\nx\n"
                    "$ attnlm translate a\ny\n```\n")  # fmt: skip
    (b,) = blocks(page, "p.md")
    assert not b.free("attnlm eval") and b.free("attnlm translate a")
    page.write_text("<!-- doctest: lines -->\n```\n$ attnlm eval\nx\n```\n")
    assert blocks(page, "p.md")[0].free("attnlm eval")
