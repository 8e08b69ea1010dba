"""The built-in page in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright)
against a live `anycore serve` running the default model with an API key and --bench-results.

One server and one browser for the module; each test gets a fresh browser context (its own
localStorage). A failing test leaves a screenshot in test-artifacts/webui/ (gitignored); the
streaming chat test always writes test-artifacts/webui/chat.png and the phone-width test
test-artifacts/webui/phone.png.

Skipped, with the reason, where Playwright or a Chromium binary is missing (`make test` installs
Debian's chromium when it runs as root with apt-get; Playwright's own browser download is not used).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
CHROMIUM = os.environ.get("ANYCORE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM:
    pytest.skip("no Chromium binary (apt-get install -y chromium, or set ANYCORE_CHROMIUM)", allow_module_level=True)

ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "webui"
KEY = "webui-secret"
LOAD_TIMEOUT_S = float(os.environ.get("ANYCORE_E2E_LOAD_TIMEOUT", "600"))
WAIT_MS = 120_000  # generous: two shared cores may be busy with other work


def _png(width: int, height: int) -> bytes:
    """A valid grey PNG (so the page's <img> really decodes it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _result(workload: str, median: float) -> dict:
    return {"meta": {"started": "2026-01-01 00:00:00", "cpu_model": "test cpu", "threads": 2}, "partial": False,
            "measurements": [
                {"workload": workload, "engine": "anycore bf16", "unit": "tok/s", "higher_is_better": True,
                 "median": median, "values": [median - 1, median, median + 1], "cv": 0.02, "noisy": False,
                 "noise_reasons": [], "ratio": None, "ratio_ref": "anycore bf16"},
                {"workload": workload, "engine": "llama.cpp Q8_0", "unit": "tok/s", "higher_is_better": True,
                 "median": median / 2, "values": [median / 2], "cv": 0.0, "noisy": True,
                 "noise_reasons": ["other processes used 1.5 cores"], "ratio": 2.0, "ratio_ref": "anycore bf16"}]}


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bench")
    path = folder / "compare.json"
    path.write_text(json.dumps(_result("decode c=1", 50.0)))
    (folder / "compare-decode.png").write_bytes(_png(40, 20))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bench_file: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("webui-server") / "server.log"
    cmd = [sys.executable, "-m", "anycore", "serve", "--port", str(port), "--api-key", KEY,
           "--bench-results", str(bench_file), "--shutdown-timeout", "2"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {LOAD_TIMEOUT_S:.0f}s\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def engine_info(url: str) -> dict:
    r = httpx.get(f"{url}/v1/engine", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium refuses its sandbox as root (containers, CI)
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture()
def open_page(browser, server, request: pytest.FixtureRequest):
    """open_page(key=KEY, viewport=None) -> a page at the server's `/` in a fresh context."""
    contexts = []
    failed_before = request.session.testsfailed

    def open_(key: str | None = KEY, viewport: dict | None = None):
        ctx = browser.new_context(viewport=viewport or {"width": 1280, "height": 800})
        if key is not None:  # as if the person had entered it before (the page keeps it in localStorage)
            ctx.add_init_script(f"localStorage.getItem('anycore.apiKey') || "
                                f"localStorage.setItem('anycore.apiKey', {json.dumps(json.dumps(key))})")
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.js_errors = errors
        response = page.goto(server)
        assert response is not None and response.status == 200
        return page

    yield open_
    if request.session.testsfailed > failed_before:  # this test failed: keep what the browser showed
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for i, ctx in enumerate(contexts):
            for j, page in enumerate(ctx.pages):
                page.screenshot(path=str(ARTIFACTS / f"failed-{request.node.name}-{i}{j}.png"), full_page=True)
    for ctx in contexts:
        for page in ctx.pages:
            assert not page.js_errors, f"JavaScript errors on the page: {page.js_errors}"
        ctx.close()


def settle(page) -> None:
    """Waits until no answer is streaming (Send enabled, Stop disabled)."""
    page.wait_for_function("!document.getElementById('send').disabled && document.getElementById('stop').disabled")


def set_controls(page, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool):
            page.set_checked(f"#{name}", value)
        else:
            page.fill(f"#{name}", str(value))


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last(page, role: str):
    return page.locator(f".msg[data-role={role}]").last


def test_engine_endpoint_reports_the_loaded_engine(server):
    assert httpx.get(f"{server}/v1/engine", timeout=10).status_code == 401
    info = engine_info(server)
    assert info["state"] == "ready" and info["dtype"] == "bfloat16" and info["architecture"] == "LlamaForCausalLM"
    assert info["model"] == info["model_file"] and info["max_model_len"] > 0 and info["num_params"] > 0
    assert set(info["kernels"]) >= {"linear", "rms_norm", "paged_attention"}
    assert all(k["impl"] and k["reason"] for k in info["kernels"].values())
    assert info["decoder_stack"] in ("native", "op by op")
    assert info["kv"]["slots_total"] > 0 and info["bench_results"] is True
    assert info["requests"]["running"] == 0


def test_chat_streams_incrementally_with_speed_readout(open_page, server):
    page = open_page()
    page.wait_for_function("document.getElementById('engine-model').textContent.includes('SmolLM2')")
    set_controls(page, temperature=0, max_tokens=16, ignore_eos=True)
    # Shift+Enter is a new line, not a send
    page.fill("#prompt", "Write a short poem")
    page.press("#prompt", "Shift+Enter")
    page.keyboard.type("about the sea.")
    assert page.input_value("#prompt") == "Write a short poem\nabout the sea."
    assert page.locator(".msg[data-role=user]").count() == 0
    page.press("#prompt", "Enter")
    assert page.input_value("#prompt") == ""
    assert last(page, "user").locator(".content").text_content() == "Write a short poem\nabout the sea."
    lengths: list[int] = []
    while page.is_disabled("#send"):
        if page.locator(".msg[data-role=assistant]").count():
            lengths.append(len(last(page, "assistant").locator(".content").text_content() or ""))
        page.wait_for_timeout(40)
    final = last(page, "assistant").locator(".content").text_content() or ""
    partial = {n for n in lengths if 0 < n < len(final)}
    assert partial, f"no partial answer seen while streaming (lengths observed: {lengths}, final {len(final)})"
    assert len(set(lengths) - {0}) >= 2, f"text did not grow across observations: {lengths}"
    meta = last(page, "assistant").locator(".stats").text_content()
    assert "16 tokens" in meta and "length" in meta and "tok/s" in meta and "TTFT" in meta, meta
    assert page.text_content("#stat-ttft").endswith("ms") and page.text_content("#stat-tps").endswith("tok/s")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)
    # the engine readout: the loaded model's facts and the kernel chosen per op
    page.click("#tab-engine")
    assert page.locator("#panel-chat").is_hidden()
    page.wait_for_selector("#kernel-table tbody tr")
    ops = page.locator("#kernel-table tbody tr td:first-child").all_text_contents()
    assert "linear" in ops and "paged_attention" in ops
    assert "bfloat16" in page.text_content("#engine-facts")


def test_sampling_controls_reach_the_request_body(open_page):
    page = open_page()
    set_controls(page, system="You answer in one word.", temperature=0.3, top_p=0.9, top_k=7, max_tokens=5,
                 seed=1234, json_mode=True)
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
        send(page, "Name a colour.")
    body = req.value.post_data_json
    assert req.value.headers["authorization"] == f"Bearer {KEY}"
    assert body["messages"] == [{"role": "system", "content": "You answer in one word."},
                                {"role": "user", "content": "Name a colour."}]
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"], body["seed"]) == (0.3, 0.9, 7, 5, 1234)
    assert body["stream"] is True and body["response_format"] == {"type": "json_object"}
    assert "ignore_eos" not in body
    settle(page)
    # answered, or (a server that rejects response_format) its error shown to the person
    assert page.locator(".msg[data-role=assistant], .msg[data-role=error]").count() >= 1
    # the controls are kept for the next visit
    page.reload()
    assert page.input_value("#seed") == "1234" and page.is_checked("#json_mode")


def test_stop_aborts_and_the_server_frees_the_request(open_page, server):
    page = open_page()
    before = engine_info(server)["totals"]["generation_tokens"]
    set_controls(page, temperature=0, max_tokens=4000, ignore_eos=True)
    send(page, "Count from one to a thousand.")
    page.wait_for_function("(document.querySelector('.msg[data-role=assistant] .content')?.textContent || '').length > 0")
    running = engine_info(server)["requests"]["running"]
    assert running == 1, f"the long answer is not running on the server (running={running})"
    page.keyboard.press("Escape")  # the keyboard path; the Stop button calls the same abort
    settle(page)
    assert "stopped" in last(page, "assistant").locator(".stats").text_content()
    deadline = time.monotonic() + 30
    info = engine_info(server)
    while (info["requests"]["running"] or info["kv"]["slots_held"]) and time.monotonic() < deadline:
        time.sleep(0.2)
        info = engine_info(server)
    assert info["requests"]["running"] == 0 and info["kv"]["slots_held"] == 0, info
    assert info["totals"]["generation_tokens"] - before < 4000  # cancelled, not run to max_tokens
    page.wait_for_function("document.getElementById('engine-running').textContent === '0'")


def test_conversations_kept_across_reload_new_and_delete(open_page):
    page = open_page()
    set_controls(page, temperature=0, max_tokens=4)
    send(page, "Say hello.")
    settle(page)
    answer = last(page, "assistant").locator(".content").text_content()
    assert answer
    page.reload()
    assert last(page, "user").locator(".content").text_content() == "Say hello."
    assert last(page, "assistant").locator(".content").text_content() == answer
    assert page.locator("#conv-list li").count() == 1
    assert page.locator("#conv-list .open").first.text_content() == "Say hello."
    page.click("#new-conv")
    assert page.locator(".msg").count() == 0 and page.locator("#conv-list li").count() == 2
    page.reload()
    assert page.locator("#conv-list li").count() == 2
    page.locator("#conv-list li[aria-current=true] .delete").click()
    assert page.locator("#conv-list li").count() == 1
    assert last(page, "user").locator(".content").text_content() == "Say hello."


def test_copy_and_regenerate(open_page):
    page = open_page()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    set_controls(page, temperature=0, max_tokens=4, seed=7)
    send(page, "Name a fruit.")
    settle(page)
    first = last(page, "assistant").locator(".content").text_content()
    last(page, "assistant").locator("button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == first
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
        last(page, "assistant").locator("button.regenerate").click()
    assert req.value.post_data_json["messages"] == [{"role": "user", "content": "Name a fruit."}]
    settle(page)
    assert page.locator(".msg[data-role=assistant]").count() == 1  # replaced, not appended
    assert last(page, "assistant").locator(".content").text_content() == first  # greedy: the same answer


def test_completion_mode_sends_a_raw_prompt(open_page):
    page = open_page()
    page.select_option("#mode", "completion")
    set_controls(page, temperature=0, max_tokens=5)
    with page.expect_request(lambda r: r.url.endswith("/v1/completions")) as req:
        send(page, "The capital of France is")
    body = req.value.post_data_json
    assert body["prompt"] == "The capital of France is" and "messages" not in body
    settle(page)
    assert last(page, "completion").locator(".content").text_content()


def test_server_error_is_shown(open_page):
    page = open_page()
    set_controls(page, max_tokens=100_000)
    send(page, "Hello")
    error = page.locator(".msg[data-role=error]")
    error.wait_for()
    text = error.text_content()
    assert "maximum context length" in text and "param: messages" in text, text
    assert page.locator(".msg[data-role=assistant]").count() == 0
    settle(page)


def test_api_key_asked_on_401_and_kept(open_page):
    page = open_page(key=None)  # the page itself loads without a key (open_page checked its 200)
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible")  # the engine poll got 401
    assert "API key" in page.text_content("#key-reason")
    page.keyboard.press("Escape")  # declined: the poll says why and stops asking
    page.wait_for_function("document.getElementById('engine-model').textContent.includes('API key')")
    assert dialog.is_hidden()
    set_controls(page, temperature=0, max_tokens=4)
    send(page, "Hi")  # sending asks again
    dialog.wait_for(state="visible")
    page.fill("#api-key", "wrong")
    page.press("#api-key", "Enter")
    dialog.wait_for(state="visible")  # asked again: the server said 401 again
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    settle(page)  # the send went through with the key
    assert last(page, "assistant").locator(".content").text_content()
    page.wait_for_function("document.getElementById('engine-model').textContent.includes('SmolLM2')")
    assert dialog.is_hidden() and page.locator(".msg[data-role=error]").count() == 0
    assert page.evaluate("JSON.parse(localStorage.getItem('anycore.apiKey'))") == KEY
    page.reload()
    page.wait_for_function("document.getElementById('engine-model').textContent.includes('SmolLM2')")
    assert dialog.is_hidden()


def test_keyboard_focus_is_visible_and_every_control_labelled(open_page):
    page = open_page()
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, select, textarea')]
        .filter(e => !e.labels || e.labels.length === 0).map(e => e.id || e.outerHTML)""")
    assert unlabelled == []
    assert page.evaluate("document.activeElement.id") == "prompt"  # ready to type on load
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "send"
    style = page.evaluate("(() => { const s = getComputedStyle(document.activeElement); "
                          "return [s.outlineStyle, parseFloat(s.outlineWidth)]; })()")
    assert style[0] != "none" and style[1] >= 2, style
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.id") == "prompt"
    set_controls(page, max_tokens=4)
    page.focus("#prompt")
    page.keyboard.type("Hello")
    page.keyboard.press("Enter")
    settle(page)
    assert last(page, "user").locator(".content").text_content() == "Hello"


def test_phone_width_keeps_the_input_usable(open_page):
    width = 390
    page = open_page(viewport={"width": width, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
    for selector in ("#prompt", "#send"):
        box = page.locator(selector).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= width and box["width"] > 40, (selector, box)
    assert not page.locator("#side-settings").evaluate("d => d.open")  # folded away on a phone
    page.click("#side-settings summary")
    set_controls(page, temperature=0, max_tokens=4)
    send(page, "Hi")
    settle(page)
    page.click("#side-settings summary")  # fold the settings again
    answer = last(page, "assistant")
    answer.scroll_into_view_if_needed()
    box = answer.bounding_box()
    assert answer.locator(".content").text_content() and box and box["x"] + box["width"] <= width, box
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "phone.png"))


def test_benchmarks_tab_shows_server_results_and_a_loaded_file(open_page, tmp_path: Path):
    page = open_page()
    page.click("#tab-bench")
    page.wait_for_selector("#bench-table tbody tr")
    rows = page.locator("#bench-table tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).locator("td").all_text_contents()[:3] == ["decode c=1", "anycore bf16", "50.0"]
    assert "NOISY" in rows.nth(1).text_content() and "2.00" in rows.nth(1).text_content()
    img = page.locator("#bench-charts img")
    img.wait_for()
    page.wait_for_function("document.querySelector('#bench-charts img').naturalWidth === 40")
    other = tmp_path / "mine.json"
    other.write_text(json.dumps(_result("prefill 512", 900.0)))
    page.set_input_files("#bench-file", str(other))
    page.wait_for_function("document.querySelector('#bench-table tbody td')?.textContent === 'prefill 512'")
    assert "mine.json" in page.text_content("#bench-meta")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    page.set_input_files("#bench-file", str(bad))
    page.wait_for_function("document.getElementById('bench-meta').textContent.includes('Could not read bad.json')")
