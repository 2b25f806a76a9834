"""The explorer's experiments inside a decoder: ``POST /api/ablate``, ``/api/patch`` and
``/api/heads`` on a tiny llama run (``tests/gguf_export_support.py``) and a tiny word GPT,
each answer against :mod:`attnlm.inspect.experiments` called directly on the same run loaded
again; the info's ``interpret`` flag; and the one-line answers for what they refuse (an
unknown head, texts of different lengths in tokens, a BERT and an RNN encoder-decoder, bad
fields, the limits)."""

from __future__ import annotations

import pytest
from test_web_families import tiny_bert, tiny_rnn
from web_helpers import post, request, serving, tiny_checkpoint

from attnlm.base.errors import InputError
from attnlm.inspect import experiments as X
from attnlm.loading.checkpoint import load_checkpoint
from attnlm.web.service import MAX_SCORE_BATCH, load_service
from gguf_export_support import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "the quick brown fox"
CLEAN, CORRUPT = "the quick brown fox", "the lazy brown fox"  # 9 tokens each (tiny BPE)
ANSWER, WRONG = "jumps", "runs"  # first tokens "ju" and "r"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("interp")
    return {
        "llama": tiny_run(base / "llama", "llama"),
        "gpt": tiny_checkpoint(base / "gpt", words=True),
        "bert": tiny_bert(base / "bert"),
        "rnn": tiny_rnn(base / "rnn"),
    }


@pytest.fixture(scope="module")
def server(runs):
    yield from serving([load_service(path, name=name) for name, path in runs.items()])


@pytest.fixture(scope="module")
def llama(runs):
    """The llama run loaded again: the experiments' reference answers."""
    ck = load_checkpoint(runs["llama"])
    return ck.model.eval(), ck.tokenizer


def one_line_error(status: int, data: dict, want: int = 400) -> str:
    assert status == want and set(data) == {"error"}, (status, data)
    assert "\n" not in data["error"] and "Traceback" not in data["error"], data
    return data["error"]


