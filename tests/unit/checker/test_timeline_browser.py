"""The timeline in a real browser: headless Chromium opens a failing history's page from a file, keeps every lane,
box and violation mark in the DOM it builds, and paints them (its screenshot holds each mark's colour); it shows
every box's label whole, and opens a history far wider than its window on the end, where the failure was found.

Needs Debian's `chromium`: a developer's run without it skips; a CI run (`CI` set) goes on and fails, since
`.ci/run` installs it. Every Chromium runs in a process group of its own, under a timeout, and the test checks that
none of its processes is left afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_model.results.timeline import render
from ckpt_model.search import profiles
from tests.unit.checker.test_timeline import DEPLOYMENT, REGRESSION, Page, failing_history, long_history

CHROMIUM = shutil.which("chromium")
# The directory Chromium makes for its singleton socket under TMPDIR.
CHROMIUM_TEMP_GLOB = "org.chromium.Chromium.*"
# Headless with nothing that reaches out: this machine's closed network refuses connections, and a test must not
# depend on one anyway.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
TIMEOUT_S = 120.0  # a cold start on two loaded cores takes seconds; a hang is killed with its whole group
GONE_TIMEOUT_S = 10.0
WINDOW = (2000, 760)  # wide enough for the whole chart of `failing_history`
# The CSS colours of what must be painted (`ckpt_model.results.timeline._css`), as RGB.
PAINTED = {
    "the violation (badge, lane, outline, found marker)": (0xC2, 0x18, 0x5B),
    "an ok box": (0xD6, 0xEE, 0xD1),
    "a fail box": (0xF8, 0xCF, 0xCA),
    "an info box": (0xFB, 0xE7, 0xA3),
    "a note": (0xDB, 0xE7, 0xF7),
    "the crash mark": (0x20, 0x20, 0x20),
    "the restore mark": (0x00, 0x79, 0x6B),
}
PAINTED_PX_MIN = 40


def require_chromium() -> None:
    if CHROMIUM is None:
        if profiles.in_ci():
            pytest.fail("chromium is not installed, and a CI run must have it (.ci/run installs Debian's chromium)")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)")


@pytest.fixture
def page_file(tmp_path: Path) -> Path:
    require_chromium()
    history, failure = failing_history()
    path = tmp_path / "P4-native-environment_restore_ignores_boundary.html"
    path.write_text(render(history.events, failure, DEPLOYMENT, REGRESSION), encoding="utf-8")
    return path


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, read from /proc as `ps` would."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        state, _ppid, group = stat.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def wait_group_gone(pgid: int) -> list[int]:
    """Wait until no process of the group is left; returns what is still there at the timeout."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def chromium(profile_dir: Path, *arguments: str) -> str:
    """Run headless Chromium in a process group of its own with a fresh profile; returns its stdout. A run past
    TIMEOUT_S is killed with its whole group; any helper left behind is killed too; either way none survives."""
    assert CHROMIUM is not None
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", *arguments]
    # Chromium puts its singleton socket in a directory of its own under TMPDIR (org.chromium.Chromium.*) and
    # leaves it there: given a TMPDIR of the test's own, it goes when the profile goes. A short one: a socket's
    # path has at most 107 bytes, which a path under pytest's tmp_path exceeds.
    temp_dir = Path(tempfile.mkdtemp(prefix="ckpt-chromium-"))
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(temp_dir)},
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"chromium did not finish in {TIMEOUT_S:g} s: {' '.join(command)}")
    finally:
        if group_members(process.pid):
            with contextlib.suppress(ProcessLookupError):  # it ended between the look and the kill
                os.killpg(process.pid, signal.SIGKILL)
        left = wait_group_gone(process.pid)
        shutil.rmtree(profile_dir, ignore_errors=True)  # megabytes of browser profile: not kept with the tmp_path
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert left == [], f"chromium left processes {left} of its group {process.pid}"
    assert process.returncode == 0, f"chromium exited with {process.returncode}:\n{stderr[-3000:]}"
    return stdout


def test_the_dom_chromium_builds_keeps_every_lane_box_and_mark(page_file: Path, tmp_path: Path) -> None:
    dom = chromium(tmp_path / "profile", "--dump-dom", page_file.as_uri())
    source, drawn = Page(page_file.read_text(encoding="utf-8")), Page(dom)

    def lanes(page: Page) -> list[str]:
        return [attrs["data-lane"] for _, attrs, _ in page.with_class("lane")]

    def boxes(page: Page) -> list[tuple[str, str]]:
        return [(attrs["class"], attrs["data-events"]) for _, attrs, _ in page.with_class("op")]

    assert lanes(drawn) == ["checkpoints & faults", "controller", "backend", "r0", "r0-a1", "r1", "r1-a1"]
    assert lanes(drawn) == lanes(source)
    assert len(boxes(drawn)) == 15  # 12 operations and notes, 3 marks
    assert boxes(drawn) == boxes(source)  # the browser's parser restructured nothing (no <a> split, say)
    assert [attrs["data-lane"] for _, attrs, _ in drawn.with_class("lane", "suspect")] == ["r0-a1"]
    assert [attrs["data-events"] for _, attrs, _ in drawn.with_class("op", "named")] == ["17"]
    assert sorted(attrs["class"] for _, attrs, _ in drawn.with_class("band")) == [
        "band crash",
        "band prepared",
        "band restore",
    ]
    assert "<span>P4 found</span>" in dom


