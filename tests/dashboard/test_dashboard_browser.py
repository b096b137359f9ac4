"""`netspec dashboard` in headless Chromium: the pages load without a script error or a CSP violation, the
curves grow while a run trains, the buttons and the New run form work, a run is published and its model
predicts on an uploaded image, and a dataset is made from a folder of images and browsed, as a person would.

Needs a Chromium executable (Debian's ``chromium`` package; ``NETSPEC_CHROMIUM`` names another one) and the
playwright Python package, never its downloaded browsers.  ``NETSPEC_DASHBOARD_SHOTS=FOLDER`` saves screenshots
of every page there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from test_dashboard import event, make_run
from test_dashboard_data_models import digit_folders

from netspec.training import run_folder

DIGITS = Path(__file__).parent.parent.parent / "configs" / "digits"
SHOWN_IMAGES = "(images) => images.every((image) => image.complete && image.naturalWidth > 0)"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
REPORT_CSP = ("document.addEventListener('securitypolicyviolation', (e) => "
              "console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI}`));")
TRACES = "(chart) => chart.data.map((trace) => trace.x.length)"  # points in each trace of a plotly chart


def chromium() -> str | None:
    """The Chromium executable to drive: $NETSPEC_CHROMIUM, else the first of CHROMIUM_NAMES on the PATH."""
    named = os.environ.get("NETSPEC_CHROMIUM")
    if named:
        return named if os.path.isfile(named) else None
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def netspec(*args, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "netspec", *map(str, args)], cwd=cwd,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kwargs)


def until(condition, seconds: float = 60.0, what: str = "the condition"):
    """Wait for ``condition()`` to be true; its value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.2)
    return value


