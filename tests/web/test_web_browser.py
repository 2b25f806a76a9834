"""The explorer page in a real browser: Debian's headless Chromium driven by selenium.

Loads the page from a server on a free loopback port, types a text, checks the head view's
lines against the API's attention weights (for one head, then while a token is hovered), the
model view and its filters, that every request stayed on 127.0.0.1, and the cross-attention
path of a standalone file made from a hand-written translation record. Saves screenshots in
the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}); "
        "apt-get install -y --no-install-recommends chromium chromium-driver",
        allow_module_level=True,
    )
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="needs selenium (pip install selenium)"
)

from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from web_helpers import request, tiny_checkpoint  # noqa: E402

from attnlm.web.html import write_standalone  # noqa: E402
from attnlm.web.server import make_server, serve_in_thread  # noqa: E402
from attnlm.web.service import load_service  # noqa: E402

LINE_MIN = 0.01  # AttnViews.LINE_MIN: weights below it draw no line
TEXT = "the central bank raised interest rates , then she sat on the river bank"
N = len(TEXT.split())  # word-level model: one token per word


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = tiny_checkpoint(tmp_path_factory.mktemp("run"), words=True)
    srv = make_server([load_service(run, name="tiny")], "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    d.set_page_load_timeout(20)
    yield d
    d.quit()


def _lines(driver) -> list[tuple[int, int, int]]:
    """(head, query, key) of every line the head view draws (one round trip)."""
    got = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.head-view line.attn'))"
        ".map(e => ['data-head', 'data-q', 'data-k'].map(a => +e.getAttribute(a)))"
    )
    return [tuple(x) for x in got]


def _token_texts(driver) -> list[str]:
    """The text of every token of the tokens strip (one round trip)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#tokens span')).map(e => e.innerText)"
    )


def _wait(driver, fn, timeout=10):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: fn(d))


