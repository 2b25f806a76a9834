"""Standalone attention HTML: self-contained, offline, the record embedded intact, bad
records rejected. (The browser test opens one and checks what it draws.)"""

from __future__ import annotations

import json
import re

import pytest
import torch
from web_helpers import tiny_checkpoint

from attnlm.base.errors import InputError
from attnlm.web.html import check_record, render_standalone, write_standalone
from attnlm.web.service import load_service

SELF = [[[[1.0, 0.0], [0.25, 0.75]], [[1.0, 0.0], [0.5, 0.5]]]]  # [1 layer][2 heads][2][2]


def embedded(doc: str, element_id: str):
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', doc, re.S)
    assert m, element_id
    return json.loads(m.group(1))


def test_document_is_self_contained_and_round_trips_the_record(tmp_path):
    tokens = ["</script><script>alert(1)</script>", "{{RECORD}} & <b>"]
    rec = {"tokens": tokens, "attention": SELF}
    path = write_standalone(rec, tmp_path / "sub" / "a.html", title="Tom & <Jerry>")
    doc = path.read_text(encoding="utf-8")
    assert embedded(doc, "attn-record") == rec  # tokens survive, placeholders not re-expanded
    assert embedded(doc, "attn-state") == {}
    assert doc.count("</script>") == 3  # two JSON blocks and the inline script: nothing injected
    assert "<title>Tom &amp; &lt;Jerry&gt;</title>" in doc
    assert "<script src" not in doc and "<link" not in doc and "{{" not in doc.split("<body")[0]
    assert "default-src 'none'" in doc  # the file may not fetch anything
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", doc))
    assert urls <= {"http://www.w3.org/2000/svg"}
    assert "AttnViews.mount" in doc and "function drawHeadView" in doc


def test_state_and_cross_attention(tmp_path):
    rec = {
        "tokens": ["a", "b"],
        "attention": SELF,
        "source_tokens": ["x", "y", "z"],
        "cross_attention": [[[[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]] * 2],
    }
    state = {"view": "model", "kind": "cross", "heads": [1]}
    doc = render_standalone(rec, "t", state)
    assert embedded(doc, "attn-record") == rec and embedded(doc, "attn-state") == state
    with pytest.raises(InputError, match="unknown view state"):
        render_standalone(rec, "t", {"zoom": 2})


def test_record_from_a_served_model_and_tensors(tmp_path):
    svc = load_service(tiny_checkpoint(tmp_path / "run"))
    rec = svc.attention("the bank")
    doc = write_standalone(rec, tmp_path / "a.html").read_text(encoding="utf-8")
    assert embedded(doc, "attn-record") == rec
    tensors = {"tokens": ["a", "b"], "attention": [torch.tensor(SELF[0])]}
    assert check_record(tensors) == {"tokens": ["a", "b"], "attention": SELF}


@pytest.mark.parametrize(
    "record, needle",
    [
        ([], "must be a dict"),
        ({"tokens": ["a"]}, "attention"),
        ({"tokens": [], "attention": SELF}, "tokens"),
        ({"tokens": ["a", 1], "attention": SELF}, "tokens"),
        ({"tokens": ["a", "b", "c"], "attention": SELF}, "3 x 3"),
        ({"tokens": ["a", "b"], "attention": [[[[1.0, 0.0], [0.5]]]]}, "2 x 2"),
        ({"tokens": ["a", "b"], "attention": [SELF[0], SELF[0][:1]]}, "heads"),
        ({"tokens": ["a", "b"], "attention": [[[[1.0, 0.0], [float("nan"), 1.0]]]]}, "non-finite"),
        ({"tokens": ["a", "b"], "attention": [[[[1.0, 0.0], ["x", 1.0]]]]}, "non-number"),
        ({"tokens": ["a", "b"], "attention": SELF, "source_tokens": ["x"]}, "both"),
        (
            {
                "tokens": ["a", "b"],
                "attention": SELF,
                "source_tokens": ["x"],
                "cross_attention": [[[[1.0, 0.0], [1.0, 0.0]]]],
            },
            "2 x 1",
        ),
        ({"tokens": ["a", "b"], "attention": SELF, "hidden": []}, "unknown field"),
    ],
)
def test_bad_records(tmp_path, record, needle):
    with pytest.raises(InputError, match=re.escape(needle)):
        write_standalone(record, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()
