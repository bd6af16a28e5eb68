"""The playground page (``GET /``) driven in headless Chromium against a real ``onepass serve``.

Debian's ``chromium`` (``scripts/install.sh`` installs it) is driven through Playwright for
Python pointed at that binary; Playwright's own browser download is never used. Without
chromium the browser tests skip on a laptop and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")

STATE = ("Order #7710 arrived with a smashed box and a cracked vase inside. The customer "
         "asks for a refund.")
QUESTIONS: dict[str, dict[str, Any]] = {
    "refund": {"type": "noul",
               "instructions": "The customer is eligible for a full refund."},
    "team": {"type": "choice", "instructions": "Which team should handle this case?",
             "criteria": {"billing": "Double charges and payment errors",
                          "logistics": "Damaged, lost or late shipments",
                          "support": None}},
    "urgency": {"type": "score", "instructions": "How urgent is this case?",
                "criteria": ["Routine", "Urgent", "Emergency"]},
}


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None



# ---------------------------------------------------------------------- without a browser


def test_page_is_public_even_with_an_api_key_and_can_be_turned_off():
    from fastapi.testclient import TestClient

    from onepass.server.app import create_app
    from onepass.server.playground import content_security_policy, page_html
    from onepass.server.settings import ServerSettings

    keyed = TestClient(create_app(lambda: None, ServerSettings(api_key="secret")))
    page = keyed.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == page_html() and "<title>onepass playground</title>" in page.text
    assert keyed.get("/v1/models").status_code == 403  # the API itself still needs the key
    csp = page.headers["content-security-policy"]
    assert csp == content_security_policy(page.text)
    assert "unsafe-inline" not in csp and "connect-src 'self'" in csp
    assert len(re.findall(r"'sha256-", csp)) == 2  # one script, one style block
    assert 'style="' not in page.text  # style attributes would be blocked by that policy
    assert "http://" not in page.text.replace("http://host:port", "")  # nothing off-origin
    off = TestClient(create_app(lambda: None, ServerSettings(playground=False)))
    assert off.get("/").status_code == 404


@pytest.mark.parametrize(("env", "expected"), [(None, True), ("1", False), ("0", True),
                                                ("true", False), ("off", True)])
def test_no_playground_flag_and_environment(monkeypatch, env, expected):
    from onepass.commands import serve
    from onepass.commands.common import CommandParser

    parser = CommandParser(prog="onepass serve")
    serve.add_arguments(parser)
    if env is None:
        monkeypatch.delenv("ONEPASS_NO_PLAYGROUND", raising=False)
    else:
        monkeypatch.setenv("ONEPASS_NO_PLAYGROUND", env)
    assert serve.settings_from_args(parser.parse_args([])).playground is expected
    assert serve.settings_from_args(parser.parse_args(["--no-playground"])).playground is False


def test_bad_no_playground_environment_is_a_one_line_error(monkeypatch, capsys):
    from onepass.commands import serve
    from onepass.commands.common import CommandParser

    parser = CommandParser(prog="onepass serve")
    serve.add_arguments(parser)
    monkeypatch.setenv("ONEPASS_NO_PLAYGROUND", "maybe")
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([])
    assert exc.value.code == 2
    assert "ONEPASS_NO_PLAYGROUND (environment, for --no-playground)" in capsys.readouterr().err


# ---------------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        message = "chromium is not installed (apt-get install -y chromium; scripts/install.sh does)"
        if running_in_ci():
            pytest.fail(message + "; CI must run the browser test", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def browser(chromium):
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(server + "/")
    page.wait_for_selector("#model option", state="attached")  # /v1/models answered
    yield page
    context.close()
    # a 4xx the test asked for shows up as a failed resource load; anything else is a bug
    assert not [e for e in errors if "status of 4" not in e], errors


def fill_questions(page, questions: dict[str, dict[str, Any]]) -> None:
    """Remove the example questions and type these in, through the page's own buttons."""
    while page.locator(".question").count():
        page.locator(".question .q-remove").first.click()
    for name, q in questions.items():
        page.click(f'[data-add="{q["type"]}"]')
        card = page.locator(".question").last
        card.locator(".q-name").fill(name)
        card.locator(".q-instructions").fill(q.get("instructions", ""))
        criteria = q.get("criteria")
        if isinstance(criteria, dict):
            text = "\n".join(f"{k}: {v}" if v else k for k, v in criteria.items())
        elif isinstance(criteria, list):
            text = "\n".join(criteria)
        else:
            text = ""
        card.locator(".q-criteria").fill(text)