def _click(driver, selector):
    """Click ``selector``, again if the page re-rendered it between finding and clicking (a
    stale element: the view redraws after a run)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def click(d):
        try:
            d.find_element(By.CSS_SELECTOR, selector).click()
            return True
        except StaleElementReferenceException:
            return False

    _wait(driver, click)


def _requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def _png_size(driver) -> int:
    """Bytes of the PNG that "Save PNG" would download for the current view."""
    size, magic = driver.execute_async_script(
        "const done = arguments[0];"
        "window.attnView.toPNG().then(b => b.arrayBuffer()).then(a => {"
        "  const u = new Uint8Array(a); done([u.length, Array.from(u.slice(1, 4))]); });"
    )
    assert bytes(magic) == b"PNG"
    return size


def _hover(driver, selector):
    ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, selector)).perform()


@pytest.mark.slow  # about 7 s: a browser session through the whole page
def test_page_head_view_model_view_and_no_outside_requests(server, driver, tmp_path):
    origin = server.url.rstrip("/")
    driver.get_log("performance")  # drop the browser's own start-up entries (its new-tab page)
    driver.get(server.url)
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(TEXT)
    driver.find_element(By.ID, "run").click()
    # the page drew its sample text on load: wait for the new text's tokens (read in one
    # round trip, so a redraw between two reads cannot leave a stale element)
    want = ["the0", "central1", "bank2"]  # token, index
    _wait(driver, lambda d: _token_texts(d)[:3] == want and len(_token_texts(d)) == N)
    _wait(driver, lambda d: _lines(d))

    # the weights the page drew, from the API itself
    status, rec = request(server.url + "api/attention", {"text": TEXT})
    assert status == 200
    layer, head, query = 1, 2, 10
    m = rec["attention"][layer][head]

    Select(driver.find_element(By.CSS_SELECTOR, "select.layer-select")).select_by_value(str(layer))
    driver.find_element(By.CSS_SELECTOR, "button.heads-none").click()
    assert _lines(driver) == []
    driver.find_element(By.CSS_SELECTOR, f"button.head-swatch[data-head='{head}']").click()
    lines = _lines(driver)
    expected = [(q, k) for q in range(N) for k in range(N) if m[q][k] >= LINE_MIN]
    drawn = sorted((q, k) for _, q, k in lines)
    assert drawn == expected
    assert {h for h, _, _ in lines} == {head}
    assert all(k <= q for q, k in drawn)  # causal: nobody attends to a later token

    # hovering a query token isolates its lines
    _hover(driver, f"svg.head-view text.tok-q[data-index='{query}']")
    hovered = _lines(driver)
    row = [k for k in range(N) if m[query][k] >= LINE_MIN]
    assert sorted(k for _, _, k in hovered) == row
    assert {q for _, q, _ in hovered} == {query}
    assert len(hovered) != len(lines)
    # ... and with every head shown, its lines in every head's colour (the docs screenshot)
    _hover(driver, "h1")
    driver.find_element(By.CSS_SELECTOR, "button.heads-all").click()
    _hover(driver, f"svg.head-view text.tok-q[data-index='{query}']")
    n_all = sum(
        1
        for h in range(len(rec["attention"][layer]))
        for w in rec["attention"][layer][h][query]
        if w >= LINE_MIN
    )
    assert len(_lines(driver)) == n_all
    driver.save_screenshot(str(tmp_path / "explorer-head-view.png"))
    assert _png_size(driver) > 1000  # "Save PNG" of the head view

    # "Save HTML": the page's standalone document of the current view draws the same lines
    doc = driver.execute_async_script(
        "const done = arguments[0]; window.attnExplorer.buildStandalone().then(done);"
    )
    (tmp_path / "from-page.html").write_text(doc, encoding="utf-8")
    page_lines = sorted(_lines(driver))
    _hover(driver, "h1")
    shown = sorted(_lines(driver))
    driver.get((tmp_path / "from-page.html").as_uri())
    _wait(driver, lambda d: _lines(d))
    assert sorted(_lines(driver)) == shown and len(shown) > len(page_lines)
    driver.back()
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    driver.find_element(By.ID, "run").click()
    _wait(driver, lambda d: _lines(d))

    # model view: every layer x head, the layer filter, click to enlarge
    _click(driver, "button.tab[data-view='model']")
    n_layer, n_head = len(rec["attention"]), len(rec["attention"][0])
    assert len(driver.find_elements(By.CSS_SELECTOR, "figure.cell")) == n_layer * n_head
    flt = driver.find_element(By.CSS_SELECTOR, "input.filter-layers")
    flt.send_keys("1\n")
    cells = driver.find_elements(By.CSS_SELECTOR, "figure.cell")
    assert [c.get_attribute("data-layer") for c in cells] == ["1"] * n_head
    cells[0].find_element(By.TAG_NAME, "canvas").click()
    big = driver.find_element(By.CSS_SELECTOR, "canvas.big")
    ActionChains(driver).move_to_element(big).perform()
    assert driver.find_element(By.CSS_SELECTOR, ".tip").text.count("\u2192") == 1
    driver.save_screenshot(str(tmp_path / "explorer-model-view.png"))

    # next-token table for a language model: one row per position (plus the header)
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#next-table tr")) > 1)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#next-table tr")) == N + 1

    # a generated continuation (greedy) and the contextual-embedding panel
    driver.find_element(By.ID, "g-temperature").clear()
    driver.find_element(By.ID, "g-temperature").send_keys("0")
    driver.find_element(By.ID, "g-run").click()
    _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#g-out b").text == TEXT)
    driver.find_element(By.ID, "e-run").click()  # "bank" in the two default sentences
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#e-out table.cos-chart tr"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#e-out table.cos-chart tr")
    assert len(rows) == n_layer + 1 and rows[0].text.startswith("embeddings")

    # nothing left the machine: the browser's network log and the page's resource timing
    urls = _requested_urls(driver)
    assert any(u.startswith(origin + "/api/attention") for u in urls)
    # chrome://, data:, blob: and file: URLs stay inside the machine; anything with a network
    # scheme must be our server
    network = [u for u in urls if u.split(":", 1)[0] in ("http", "https", "ws", "wss", "ftp")]
    assert [u for u in network if not u.startswith(origin + "/")] == []
    assert {u.split(":", 1)[0] for u in urls} <= {"http", "chrome", "data", "blob", "file"}
    timing = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert timing and all(u.startswith(origin + "/") for u in timing)
    if os.environ.get("ATTNLM_SCREENSHOT_DIR"):  # refresh the docs' screenshot by hand
        shutil.copy(tmp_path / "explorer-head-view.png", os.environ["ATTNLM_SCREENSHOT_DIR"])


def _expected(layer_maps, heads=None) -> set[tuple[int, int, int]]:
    """(head, query, key) of each weight >= LINE_MIN in one layer's maps (``heads``: only those)."""
    return {(h, q, k) for h, m in enumerate(layer_maps) if heads is None or h in heads
            for q, row in enumerate(m) for k, w in enumerate(row) if w >= LINE_MIN}  # fmt: skip


