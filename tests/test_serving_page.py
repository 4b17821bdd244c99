"""The web page in a real browser: Debian's headless Chromium, driven by selenium through Debian's
chromedriver (never a browser or driver downloaded by a tool). A person's steps: open the page,
type a sentence, wait for the translation, its n-best list and its attention heatmap; then the
screenshot must show them, at a desktop's width and at a phone's. The page's timers run on a fake
clock that the test advances, so the debounce is checked the same way however slowly the browser
receives the keys."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app
from aiayn.serving.settings import ServeSettings

from helpers import FixedAttentionModel, chrome, serve_in_thread

SENTENCE = "the cat sat on the mat"

# Replaces the page's setTimeout/clearTimeout by a clock that stands still until the test calls
# __advance(ms), which runs the timers due by then in order; __fetches records the lines each
# /translate request the page makes carries, __bodies the whole of each request.
FAKE_CLOCK = """
const clock = {now: 0, next: 1, timers: new Map()};
window.setTimeout = (fn, ms, ...args) => {
  const id = clock.next++;
  clock.timers.set(id, {at: clock.now + Math.max(0, Number(ms) || 0), fn, args});
  return id;
};
window.clearTimeout = (id) => { clock.timers.delete(id); };
window.__advance = (ms) => {
  const end = clock.now + ms;
  for (;;) {
    let due = null;
    for (const entry of clock.timers) if (entry[1].at <= end && (!due || entry[1].at < due[1].at)) due = entry;
    if (!due) break;
    clock.timers.delete(due[0]);
    clock.now = due[1].at;
    due[1].fn(...due[1].args);
  }
  clock.now = end;
};
window.__fetches = [];
window.__bodies = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (url === "/translate") window.__fetches.push(JSON.parse(init.body).q);
  if (url === "/translate") window.__bodies.push(JSON.parse(init.body));
  return realFetch.call(window, url, init);
};
"""


def image(path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(str(path))[:, :, :3]  # (H, W, 3) floats in [0, 1]


def test_typing_shows_translation_nbest_and_heatmap(model_dir, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    loaded = load_model(model_dir)
    loaded.meta = {"src_lang": "en", "tgt_lang": "de"}
    expected = Translator(loaded).translate([SENTENCE])[0]
    app = create_app(FixedAttentionModel(Translator(loaded)), ServeSettings())
    with serve_in_thread(app) as url:
        driver = chrome(tmp_path / "profile", 1100, 1000, skip=pytest.skip, fail=pytest.fail)
        try:
            wait = WebDriverWait(driver, 60)
            driver.get(url + "/")
            wait.until(lambda d: "→" in d.find_element(By.ID, "model-info").text)
            driver.execute_script(FAKE_CLOCK)
            debounce = driver.execute_script("return DEBOUNCE_MS")
            box = driver.find_element(By.ID, "src")
            # one key at a time, each just inside the debounce of the one before: nothing is sent
            # while typing, however long the whole takes; the pause after the last key sends it
            type_keys(driver, box, SENTENCE, debounce - 1)
            assert driver.execute_script("return window.__fetches") == []
            driver.execute_script("__advance(arguments[0])", debounce)
            wait.until(lambda d: " ms" in d.find_element(By.ID, "status").text
                       and d.find_element(By.ID, "out").text == expected)
            # one request for the 22 keys, carrying the whole line
            assert driver.execute_script("return window.__fetches") == [[SENTENCE]]
            # streamed, with the pieces' probabilities: the answer came as events (the settled
            # prefixes, if the beams agreed before the end, then `done`)
            body = driver.execute_script("return window.__bodies")[0]
            assert body["stream"] is True and body["scores"] is True
            assert driver.execute_script("return state.events") >= 1
            wait.until(lambda d: d.find_element(By.ID, "heatmap").is_displayed())
            nbest = driver.find_elements(By.CSS_SELECTOR, "#nbest li")
            assert len(nbest) == min(3, loaded.cfg.beam_size)
            assert nbest[0].text.startswith(expected)
            # and the server answered that one request (counted just after its answer is sent;
            # the test's own requests below come after)
            wait.until(lambda d: translate_requests(app) >= 1)
            assert app.state.metrics.requests.labels("/translate", "200")._value.get() == 1
            assert translate_requests(app) == 1
            # the words marked are those with a piece under the threshold, by the API's numbers
            low = driver.execute_script("return LOW_PROB")
            scored = post_json(url + "/translate", {k: v for k, v in body.items() if k != "stream"})
            item = scored["translations"][0]
            assert item["tgt"] == expected
            marked = low_words(item, low)
            assert [(e.text, e.get_attribute("title"))
                    for e in driver.find_elements(By.CSS_SELECTOR, "#out .low")] == [
                (w, f"probability {p:.2f} (a piece of this word; marked under {low:g})")
                for w, p in marked]
            shot = tmp_path / "desktop.png"
            driver.save_screenshot(str(shot))
            canvas = driver.find_element(By.ID, "heatmap")
            # The heatmap's cells: blue in proportion to the weights (a strong diagonal).
            pixels = image(shot)
            r = canvas.rect
            dpr = pixels.shape[1] / driver.execute_script("return window.innerWidth")
            cells = pixels[int(r["y"] * dpr): int((r["y"] + r["height"]) * dpr),
                           int(r["x"] * dpr): int((r["x"] + r["width"]) * dpr)]
            deep_blue = (cells[:, :, 2] - cells[:, :, 0] > 0.3).mean()  # weight 0.7: B - R = 0.44
            assert 0.01 < deep_blue < 0.5, deep_blue
            assert not_blank(pixels)

            # A second line: only it goes to the server, the first comes from the page's cache.
            second = "a dog runs in the park"
            expected2 = Translator(loaded).translate([second])[0]
            before = app.state.metrics.sentences._value.get(), translate_requests(app)
            type_keys(driver, box, Keys.ENTER + second, debounce - 1)
            driver.execute_script("__advance(arguments[0])", debounce)
            wait.until(lambda d: d.find_element(By.ID, "out").text == expected + "\n" + expected2
                       and "from cache" in d.find_element(By.ID, "status").text)
            assert driver.execute_script("return window.__fetches") == [[SENTENCE], [second]]
            assert app.state.metrics.sentences._value.get() - before[0] == 1
            wait.until(lambda d: translate_requests(app) > before[1])
            assert translate_requests(app) - before[1] == 1
            item2 = post_json(url + "/translate", {**{k: v for k, v in body.items() if k != "stream"},
                                                   "q": [second]})["translations"][0]
            assert [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#out .low")] == [
                w for w, _ in marked + low_words(item2, low)]

            # the page's reader of server-sent events, on a stream cut mid-line and mid-character
            raw = ('event: prefix\ndata: {"index":0,"text":"ein H\u00fc","pieces":2}\n\n'
                   'event: done\r\ndata: {"translatedText":["x"]}\r\n\r\n').encode()
            cuts = [0, 9, 40, 44, 45, len(raw) - 3, len(raw)]  # 44-45 splits the two bytes of "ü"
            events = driver.execute_async_script(
                "const [chunks, done] = [arguments[0], arguments[arguments.length - 1]];"
                "const body = new ReadableStream({start(c) {"
                "  for (const k of chunks) c.enqueue(new Uint8Array(k)); c.close(); }});"
                "const seen = [];"
                "readEvents(new Response(body), (e, d) => seen.push([e, d])).then(() => done(seen));",
                [list(raw[a:b]) for a, b in zip(cuts, cuts[1:])])
            assert events == [["prefix", {"index": 0, "text": "ein Hü", "pieces": 2}],
                              ["done", {"translatedText": ["x"]}]]
            # words of several pieces, hand-built: marked when any piece is under the threshold
            made = {"tgt": "ein Hund rennt.", "pieces": ["\u2581ein", "\u2581Hu", "nd", "\u2581rennt", "."],
                    "token_probs": [0.9, 0.8, 0.3, 0.7, 0.45, 0.99]}
            assert low_words(made, low) == [("Hund", 0.3), ("rennt.", 0.45)]
            shown = driver.execute_script(
                "fillOut([arguments[0]]); const out = document.getElementById('out');"
                "return [out.textContent, [...out.querySelectorAll('.low')].map((e) => e.textContent)]",
                made)
            assert shown == [made["tgt"], ["Hund", "rennt."]]
            driver.execute_script("fillOut(state.last.translations)")

            driver.set_window_size(390, 844)  # a phone
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0
            phone = tmp_path / "phone.png"
            driver.save_screenshot(str(phone))
            assert not_blank(image(phone))
        finally:
            driver.quit()


def post_json(url: str, body: dict) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def low_words(item: dict, threshold: float) -> list[tuple[str, float]]:
    """The words of `item["tgt"]` one of whose pieces has a probability under `threshold`, with
    their lowest; a piece that starts with U+2581 starts a word."""
    groups: list[list[float]] = []
    for piece, p in zip(item["pieces"], item["token_probs"]):
        if not groups or piece.startswith("\u2581"):
            groups.append([])
        groups[-1].append(p)
    words = item["tgt"].split(" ") if item["tgt"] else []
    # EOS's probability is last when the search ended the translation (not at its length limit)
    assert len(words) == len(groups) and len(item["token_probs"]) - len(item["pieces"]) in (0, 1)
    return [(w, min(g)) for w, g in zip(words, groups) if min(g) < threshold]


def type_keys(driver, box, keys: str, pause_ms: int) -> None:
    """Type `keys` one at a time, advancing the page's fake clock `pause_ms` after each."""
    for key in keys:
        box.send_keys(key)
        driver.execute_script("__advance(arguments[0])", pause_ms)


def translate_requests(app) -> float:
    """/translate requests answered so far, whatever their status."""
    return sum(s.value for family in app.state.metrics.registry.collect() for s in family.samples
               if s.name == "aiayn_http_requests_total" and s.labels["path"] == "/translate")


def not_blank(pixels: np.ndarray) -> bool:
    """A rendered page, not an empty or one-colour screenshot: dark text on a light page, and
    more than a handful of colours."""
    grey = pixels.mean(axis=2)
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    return bool((grey < 0.3).mean() > 0.001 and (grey > 0.9).mean() > 0.3 and colours > 50)