def shown_bars(page) -> dict[tuple[str, str], tuple[float, str]]:
    rows = page.eval_on_selector_all(
        "#results .bar-row",
        "els => els.map(e => [e.dataset.question, e.dataset.key, Number(e.dataset.probability),"
        " e.querySelector('.bar-value').textContent])",
    )
    return {(q, k): (p, text) for q, k, p, text in rows}


def expected_bars(answers: dict[str, Any]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for name, a in answers.items():
        if a["type"] == "noul":
            out[(name, "yes")] = a["noul"]
            out[(name, "no")] = 1 - a["noul"]
        else:
            out.update({(name, k): p for k, p in a["probabilities"].items()})
    return out


def test_questions_bars_match_the_api_and_errors_show_at_the_field(page, server, tmp_path):
    page.fill("#state", STATE)
    fill_questions(page, QUESTIONS)
    with page.expect_request("**/v1/systemone") as sent:
        page.click("#submit")
    page.wait_for_selector("#stat-latency")
    body = json.loads(sent.value.post_data)
    model = page.input_value("#model")
    assert body == {"model": model, "state": STATE, "questions": QUESTIONS}

    direct = httpx.post(server + "/v1/systemone", json=body, timeout=60)
    assert direct.status_code == 200
    api = direct.json()
    shown = shown_bars(page)
    expected = expected_bars(api["answers"])
    assert set(shown) == set(expected) and len(expected) == 2 + 3 + 3
    for key, p in expected.items():
        value, text = shown[key]
        assert value == pytest.approx(p, abs=1e-4), key
        assert float(text) == pytest.approx(p, abs=2e-4), key
    chosen = page.eval_on_selector_all("#results .bar-row.chosen",
                                       "els => els.map(e => [e.dataset.question, e.dataset.key])")
    assert ["team", api["answers"]["team"]["choice"]] in chosen
    assert f"confidence {api['answers']['team']['confidence']:.3f}" in page.inner_text("#results")
    assert page.inner_text("#stat-input") == str(api["usage"]["input_tokens"])
    assert page.inner_text("#stat-output") == str(api["usage"]["output_tokens"])
    assert page.inner_text("#stat-cached").isdigit()
    assert re.fullmatch(r"\d+ ms", page.inner_text("#stat-latency"))
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
    assert (tmp_path / "playground.png").stat().st_size > 10_000

    # a server-side validation error: its message, next to the criteria of that question
    card = page.locator(".question").nth(2)
    card.locator(".q-criteria").fill("\n".join(f"level {i}" for i in range(11)))
    page.click("#submit")
    error = card.locator(".q-error")
    error.wait_for(state="visible")
    bad = {**body, "questions": {**QUESTIONS, "urgency": {
        **QUESTIONS["urgency"], "criteria": [f"level {i}" for i in range(11)]}}}
    envelope = httpx.post(server + "/v1/systemone", json=bad, timeout=30).json()["error"]
    assert envelope["field"] == "questions.urgency.criteria"
    assert envelope["message"] in error.inner_text()
    assert "expected 1 to 10 levels, got 11" in error.inner_text()
    assert card.locator(".q-criteria").get_attribute("aria-invalid") == "true"
    assert page.evaluate("document.activeElement.classList.contains('q-criteria')")
    page.screenshot(path=str(tmp_path / "playground-error.png"))

    # the browser's own check: a JSON state that does not parse never leaves the page
    page.check('input[name="state-format"][value="json"]')
    page.fill("#state", "{not json")
    page.click("#submit")
    assert "state: not valid JSON" in page.inner_text("#state-error")

    # the last request is remembered across a reload (local storage)
    page.reload()
    page.wait_for_selector("#model option", state="attached")
    assert page.input_value("#state") == "{not json"
    assert [page.locator(".q-name").nth(i).input_value() for i in range(3)] == list(QUESTIONS)
    assert page.evaluate("sessionStorage.getItem('onepass.apiKey')") is None


def test_copy_as_snippets_run_and_agree(page, server):
    page.fill("#state", STATE)
    fill_questions(page, QUESTIONS)
    direct = httpx.post(server + "/v1/systemone",
                        json={"state": STATE, "questions": QUESTIONS}, timeout=60).json()
    env = {**os.environ, "ONEPASS_API_KEY": "local"}
    outputs = {}
    for kind in ("python", "openai"):
        page.click(f'#panel-questions [data-copy="{kind}"]')
        code = page.inner_text("#snippet")
        assert server in code and "ONEPASS_API_KEY" in code
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=60)
        assert run.returncode == 0, run.stderr
        outputs[kind] = run.stdout
    team = direct["answers"]["team"]["choice"]
    assert f"team type='choice' choice='{team}'" in outputs["python"]
    assert f"'choice': '{team}'" in outputs["openai"]
    page.click('#panel-questions [data-copy="curl"]')
    curl = page.inner_text("#snippet")
    assert curl.startswith(f"curl -sS {server}/v1/systemone")
    if shutil.which("curl"):
        run = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert json.loads(run.stdout)["answers"]["team"]["choice"] == team