def library_error(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def assert_same_numbers(got, want):
    """The same nested structure; every number within float32 rounding of the reference."""
    if isinstance(want, dict):
        assert set(got) >= set(want), (sorted(got), sorted(want))
        for k in want:
            assert_same_numbers(got[k], want[k])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_numbers(g, w)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    else:
        assert got == want


def test_info_says_which_models_the_experiments_read(server):
    info = {m["name"]: m for m in request(server.url + "api/models")[1]["models"]}
    assert {n: m["interpret"] for n, m in info.items()} == {
        "llama": True, "gpt": True, "bert": False, "rnn": False,
    }  # fmt: skip


# -- ablation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mean", [False, True])
def test_ablate_equals_the_experiment(server, llama, mean):
    model, tok = llama
    heads = ["0.1", "1.2", "1.3"]
    status, got = post(server, "ablate", {"text": TEXT, "heads": heads, "mean": mean,
                                          "k": 7, "model": "llama"})  # fmt: skip
    assert status == 200, got
    want = X.ablation(model, tok, TEXT, [(0, 1), (1, 2), (1, 3)], mean=mean, top=7)
    assert_same_numbers(got, want)
    assert got["k"] == 7 and len(got["top"]) == len(got["top_ablated"]) == 7
    assert got["heads"] == heads and got["ablation"] == ("mean" if mean else "zero")
    assert got["kl"] > 1e-3  # the heads matter: the distribution moved
    assert [r["p"] for r in got["top"]] == sorted((r["p"] for r in got["top"]), reverse=True)
    ps = [r["p_ablated"] for r in got["top_ablated"]]
    assert ps == sorted(ps, reverse=True)


def test_zero_and_mean_ablation_differ_and_no_heads_moves_nothing(server):
    body = {"text": TEXT, "heads": ["0.1"], "model": "llama"}
    zero = post(server, "ablate", body)[1]
    assert zero["k"] == 10 and len(zero["top_ablated"]) == 10  # the default
    mean = post(server, "ablate", {**body, "mean": True})[1]
    assert zero["kl"] != pytest.approx(mean["kl"], rel=1e-3)
    none = post(server, "ablate", {**body, "heads": []})[1]
    assert none["kl"] == pytest.approx(0.0, abs=1e-7)
    assert all(r["p"] == r["p_ablated"] for r in none["top"])


def test_ablate_on_a_word_gpt(server, runs):
    ck = load_checkpoint(runs["gpt"])
    status, got = post(server, "ablate", {"text": "the central bank", "heads": ["1.0"],
                                          "model": "gpt"})  # fmt: skip
    assert status == 200, got
    want = X.ablation(ck.model.eval(), ck.tokenizer, "the central bank", [(1, 0)])
    assert_same_numbers(got, want)
    assert got["k"] == 10 and len(got["top"]) == 10  # the default


# -- patching ----------------------------------------------------------------------------------


def test_patch_equals_the_experiment(server, llama):
    model, tok = llama
    status, got = post(server, "patch", {"clean": CLEAN, "corrupt": CORRUPT, "answer": ANSWER,
                                         "wrong": WRONG, "model": "llama"})  # fmt: skip
    assert status == 200, got
    want = X.patching(model, tok, CLEAN, CORRUPT, ANSWER, WRONG)
    assert_same_numbers(got, want)
    T = len(tok.encode(CLEAN))
    assert len(got["tokens"]) == T and got["tokens"] == [tok.decode([i]) for i in tok.encode(CLEAN)]
    assert len(got["resid"]) == 2 and all(len(r) == T for r in got["resid"])  # layers x positions
    assert len(got["heads"]) == 2 and all(len(r) == 4 for r in got["heads"])  # layers x heads
    assert (got["answer"], got["wrong"]) == (tok.decode([want["answer_token"]]),
                                             tok.decode([want["wrong_token"]]))  # fmt: skip
    assert got["clean_logit_diff"] != pytest.approx(got["corrupt_logit_diff"])
    # patching the whole residual stream at the one position where the texts differ, before
    # block 0, is the clean run: all of the difference recovered
    differ = [i for i, (a, b) in enumerate(zip(tok.encode(CLEAN), tok.encode(CORRUPT))) if a != b]
    assert got["resid"][0][differ[0]] == pytest.approx(1.0, abs=1e-4)


def test_patch_refusals_are_the_experiments_one_line(server, llama):
    model, tok = llama
    body = {"clean": CLEAN, "corrupt": "the lazy dog", "answer": ANSWER, "wrong": WRONG,
            "model": "llama"}  # fmt: skip
    msg = one_line_error(*post(server, "patch", body))
    want = library_error(X.patching, model, tok, CLEAN, "the lazy dog", ANSWER, WRONG)
    assert msg == want and "same length in tokens" in msg
    same = {**body, "corrupt": CORRUPT, "wrong": ANSWER}
    msg = one_line_error(*post(server, "patch", same))
    assert msg == library_error(X.patching, model, tok, CLEAN, CORRUPT, ANSWER, ANSWER)
    assert "start with the same token" in msg
    msg = one_line_error(*post(server, "patch", {**body, "corrupt": CLEAN}))
    assert "nothing to recover" in msg  # the same text twice
    msg = one_line_error(*post(server, "patch", {**body, "corrupt": CORRUPT, "answer": ""}))
    assert "answer must be a non-empty string" in msg


def test_patch_over_its_limit_is_a_413(server, monkeypatch):
    import attnlm.web.service.interp as interp

    monkeypatch.setattr(interp, "MAX_PATCH_LOGITS", 1000)
    body = {"clean": CLEAN, "corrupt": CORRUPT, "answer": ANSWER, "wrong": WRONG,
            "model": "llama"}  # fmt: skip
    msg = one_line_error(*post(server, "patch", body), want=413)
    assert "the limit is 1,000" in msg and "2 layers x 9 rows of 9 tokens" in msg


# -- head scores -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["induction", "previous-token", "duplicate-token"])
def test_heads_equals_the_experiment(server, llama, kind):
    model, _ = llama
    status, got = post(server, "heads", {"kind": kind, "model": "llama"})
    assert status == 200, got
    assert_same_numbers(got, X.head_scores(model, kind))
    assert len(got["scores"]) == 2 and all(len(r) == 4 for r in got["scores"])
    assert all(0 <= s <= 1 for r in got["scores"] for s in r)


def test_heads_defaults_and_settings(server, llama):
    model, _ = llama
    status, got = post(server, "heads", {})  # the first served model, induction
    assert status == 200 and got["kind"] == "induction"
    assert (got["length"], got["batch"], got["seed"]) == (20, 8, 0)
    body = {"model": "llama", "length": 7, "batch": 3, "seed": 5, "kind": "previous-token"}
    got = post(server, "heads", body)[1]
    assert_same_numbers(got, X.head_scores(model, "previous-token", length=7, batch=3, seed=5))
    other = post(server, "heads", {**body, "seed": 6})[1]
    assert other["scores"] != got["scores"]


def test_heads_refusals(server):
    msg = one_line_error(*post(server, "heads", {"kind": "copying", "model": "llama"}))
    assert "kind must be one of induction, previous-token, duplicate-token" in msg
    msg = one_line_error(*post(server, "heads", {"batch": MAX_SCORE_BATCH + 1}))
    assert f"batch must be between 1 and {MAX_SCORE_BATCH}" in msg
    msg = one_line_error(*post(server, "heads", {"length": 33, "model": "llama"}), want=413)
    assert "window is 64" in msg  # 66 tokens
    assert one_line_error(*post(server, "heads", {"length": "20"})) == (
        "field length must be an integer"
    )
    status, data = request(server.url + "api/heads")  # a GET
    assert one_line_error(status, data, want=405) == "/api/heads takes POST with a JSON body"


# -- what every experiment refuses ---------------------------------------------------------------


def test_unknown_heads_are_the_experiments_one_line(server, llama):
    model, _ = llama
    out_of_range, malformed = "out of range (layers 0..1, heads 0..3)", "expected LAYER.HEAD"
    for spec, why in {"9.9": out_of_range, "0.4": out_of_range, "a.b": malformed,
                      "1": malformed}.items():  # fmt: skip
        body = {"text": TEXT, "heads": ["0.1", spec], "model": "llama"}
        msg = one_line_error(*post(server, "ablate", body))
        assert msg == library_error(X.parse_heads, ["0.1", spec], model)
        assert why in msg and spec in msg


@pytest.mark.parametrize("name", ["bert", "rnn"])
def test_models_the_tracer_does_not_read(server, runs, name):
    from attnlm.inspect.trace import hook_names

    model = load_checkpoint(runs[name]).model
    want = library_error(hook_names, model)
    assert "tracing needs a causal decoder" in want
    bodies = {
        "ablate": {"text": "one two", "heads": ["0.0"]},
        "patch": {"clean": "one two", "corrupt": "one one", "answer": "a", "wrong": "b"},
        "heads": {},
    }
    for endpoint, body in bodies.items():
        assert one_line_error(*post(server, endpoint, {**body, "model": name})) == want


def test_bad_fields_and_limits(server):
    base = {"text": TEXT, "heads": ["0.1"], "model": "llama"}
    cases = [
        ({**base, "heads": "0.1"}, 'field heads must be a list of "LAYER.HEAD" strings'),
        ({**base, "heads": [[0, 1]]}, 'field heads must be a list of "LAYER.HEAD" strings'),
        ({**base, "mean": 1}, "field mean must be true or false"),
        ({**base, "k": 0}, "k must be between 1 and 50"),
        ({**base, "top": 3}, "unknown field(s): top"),
        ({"text": TEXT}, "missing field: heads"),
        ({**base, "text": ""}, "text must be a non-empty string"),
        ({**base, "heads": ["0.1"] * 9}, "heads lists 9 heads; this model has 2 layers x 4 heads"),
    ]
    for body, want in cases:
        assert want in one_line_error(*post(server, "ablate", body)), body
    long = {**base, "text": "the quick brown fox " * 20}  # over the 64-token window
    assert "window is 64" in one_line_error(*post(server, "ablate", long), want=413)
    status, data = post(server, "ablate", {**base, "model": "nope"})
    assert one_line_error(status, data, want=404).startswith("unknown model 'nope'")


def test_non_finite_numbers_answer_null():
    from attnlm.web.service.interp import _finite

    got = _finite({"kl": float("inf"), "grid": [[1.0, float("nan")]], "n": 3, "s": "x"})
    assert got == {"kl": None, "grid": [[1.0, None]], "n": 3, "s": "x"}