def test_page_draws_on_load_and_the_url_keeps_the_view(server, driver):
    """Issue 22: the first screen shows the sample's attention without a click, and the URL
    (#text=...&layer=...&heads=...) reloads the same view in a fresh page."""
    from urllib.parse import parse_qs, urlsplit

    driver.get("about:blank")
    driver.get(server.url)
    _wait(driver, lambda d: _lines(d))  # nothing was clicked
    sample = driver.find_element(By.ID, "text").get_attribute("value")
    rec = request(server.url + "api/attention", {"text": sample})[1]
    assert set(_lines(driver)) == _expected(rec["attention"][0])
    _wait(driver, lambda d: "text=" in d.current_url)
    assert parse_qs(urlsplit(driver.current_url).fragment)["text"] == [sample]

    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(TEXT)
    driver.find_element(By.ID, "run").click()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#tokens span")) == N)
    Select(driver.find_element(By.CSS_SELECTOR, "select.layer-select")).select_by_value("1")
    driver.find_element(By.CSS_SELECTOR, "button.heads-none").click()
    driver.find_element(By.CSS_SELECTOR, "button.head-swatch[data-head='2']").click()
    url = driver.current_url
    q = parse_qs(urlsplit(url).fragment)
    assert (q["text"], q["model"], q["layer"], q["heads"]) == ([TEXT], ["tiny"], ["1"], ["2"])

    driver.get("about:blank")
    driver.get(url)  # a fresh page from the shared URL
    _wait(driver, lambda d: _lines(d))
    assert driver.find_element(By.ID, "text").get_attribute("value") == TEXT
    layer = Select(driver.find_element(By.CSS_SELECTOR, "select.layer-select"))
    assert layer.first_selected_option.get_attribute("value") == "1"
    rec = request(server.url + "api/attention", {"text": TEXT})[1]
    assert set(_lines(driver)) == _expected(rec["attention"][1], heads={2})


def test_standalone_file_draws_cross_attention(driver, tmp_path):
    # a hand-made translation record: 3 target tokens attending over 4 source tokens
    src = ["le", " chat", " noir", "</s>"]
    tgt = ["the", " black", " cat"]
    self_attn = [[[[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.2, 0.3, 0.5]]]]  # [1][1][3][3]
    cross = [[[[0.9, 0.05, 0.05, 0.0], [0.0, 0.1, 0.9, 0.0], [0.005, 0.985, 0.0, 0.01]]]]
    path = write_standalone(
        {"tokens": tgt, "attention": self_attn, "source_tokens": src, "cross_attention": cross},
        tmp_path / "cross.html",
        title="cross <test>",
    )
    driver.get(path.as_uri())
    _wait(driver, lambda d: _lines(d))
    assert driver.find_element(By.TAG_NAME, "h1").text == "cross <test>"
    assert len(_lines(driver)) == 6  # self-attention weights >= 0.01
    Select(driver.find_element(By.CSS_SELECTOR, "select.kind-select")).select_by_value("cross")
    keys = driver.find_elements(By.CSS_SELECTOR, "svg.head-view text.tok-k")
    assert [k.text for k in keys] == ["le", "\u2423chat", "\u2423noir", "</s>"]
    pairs = sorted((q, k) for _, q, k in _lines(driver))
    assert pairs == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 3)]
    _hover(driver, "svg.head-view text.tok-k[data-index='1']")  # a source token: its column
    assert sorted(q for _, q, _ in _lines(driver)) == [0, 1, 2]
    _hover(driver, "h1")
    _click(driver, "button.tab[data-view='model']")
    assert len(driver.find_elements(By.CSS_SELECTOR, "figure.cell canvas")) == 1
    assert _png_size(driver) > 100  # "Save PNG" of the model view
    driver.save_screenshot(str(tmp_path / "standalone-cross.png"))
    assert Path(tmp_path / "standalone-cross.png").stat().st_size > 0


@pytest.fixture(scope="module")
def family_server(tmp_path_factory):
    from test_web_families import tiny_bert, tiny_rnn, tiny_transformer

    base = tmp_path_factory.mktemp("families")
    services = [
        load_service(tiny_bert(base / "bert"), name="bert"),
        load_service(tiny_transformer(base / "mt"), name="mt"),
        load_service(tiny_rnn(base / "rnn"), name="rnn"),
    ]
    srv = make_server(services, "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def _choose(driver, model, text):
    Select(driver.find_element(By.ID, "model")).select_by_value(model)
    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)


