"""Screenshots of `aiayn serve`'s web page, as docs/guides/serving.md shows it: starts `aiayn
serve` on 127.0.0.1, opens the page in Debian's headless Chromium, types sentences, waits for their
translation and saves a PNG at a desktop's width and one at a phone's.

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

SENTENCES = ["A man in an orange hat starring at something.",
             "Two young children are playing in the sand on the beach."]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="PNG path; the phone's gets -phone before .png")
    p.add_argument("--text", nargs="+", default=SENTENCES, help="lines to type")
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
            finally:
                driver.quit()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