def screenshot(page, name: str) -> None:
    """With $NETSPEC_DASHBOARD_SHOTS, save the whole page there as NAME.png (128 colours: small enough for the
    README, as sharp as the page)."""
    shots = os.environ.get("NETSPEC_DASHBOARD_SHOTS")
    if shots:
        path = os.path.join(shots, f"{name}.png")
        page.screenshot(path=path, full_page=True)
        with Image.open(path) as shot:
            colours = shot.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT,
                                                   dither=Image.Dither.NONE)
        colours.save(path, optimize=True)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The quickstart's configs (test and log every 20 iterations, no periodic snapshots), the digits converted,
    and one finished run, runs/done."""
    folder = tmp_path_factory.mktemp("workspace")
    shutil.copy(DIGITS / "digits_net.yaml", folder)
    solver = (DIGITS / "solver.yaml").read_text()
    for old, new in (("snapshot: 500", "snapshot: 0"), ("display: 50", "display: 20"),
                     ("test_interval: 200", "test_interval: 100")):
        assert old in solver
        solver = solver.replace(old, new)
    (folder / "solver.yaml").write_text(solver)
    assert netspec("convert", "digits", "data", cwd=folder).wait(120) == 0
    digit_folders(folder / "images" / "digits")
    assert netspec("train", "solver.yaml", "--out", "runs/done", "--max-iter", "100", cwd=folder,
                   stdout=subprocess.DEVNULL).wait(300) == 0
    return folder


@pytest.fixture
def dashboard(workspace):
    """``netspec dashboard`` over the workspace on a free port: the URL it prints (with the token)."""
    with serving(workspace) as url:
        yield url


@contextlib.contextmanager
def serving(workspace: Path):
    """``netspec dashboard`` over ``workspace`` on a free port while in the block: the URL it prints."""
    server = netspec("dashboard", workspace, "--port", "0", "--zoo", workspace.parent / f"{workspace.name}-zoo",
                     cwd=workspace, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "?token=" in line, line
        yield line.split(": ", 1)[1].strip()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextlib.contextmanager
def stopped_at_exit(training: subprocess.Popen):
    try:
        yield training
    finally:
        if training.poll() is None:
            training.send_signal(signal.SIGINT)
            training.wait(30)


@pytest.mark.browser
def test_the_dashboard_in_a_browser(workspace, dashboard):
    with browser_page(60_000) as page:
        from playwright.sync_api import expect

        base = dashboard.split("/?", 1)[0]
        # the Runs list: the finished run, then a training started while the page is open
        page.goto(dashboard)
        assert page.url == base + "/"  # the token went into the cookie, and out of the address
        finished = page.locator("#runs tr", has_text="runs/done")
        expect(finished.locator(".state")).to_have_text("finished")
        assert page.locator("script:not([src])").count() == 0
        # (as many iterations as it takes: 400 are over in 3 s on a fast machine, 40 s on a busy one)
        with stopped_at_exit(netspec("train", "solver.yaml", "--out", "runs/live", "--max-iter", "1000000",
                                     cwd=workspace, stdout=subprocess.DEVNULL)) as training:
            live = page.locator("#runs tr", has_text="runs/live")
            expect(live.locator(".state")).to_have_text("running")  # the list refreshed itself
            screenshot(page, "runs")

            # its page: curves growing without a reload, an overlay, config files, snapshot and stop
            live.locator("a").click()
            page.wait_for_url("**/run?run=runs%2Flive")
            expect(page.locator("#run-state .state")).to_have_text("running")
            for chart in ("chart-loss", "chart-test", "chart-lr"):
                expect(page.locator(f"#{chart}.js-plotly-plot")).to_have_count(1)
            loss = page.locator("#chart-loss")
            first = until(lambda: loss.evaluate(TRACES)[0], what="a loss point")
            until(lambda: loss.evaluate(TRACES)[0] > first, what="the loss curve to grow")
            expect(page.locator("h3", has_text="solver.yaml")).to_have_count(1)
            expect(page.locator("pre", has_text="snapshot: 0")).to_have_count(1)
            page.locator("summary", has_text="Overlay").click()
            page.locator("input.overlay[value='runs/done']").check()
            until(lambda: len(loss.evaluate(TRACES)) == 2, what="the overlaid run's trace")
            assert "with=runs%2Fdone" in page.url
            assert page.locator("#chart-test").evaluate(TRACES)[-1] > 0  # runs/done's test outputs

            page.locator("button[data-action=snapshot]").click()
            expect(page.locator("#action-result")).to_contain_text("asked runs/live")
            expect(page.locator("#snapshots td", has_text=".weights.h5")).to_have_count(1)
            snapshotted = list((workspace / "runs" / "live").glob("*.weights.h5"))
            assert len(snapshotted) == 1 and training.poll() is None
            screenshot(page, "run")
            page.locator("button[data-action=stop]").click()
            expect(page.locator("#run-state .state")).to_have_text("stopped")
            expect(page.locator("button[data-action=stop]")).to_be_disabled()
            assert training.wait(30) == 130  # stopped by SIGINT
        assert run_folder.run_state(str(workspace / "runs" / "live"))[0] == "stopped"

        # Publish the stopped run, and try the model on an image
        page.locator("#publish").click()
        page.wait_for_url("**/publish?run=runs%2Flive")
        page.fill("input[name=name]", "live-digits")
        page.fill("input[name=summary]", "8x8 digits, trained from the browser")
        page.fill("input[name=scale]", "0.00392")  # its HDF5 data holds values in [0, 1]
        page.locator("button[type=submit]").click()
        page.wait_for_url("**/model?ref=live-digits%401")
        page.set_input_files("#predict-file", str(DIGITS / "seven.png"))
        page.locator("#predict-form button[type=submit]").click()
        expect(page.locator("#predictions tr")).to_have_count(6)  # a header and the top 5
        expect(page.locator("#predictions tr").nth(1).locator("td").first).to_have_text("7")
        assert page.locator("#predict-image").evaluate("(image) => image.naturalWidth") == 8
        screenshot(page, "model")
        page.locator("header a", has_text="Models").click()
        expect(page.locator("#models .card", has_text="live-digits@1")).to_have_count(1)
        screenshot(page, "models")

        # Datasets: one made from the image folder, its progress followed, then browsed
        page.locator("header a", has_text="Datasets").click()
        page.fill("input[name=source]", "images/digits")
        page.fill("input[name=out]", "data/three")
        page.check("input[name=gray]")
        page.fill("input[name=val_fraction]", ".25")
        page.locator("button[type=submit]").click()
        page.wait_for_url("**/datasets#conversions")
        expect(page.locator("#conversion-list li")).to_contain_text("finished")
        expect(page.locator("#conversion-list li")).to_contain_text("36 / 36 images")
        expect(page.locator("#datasets a", has_text="data/three/train")).to_have_count(1)  # no reload
        screenshot(page, "datasets")
        page.locator("#datasets a", has_text="data/three/train").click()
        expect(page.locator("#histogram tbody tr")).to_have_count(3)
        expect(page.locator("#samples figure")).to_have_count(27)
        until(lambda: page.locator("#samples img").evaluate_all(SHOWN_IMAGES), what="the records' images")
        screenshot(page, "dataset")

        # New run: the form starts a training and leads to its page, whose curves grow
        page.locator("header a", has_text="New run").click()
        page.select_option("select[name=solver]", "solver.yaml")
        page.fill("input[name=max_iter]", "100")
        page.fill("input[name=out]", "runs/web")
        screenshot(page, "new")
        page.locator("button[type=submit]").click()
        page.wait_for_url("**/run?run=runs%2Fweb")
        expect(page.locator("#chart-loss.js-plotly-plot")).to_have_count(1)
        until(lambda: page.locator("#chart-loss").evaluate(TRACES)[0] >= 2, what="the new run's curve")
        expect(page.locator("#run-state .state")).to_have_text("finished")
        assert run_folder.run_state(str(workspace / "runs" / "web"))[0] == "finished"


# ---- the run page's charts ---------------------------------------------------------------------------------
NAMES = "(chart) => chart.data.map((trace) => trace.name)"
Y_AXIS = ("(chart) => ((axis) => ({ type: axis.type, range: axis.range, autorange: axis.autorange }))"
          "(chart._fullLayout.yaxis)")  # the y axis as Plotly drew it


@pytest.fixture(scope="module")
def charted(tmp_path_factory):
    """A dashboard (its URL) over two runs written by hand: "steady" trains at a fixed rate and tests a loss, an
    accuracy, a perplexity and a top-5 rate twice; "lone" has one train and one test event, whose loss is 0."""
    folder = tmp_path_factory.mktemp("charted")
    events = []
    for iteration in range(0, 101, 10):
        events.append(event(iteration, smoothed_loss=2.0 / (iteration + 1)))
        if iteration in (50, 100):
            events.append(event(iteration, "TEST", loss=0.9 - iteration / 200, accuracy=0.4 + iteration / 250,
                                perplexity=40 - iteration / 10, top5=0.7 + iteration / 500))
    make_run(folder / "steady", events, ("finished", "optimization done at iteration 100"))
    make_run(folder / "lone", [event(0, smoothed_loss=2.3, lr=0.1), event(0, "TEST", loss=0.0, accuracy=0.1)])
    with serving(folder) as url:
        yield url


@contextlib.contextmanager
def browser_page(timeout_ms: float):
    """A page of headless Chromium (the test skipped without one) that reports CSP violations, its waits taking up
    to ``timeout_ms``; no script error or CSP violation may happen on it."""
    executable = chromium()
    if executable is None:
        pytest.skip(f"no Chromium executable found (none of {', '.join(CHROMIUM_NAMES)} on the PATH, "
                    "and NETSPEC_CHROMIUM not set)")
    from playwright.sync_api import expect, sync_playwright

    problems = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script(REPORT_CSP)
            page.on("console", lambda message: problems.append(f"console: {message.text} at {message.location}")
                    if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            expect.set_options(timeout=timeout_ms)
            yield page
        finally:
            browser.close()
    assert problems == []


@contextlib.contextmanager
def run_page(dashboard: str, address: str):
    """A :func:`browser_page` showing the run page ``address`` names (relative to the dashboard), once its loss
    chart is drawn."""
    with browser_page(30_000) as page:
        from playwright.sync_api import expect

        page.goto(dashboard)  # (the token into the cookie)
        page.goto(dashboard.split("/?", 1)[0] + "/" + address)
        expect(page.locator("#chart-loss.js-plotly-plot")).to_have_count(1)
        yield page


def tick_labels(page, chart: str) -> list[str]:
    """The y axis's tick labels as drawn."""
    return page.locator(f"#{chart} .ytick text").all_text_contents()


