"""Screenshots of `aiayn serve`'s web page, as docs/guides/serving.md shows it: starts `aiayn
serve` on 127.0.0.1, opens the page in Debian's headless Chromium, types sentences, waits for their
translation and saves a PNG at a desktop's width and one at a phone's; then replaces the text
with longer sentences and saves a third (-streaming) the moment the page first shows settled
prefixes while the search goes on (a MutationObserver in the page, so the picture is taken
mid-stream, not after the answer).

    .venv/bin/python tools/page_screenshot.py --model runs/m30k/model --out docs/serve-page.png
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import chrome  # noqa: E402

LONG = ["A young man in a red shirt and a black hat is playing the guitar on a street corner "
        "while people walk by.",
        "Several children in colorful swimsuits are running along the beach towards the water "
        "on a sunny day.",
        "An older woman with a blue umbrella waits at the bus stop next to a man reading a "
        "newspaper."]
SENTENCES = ["A man in an orange hat starring at something.",
             "Two young children are playing in the sand on the beach."]


# Replaces the text box's lines and resolves as soon as the translation pane is settling (the
# answer streaming in) and shows some settled text; or after 20 s, saying so.
MID_STREAM = """
const [text, done] = arguments;
const out = document.getElementById("out");
const seen = () => out.classList.contains("settling") && out.textContent.trim().length > 0;
const obs = new MutationObserver(() => { if (seen()) { obs.disconnect(); done("settling"); } });
obs.observe(out, {subtree: true, childList: true, characterData: true, attributes: true});
setTimeout(() => { obs.disconnect(); done("timed out: no settled prefix shown"); }, 20000);
const box = document.getElementById("src");
box.value = text;
box.dispatchEvent(new Event("input", {bubbles: true}));
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="PNG path; the phone's gets -phone before .png")
    p.add_argument("--text", nargs="+", default=SENTENCES, help="lines to type")
    p.add_argument("--stream-text", nargs="+", default=LONG,
                   help="lines for the mid-stream picture")
    args = p.parse_args()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    server = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--model", args.model,
                               "--port", "0"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              stderr=subprocess.PIPE)
    try:
        for raw in server.stderr:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)/", raw.decode())
            if m:
                break
        else:
            raise SystemExit("aiayn serve did not start")
        with tempfile.TemporaryDirectory() as profile:
            driver = chrome(Path(profile), 1100, 760)
            try:
                wait = WebDriverWait(driver, 120)
                driver.get(m.group(1) + "/")
                wait.until(lambda d: "→" in d.find_element(By.ID, "model-info").text)
                box = driver.find_element(By.ID, "src")
                for i, line in enumerate(args.text):
                    if i:
                        box.send_keys(Keys.ENTER)
                    box.send_keys(line)
                n = len(args.text)
                wait.until(lambda d: re.search(rf"^{n} lines? in \d+ ms", d.find_element(By.ID, "status").text))
                box.send_keys(Keys.CONTROL, Keys.HOME)  # the n-best list of the first line
                driver.save_screenshot(args.out)
                driver.set_window_size(390, 844)
                driver.save_screenshot(args.out.replace(".png", "-phone.png"))
                driver.set_window_size(1100, 760)
                driver.set_script_timeout(30)
                caught = driver.execute_async_script(MID_STREAM, "\n".join(args.stream_text))
                driver.save_screenshot(args.out.replace(".png", "-streaming.png"))
                print(f"mid-stream picture: {caught}", file=sys.stderr)
            finally:
                driver.quit()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
