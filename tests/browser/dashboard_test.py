"""The dashboard in a real headless Chromium, against the release binary.

Signs in, opens every page (screenshots of each, light and dark, go to
target/ui-screenshots/), presses the buttons an operator presses and checks
through the API that each happened, watches a live event arrive, checks
that a job whose args hold markup is shown as text and never runs, and
signs out.

Needs: SVC_BIN (the svc binary), chromium and chromedriver, selenium.
"""

import hashlib
import json
import os
import pathlib
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def left(element):
    """A wait condition: the page holding `element` was replaced. Chromium
    reports an element of a page it is leaving either as stale or, in the
    middle of the change, as a node that no longer belongs to the document."""

    def replaced(_browser):
        try:
            element.is_enabled()
            return False
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            if "does not belong to the document" in str(error):
                return True
            raise

    return replaced


ROOT = pathlib.Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "ui-screenshots"
ADMIN_KEY = secrets.token_hex(32)
VIEWER_KEY = secrets.token_hex(32)
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        config = pathlib.Path(self.dir.name) / "svc.toml"
        digest = lambda key: hashlib.sha256(key.encode()).hexdigest()
        config.write_text(
            f'[[auth.keys]]\nname = "ops"\nrole = "admin"\nkey_sha256 = "{digest(ADMIN_KEY)}"\n\n'
            f'[[auth.keys]]\nname = "watch"\nrole = "viewer"\nkey_sha256 = "{digest(VIEWER_KEY)}"\n'
        )
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        binary = os.environ.get("SVC_BIN", str(ROOT / "target" / "release" / "svc"))
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir",
             str(pathlib.Path(self.dir.name) / "data"), "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                urllib.request.urlopen(self.base + "/svc/v1/health", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("svc did not start")

    def api(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {ADMIN_KEY}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            return json.loads(text) if text else None

    def enqueue(self, job_type, args, **options):
        return self.api("POST", "/svc/v1/jobs", {"type": job_type, "args": args, "options": options})["job"]["id"]

    def discard(self, queue, marker):
        job = self.enqueue("report.build", [marker], queue=queue,
                           retry={"max_attempts": 1, "on_exhaustion": "dead_letter"})
        self.api("POST", "/svc/v1/workers/fetch", {"queues": [queue], "count": 1, "worker_id": "w-seed"})
        self.api("POST", "/svc/v1/workers/nack", {"job_id": job, "error": {"type": "Boom", "message": f"failed {marker}"}})
        return job

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self.dir.cleanup()


class Dashboard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        options = webdriver.ChromeOptions()
        for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"]:
            options.add_argument(flag)
        options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
        service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
        cls.browser = webdriver.Chrome(options=options, service=service)
        cls.browser.implicitly_wait(0)
        SHOTS.mkdir(parents=True, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        cls.server.stop()

    # Helpers.

    def open(self, path):
        self.browser.get(self.server.base + path)

    def heading(self):
        return self.browser.find_element(By.TAG_NAME, "h1").text

    def press(self, action_suffix, label):
        """Clicks the button labelled `label` in the form posting to a path ending in `action_suffix`."""
        for form in self.browser.find_elements(By.CSS_SELECTOR, "form[method=post]"):
            if form.get_attribute("action").endswith(action_suffix):
                button = form.find_element(By.TAG_NAME, "button")
                self.assertEqual(button.text, label)
                page = self.browser.find_element(By.TAG_NAME, "html")
                button.click()
                # The post, then the page it leads to.
                WebDriverWait(self.browser, 10).until(left(page), message=f"{label} leads on")
                WebDriverWait(self.browser, 10).until(
                    lambda browser: browser.execute_script("return document.readyState") == "complete")
                return
        self.fail(f"no form posting to ...{action_suffix} on {self.browser.current_url}")

    def wait_for(self, condition, what):
        WebDriverWait(self.browser, 10).until(lambda _: condition(), message=what)

    def sign_in(self, key):
        self.open("/ui")
        self.assertTrue(self.browser.current_url.endswith("/ui/sign-in"))
        self.browser.find_element(By.NAME, "key").send_keys(key)
        page = self.browser.find_element(By.TAG_NAME, "html")
        self.browser.find_element(By.CSS_SELECTOR, "form button").click()
        WebDriverWait(self.browser, 10).until(left(page), message="signed in")
        self.assertEqual(self.heading(), "Overview")

    def test_an_operator_session(self):
        server = self.server
        hostile = server.enqueue("email.send", [HOSTILE], queue="mail")
        waiting = server.enqueue("email.send", ["ada@example.com"], queue="mail")
        server.enqueue("report.build", ["later"], queue="reports", delay_until="2099-01-01T00:00:00Z")
        dead = server.discard("reports", "first")
        server.api("POST", "/svc/v1/cron", {"name": "nightly", "schedule": "0 3 * * *", "timezone": "UTC",
                                           "type": "report.build", "args": []})
        flow = server.api("POST", "/svc/v1/workflows", {"type": "chain", "name": "onboarding",
                                                       "steps": [{"type": "a", "args": []}, {"type": "b", "args": []}]})
        flow = flow["workflow"]["id"]
        server.api("POST", "/svc/v1/workers/fetch", {"queues": ["idle"], "count": 1, "worker_id": "w-7"})

        self.sign_in(ADMIN_KEY)

        # Every page, in both themes.
        pages = {"overview": "/ui", "queues": "/ui/queues", "queue": "/ui/queues/mail", "jobs": "/ui/jobs",
                 "job": f"/ui/jobs/{hostile}", "scheduled": "/ui/scheduled", "dead-letter": "/ui/dead-letter",
                 "cron": "/ui/cron", "workers": "/ui/workers", "workflows": "/ui/workflows",
                 "workflow": f"/ui/workflows/{flow}", "events": "/ui/events"}
        for theme in ["light", "dark"]:
            for name, path in pages.items():
                self.open(path)
                self.assertNotIn("Something went wrong", self.browser.page_source, path)
                self.browser.save_screenshot(str(SHOTS / f"{name}-{theme}.png"))
            if theme == "light":
                self.press("/ui/theme", "Dark mode")
                self.assertEqual(self.browser.find_element(By.TAG_NAME, "html").get_attribute("data-theme"), "dark")
        self.press("/ui/theme", "Light mode")

        # Markup in args is text: shown, never run.
        self.open(f"/ui/jobs/{hostile}")
        self.assertIn("<script>window.__pwned=1</script>", self.browser.find_element(By.TAG_NAME, "main").text)
        self.assertIsNone(self.browser.execute_script("return window.__pwned"))

        # Pause and resume a queue with its buttons.
        self.open("/ui/queues")
        self.press("/ui/queues/mail/pause", "Pause")
        self.assertIn("Queue mail paused.", self.browser.page_source)
        self.assertTrue(server.api("GET", "/svc/v1/queues/mail/stats")["paused"])
        self.press("/ui/queues/mail/resume", "Resume")
        self.assertFalse(server.api("GET", "/svc/v1/queues/mail/stats")["paused"])

        # Retry a dead job.
        self.open("/ui/dead-letter")
        self.press(f"/ui/jobs/{dead}/retry", "Retry")
        self.assertEqual(server.api("GET", f"/svc/v1/jobs/{dead}")["job"]["state"], "available")

        # Bulk-retry by filter: the count first, then the deed.
        more = [server.discard("exports", f"more-{n}") for n in range(2)]
        self.open("/ui/jobs?queue=exports&state=discarded")
        self.press("/ui/jobs/bulk/retry", "Retry all")
        self.assertEqual(self.heading(), "Retry all?")
        self.press("/ui/jobs/bulk/retry", "Retry all 2")
        for job in more:
            self.assertEqual(server.api("GET", f"/svc/v1/jobs/{job}")["job"]["state"], "available")

        # Cancel a job.
        self.open(f"/ui/jobs/{waiting}")
        self.press(f"/ui/jobs/{waiting}/cancel", "Cancel")
        self.assertEqual(server.api("GET", f"/svc/v1/jobs/{waiting}")["job"]["state"], "cancelled")

        # Quiet a worker.
        self.open("/ui/workers")
        self.press("/ui/workers/w-7/quiet", "Quiet")
        self.assertEqual(server.api("GET", "/svc/v1/workers/w-7")["worker"]["state"], "quiet")

        # A live event arrives.
        self.open("/ui/events")
        time.sleep(0.5)
        live = server.enqueue("email.send", ["live"], queue="mail")
        rows = lambda: self.browser.find_element(By.CSS_SELECTOR, "#live tbody").text
        self.wait_for(lambda: live in rows() and "job.enqueued" in rows(), "the event shows up")
        self.browser.save_screenshot(str(SHOTS / "events-live-light.png"))

        # While the tab is hidden the stream is closed; shown again, it goes
        # on after the last event seen, so nothing is missed.
        table = lambda: self.browser.find_element(By.ID, "live")
        visibility = ("Object.defineProperty(document, 'hidden', {configurable: true, get: () => %s});"
                      "document.dispatchEvent(new Event('visibilitychange'));")
        self.browser.execute_script(visibility % "true")
        self.assertEqual(table().get_attribute("data-following"), "no")
        unseen = server.enqueue("email.send", ["while hidden"], queue="mail")
        time.sleep(1)
        self.assertNotIn(unseen, rows(), "no events while hidden")
        self.browser.execute_script(visibility % "false")
        self.assertEqual(table().get_attribute("data-following"), "yes")
        self.wait_for(lambda: unseen in rows(), "the event sent while hidden arrives once shown")

        # A live part: the overview reloads its figures as events arrive.
        self.open("/ui")
        time.sleep(0.5)
        self.assertNotIn("fresh-queue", self.browser.find_element(By.TAG_NAME, "main").text)
        server.enqueue("email.send", ["refresh"], queue="fresh-queue")
        self.wait_for(lambda: "fresh-queue" in self.browser.find_element(By.TAG_NAME, "main").text,
                      "the overview shows the new queue without a reload")

        # Sign out.
        self.open("/ui")
        self.press("/ui/sign-out", "Sign out")
        self.assertTrue(self.browser.current_url.endswith("/ui/sign-in"))
        self.open("/ui/queues")
        self.assertTrue(self.browser.current_url.endswith("/ui/sign-in"))

    def test_a_viewer_sees_no_buttons(self):
        self.browser.delete_all_cookies()
        self.sign_in(VIEWER_KEY)
        self.open("/ui/queues")
        labels = [button.text for button in self.browser.find_elements(By.TAG_NAME, "button")]
        self.assertNotIn("Pause", labels)
        self.assertIn("Sign out", labels)
        self.press("/ui/sign-out", "Sign out")


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)