def png_rows(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB(A) rows of a non-interlaced 8-bit PNG: enough to count a screenshot's colours."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, [], b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        header = body if kind == b"IHDR" else header
        if kind == b"IDAT":
            chunks.append(body)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, colour in (2, 6), interlace) == (8, True, 0), f"unexpected PNG format {header!r}"
    raw = zlib.decompress(b"".join(chunks))
    return width, height, list(_unfiltered(raw, width * (3 if colour == 2 else 4), 3 if colour == 2 else 4, height))


def _unfiltered(raw: bytes, stride: int, bpp: int, height: int) -> Iterator[bytes]:
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 2:  # the common filters first, without a loop per byte
            line = bytearray((byte + up) & 255 for byte, up in zip(line, previous, strict=True))
        for i in range(stride if kind in (1, 3, 4) else 0):
            left = line[i - bpp] if i >= bpp else 0
            up, up_left = previous[i], (previous[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - up_left
                near = min((abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - up_left), 2, up_left))
                line[i] = (line[i] + near[2]) & 255
        yield bytes(line)
        previous = line


def test_the_screenshot_paints_the_lanes_and_every_mark(page_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    width, height = WINDOW
    chromium(tmp_path / "profile", f"--screenshot={png}", f"--window-size={width},{height}", page_file.as_uri())
    assert png.is_file(), "chromium wrote no screenshot"
    assert png.stat().st_size > 20_000, f"a screenshot of {png.stat().st_size} bytes is next to blank"
    got_width, got_height, rows = png_rows(png.read_bytes())
    assert (got_width, got_height) == WINDOW
    bpp = len(rows[0]) // got_width
    colours = Counter(row[x : x + 3] for row in rows for x in range(0, len(row), bpp))
    white = colours[b"\xff\xff\xff"]
    assert white < 0.9 * got_width * got_height, "the screenshot is almost all white"
    assert len(colours) > 200, f"only {len(colours)} colours: no text or boxes drawn"
    missing = {what: colours[bytes(rgb)] for what, rgb in PAINTED.items() if colours[bytes(rgb)] < PAINTED_PX_MIN}
    assert missing == {}, f"not painted (pixels of its colour): {missing}"


def test_a_chromium_past_its_timeout_is_killed_with_its_whole_group(
    page_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT_S", 0.3)  # before it can even start
    started: list[int] = []
    popen = subprocess.Popen

    def recorded(*arguments: object, **keywords: object) -> subprocess.Popen[str]:
        process = popen(*arguments, **keywords)  # type: ignore[call-overload]
        started.append(process.pid)
        return process

    monkeypatch.setattr(subprocess, "Popen", recorded)
    system_temp_before = set(Path(tempfile.gettempdir()).glob(CHROMIUM_TEMP_GLOB))
    with pytest.raises(pytest.fail.Exception, match=r"did not finish in 0\.3 s"):
        chromium(tmp_path / "profile", "--dump-dom", page_file.as_uri())
    assert len(started) == 1
    assert group_members(started[0]) == []
    # A Chromium killed cannot remove its singleton directory: it was under a TMPDIR the run removed, not in /tmp.
    left = set(Path(tempfile.gettempdir()).glob(CHROMIUM_TEMP_GLOB)) - system_temp_before
    assert not left, f"the killed chromium left {sorted(map(str, left))}"


# Measures the page as Chromium laid it out, into an attribute `--dump-dom` shows: each box whose label overflows it,
# and what of the chart the scrolling box shows when the page opens. Added to a copy of the page: it has no script.
MEASURE = """<script>
const view = document.querySelector(".scroll").getBoundingClientRect();
const shown = (element) => {
  const box = element.getBoundingClientRect();
  return box.right > view.left + 150 && box.left < view.right;  // not under the lane names, not past the edge
};
const ops = [...document.querySelectorAll(".op")];
document.body.dataset.measured = JSON.stringify({
  cut: ops.filter((op) => op.scrollWidth > op.clientWidth).map((op) => op.textContent),
  scrolls: document.querySelector(".scroll").scrollWidth > view.width,
  found_shown: shown(document.querySelector(".found-line")),
  shown: ops.filter(shown).map((op) => op.dataset.events),
});
</script>"""
NARROW_WINDOW = (1000, 700)


def measured(tmp_path: Path, page: str) -> dict[str, object]:
    path = tmp_path / "measured.html"
    path.write_text(page.replace("</body>", f"{MEASURE}</body>"), encoding="utf-8")
    width, height = NARROW_WINDOW
    dom = chromium(tmp_path / "profile", f"--window-size={width},{height}", "--dump-dom", path.as_uri())
    (found,) = [attrs["data-measured"] for tag, attrs, _ in Page(dom).elements if tag == "body"]
    result: dict[str, object] = json.loads(found)
    return result


@pytest.mark.parametrize("steps", [1, 12])
def test_every_label_is_shown_whole_and_a_long_history_opens_on_the_failure(tmp_path: Path, steps: int) -> None:
    require_chromium()
    history, failure = long_history(steps)
    layout = measured(tmp_path, render(history.events, failure, DEPLOYMENT, REGRESSION))

    assert layout["cut"] == [], "labels cut by their boxes"
    assert layout["found_shown"], "the page did not open where the failure was found"
    last_commit = f"{len(history.events) - 2} {len(history.events) - 1}"
    assert last_commit in layout["shown"]  # the last step before the failure is in view
    if steps > 1:
        assert layout["scrolls"]  # far wider than the window: the first steps are left of it...
        assert "0" not in [events.split()[0] for events in layout["shown"]]  # ...the first run's box among them