def test_schema_tab_and_chat_tab(page, server):
    page.keyboard.press("Tab")  # the tabs take arrow keys, like any tablist
    page.focus("#tab-questions")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#tab-schema", "aria-selected") == "true"
    assert page.is_visible("#schema") and not page.is_visible("#state")
    with page.expect_request("**/v1/decisions/schema") as sent:
        page.keyboard.press("Control+Enter")
    page.wait_for_selector("#schema-results .answer")
    body = json.loads(sent.value.post_data)
    assert body["mode"] == "sequential" and set(body) >= {"context", "schema"}
    api = httpx.post(server + "/v1/decisions/schema", json=body, timeout=60).json()
    rows = page.eval_on_selector_all(
        "#schema-results .bar-row",
        "els => els.map(e => [e.dataset.question, e.dataset.key, Number(e.dataset.probability)])")
    expected = {(path, k): p for path, f in api["fields"].items()
                for k, p in f["probabilities"].items()}
    assert {(q, k) for q, k, _ in rows} == set(expected)
    for q, k, p in rows:
        assert p == pytest.approx(expected[(q, k)], abs=1e-4)
    # an error in the schema lands next to the schema editor
    page.fill("#schema", json.dumps({"type": "object", "properties": {"note": {"type": "string"}}}))
    page.click("#schema-submit")
    page.locator("#schema-error").wait_for(state="visible")
    assert "note" in page.inner_text("#schema-error")
    assert page.get_attribute("#schema", "aria-invalid") == "true"

    paths = httpx.get(server + "/openapi.json").json()["paths"]
    can_chat = "/v1/chat/completions" in paths
    assert page.is_visible("#tab-chat") is can_chat
    if not can_chat:
        return
    page.click("#tab-chat")
    page.fill("#chat-input", "Say hello.")
    page.fill("#chat-max-tokens", "6")
    page.click("#chat-send")
    page.wait_for_selector("#chat-stats span", timeout=60_000)  # written when the stream ends
    assert not page.inner_text("#chat-error")
    reply = page.locator("#chat-log .msg").last.locator("span").inner_text()
    assert reply.strip(), "the streamed reply is empty"