@pytest.mark.browser
def test_a_flat_series_is_drawn_at_its_value_on_an_axis_around_it(charted):
    with run_page(charted, "run?run=steady") as page:
        axis = page.locator("#chart-lr").evaluate(Y_AXIS)
        assert axis["range"] == pytest.approx([0.009, 0.011])  # (Plotly's own: -0.99 to 1.01)
        assert tick_labels(page, "chart-lr") == ["0.009", "0.01", "0.011"]
        assert axis["autorange"] is False
        assert page.locator("#chart-loss").evaluate(Y_AXIS)["autorange"] is True  # a curve: Plotly's range


@pytest.mark.browser
def test_a_lone_point_is_drawn_as_a_dot_with_its_value(charted):
    with run_page(charted, "run?run=lone") as page:
        for chart, value in (("chart-loss", "2.3"), ("chart-lr", "0.1"), ("chart-test", "0"),
                             ("chart-accuracy", "0.1")):
            expect_one = page.locator(f"#{chart} .scatterlayer .point")
            until(lambda locator=expect_one: locator.count() == 1, what=f"the dot of {chart}")
            assert page.locator(f"#{chart} .scatterlayer .textpoint").all_text_contents() == [value], chart
            assert value in tick_labels(page, chart), chart


@pytest.mark.browser
def test_test_losses_accuracies_and_other_outputs_are_charted_apart(charted):
    with run_page(charted, "run?run=steady&with=lone") as page:
        until(lambda: page.locator("#chart-other.js-plotly-plot").count() == 1, what="the other outputs' chart")
        charts = {chart: page.locator(f"#{chart}").evaluate(NAMES)
                  for chart in ("chart-loss", "chart-test", "chart-accuracy", "chart-other", "chart-lr")}
        assert charts == {"chart-loss": ["steady: loss", "lone: loss"], "chart-test": ["steady: loss", "lone: loss"],
                          "chart-accuracy": ["steady: accuracy", "steady: top5", "lone: accuracy"],
                          "chart-other": ["steady: perplexity"], "chart-lr": ["steady", "lone"]}
        assert page.locator("#chart-accuracy").evaluate(Y_AXIS)["range"][1] < 1.1  # not stretched to 40
    with run_page(charted, "run?run=lone") as page:
        assert page.locator("#chart-other").is_hidden()  # no other outputs: no empty chart


