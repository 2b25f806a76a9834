"""The explorer's experiments inside a decoder in headless Chromium (a tiny word GPT): the
head-score grid drawn on load (every cell the API's score), a head ablated from the head
view's "ablate" button and another from the score grid, the ablation table against
``POST /api/ablate`` for the same heads (zero, then mean), restoring every head, the patching
grids against ``POST /api/patch`` with the value of a hovered cell, and its one-line error
for texts of different lengths."""

from __future__ import annotations

import pytest
import test_web_browser as browser  # noqa: E402  (skips without chromium / selenium)
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402
from web_helpers import request, serving, tiny_checkpoint  # noqa: E402

from attnlm.web.service import load_service  # noqa: E402

driver = browser.driver  # the Chromium fixture of the explorer's other browser tests
_token_texts, _wait = browser._token_texts, browser._wait
TEXT = "the central bank raised"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = tiny_checkpoint(tmp_path_factory.mktemp("browser-interp") / "gpt", words=True)
    yield from serving([load_service(run, name="gpt")])


def _cells(driver, table: str) -> list[list[float]]:
    """The ``data-value`` of every cell of a grid, row by row (one round trip)."""
    return driver.execute_script(
        f"return Array.from(document.querySelectorAll('#{table} tbody tr')).map(r =>"
        " Array.from(r.querySelectorAll('td')).map(c => +c.getAttribute('data-value')))"
    )


def _ablation_rows(driver) -> list[list[str]]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#ab-table tr')).slice(1)"
        ".map(r => Array.from(r.children).map(c => c.textContent))"
    )


def _want_rows(answer) -> list[list[str]]:
    """The ablation table the page should draw for an /api/ablate answer."""
    rows = []
    for i, (a, b) in enumerate(zip(answer["top"], answer["top_ablated"])):
        d = a["p_ablated"] - a["p"]
        rows.append([str(i + 1), a["token"], f"{a['p']:.3f} \u2192 {a['p_ablated']:.3f}",
                     ("+" if d >= 0 else "\u2212") + f"{abs(d):.3f}", b["token"],
                     f"{b['p_ablated']:.3f} ({b['p']:.3f})"])  # fmt: skip
    return rows


def _close(a, b) -> bool:
    return len(a) == len(b) and all(
        len(r) == len(s) and all(abs(x - y) < 1e-9 for x, y in zip(r, s)) for r, s in zip(a, b)
    )


@pytest.mark.slow  # about 5 s: a browser session through the three views
def test_ablate_heads_score_grid_and_patching(server, driver):
    driver.get("about:blank")
    driver.get(server.url)
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(TEXT)
    driver.find_element(By.ID, "run").click()
    _wait(driver, lambda d: len(_token_texts(d)) == 4 and _token_texts(d)[1] == "central1")

    # the induction scores, drawn on load
    scores = request(server.url + "api/heads", {"kind": "induction"})[1]["scores"]
    _wait(driver, lambda d: _close(_cells(d, "hs-grid"), scores))
    assert not driver.find_element(By.ID, "ablation").is_displayed()

    # ablate head 1 of layer 0 from the head view: the table moves as the API says
    button = "button.ablate-head[data-layer='0'][data-head='1']"
    driver.find_element(By.CSS_SELECTOR, button).click()
    want = request(server.url + "api/ablate", {"text": TEXT, "heads": ["0.1"]})[1]
    _wait(driver, lambda d: _ablation_rows(d) == _want_rows(want))
    kl = driver.find_element(By.ID, "ab-kl").text
    assert kl == f"KL(plain \u2016 ablated) = {want['kl']:.4f} nats"
    assert "ablated: 0.1 (zeroed)" in driver.find_element(By.ID, "ab-heads").text
    on = driver.find_element(By.CSS_SELECTOR, button)
    assert "on" in on.get_attribute("class").split()

    # ... and head 2 of layer 1 from the score grid, then mean ablation of both
    driver.find_element(By.CSS_SELECTOR, "#hs-grid td[data-row='1'][data-col='2']").click()
    both = {"text": TEXT, "heads": ["0.1", "1.2"]}
    want = request(server.url + "api/ablate", both)[1]
    assert want["kl"] > 0
    _wait(driver, lambda d: _ablation_rows(d) == _want_rows(want))
    cell = driver.find_element(By.CSS_SELECTOR, "#hs-grid td[data-row='1'][data-col='2']")
    assert "ablated" in cell.get_attribute("class").split()
    driver.find_element(By.ID, "ab-mean").click()
    mean = request(server.url + "api/ablate", {**both, "mean": True})[1]
    assert _want_rows(mean) != _want_rows(want)
    _wait(driver, lambda d: _ablation_rows(d) == _want_rows(mean))
    assert "(each replaced by its mean" in driver.find_element(By.ID, "ab-heads").text

    # restoring every head hides the panel and the buttons
    driver.find_element(By.ID, "ab-clear").click()
    _wait(driver, lambda d: not d.find_element(By.ID, "ablation").is_displayed())
    assert driver.find_elements(By.CSS_SELECTOR, "button.ablate-head.on") == []
    assert driver.find_elements(By.CSS_SELECTOR, "#hs-grid td.ablated") == []

    # another kind of score
    Select(driver.find_element(By.ID, "hs-kind")).select_by_value("previous-token")
    prev = request(server.url + "api/heads", {"kind": "previous-token"})[1]["scores"]
    _wait(driver, lambda d: _close(_cells(d, "hs-grid"), prev))

    # activation patching: both grids as the API answers them, a hovered cell's value
    body = {"clean": "the central bank raised", "corrupt": "the river bank raised",
            "answer": "interest", "wrong": "rates"}  # fmt: skip
    for k, v in body.items():
        field = driver.find_element(By.ID, "p-" + k)
        field.clear()
        field.send_keys(v)
    driver.find_element(By.ID, "p-run").click()
    got = request(server.url + "api/patch", body)[1]
    _wait(driver, lambda d: _close(_cells(d, "p-resid"), got["resid"]))
    assert _close(_cells(driver, "p-heads"), got["heads"])
    heads = driver.execute_script(
        "return Array.from(document.querySelectorAll('#p-resid thead th')).map(c => c.textContent)"
    )
    assert heads == [""] + got["tokens"]
    ActionChains(driver).move_to_element(
        driver.find_element(By.CSS_SELECTOR, "#p-resid td[data-row='1'][data-col='1']")
    ).perform()
    readout = driver.find_element(By.ID, "p-readout").text
    value = got["resid"][1][1]
    assert readout == f"residual stream into layer 1 at position 1 \u201ccentral\u201d: {value:.4f}"
    assert f"clean {got['clean_logit_diff']:.3f}" in driver.find_element(By.ID, "p-summary").text

    corrupt = driver.find_element(By.ID, "p-corrupt")
    corrupt.clear()
    corrupt.send_keys("the river bank")
    driver.find_element(By.ID, "p-run").click()
    err = request(server.url + "api/patch", {**body, "corrupt": "the river bank"})[1]["error"]
    _wait(driver, lambda d: d.find_element(By.ID, "p-status").text == err)
    assert "same length in tokens" in err
    assert driver.find_elements(By.CSS_SELECTOR, "#p-resid td") == []
