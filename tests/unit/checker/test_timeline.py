"""The timeline picture of a failing history, on hand-built histories: lanes, boxes placed by time, open operations,
the marks across lanes, the violation, escaping, determinism, and the report writing it beside the regression
file without ever hiding the failure."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ckpt_model.errors import PropertyViolation, QuiescenceTimeout
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.protocol.history import History
from ckpt_model.results import regression, report, timeline
from ckpt_model.results.timeline import Failure, Scale, render

LEFT_PX = timeline.GUTTER_PX + timeline.LEFT_PAD_PX
REGRESSION = ".ckpt-model/regressions/P4-native-environment_restore_ignores_boundary.json"
DEPLOYMENT = "native with environment_restore_ignores_boundary"
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source", "track", "embed"}


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 50.0

    def __call__(self) -> float:
        return self.now_s


def failing_history() -> tuple[History, Failure]:
    """r0 and r1 in flight across a checkpoint and a crash, a restore, then r0-a1 continued and r1-a1 never
    answered; the violation names r0-a1 and the backend call it made (#17)."""
    clock = FakeClock()
    history = History(clock=clock)

    def at(elapsed_s: float) -> None:
        clock.now_s = 50.0 + elapsed_s

    r0 = history.invoke("r0", "run", {"attempt": 0})  # 0
    at(0.02)
    r1 = history.invoke("r1", "run", {"attempt": 0})  # 1
    at(0.05)
    history.note("backend", "model_call", "r0 n_messages=2")  # 2
    at(0.2)
    prepare = history.invoke("controller", "prepare", "c1")  # 3
    at(0.23)
    history.complete(prepare, "ok", "prepared")  # 4
    history.note("controller", "prepared", "c1")  # 5
    at(0.3)
    commit = history.invoke("controller", "commit", "c1")  # 6
    at(0.42)
    history.complete(commit, "ok", {"environment": ["r0", "r1"]})  # 7
    at(0.5)
    crash = history.invoke("controller", "crash")  # 8
    at(0.64)
    history.complete(crash, "ok")  # 9
    history.complete(r0, "info", "RemoteProtocolError: Server disconnected")  # 10
    history.complete(r1, "fail", {"error": {"code": "stale_attempt"}})  # 11
    at(2.9)
    restore = history.invoke("controller", "restore", "c1-restore2")  # 12
    at(3.01)
    history.complete(restore, "ok", "restored")  # 13
    at(3.02)
    resume = history.invoke("controller", "resume", "c1-restore2")  # 14
    at(3.03)
    history.complete(resume, "ok")  # 15
    at(3.04)
    continued = history.invoke("r0-a1", "run", {"attempt": 1})  # 16
    at(3.06)
    history.note("backend", "model_call", "r0-a1 n_messages=2")  # 17
    at(3.5)
    history.complete(continued, "ok", {"result": {"reward": 1.0}})  # 18
    at(3.52)
    history.invoke("r1-a1", "run", {"attempt": 1})  # 19: never answered
    failure = Failure(
        label="P4",
        title="continued, not redone",
        rollout="r0-a1",
        history_indices=(17,),
        details="  expected: model calls with message counts [4]\n  observed: backend calls with message counts [2]",
    )
    return history, failure


class Page(HTMLParser):
    """Every element as (tag, attributes, its own text, without its children's); checks that tags nest and close."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.open: list[tuple[str, int]] = []  # tag, and its index in `elements`
        self.problems: list[str] = []
        self.doctype = ""
        self.feed(text)
        self.close()
        if self.open:
            self.problems.append(f"never closed: {self.open}")

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {name: value or "" for name, value in attrs}, []))
        if tag not in VOID:
            self.open.append((tag, len(self.elements) - 1))

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1][0] != tag:
            self.problems.append(f"</{tag}> closes {self.open[-1:] or 'nothing'}")
            return
        self.open.pop()

    def handle_data(self, data: str) -> None:
        if self.open:
            self.elements[self.open[-1][1]][2].append(data)

    def with_class(self, *classes: str) -> list[tuple[str, dict[str, str], str]]:
        wanted = set(classes)
        return [
            (tag, attrs, "".join(text))
            for tag, attrs, text in self.elements
            if wanted <= set(attrs.get("class", "").split())
        ]


def style_px(attrs: dict[str, str], name: str) -> int:
    match = re.search(rf"(?:^|;){name}:(-?\d+)px", attrs["style"])
    assert match is not None, f"no {name} in {attrs['style']!r}"
    return int(match.group(1))


def boxes_of(page: Page, lane: str) -> list[tuple[dict[str, str], str]]:
    """The boxes drawn in one lane, in document order (the lane's div holds them)."""
    found, inside = [], False
    for tag, attrs, text in page.elements:
        if tag == "div" and "lane" in attrs.get("class", "").split():
            inside = attrs.get("data-lane") == lane
        elif inside and tag == "a" and "op" in attrs.get("class", "").split():
            found.append((attrs, "".join(text)))
    return found


def box_of(page: Page, lane: str, first_event: int) -> dict[str, str]:
    matches = [attrs for attrs, _ in boxes_of(page, lane) if attrs["data-events"].split()[0] == str(first_event)]
    assert len(matches) == 1, f"{lane}: boxes starting at #{first_event}: {matches}"
    return matches[0]


def rendered() -> tuple[str, Page, History]:
    history, failure = failing_history()
    text = render(history.events, failure, DEPLOYMENT, REGRESSION)
    return text, Page(text), history


# -- the page as a whole ---------------------------------------------------------------------------------------


def test_the_page_is_well_formed_html5_and_self_contained() -> None:
    text, page, _ = rendered()
    assert text.startswith("<!DOCTYPE html>\n")
    assert page.doctype == "DOCTYPE html"
    assert page.problems == []
    assert [tag for tag, _, _ in page.elements if tag in ("script", "link", "img", "iframe")] == []
    for outside in ("http://", "https://", "src=", "@import", "url("):
        assert outside not in text
    assert len([tag for tag, _, _ in page.elements if tag == "style"]) == 1


def test_the_header_names_the_property_the_deployment_and_how_to_replay() -> None:
    _, page, _ = rendered()
    (_, _, label), *_ = page.with_class("pid")
    assert label == "P4"
    texts = ["".join(text) for _, _, text in page.elements]
    assert "continued, not redone" in "".join(texts)
    assert DEPLOYMENT in texts
    assert "P4-native-environment_restore_ignores_boundary.json" in texts
    assert f"ckpt-model replay {REGRESSION}" in texts


# -- lanes and boxes ---------------------------------------------------------------------------------------------


def test_every_process_has_a_lane_controller_and_backend_first_then_rollouts_in_natural_order() -> None:
    clock = FakeClock()
    history = History(clock=clock)
    for process in ("r10", "r2", "backend", "r0-a1", "r0", "controller"):
        history.note(process, "seen")
    failure = Failure(label="P1", title="t", rollout="r7")
    page = Page(render(history.events, failure, "native", "P1-native.json"))
    lanes = [attrs["data-lane"] for _, attrs, _ in page.with_class("lane")]
    # r7 has no event: it gets a lane anyway, so the violation's highlight shows
    assert lanes == [timeline.MARKS_LANE, "controller", "backend", "r0", "r0-a1", "r2", "r7", "r10"]


def test_a_box_spans_its_operation_from_invocation_to_completion_by_time() -> None:
    _, page, history = rendered()
    scale = timeline.scale_for(history.events)
    commit = box_of(page, "controller", 6)  # invoked at 0.30 s, completed at 0.42 s
    assert style_px(commit, "left") == round(LEFT_PX + scale.x(0.30))
    assert style_px(commit, "width") == round(scale.x(0.42) - scale.x(0.30))
    assert commit["data-events"] == "6 7"
    restore = box_of(page, "controller", 12)  # later in time: further right
    assert style_px(restore, "left") > style_px(commit, "left") + style_px(commit, "width")
    run = box_of(page, "r0-a1", 16)  # 3.04 s to 3.50 s: a longer operation, a wider box than the commit's
    assert style_px(run, "width") > style_px(commit, "width")


def test_the_scale_keeps_order_stretches_short_gaps_and_compresses_long_ones() -> None:
    scale = Scale.of([0.0, 0.001, 0.5, 10.0])
    xs = [scale.x(t) for t in (0.0, 0.001, 0.5, 10.0)]
    assert xs == sorted(xs)
    assert xs[1] - xs[0] == pytest.approx(timeline.GAP_MIN_PX, abs=1)  # a millisecond gets a readable column
    assert xs[2] - xs[1] > xs[1] - xs[0]  # a longer gap is drawn wider...
    assert xs[3] - xs[2] == timeline.GAP_MIN_PX + timeline.GAP_EXTRA_MAX_PX  # ...up to the cap
    assert scale.compressed == (2,)
    assert scale.x(0.25) == pytest.approx((xs[1] + xs[2]) / 2, abs=1.0)  # between columns: in proportion
    assert scale.x(float("inf")) == scale.end_px > xs[3]


def test_a_compressed_gap_is_marked_on_the_axis_with_how_long_it_lasted() -> None:
    _, page, _ = rendered()
    gaps = [text for _, _, text in page.with_class("gap")]
    assert gaps == ["≈ 2.26s"]  # 0.64 s to 2.90 s


def test_an_operation_with_no_completion_is_drawn_open_to_where_the_failure_was_found() -> None:
    _, page, _ = rendered()
    (attrs, label), *others = boxes_of(page, "r1-a1")
    assert others == []
    assert attrs["class"].split() == ["op", "open"]
    assert label.endswith("(open)")
    assert "no completion recorded" in attrs["title"]
    (_, found, _), *_ = page.with_class("found-line")
    assert style_px(attrs, "left") + style_px(attrs, "width") == style_px(found, "left")


def test_outcomes_get_their_own_classes() -> None:
    _, page, _ = rendered()
    kinds = {
        (lane, attrs["data-events"]): attrs["class"].split()[1]
        for lane in ("r0", "r1", "r0-a1", "backend", "controller")
        for attrs, _ in boxes_of(page, lane)
    }
    assert kinds[("r0", "0 10")] == "info"
    assert kinds[("r1", "1 11")] == "fail"
    assert kinds[("r0-a1", "16 18")] == "ok"
    assert kinds[("backend", "2")] == "note"
    assert kinds[("controller", "5")] == "note"  # the prepared note


def test_overlapping_operations_of_one_process_take_separate_tracks() -> None:
    clock = FakeClock()
    history = History(clock=clock)
    held = history.invoke("controller", "commit", "c1")
    clock.now_s += 0.1
    crash = history.invoke("controller", "crash")
    clock.now_s += 0.1
    history.complete(crash, "ok")
    history.complete(held, "info", "cut off by the crash")
    page = Page(render(history.events, Failure("P1", "t"), "native", "P1-native.json"))
    tops = sorted(style_px(attrs, "top") for attrs, _ in boxes_of(page, "controller"))
    assert tops == [timeline.LANE_PAD_PX, timeline.LANE_PAD_PX + timeline.TRACK_PX]


def test_hovering_a_box_shows_its_events_with_full_values() -> None:
    _, page, _ = rendered()
    title = box_of(page, "controller", 6)["title"]
    assert title.splitlines() == [
        "#6 0.300s controller invoke commit c1",
        "#7 0.420s controller ok commit {'environment': ['r0', 'r1']}",
        "took 0.120s",
    ]


def long_history(steps: int) -> tuple[History, Failure]:
    """A history of `steps` rounds of a rollout run, a probe with a long name and a long value, and a commit,
    about 0.1 s apart, and a rollout still running at the end: far wider than a window, as an unminimised one is."""
    clock = FakeClock()
    history = History(clock=clock)
    for step in range(steps):
        run = history.invoke(f"r{step}", "run", {"attempt": 0})
        clock.now_s += 0.01
        probe = history.invoke("controller", "probe prepare past its deadline", f"c{step}")
        clock.now_s += 0.001
        history.complete(probe, "ok", {"agent": "HTTP 409 deadline_exceeded " * 4})
        history.note("controller", "hook failure injected", {"participant": "environment", "hook": "export"})
        clock.now_s += 0.04
        commit = history.invoke("controller", "commit", f"c{step}")
        clock.now_s += 0.002
        history.complete(commit, "ok")
        if step < steps - 1:
            history.complete(run, "ok", {"reward": 1.0})
        clock.now_s += 0.05
    return history, Failure("P9", "durable and immutable", history_indices=(len(history.events) - 1,))


def test_every_label_fits_its_box_with_what_was_done_whole_and_its_value_shortened() -> None:
    history, failure = long_history(3)
    page = Page(render(history.events, failure, "native", "P9-native.json"))
    labels = [(attrs, label) for _, attrs, label in page.with_class("op")]
    assert {label for _, label in labels} >= {
        "probe prepare past its deadline c0",
        "hook failure injected {'participant': 'environment',…",
        "run {'attempt': 0} (open)",
        "commit c2",
    }
    scale = timeline.scale_for(history.events)
    times = {event.index: event.time_s for event in history.events}
    for attrs, label in labels:
        assert style_px(attrs, "width") >= timeline.label_px(label), label
        events = [int(index) for index in attrs["data-events"].split()]
        if len(events) == 2:  # a box ends where its operation did: its columns were spread for its label
            assert style_px(attrs, "width") == round(scale.x(times[events[1]]) - scale.x(times[events[0]])), label
        assert not label.startswith(("probe prep…", "hook faul…"))
    note = next(attrs for attrs, label in labels if label.startswith("hook failure"))
    assert "{'participant': 'environment', 'hook': 'export'}" in note["title"]  # the whole value on hover


def test_a_label_widens_the_gaps_it_spans_and_never_narrows_another() -> None:
    short_gap = timeline.GAP_MIN_PX
    wide = timeline.Room(0.0, 0.001, 300.0)  # a box over one millisecond with a 300 px label
    point = timeline.Room(0.002, None, 200.0)  # a point: the gap after it
    to_the_end = timeline.Room(0.001, float("inf"), 500.0)  # an open operation: to where the failure was found
    scale = Scale.of([0.0, 0.001, 0.002, 0.003], [point, wide, to_the_end])
    assert scale.x(0.001) - scale.x(0.0) == 300.0
    assert scale.x(0.003) - scale.x(0.002) == 200.0
    assert scale.end_px - scale.x(0.001) == 500.0
    assert scale.x(0.002) - scale.x(0.001) == pytest.approx(short_gap, abs=1)  # nothing asked more of this one
    assert Scale.of([0.0, 0.001], [timeline.Room(0.0, 0.001, 10.0)]).xs_px == Scale.of([0.0, 0.001]).xs_px


def test_the_picture_opens_on_its_end_where_the_failure_was_found() -> None:
    """The chart scrolls inside a right-to-left box holding a left-to-right chart: a browser opens such a box
    scrolled to its right end, the found marker and the steps before it (no script: the page has none)."""
    text, _, _ = rendered()
    assert re.search(r"\.scroll \{[^}]*direction: rtl;", text)
    assert re.search(r"\.chart \{[^}]*direction: ltr;", text)
    assert "opens on its end, where the failure was found" in text


# -- marks across lanes -----------------------------------------------------------------------------------------


def test_crashes_restores_and_prepared_intervals_are_bands_across_every_lane() -> None:
    _, page, history = rendered()
    scale = timeline.scale_for(history.events)
    bands = {attrs["class"].split()[1]: attrs for _, attrs, _ in page.with_class("band")}
    assert sorted(bands) == ["crash", "prepared", "restore"]
    # prepared: from the prepared note (0.23 s) to the next crash or resume invocation (the crash, 0.50 s)
    assert style_px(bands["prepared"], "left") == round(LEFT_PX + scale.x(0.23))
    assert style_px(bands["prepared"], "width") == round(scale.x(0.5) - scale.x(0.23))
    assert "until crash #8" in bands["prepared"]["title"]
    assert style_px(bands["crash"], "left") == round(LEFT_PX + scale.x(0.5))
    assert style_px(bands["restore"], "left") == round(LEFT_PX + scale.x(2.9))
    assert bands["restore"]["title"] == "restore c1-restore2: ok"
    labels = [text for _, _, text in page.with_class("mark")]
    assert labels == ["prepared c1", "crash", "restore c1-restore2"]


def test_a_restore_that_failed_says_so_on_its_mark() -> None:
    clock = FakeClock()
    history = History(clock=clock)
    restore = history.invoke("controller", "restore", "c2-restore3")
    history.complete(restore, "fail", "checkpoint restore failed on 1 participant(s)")
    (mark,) = timeline.marks(history.events)
    assert (mark.kind, mark.label, mark.title) == ("restore", "restore c2-restore3 (fail)", "restore c2-restore3: fail")


def test_a_prepared_interval_still_open_runs_to_the_end() -> None:
    clock = FakeClock()
    history = History(clock=clock)
    history.note("controller", "prepared", "c1")
    clock.now_s += 1.0
    history.note("backend", "model_call", "r0")
    marks = timeline.marks(history.events)
    assert [(mark.kind, mark.start_s, mark.end_s) for mark in marks] == [("prepared", 0.0, float("inf"))]
    assert marks[0].title == "prepared c1, still open at the end"


# -- the violation ------------------------------------------------------------------------------------------------


def test_the_violation_highlights_its_rollout_lane_and_the_events_it_names() -> None:
    text, page, _ = rendered()
    assert [attrs["data-lane"] for _, attrs, _ in page.with_class("lane", "suspect")] == ["r0-a1"]
    named = [(attrs["data-events"], label) for _, attrs, label in page.with_class("op", "named")]
    assert named == [("17", "model_call r0-a1 n_messages=2")]
    assert [attrs["id"] for _, attrs, _ in page.with_class("named") if attrs.get("id")] == ["e17"]
    assert "expected: model calls with message counts [4]" in text
    assert "<span>P4 found</span>" in text


def test_a_violation_naming_no_rollout_and_no_events_highlights_nothing() -> None:
    history, _ = failing_history()
    page = Page(render(history.events, Failure("P9", "durable"), "native", "P9-native.json"))
    assert page.with_class("suspect") == []
    assert page.with_class("op", "named") == []
    assert page.with_class("found-line") != []


def test_failure_of_reads_a_violation_and_a_harness_error() -> None:
    violation = PropertyViolation(
        rollout="r0-a1", expected="4 calls", observed="2 calls", history_indices=[3, 5], property_id="P4", title="t"
    )
    assert timeline.failure_of(violation) == Failure(
        label="P4",
        title="t",
        rollout="r0-a1",
        history_indices=(3, 5),
        details="  expected: 4 calls\n  observed: 2 calls\n  history:  #3, #5",
    )
    harness_error = timeline.failure_of(QuiescenceTimeout(prediction="quiet", observed="busy", pending=["r0"]))
    assert (harness_error.label, harness_error.title) == (
        "QuiescenceTimeout",
        "the predicted quiet state was not reached",
    )
    assert (harness_error.rollout, harness_error.history_indices) == (None, ())
    assert "pending:   r0" in harness_error.details


# -- escaping and determinism -----------------------------------------------------------------------------------

NASTY = "</a><script>alert(\"x\")</script> & 'quoted' <b>"


def test_every_value_is_escaped_and_reads_back_exactly() -> None:
    clock = FakeClock()
    history = History(clock=clock)
    invocation = history.invoke(f"r0{NASTY}", f"run{NASTY}", NASTY)
    history.complete(invocation, "fail", {"error": NASTY})
    failure = Failure(label=f"P1{NASTY}", title=NASTY, rollout=f"r0{NASTY}", details=NASTY)
    text = render(history.events, failure, f"native{NASTY}", f"dir/P1{NASTY}.json")
    page = Page(text)
    assert page.problems == []
    assert "<script" not in text
    assert [tag for tag, _, _ in page.elements if tag in ("script", "b")] == []
    (attrs, label), *_ = boxes_of(page, f"r0{NASTY}")
    assert label == f"run{NASTY} {NASTY}"[: timeline.LABEL_CHARS_MAX - 1] + "…"
    assert attrs["title"].splitlines()[0] == f"#0 0.000s r0{NASTY} invoke run{NASTY} {NASTY}"
    assert f"{{'error': {NASTY!r}}}" in attrs["title"]
    texts = ["".join(text) for _, _, text in page.elements]
    assert f"native{NASTY}" in texts
    assert f"ckpt-model replay dir/P1{NASTY}.json" in texts


def test_the_same_history_renders_to_the_same_text() -> None:
    first_history, failure = failing_history()
    second_history, _ = failing_history()  # built again: equal events, other objects
    first = render(first_history.events, failure, DEPLOYMENT, REGRESSION)
    assert render(second_history.events, failure, DEPLOYMENT, Path(REGRESSION)) == first
    assert render(first_history.events[:-1], failure, DEPLOYMENT, REGRESSION) != first


def test_an_empty_history_still_renders_the_failure() -> None:
    page = Page(render((), Failure("QuiescenceTimeout", "never quiet", rollout="r0"), "native", "x.json"))
    assert page.problems == []
    assert [attrs["data-lane"] for _, attrs, _ in page.with_class("lane")] == [timeline.MARKS_LANE, "r0"]


# -- writing it, and the report ---------------------------------------------------------------------------------


def test_write_timeline_puts_the_page_beside_the_regression_file(tmp_path: Path) -> None:
    history, failure = failing_history()
    regression_path = tmp_path / "P4-native.json"
    path = timeline.write_timeline(
        timeline.path_beside(regression_path), history.events, failure, DEPLOYMENT, regression_path
    )
    assert path == tmp_path / "P4-native.html"
    assert path.read_text(encoding="utf-8") == render(history.events, failure, DEPLOYMENT, regression_path)
    assert [p.name for p in tmp_path.iterdir()] == ["P4-native.html"]  # no partial file left


class FakeHarness:
    spec = DeploymentSpec("native", faults=("environment_restore_ignores_boundary",))
    artifacts = None  # no --keep-artifacts

    def __init__(self, directory: Path) -> None:
        self.regressions_dir = directory
        self.run_store, self.run_dir, self.failure_files = None, None, {}  # no run store

    def log_tails(self) -> str:
        return "(no logs)"


def annotated(tmp_path: Path) -> PropertyViolation:
    history, _ = failing_history()
    error = PropertyViolation(rollout="r0-a1", expected="4", observed="2", history_indices=[17], property_id="P4")
    harness: Any = FakeHarness(tmp_path)
    assert report.annotate(
        error, harness=harness, steps=["dispatch() -> r0"], history=history, rule_calls=[], backend_calls=dict
    )
    return error


def test_the_report_writes_the_timeline_beside_the_regression_file_and_names_it(tmp_path: Path) -> None:
    error = annotated(tmp_path)
    picture = tmp_path / regression.file_name("P4-native-environment_restore_ignores_boundary", []).replace(
        ".json", ".html"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [picture.name, picture.with_suffix(".json").name]
    # The timeline's note, then the note of what --keep-artifacts kept (here: that nothing is kept).
    assert error.__notes__[-2] == f"Timeline of the failing history (open in a browser): {picture}"
    page = Page(picture.read_text(encoding="utf-8"))
    assert [attrs["data-lane"] for _, attrs, _ in page.with_class("lane", "suspect")] == ["r0-a1"]
    assert "native with environment_restore_ignores_boundary" in ["".join(t) for _, _, t in page.elements]


def test_a_timeline_that_cannot_be_drawn_is_a_note_never_a_new_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> Path:
        raise ValueError("cannot draw <this>")

    monkeypatch.setattr(timeline, "write_timeline", broken)
    error = annotated(tmp_path)
    assert error.__notes__[-3].startswith("Replay without Hypothesis")
    assert error.__notes__[-2] == "Timeline not written: ValueError: cannot draw <this>"
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]