@pytest.mark.browser
def test_a_loss_chart_switches_to_a_log_scale_unless_a_value_is_at_most_0(charted):
    with run_page(charted, "run?run=steady&with=lone") as page:
        assert page.locator("input.log-scale").evaluate_all("(boxes) => boxes.map((box) => box.dataset.chart)") \
            == ["chart-loss", "chart-test"]
        loss, test = page.locator("#chart-loss"), page.locator("#chart-test")
        assert loss.evaluate(Y_AXIS)["type"] == "linear"
        page.check("input.log-scale[data-chart=chart-loss]")
        until(lambda: loss.evaluate(Y_AXIS)["type"] == "log", what="the loss chart on a log scale")
        page.check("input.log-scale[data-chart=chart-test]")  # lone's test loss is 0
        until(lambda: page.locator("#chart-test .annotation-text").count() == 1, what="the refusal's note")
        assert page.locator("#chart-test .annotation-text").text_content() == \
            "log scale refused: values ≤ 0 (drawn linear)"
        assert test.evaluate(Y_AXIS)["type"] == "linear"
        page.reload()  # the switches are remembered
        until(lambda: page.locator("#chart-loss.js-plotly-plot").count() == 1 and
              loss.evaluate(Y_AXIS)["type"] == "log", what="the log scale after a reload")
        assert page.locator("input.log-scale:checked").count() == 2
        page.uncheck("input.log-scale[data-chart=chart-test]")
        until(lambda: page.locator("#chart-test .annotation-text").count() == 0, what="the note to go")


@pytest.mark.browser
def test_the_per_class_table_follows_each_test_pass_as_it_is_written(tmp_path):
    """A run whose test passes start to carry per-class accuracies: the table appears, then shows the change, as
    the stream brings each pass (the page's refresh every 5 seconds stopped)."""
    hostile = "<img src=x onerror=alert(1)>"  # (a top named so would be a script error or a CSP violation)
    metrics = make_run(tmp_path / "classes", [event(0, smoothed_loss=1.0), event(0, "TEST", accuracy=0.5)]) / \
        run_folder.METRICS

    def write_pass(iteration: int, figures: list) -> None:
        with open(metrics, "a") as handle:
            handle.write(json.dumps(event(iteration, "TEST", accuracy=0.5, per_class={hostile: figures})) + "\n")

    with serving(tmp_path) as dashboard, run_page(dashboard, "run?run=classes") as page:
        from playwright.sync_api import expect

        section, rows = page.locator("#per-class"), page.locator("#per-class tbody tr")
        assert section.is_hidden()
        page.evaluate("() => { for (let id = 1; id < 1000; id++) window.clearInterval(id); }")
        write_pass(10, [0.5, 0.25, None])
        expect(section.locator("caption")).to_have_text(f"{hostile} at iteration 10")
        expect(rows.nth(1)).to_have_class("lowest")
        assert [row.locator("td").all_text_contents() for row in rows.all()] == [
            ["0", "0", "0.5", "–"], ["1", "1", "0.25", "–"], ["2", "2", "–", "–"]]
        write_pass(20, [0.25, 0.75, 1.0])
        expect(section.locator("caption")).to_have_text(f"{hostile} at iteration 20")
        assert [row.locator("td").all_text_contents() for row in rows.all()] == [
            ["0", "0", "0.25", "-0.25"], ["1", "1", "0.75", "+0.5"], ["2", "2", "1", "–"]]
        expect(rows.nth(0)).to_have_class("lowest")
        assert section.is_visible() and page.locator("#per-class tr.lowest").count() == 1
