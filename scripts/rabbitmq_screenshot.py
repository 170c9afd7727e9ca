"""Screenshot of the RabbitMQ management UI's Queues page, in headless Chromium (Debian's
chromium and chromium-driver), logged in as the read-only ladder-monitor: the README's
docs/rabbitmq-queues.png.

    python scripts/rabbitmq_screenshot.py --url http://127.0.0.1:15672 \
        --out docs/rabbitmq-queues.png [--password P]

The password is ladder-monitor's, LADDER_BROKER_MONITOR_PASSWORD (dev-monitor, as `make up`
sets it by default; `make containers` writes its own into deploy/.env).
"""

from __future__ import annotations

import argparse
import shutil
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:15672")
    parser.add_argument("--out", default="docs/rabbitmq-queues.png")
    parser.add_argument("--user", default="ladder-monitor")
    parser.add_argument("--password", default="dev-monitor")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        print("needs Debian's chromium and chromium-driver", file=sys.stderr)
        return 2
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(args.url.rstrip("/") + "/")
        wait.until(expected_conditions.presence_of_element_located((By.NAME, "username")))
        driver.find_element(By.NAME, "username").send_keys(args.user)
        driver.find_element(By.NAME, "password").send_keys(args.password)
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait.until(expected_conditions.presence_of_element_located((By.ID, "logout")))
        driver.get(args.url.rstrip("/") + "/#/queues")
        wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "main"), "ladder."))
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
