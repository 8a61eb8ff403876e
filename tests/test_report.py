"""The page report: `doit report:<model>-<arch>` (and a bare `doit`) writes one self-contained HTML page.

The tiny chain is built once for the module by a bare `doit`, as a user runs it. The page is opened in a real
headless chromium (Debian's package, driven by selenium through the system chromedriver): no console errors,
every figure drawn with a size, readable at a phone's width, and a failed verify's page opens with the failure.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from mnnbuild.base.errors import StageError
from mnnbuild.partition.records import PartitionReport
from mnnbuild.pipeline.layout import REPORT_PAGE as PAGE
from mnnbuild.stages.bundle import BundleManifest
from mnnbuild.stages.report import ReportInputs, ReportManifest, ReportParams, report
from mnnbuild.stages.verify import REPORT_JSON, VerifyManifest
from mnnbuild.verify.verdict import VerifyReport
from tests.conftest import doit, executed_tasks

pytestmark = pytest.mark.slow  # every test here runs doit, a bundle or a whole model

TINY = "tiny-qwen3"
ARCH = "v79"
TASK = f"report:{TINY}-{ARCH}"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT_ENV = "MNNBUILD_REPORT_SCREENSHOT"
"""Where the browser test also saves its screenshot (the README's docs/report.png is made this way)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare `doit` from scratch: builds, verifies and reports the tiny bundle. Returns the artifact root."""
    cwd = tmp_path_factory.mktemp("report")
    proc = doit(cwd)
    assert proc.returncode == 0, f"doit failed:\n{proc.stdout}\n{proc.stderr}"
    assert TASK in executed_tasks(proc.stdout)
    return cwd / "artifacts"


def target_root(artifacts: Path) -> Path:
    return artifacts / TINY / ARCH


def page_of(artifacts: Path) -> str:
    return (target_root(artifacts) / "report" / PAGE).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless chromium through the system chromedriver; selenium must not look for or download a driver."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run tests/install-browser.sh (Debian chromium, chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: webdriver.Chrome, path: Path, width: int, height: int = 1000) -> list[dict[str, object]]:
    """Load the page at a window size; returns the browser's console entries of the load."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.set_window_size(width, height)
    driver.get(path.as_uri())
    driver.execute_script("return document.readyState")
    return driver.get_log("browser")


# ---- the page's content ---------------------------------------------------------------------------------


def test_bare_doit_writes_a_self_contained_page(built: Path) -> None:
    root = target_root(built)
    manifest = ReportManifest.read(root / "report")
    assert manifest.verify_passed and [r.path for r in manifest.outputs] == [PAGE]
    page = page_of(built)
    # nothing is fetched to view it: no scripts, stylesheets, images or fonts from anywhere
    assert not re.search(r"<(script|link|img|iframe)\b", page), "the page must need nothing beside itself"
    assert "@import" not in page
    refs = re.findall(r"url\(([^)]*)\)", page)
    assert refs and all(r.startswith("#") for r in refs), "only references inside the page"
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert {r[1:] for r in refs} <= ids and len(re.findall(r' id="([^"]+)"', page)) == len(ids), "ids unique"
    urls = re.findall(r"(\S+=)?\"?(https?://[^\s\"'<>]+)", page)
    assert urls and all(attr.startswith("xmlns") for attr, _ in urls), "URLs only as XML namespace names"
    assert 'name="viewport"' in page  # phone screens: see the browser test for the layout
    # verdict first: pass, SoC and QNN build, and the sha256 of every bundle file
    verify_report = VerifyReport.model_validate_json((root / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    text = html.unescape(page)
    verdict = text.index('id="verdict"')
    assert verdict < text.index("PASS", verdict) < text.index('id="checks"')
    assert "SM8750" in text and verify_report.qnn["build_id"] in text
    bundle = BundleManifest.read(root / "bundle")
    for rec in bundle.outputs:
        if rec.path.startswith("model/"):
            assert rec.sha256 in text, rec.path
    assert verify_report.executed_note in text
    # the partition: every op kept on the CPU with its reason; every plugin
    partition = PartitionReport.model_validate_json(
        (built / TINY / "partition" / "partition.json").read_text(encoding="utf-8")
    )
    for op in partition.cpu_ops:
        assert op.name in text and op.reason in text
    for plugin in partition.plugins:
        assert plugin.name in text
        # its size in parameters (the "params") as well as bytes
        assert plugin.parameters > 0 and f"{plugin.parameters:,}" in text, plugin.name
    # numbers: generation tokens side by side with the decoded text
    gen = verify_report.generation
    assert gen is not None and gen.cpu_text is not None and gen.hybrid_text is not None
    assert gen.cpu_text in text and gen.hybrid_text in text
    # figures: partition strip, plugin sizes, per-graph errors, per-position errors, generation, cost, bundle files
    assert page.count('<svg role="img"') == 7
    prefill = [s for s in verify_report.whole_model if s.seq_len > 1]
    assert prefill and prefill[0].logits_rows is not None and len(prefill[0].logits_rows.max_abs_err) == 128
    # cost: the run that verified built every stage, and says so with time and peak memory
    for stage in ("io", "partition", "bundle", "verify"):
        assert re.search(rf"<td[^>]*>{stage}</td><td[^>]*>built</td><td class=\"num\"[^>]*>\d+\.\d\d</td>", page), stage
    # every plugin's context and twin (verify's build cost) has its row
    assert len(verify_report.plugins) == 4
    for k in range(len(verify_report.plugins)):
        for stage in ("context", "twin"):
            assert re.search(rf"<td[^>]*>{stage} graphllm{k}</td><td[^>]*>built</td>", page), (stage, k)


def test_page_names_outputs_units_and_paths_as_the_reader_needs(built: Path) -> None:
    """The per-graph figure names each output (a missing value says n/a, never a point at the floor); one unit
    family (KiB/MiB) everywhere; the file count the page gives is the integrity check's; the footer's timings in
    words; no absolute path (a page restored from the cache into another artifact root names that root's bundle,
    through a link relative to the page), and verify.txt likewise."""
    root = target_root(built)
    page = page_of(built)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    verify_report = VerifyReport.model_validate_json((root / "verify" / REPORT_JSON).read_text(encoding="utf-8"))
    svg = page[page.index('aria-label="graph-errors"') :]
    svg = svg[: svg.index("</svg>")]
    for g in verify_report.graphs:
        for t in g.outputs:
            assert f"{g.graph} {t.name.strip('/').removesuffix('_output_0')}" in svg, (g.graph, t.name)
    missing = sum(t.rel_err is None for g in verify_report.graphs for t in g.outputs)
    assert missing and svg.count("n/a") == 2 * missing, "each missing value is marked in both panels"
    assert not re.search(r"\d (MB|KB|GB)\b", text) and re.search(r"\d (KiB|MiB)\b", text), "one unit family"
    integrity = verify_report.integrity
    assert integrity is not None and f"{integrity.files} files vs the bundle manifest" in text
    assert f"{integrity.files} files, " in text, "the bundle section counts the files integrity checked"
    footer = text[text.index("verify time (s):") :]
    assert "CPU reference" in footer and not re.search(r"\w_\w", footer.split("mnnbuild report")[0]), footer[:200]
    for where in (page, (root / "verify" / "verify.txt").read_text(encoding="utf-8")):
        assert str(built.parent) not in where and "/tmp/" not in where, "no absolute path of this artifact root"
    link = re.search(r'<dt>bundle</dt><dd class="mono"><a href="([^"]+)"', page)
    assert link is not None and (root / "report" / link.group(1)).resolve() == (root / "bundle" / "model" / TINY)
    assert verify_report.bundle == f"../bundle/model/{TINY}"
    assert (root / "verify" / verify_report.bundle).resolve() == (root / "bundle" / "model" / TINY).resolve()


def test_the_page_is_deterministic(built: Path, tmp_path: Path) -> None:
    root = target_root(built)
    inputs = ReportInputs(
        model=TINY,
        verify_dir=root / "verify",
        partition_dir=built / TINY / "partition",
        bundle_dir=root / "bundle",
        model_dir=built / TINY / "model",
        io_dir=built / TINY / "io",
        config_dir=root / "config",
        context_dir=root / "context",
        twin_dir=root / "twin",
    )
    again = root / "report-again"  # beside report/: paths on the page are relative to where it is
    try:
        report(inputs, ReportParams(target=ARCH), again)
        assert (again / PAGE).read_bytes() == (root / "report" / PAGE).read_bytes()
    finally:
        shutil.rmtree(again, ignore_errors=True)


def test_bad_verify_json_is_one_line_naming_the_file(built: Path, tmp_path: Path) -> None:
    verify_dir = tmp_path / "verify"
    verify_dir.mkdir()
    (verify_dir / REPORT_JSON).write_text('{"model": "x"}')
    root = target_root(built)
    inputs = ReportInputs(
        model=TINY,
        verify_dir=verify_dir,
        partition_dir=built / TINY / "partition",
        bundle_dir=root / "bundle",
        model_dir=built / TINY / "model",
        io_dir=built / TINY / "io",
        config_dir=root / "config",
        context_dir=root / "context",
        twin_dir=root / "twin",
    )
    with pytest.raises(StageError) as err:
        report(inputs, ReportParams(target=ARCH), tmp_path / "out")
    assert str(verify_dir / REPORT_JSON) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


# ---- incremental ------------------------------------------------------------------------------------------


def test_report_is_not_remade_while_verify_results_stay(built: Path) -> None:
    """(That it follows a changed verify result: the failed-verify test below, fail -> pass.)"""
    cwd = built.parent
    root = target_root(built)
    page = root / "report" / PAGE
    first = page.read_bytes()
    # nothing changed: nothing runs
    proc = doit(cwd)
    assert proc.returncode == 0 and executed_tasks(proc.stdout) == [], proc.stdout
    # verify.json touched (same content): not a new result
    verify_json = root / "verify" / REPORT_JSON
    os.utime(verify_json)
    proc = doit(cwd, TASK)
    assert proc.returncode == 0 and TASK not in executed_tasks(proc.stdout), proc.stdout
    # an upstream stage rebuilt with the same content: verify is up to date, so is the page
    proc = doit(cwd, "clean", f"config:{TINY}-{ARCH}")
    assert proc.returncode == 0, proc.stderr
    proc = doit(cwd)
    assert proc.returncode == 0 and executed_tasks(proc.stdout) == [f"config:{TINY}-{ARCH}"], proc.stdout
    assert page.read_bytes() == first


# ---- in a browser -----------------------------------------------------------------------------------------


def figure_sizes(driver: webdriver.Chrome) -> list[tuple[float, float]]:
    return [(e.rect["width"], e.rect["height"]) for e in driver.find_elements(By.CSS_SELECTOR, "svg.figure")]


CUT_OFF = """
const width = document.documentElement.clientWidth, out = [];
for (const el of document.querySelectorAll("body *")) {
  const r = el.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;  // not laid out (a closed <details>)
  const name = `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""} "${(el.textContent || "").trim().slice(0, 30)}"`;
  if (r.left < -0.5 || r.right > width + 0.5) out.push(`${name}: ${Math.round(r.left)}..${Math.round(r.right)} px`);
  const x = getComputedStyle(el).overflowX;
  if ((x === "auto" || x === "scroll" || x === "hidden") && el.scrollWidth > el.clientWidth + 1)
    out.push(`${name}: scrolls sideways (${el.scrollWidth} px in ${el.clientWidth} px)`);
}
return out;
"""
"""Every laid-out element that starts or ends off-screen, or hides content behind a sideways scroll."""

FRAGMENTS = """
const out = [];
for (const cell of document.querySelectorAll("th, td")) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.textContent.matchAll(/\\S+/g)) {
      if (m[0].length > 24) continue;  // a hash or a long path may wrap
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      if (tops.size > 1) out.push(`${m[0]} (${tops.size} lines)`);
    }
  }
}
return out;
"""
"""Every word of at most 24 characters in a table that the layout breaks across lines ("resul|t", "qnn/|grap|hllm")."""


def test_page_renders_in_chromium(built: Path, browser: webdriver.Chrome, tmp_path: Path) -> None:
    """At a desktop's width and a phone's (390 px), nothing is cut off: no element reaches past either edge of the
    window and no table or figure needs a sideways scroll to be seen whole."""
    path = target_root(built) / "report" / PAGE
    for width in (1280, 390):  # a desktop window, a phone
        log = open_page(browser, path, width)
        assert [e for e in log if e.get("level") in ("SEVERE", "WARNING")] == [], log
        sizes = figure_sizes(browser)
        assert len(sizes) == 7 and all(w > 100 and h > 30 for w, h in sizes), (width, sizes)
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"page wider than a {width} px window by {overflow} px"
        cut = browser.execute_script(CUT_OFF)
        assert cut == [], f"at {width} px: {cut[:10]}"
        assert all(w <= width for w, _ in sizes), "every figure fits the window"
        fragments = browser.execute_script(FRAGMENTS)
        assert fragments == [], f"at {width} px, words broken across lines: {fragments[:10]}"
    page = path.read_text("utf-8")
    for title in ("wall time per stage", "peak RSS per stage", "largest files"):  # the cost figures say what they are
        assert title in page, title
    open_page(browser, path, 1000, 1250)
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        from PIL import Image

        with Image.open(shot) as image:  # a small PNG for the README: palette colors, half size
            image.convert("RGB").resize((500, 625)).quantize(colors=64).save(os.environ[SCREENSHOT_ENV], optimize=True)


def test_failed_verify_page_opens_with_the_failure(built: Path, browser: webdriver.Chrome) -> None:
    """A bundle file replaced after bundling: doit fails at verify, and verify's teardown writes the page."""
    cwd = built.parent
    root = target_root(built)
    target = root / "bundle" / "model" / TINY / "qnn" / "graphllm2.bin"
    original = target.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01
    stat = target.stat()
    target.unlink()
    target.write_bytes(bytes(data))
    # corruption size and mtime do not show, so the bundle task keeps the file and verify (made to run again)
    # hashes it; verify's teardown writes the page of the failed run
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (root / "verify" / VerifyManifest.filename()).unlink()
    try:
        proc = doit(cwd)
        assert proc.returncode != 0, proc.stdout
        assert not (root / "verify" / VerifyManifest.filename()).exists()
        manifest = ReportManifest.read(root / "report")
        assert not manifest.verify_passed
        failures = VerifyReport.model_validate_json((root / "verify" / REPORT_JSON).read_text("utf-8")).failures
        assert failures
        log = open_page(browser, root / "report" / PAGE, 390)
        assert [e for e in log if e.get("level") == "SEVERE"] == [], log
        first = browser.find_element(By.CSS_SELECTOR, "main > section")
        assert first.get_attribute("id") == "verdict"
        assert first.text.startswith("FAIL") and "qnn/graphllm2.bin" in first.text and "sha256" in first.text
        assert failures[0] in first.text
        assert first.rect["y"] < 200  # on a phone, above the fold
        assert browser.find_element(By.ID, "checks").rect["y"] > first.rect["y"]
    finally:
        target.unlink()
        target.write_bytes(original)
    failed_page = page_of(built)
    proc = doit(cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert executed_tasks(proc.stdout) == [f"verify:{TINY}-{ARCH}", TASK]
    assert ReportManifest.read(root / "report").verify_passed
    page = page_of(built)
    assert page != failed_page and 'class="verdict pass"' in page and 'class="verdict fail"' in failed_page
    total = json.loads((root / "verify" / REPORT_JSON).read_text(encoding="utf-8"))["timings"]["total"]
    assert f"total {total:.2f}" in page
