"""The explorer page on a chat model in headless Chromium (the tiny random ChatML Llama folder
of ``tests/support_chat.py`` served beside a tiny word GPT): the logit-lens grid (layers + 1
rows x T columns, each cell the API's top token), one chat turn (the reply the API gives for
the same conversation), and switching to the GPT and back redraws and shows the panels each
model has."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import test_web_browser as browser  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402
from web_helpers import request, tiny_checkpoint  # noqa: E402

from attnlm.web.server import make_server, serve_in_thread  # noqa: E402
from attnlm.web.service import MAX_ATTENTION_VALUES as S_MAX  # noqa: E402
from attnlm.web.service import load_service  # noqa: E402
from support_chat import tiny_chat_llama  # noqa: E402

driver = browser.driver  # the Chromium fixture of the explorer's other browser tests
_token_texts, _wait = browser._token_texts, browser._wait


def label(tok: str) -> str:
    """What ``AttnViews.label`` shows for a token."""
    if tok == "":
        return "\u2205"
    return tok.replace(" ", "\u2423").replace("\n", "\\n").replace("\t", "\\t")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tiny_chat_llama(tmp_path_factory.mktemp("browser-llm") / "llama")
    gpt = tiny_checkpoint(tmp_path_factory.mktemp("browser-gpt") / "gpt", words=True)
    services = [load_service(model=str(folder), name="llama"), load_service(gpt, name="gpt")]
    srv = make_server(services, "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def _grid(driver) -> list[list[str]]:
    """The lens grid's body: per row, its name then every cell's text (one round trip)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#lens-grid tbody tr'))"
        ".map(r => Array.from(r.children).map(c => c.textContent))"
    )


@pytest.mark.slow  # about 5 s: a browser session through the lens and the chat
def test_lens_grid_chat_and_switching_models(server, driver):
    driver.get("about:blank")
    driver.get(server.url)
    _wait(driver, lambda d: _grid(d))  # drawn on load, with the sample
    text = driver.find_element(By.ID, "text").get_attribute("value")
    lens = request(server.url + "api/lens", {"text": text, "model": "llama", "k": 5})[1]
    rows = _grid(driver)
    assert len(rows) == 3 and all(len(r) == 1 + len(lens["tokens"]) for r in rows)
    want = [[r["layer"]] + [label(p[0]["token"]) for p in r["positions"]]
            for r in reversed(lens["layers"])]  # fmt: skip
    assert rows == want  # last layer on top, each cell the top token
    heads = driver.execute_script(
        "return Array.from(document.querySelectorAll('#lens-grid thead th'))"
        ".map(c => c.textContent)"
    )
    assert heads == [""] + [label(t) for t in lens["tokens"]]
    assert driver.find_element(By.ID, "chat").is_displayed()

    box = driver.find_element(By.ID, "c-input")
    box.send_keys("hello")
    box.send_keys(Keys.ENTER)
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#c-log .msg.assistant"), 30)
    said = driver.execute_script(
        "return document.querySelector('#c-log .msg.assistant').childNodes[1].textContent"
    )
    ref = request(server.url + "api/chat", {"model": "llama", "max_new_tokens": 200,
                  "messages": [{"role": "user", "content": "hello"}]})[1]  # fmt: skip
    assert said == ref["reply"]
    assert [e.text.split("\n")[0] for e in driver.find_elements(By.CSS_SELECTOR, "#c-log .msg")] \
        == ["user", "assistant"]  # fmt: skip

    # an attention answer over the limit: one line, the old record hidden, the rest still drawn
    service = server.explorer.services["llama"]
    service.max_attention_values = 100
    try:
        box = driver.find_element(By.ID, "text")
        box.clear()
        box.send_keys("the capital of France")
        driver.find_element(By.ID, "run").click()
        _wait(driver, lambda d: "the limit is 100 " in d.find_element(By.ID, "status").text)
        assert not driver.find_element(By.ID, "attention").is_displayed()
        toks = request(server.url + "api/tokens", {"text": "the capital of France"})[1]["tokens"]
        _wait(
            driver,
            lambda d: len(_token_texts(d)) == len(toks) and len(_grid(d)[0]) == 1 + len(toks),
        )
    finally:
        service.max_attention_values = S_MAX
    box.clear()
    box.send_keys(text)

    Select(driver.find_element(By.ID, "model")).select_by_value("gpt")
    n = len(request(server.url + "api/tokens", {"text": text, "model": "gpt"})[1]["tokens"])
    _wait(driver, lambda d: len(_token_texts(d)) == n and len(_grid(d)[0]) == 1 + n)  # redrawn
    assert not driver.find_element(By.ID, "chat").is_displayed()  # no chat template
    Select(driver.find_element(By.ID, "model")).select_by_value("llama")
    assert driver.find_element(By.ID, "attention").is_displayed()
    t = len(lens["tokens"])
    _wait(driver, lambda d: len(_token_texts(d)) == t and len(_grid(d)[0]) == 1 + t)
    assert _grid(driver) == want
    assert driver.find_element(By.ID, "chat").is_displayed()
    assert driver.find_elements(By.CSS_SELECTOR, "#c-log .msg") == []  # a new conversation