@pytest.mark.slow  # a browser session: fill-mask and both translation families
def test_page_fill_mask_and_translation_panels(family_server, driver):
    url = family_server.url
    driver.get(url)
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    shown = lambda i: "hidden" not in driver.find_element(By.ID, i).get_attribute("class")  # noqa: E731

    # BERT: the fill-mask panel draws one row per [MASK] with the API's top-k tokens
    text = "the [MASK] bank closed . she sat on the [MASK]"
    _choose(driver, "bert", text)
    assert shown("fillmask") and not shown("translate") and not shown("generate")
    k = driver.find_element(By.ID, "fm-k")
    k.clear()
    k.send_keys("3")
    driver.find_element(By.ID, "fm-run").click()
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#fm-out table.masks tr"))
    api = request(url + "api/fill_mask", {"text": text, "model": "bert", "k": 3})[1]
    rows = driver.find_elements(By.CSS_SELECTOR, "#fm-out table.masks tr")[1:]
    assert len(rows) == 2
    for row, mask in zip(rows, api["masks"]):
        cands = [c.text.rsplit(" ", 1)[0] for c in row.find_elements(By.CSS_SELECTOR, ".cand")]
        assert cands == [p["token"] for p in mask["predictions"]]
    assert driver.find_element(By.CSS_SELECTOR, "#fm-out .filled").text == api["filled"]
    driver.find_element(By.ID, "run").click()
    _wait(driver, lambda d: _lines(d))
    # read in one round trip: a redraw of an earlier run cannot leave a stale element
    tokens = _wait(driver, lambda d: (t := _token_texts(d)) and t[0] == "[CLS]0" and t)
    assert tokens[-1].startswith("[SEP]")

    # translation: the page shows the API's translation and its cross-attention
    for model, layers in (("mt", 2), ("rnn", 1)):
        _choose(driver, model, "one two")
        assert shown("translate") and not shown("fillmask") and not shown("embed")
        driver.find_element(By.ID, "run").click()
        api = request(url + "api/translate", {"text": "one two", "model": model})[1]
        out = api["translation"]  # the record is drawn in the same step as the translation
        _wait(driver, lambda d, out=out: d.find_element(By.ID, "translation").text == out)
        kinds = driver.find_elements(By.CSS_SELECTOR, "select.kind-select")
        if model == "mt":
            assert len(kinds) == 1  # self- and cross-attention
            Select(kinds[0]).select_by_value("cross")
        else:
            assert kinds == []  # cross-attention only: the views open on it
        assert driver.execute_script("return window.attnView.state.kind") == "cross"
        keys = driver.find_elements(By.CSS_SELECTOR, "svg.head-view text.tok-k")
        assert len(keys) == len(api["source_tokens"])
        layer = api["cross_attention"][0]
        want = {(h, q, k) for h, m in enumerate(layer) for q, row in enumerate(m)
                for k, w in enumerate(row) if w >= LINE_MIN}  # fmt: skip
        assert set(_lines(driver)) == want
        assert len(driver.find_elements(By.CSS_SELECTOR, "select.layer-select option")) == layers

    # beams: the page sends num_beams and shows the beam-search translation
    driver.execute_script(
        "window.sent = []; var f = window.fetch; window.fetch = function (u, o) {"
        " if (o && o.body) window.sent.push(JSON.parse(o.body)); return f(u, o); };"
    )
    beams = driver.find_element(By.ID, "t-beams")
    beams.clear()
    beams.send_keys("3")
    driver.find_element(By.ID, "run").click()
    body = {"text": "one two", "model": "rnn", "num_beams": 3}
    out = request(url + "api/translate", body)[1]["translation"]
    _wait(
        driver,
        lambda d: any(b.get("num_beams") == 3 for b in d.execute_script("return window.sent")),
    )
    _wait(driver, lambda d, out=out: d.find_element(By.ID, "translation").text == out)


def test_first_screen_draws_for_a_small_window_and_follows_the_model(driver, tmp_path):
    """A char model whose 32-token window is shorter than the sample sentence (38 characters)
    opens on the sample trimmed to fit, says so, and draws; switching to a word model puts
    that model's (whole) sample in the box and redraws."""
    from attnlm.web.service.model import SAMPLE_TEXT

    small = tiny_checkpoint(tmp_path / "small", block=32)
    words = tiny_checkpoint(tmp_path / "words", words=True)
    services = [load_service(small, name="small"), load_service(words, name="words")]
    srv = make_server(services, "127.0.0.1", 0)
    serve_in_thread(srv)
    try:
        driver.get("about:blank")
        driver.get(srv.url)
        _wait(driver, lambda d: _lines(d))  # drawn without a click
        box = driver.find_element(By.ID, "text").get_attribute("value")
        assert box and len(box) <= 32 and SAMPLE_TEXT.startswith(box)
        assert len(_token_texts(driver)) == len(box)  # one token per character
        _wait(driver, lambda d: "trimmed" in d.find_element(By.ID, "status").text)
        rec = request(srv.url + "api/attention", {"text": box, "model": "small"})[1]
        assert set(_lines(driver)) == _expected(rec["attention"][0])

        Select(driver.find_element(By.ID, "model")).select_by_value("words")
        n = len(SAMPLE_TEXT.split())
        _wait(driver, lambda d: len(_token_texts(d)) == n)  # redrawn for the new model
        assert driver.find_element(By.ID, "text").get_attribute("value") == SAMPLE_TEXT
        rec = request(srv.url + "api/attention", {"text": SAMPLE_TEXT, "model": "words"})[1]
        _wait(driver, lambda d: set(_lines(d)) == _expected(rec["attention"][0]))
        assert "trimmed" not in driver.find_element(By.ID, "status").text
    finally:
        srv.shutdown()
        srv.server_close()
