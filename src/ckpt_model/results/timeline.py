"""A failing history drawn as a timeline: one self-contained HTML file beside the regression file.

The history note of a failure lists the last events as text, which hides what overlapped what: a `/run` still in
flight across a prepare, a crash inside a commit, a reply inside a prepared interval. In the spirit of Jepsen's
`timeline.html`, the picture gives every process its lane (the controller, the backend, each rollout attempt),
draws every operation as a box from its invocation to its completion (open-ended when none came), coloured by
outcome, and marks across all lanes what the controller did to everyone at once: the prepared intervals (from the
`prepared` note to the next resume or crash, as P2 judges them), the crashes and the restores. The violation is
named at the top, its rollout's lane and the events it names are highlighted, and a table below lists every event.

Time runs left to right. Every event time gets its own column and the gap to the next one is drawn wider the longer
it is, up to a cap (gaps over the cap are marked `≈`): a history mixes millisecond control calls with multi-second
waits, and a linear scale would crush the one or stretch the other off the screen. Boxes are ordered and sized by
their times, and the columns a box spans are spread until its label fits (`Scale.of`'s rooms): a label shows what
was done whole and its value shortened (in a monospace font, so its width is known here), and hovering a box shows
its events with exact times and full values. The chart opens scrolled to its end (a right-to-left scroll box around
a left-to-right chart): where the failure was found, and the steps that led to it.

`render` is pure (same events, same failure: the same bytes; no clock, no I/O), so tests pin it and a replay's
picture can be compared with the first one; `write_timeline` puts it on disk. The file has inline CSS only: no
script, no external resource, so it opens anywhere, offline, from an artifact store.
"""

from __future__ import annotations

import bisect
import html
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from ckpt_model.errors import PropertyViolation
from ckpt_model.protocol.history import Event

# Layout, in CSS pixels.
GUTTER_PX = 150  # the lane names on the left
LEFT_PAD_PX = 16  # between the gutter and time 0
AXIS_PX = 34  # the time axis at the top
TRACK_PX = 22  # one row of boxes inside a lane; overlapping operations of one process take several
LANE_PAD_PX = 4  # above and below a lane's tracks
GAP_MIN_PX = 76  # the narrowest step from one event time to the next: a box label stays readable
GAP_PX_PER_S = 160.0  # how much wider a longer gap is drawn...
GAP_EXTRA_MAX_PX = 140  # ...up to this much (a longer gap is compressed and marked)
POINT_PX = 74  # a point event (a note) has no duration: it is drawn this wide
MARK_MIN_PX = 6  # a crash or restore band lasting a millisecond still shows
END_PX = 140  # after the last event: where open operations and intervals end
RIGHT_PAD_PX = 90  # room for the "found" label at the end
TICK_LABEL_MIN_PX = 58  # axis labels closer than this to the previous one are left out (the tick stays)
LABEL_CHARS_MAX = 60  # a box's visible label; its title holds the whole value
VALUE_CHARS_MAX = 32  # of which the event's value, so what was done shows whole
LABEL_FONT_PX = 11  # a box's label is set in a monospace font, so its width is known before a browser draws it
LABEL_CHAR_PX = 7.0  # one character of it (0.6 em and a margin: DejaVu Sans Mono's is 0.602 em)
LABEL_EXTRA_PX = 12  # a box's padding and borders around its label
MARKS_LANE = "checkpoints & faults"
TIME_DECIMALS = 3  # times are shown, and given their columns, to the millisecond


@attrs.frozen
class Failure:
    """What the picture marks as the failure: a property violation's fields, or a harness error's type and text."""

    label: str  # `P9`, or the exception type (`QuiescenceTimeout`) when no property was violated
    title: str
    rollout: str | None = None
    history_indices: tuple[int, ...] = ()
    details: str = ""  # expected and observed (a violation), or the rest of the error's message


def failure_of(error: BaseException) -> Failure:
    """The failure as the picture names it; any exception will do (the report draws harness errors too)."""
    message = str(error)
    first, _, rest = message.partition("\n")
    if isinstance(error, PropertyViolation):
        return Failure(
            label=error.property_id,
            title=error.title,
            rollout=error.rollout,
            history_indices=tuple(error.history_indices),
            details=rest,
        )
    rollout = getattr(error, "rollout", None)
    return Failure(
        label=type(error).__name__,
        title=first or type(error).__name__,
        rollout=rollout if isinstance(rollout, str) else None,
        details=rest,
    )


@attrs.frozen
class Operation:
    """An invocation and its completion (None: none was recorded), or a point event (a note) on its own."""

    start: Event
    end: Event | None

    @property
    def point(self) -> bool:
        return self.start.type != "invoke"

    @property
    def kind(self) -> str:
        """The CSS class of its box: ok, fail, info, open (no completion), or note (a point)."""
        if self.point:
            return "note" if self.start.type == "ok" else self.start.type
        return self.end.type if self.end is not None else "open"

    @property
    def indices(self) -> tuple[int, ...]:
        return (self.start.index,) if self.end is None else (self.start.index, self.end.index)


def operations(events: Sequence[Event]) -> list[Operation]:
    """Pair every completion with its invocation (`invoke_index`); anything else stands alone as a point."""
    present = {event.index for event in events if event.type == "invoke"}
    completions = {e.invoke_index: e for e in events if e.invoke_index is not None and e.invoke_index in present}
    paired: list[Operation] = []
    for event in events:
        if event.invoke_index is not None and event.invoke_index in present:
            continue  # drawn with its invocation
        paired.append(Operation(event, completions.get(event.index) if event.type == "invoke" else None))
    return paired


@attrs.frozen
class Room:
    """The room a label needs on the time axis: `px` from `start_s` to `end_s` (an event time; inf: to where the
    failure was found; None: a point, which has the gap after its own time)."""

    start_s: float
    end_s: float | None
    px: float


def label_px(label: str) -> float:
    """How wide a box must be to show `label` whole."""
    return len(label) * LABEL_CHAR_PX + LABEL_EXTRA_PX


@attrs.frozen
class Scale:
    """Event times to x positions (px from time 0): increasing, each gap GAP_MIN_PX plus a capped share of it.
    Times are taken to the millisecond, as the axis shows them: events within one share a column."""

    times_s: tuple[float, ...]
    xs_px: tuple[float, ...]
    compressed: tuple[int, ...]  # gaps (by the index of their left time) drawn shorter than their length

    end_gap_px: float = END_PX  # from the last event time to where open operations and intervals end

    @classmethod
    def of(cls, times_s: Iterable[float], rooms: Iterable[Room] = ()) -> Scale:
        """The scale of `times_s`, each gap widened where a label needs it (`rooms`): a box is drawn over what it
        lasted, so its label fits inside it only if its columns are that far apart."""
        distinct = sorted({round(t, TIME_DECIMALS) for t in times_s}) or [0.0]
        gaps, compressed = [], []
        for i in range(1, len(distinct)):
            extra_px = (distinct[i] - distinct[i - 1]) * GAP_PX_PER_S
            if extra_px > GAP_EXTRA_MAX_PX:
                compressed.append(i - 1)
            gaps.append(GAP_MIN_PX + min(extra_px, GAP_EXTRA_MAX_PX))
        gaps.append(float(END_PX))  # the last: to the end
        column = {t: i for i, t in enumerate(distinct)}
        spans = []
        for room in rooms:
            first = column[round(room.start_s, TIME_DECIMALS)]
            end = room.end_s if room.end_s is not None else room.start_s
            last = len(distinct) if end == float("inf") else column[round(end, TIME_DECIMALS)]
            spans.append((max(last, first + 1), first, room.px))  # a point takes the gap after its column
        # Widen each span's last gap by what it lacks, spans ending first first: a later widening never narrows
        # what an earlier span has.
        for last, first, px in sorted(spans):
            lacking = px - sum(gaps[first:last])
            if lacking > 0:
                gaps[last - 1] += lacking
        xs = [0.0]
        for gap in gaps[:-1]:
            xs.append(xs[-1] + gap)
        return cls(tuple(distinct), tuple(xs), tuple(compressed), gaps[-1])

    @property
    def end_px(self) -> float:
        return self.xs_px[-1] + self.end_gap_px

    def x(self, time_s: float) -> float:
        """Where `time_s` is drawn: an event time's column, between two columns in proportion, past the last one
        (an open end) at `end_px`."""
        t = round(time_s, TIME_DECIMALS)
        if t > self.times_s[-1]:
            return self.end_px
        i = bisect.bisect_left(self.times_s, t)
        if self.times_s[i] == t or i == 0:
            return self.xs_px[i]
        share = (t - self.times_s[i - 1]) / (self.times_s[i] - self.times_s[i - 1])
        return self.xs_px[i - 1] + share * (self.xs_px[i] - self.xs_px[i - 1])


@attrs.frozen
class Box:
    """Something drawn in a lane: its extent, its track (row inside the lane), CSS classes, text and hover text."""

    x_px: float
    width_px: float
    kind: str
    label: str
    title: str
    indices: tuple[int, ...] = ()
    track: int = 0


@attrs.frozen
class Mark:
    """A controller action that concerns every lane: drawn as a band across all of them."""

    kind: str  # crash, restore, prepared
    start_s: float
    end_s: float  # inf: still open when the history ended
    label: str
    title: str
    indices: tuple[int, ...] = ()


def _natural(name: str) -> tuple[tuple[int, int, str], ...]:
    """`r2` before `r10`, and a rollout's attempts (`r0`, `r0-a1`) together."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def lanes(events: Sequence[Event], failure: Failure) -> list[str]:
    """The controller, then the backend, then every other process (the rollout attempts) in natural order; the
    violation's rollout gets a lane even when the history has no event of it, so its highlight shows."""
    names = {event.process for event in events}
    if failure.rollout:
        names.add(failure.rollout)
    first = [name for name in ("controller", "backend") if name in names]
    return first + sorted(names - set(first), key=_natural)


def marks(events: Sequence[Event]) -> list[Mark]:
    """Crashes and restores (controller operations), and prepared intervals: from a `prepared` note to the next
    resume or crash invocation, the interval P2 judges (`History.intervals("prepared", ("resume", "crash"))`)."""
    found: list[Mark] = []
    for op in operations(events):
        if op.start.process != "controller" or op.point or op.start.f not in ("crash", "restore"):
            continue
        end_s = op.end.time_s if op.end is not None else float("inf")
        what = f"{op.start.f} {_text(op.start.value)}".strip()
        outcome = op.end.type if op.end is not None else "no completion"
        label = what if outcome == "ok" else f"{what} ({outcome})"  # a restore refused, a crash cut short
        found.append(Mark(op.start.f, op.start.time_s, end_s, label, f"{what}: {outcome}", op.indices))
    opened: Event | None = None
    for event in events:
        if event.process != "controller":
            continue
        if event.f == "prepared" and event.type == "ok" and opened is None:
            opened = event
        elif event.f in ("resume", "crash") and event.type == "invoke" and opened is not None:
            found.append(_prepared(opened, event))
            opened = None
    if opened is not None:
        found.append(_prepared(opened, None))
    return sorted(found, key=lambda mark: (mark.start_s, mark.indices))


def _prepared(opened: Event, closing: Event | None) -> Mark:
    checkpoint = _text(opened.value)
    until = f"until {closing.f} #{closing.index}" if closing is not None else "still open at the end"
    end_s = closing.time_s if closing is not None else float("inf")
    indices = (opened.index,) if closing is None else (opened.index, closing.index)
    return Mark("prepared", opened.time_s, end_s, f"prepared {checkpoint}", f"prepared {checkpoint}, {until}", indices)


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _short(text: str, most: int = LABEL_CHARS_MAX) -> str:
    return text if len(text) <= most else text[: most - 1].rstrip() + "…"


def label_of(op: Operation) -> str:
    """A box's label: what was done in full, its value shortened (the box's title and the table hold it whole),
    and `(open)` for an operation with no completion."""
    value = _short(_text(op.start.value), VALUE_CHARS_MAX)
    label = _short(f"{op.start.f} {value}".strip())
    return f"{label} (open)" if not op.point and op.end is None else label


def lasted(op: Operation) -> bool:
    """Whether the operation is drawn over what it lasted: a point or one within a millisecond is drawn as a point."""
    return op.end is None or round(op.end.time_s, TIME_DECIMALS) > round(op.start.time_s, TIME_DECIMALS)


def room_of(op: Operation) -> Room:
    """The room its label needs: over what it lasted, to the end if it never completed, or beside it as a point."""
    if op.point:
        return Room(op.start.time_s, None, label_px(label_of(op)))
    end_s = float("inf") if op.end is None else op.end.time_s if lasted(op) else None
    return Room(op.start.time_s, end_s, label_px(label_of(op)))


def mark_room(mark: Mark) -> Room:
    lasting = round(mark.end_s, TIME_DECIMALS) > round(mark.start_s, TIME_DECIMALS)
    return Room(mark.start_s, mark.end_s if lasting else None, label_px(_short(mark.label)))


def _describe(event: Event) -> str:
    value = "" if event.value is None else f" {event.value}"
    return f"#{event.index} {event.time_s:.3f}s {event.process} {event.type} {event.f}{value}"


def _operation_box(op: Operation, scale: Scale) -> Box:
    """Its box, as wide as what it lasted, and at least as wide as its label (a point's, or one that lasted under a
    millisecond, is only as wide as that: the scale gives it the room after it)."""
    x_px = scale.x(op.start.time_s)
    label = label_of(op)
    at_least_px = max(label_px(label), POINT_PX)
    lines = [_describe(op.start)]
    if op.point:
        return Box(x_px, at_least_px, op.kind, label, lines[0], op.indices)
    if op.end is None:
        lines.append("no completion recorded: still running (or never answered) when the failure was found")
        width_px = max(scale.end_px - x_px, GAP_MIN_PX)
        return Box(x_px, width_px, "open", label, "\n".join(lines), op.indices)
    lines.append(_describe(op.end))
    lines.append(f"took {op.end.time_s - op.start.time_s:.3f}s")
    width_px = max(scale.x(op.end.time_s) - x_px, at_least_px)
    return Box(x_px, width_px, op.kind, label, "\n".join(lines), op.indices)


def _mark_box(mark: Mark, scale: Scale) -> Box:
    x_px = scale.x(mark.start_s)
    label = _short(mark.label)
    width_px = max(scale.x(mark.end_s) - x_px, label_px(label), POINT_PX)  # the band keeps the extent
    return Box(x_px, width_px, f"mark {mark.kind}", label, mark.title, mark.indices)


def stacked(boxes: Iterable[Box]) -> list[Box]:
    """Give each box the first track where it overlaps no earlier box (greedy interval partitioning), so the
    operations of one process that overlap in time (a commit held across a crash) stay apart."""
    ends_px: list[float] = []
    placed: list[Box] = []
    for box in sorted(boxes, key=lambda b: (b.x_px, b.indices)):
        track = next((i for i, end_px in enumerate(ends_px) if end_px <= box.x_px + 0.5), len(ends_px))
        if track == len(ends_px):
            ends_px.append(0.0)
        ends_px[track] = box.x_px + box.width_px
        placed.append(attrs.evolve(box, track=track))
    return placed


def scale_for(events: Sequence[Event]) -> Scale:
    """The picture's scale: the events' times, with room for every box's and mark's label."""
    rooms = [*(room_of(op) for op in operations(events)), *(mark_room(mark) for mark in marks(events))]
    return Scale.of((event.time_s for event in events), rooms)


def render(
    events: Sequence[Event],
    failure: Failure,
    deployment: str,
    regression_path: str | os.PathLike[str],
) -> str:
    """The whole page: the header (failure, deployment, regression file, how to replay), the legend, the lanes and
    the table of events. Pure: the same arguments give the same text."""
    scale = scale_for(events)
    found_marks = marks(events)
    by_lane: dict[str, list[Box]] = {name: [] for name in lanes(events, failure)}
    for op in operations(events):
        by_lane[op.start.process].append(_operation_box(op, scale))
    rows = [(MARKS_LANE, stacked(_mark_box(mark, scale) for mark in found_marks))]
    rows += [(name, stacked(boxes)) for name, boxes in by_lane.items()]
    width_px = GUTTER_PX + LEFT_PAD_PX + scale.end_px + RIGHT_PAD_PX
    parts = [
        _head(failure),
        _header(events, failure, deployment, str(regression_path), scale),
        _legend(),
        f'<div class="scroll"><div class="chart" style="width:{width_px:.0f}px">',
        _axis(scale, failure, bool(events)),
        *(_band(mark, scale) for mark in found_marks),
        *(_lane(name, boxes, failure) for name, boxes in rows),
        "</div></div>",
        _table(events, failure),
        "</body>\n</html>\n",
    ]
    return "\n".join(parts)


def write_timeline(
    path: Path,
    events: Sequence[Event],
    failure: Failure,
    deployment: str,
    regression_path: str | os.PathLike[str],
) -> Path:
    """Render and write (overwrite) the picture at `path`, beside and then renamed over: a reader never sees half."""
    page = render(events, failure, deployment, regression_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(page, encoding="utf-8")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def path_beside(regression_path: Path) -> Path:
    """The picture's path: the regression file's, with `.html` for `.json`."""
    return regression_path.with_suffix(".html")


# --- HTML ---------------------------------------------------------------------------------------------------------


def _e(text: object) -> str:
    """Escape for text and for double-quoted attributes alike: event values can hold any text."""
    return html.escape(str(text), quote=True)


def _head(failure: Failure) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(failure.label)} timeline: {_e(failure.title)}</title>\n"
        f"<style>\n{_css()}\n</style>\n</head>\n<body>"
    )


def _header(events: Sequence[Event], failure: Failure, deployment: str, regression: str, scale: Scale) -> str:
    rollout = (
        f'<p class="rollout">rollout <strong>{_e(failure.rollout)}</strong>: its lane is highlighted</p>'
        if failure.rollout
        else ""
    )
    named = ", ".join(f'<a href="#e{i}">#{i}</a>' for i in failure.history_indices)
    named_line = f"<dt>events named</dt><dd>{named} (outlined in the lanes and the table)</dd>" if named else ""
    details = f'<pre class="details">{_e(failure.details)}</pre>' if failure.details else ""
    span = f"{len(events)} events, 0.000s to {scale.times_s[-1]:.3f}s after the example started" if events else "none"
    return (
        f'<header>\n<h1><span class="pid">{_e(failure.label)}</span> {_e(failure.title)}</h1>\n{rollout}{details}\n'
        f"<dl>\n<dt>deployment</dt><dd>{_e(deployment)}</dd>\n"
        f"<dt>regression file</dt><dd><code>{_e(Path(regression).name)}</code></dd>\n"
        f"<dt>replay</dt><dd><code>ckpt-model replay {_e(regression)}</code></dd>\n"
        f"<dt>history</dt><dd>{span}</dd>\n{named_line}</dl>\n</header>"
    )


LEGEND = (
    ("ok", "ok: completed"),
    ("fail", "fail: refused or failed"),
    ("info", "info: outcome unknown"),
    ("open", "open: no completion recorded"),
    ("note", "note (a point event)"),
    ("prepared", "prepared interval"),
    ("crash", "crash"),
    ("restore", "restore"),
    ("named", "event the violation names"),
    ("found", "where the failure was found"),
)


def _legend() -> str:
    keys = "".join(f'<span class="item"><span class="swatch {css}"></span>{_e(text)}</span>' for css, text in LEGEND)
    return (
        f'<div class="legend">{keys}</div>\n<p class="hint">Time runs left to right; the picture opens on its end, '
        "where the failure was found, and the steps that led to it (scroll left for the start). Gaps marked ≈ are "
        "drawn shorter than they lasted. Hover over a box for its events (times, full values); click it for its "
        "rows in the table below.</p>"
    )


def _axis(scale: Scale, failure: Failure, any_events: bool) -> str:
    left = GUTTER_PX + LEFT_PAD_PX
    ticks: list[str] = []
    last_label_px = -float(TICK_LABEL_MIN_PX)
    for t, x in zip(scale.times_s, scale.xs_px, strict=True):
        text = f"{t:.3f}s" if x - last_label_px >= TICK_LABEL_MIN_PX else ""
        last_label_px = x if text else last_label_px
        ticks.append(f'<span class="tick" style="left:{left + x:.0f}px">{text}</span>')
    for i in scale.compressed:
        middle_px = left + (scale.xs_px[i] + scale.xs_px[i + 1]) / 2
        lasted_s = scale.times_s[i + 1] - scale.times_s[i]
        ticks.append(f'<span class="gap" style="left:{middle_px - 30:.0f}px">≈ {lasted_s:.2f}s</span>')
    # The failure was raised after the last event; open operations and intervals are drawn up to here.
    found_px = left + (scale.end_px if any_events else 0)
    found = (
        f'<div class="found-line" style="left:{found_px:.0f}px" title="{_e(failure.label)} was raised after the last '
        f'event of the history; operations still open then end here"><span>{_e(failure.label)} found</span></div>'
    )
    return f'<div class="axis"><div class="who">time</div>{"".join(ticks)}</div>\n{found}'


def _band(mark: Mark, scale: Scale) -> str:
    x_px = scale.x(mark.start_s)
    width_px = max(scale.x(mark.end_s) - x_px, MARK_MIN_PX)
    return (
        f'<div class="band {mark.kind}" style="left:{GUTTER_PX + LEFT_PAD_PX + x_px:.0f}px;width:{width_px:.0f}px" '
        f'title="{_e(mark.title)}"></div>'
    )


def _lane(name: str, boxes: Sequence[Box], failure: Failure) -> str:
    tracks = max((box.track for box in boxes), default=0) + 1
    height_px = tracks * TRACK_PX + 2 * LANE_PAD_PX
    suspect = name == failure.rollout
    classes = "lane marks" if name == MARKS_LANE else "lane suspect" if suspect else "lane"
    badge = f' <span class="badge">{_e(failure.label)}</span>' if suspect else ""
    drawn = "".join(_box(box, failure) for box in boxes)
    return (
        f'<div class="{classes}" data-lane="{_e(name)}" style="height:{height_px}px">'
        f'<div class="who" title="{_e(name)}">{_e(name)}{badge}</div>{drawn}</div>'
    )


def _box(box: Box, failure: Failure) -> str:
    named = bool(set(box.indices) & set(failure.history_indices)) and not box.kind.startswith("mark")
    classes = f"op {box.kind}" + (" named" if named else "")
    style = (
        f"left:{GUTTER_PX + LEFT_PAD_PX + box.x_px:.0f}px;width:{box.width_px:.0f}px;"
        f"top:{LANE_PAD_PX + box.track * TRACK_PX}px"
    )
    target = f' href="#e{box.indices[0]}"' if box.indices else ""
    index_list = " ".join(str(i) for i in box.indices)
    return (
        f'<a class="{classes}"{target} style="{style}" data-events="{index_list}" title="{_e(box.title)}">'
        f"{_e(box.label)}</a>"
    )


def _table(events: Sequence[Event], failure: Failure) -> str:
    named = set(failure.history_indices)
    rows = []
    for event in events:
        classes = " ".join(
            c for c, on in (("named", event.index in named), ("suspect", event.process == failure.rollout)) if on
        )
        pairs = "" if event.invoke_index is None else f'<a href="#e{event.invoke_index}">#{event.invoke_index}</a>'
        rows.append(
            f'<tr id="e{event.index}" class="{classes}"><td>#{event.index}</td><td>{event.time_s:.3f}s</td>'
            f'<td>{_e(event.process)}</td><td class="{event.type}">{event.type}</td><td>{_e(event.f)}</td>'
            f"<td>{pairs}</td><td><code>{_e(_text(event.value))}</code></td></tr>"
        )
    return (
        '<h2>Events</h2>\n<table class="events"><thead><tr><th>#</th><th>time</th><th>process</th><th>type</th>'
        "<th>f</th><th>invoked at</th><th>value</th></tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table>"
    )


def _css() -> str:
    return f"""
:root {{ --ok:#2e7d32; --ok-bg:#d6eed1; --fail:#b3261e; --fail-bg:#f8cfca; --info:#946200; --info-bg:#fbe7a3;
  --note:#2f5f98; --note-bg:#dbe7f7; --crash:#202020; --restore:#00796b; --prepared:#6a4fb3; --found:#c2185b; }}
body {{ font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1d1d1d;
  background: #fff; }}
h1 {{ font-size: 19px; margin: 0 0 6px; }}
h2 {{ font-size: 15px; margin: 22px 0 6px; }}
.pid {{ background: var(--found); color: #fff; border-radius: 4px; padding: 1px 7px; margin-right: 4px; }}
.rollout {{ margin: 4px 0; color: var(--found); }}
pre.details {{ background: #faf3f6; border-left: 4px solid var(--found); padding: 6px 10px; margin: 6px 0;
  white-space: pre-wrap; word-break: break-word; font-size: 12px; }}
dl {{ display: grid; grid-template-columns: max-content auto; gap: 2px 12px; margin: 8px 0; }}
dt {{ color: #666; }} dd {{ margin: 0; }}
code {{ font: 12px/1.3 ui-monospace, "DejaVu Sans Mono", monospace; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 10px 0 4px; }}
.legend .item {{ display: inline-flex; align-items: center; gap: 6px; }}
.swatch {{ display: inline-block; width: 28px; height: 14px; box-sizing: border-box; border: 1px solid;
  border-radius: 3px; }}
.hint {{ color: #666; margin: 2px 0 8px; }}
.scroll {{ overflow-x: auto; border: 1px solid #bbb; width: fit-content; max-width: 100%; direction: rtl; }}
.chart {{ position: relative; direction: ltr; }}
.axis {{ position: relative; height: {AXIS_PX}px; background: #f4f4f4; border-bottom: 1px solid #999; }}
.tick {{ position: absolute; bottom: 0; height: 12px; border-left: 1px solid #888; font-size: 10px;
  color: #444; padding-left: 2px; white-space: nowrap; line-height: 10px; }}
.tick:not(:empty) {{ height: 26px; }}
.gap {{ position: absolute; top: 2px; width: 60px; text-align: center; font-size: 10px; color: #555;
  font-style: italic; background: #e6e6e6; border-radius: 3px; }}
.found-line {{ position: absolute; top: 0; bottom: 0; border-left: 2px dashed var(--found); z-index: 2;
  pointer-events: none; }}
.found-line span {{ position: absolute; top: 2px; left: 3px; background: var(--found); color: #fff; font-size: 11px;
  font-weight: 700; padding: 0 5px; border-radius: 3px; white-space: nowrap; pointer-events: auto; }}
.band {{ position: absolute; top: {AXIS_PX}px; bottom: 0; z-index: 0; }}
.band.prepared {{ background: rgba(106, 79, 179, 0.09); border-left: 1px solid rgba(106, 79, 179, 0.6);
  border-right: 1px solid rgba(106, 79, 179, 0.6); }}
.band.crash {{ background: repeating-linear-gradient(135deg, rgba(0,0,0,0.16) 0 4px, rgba(0,0,0,0.04) 4px 8px);
  border-left: 2px solid var(--crash); }}
.band.restore {{ background: rgba(0, 121, 107, 0.12); border-left: 2px solid var(--restore); }}
.lane {{ position: relative; border-bottom: 1px solid #e2e2e2; }}
.lane.marks {{ background: rgba(0, 0, 0, 0.025); border-bottom: 1px solid #bbb; }}
.lane.suspect {{ background: rgba(194, 24, 91, 0.08); box-shadow: inset 0 2px 0 var(--found),
  inset 0 -2px 0 var(--found); }}
.who {{ position: sticky; left: 0; z-index: 3; width: {GUTTER_PX}px; height: 100%; box-sizing: border-box;
  background: #f4f4f4; border-right: 1px solid #bbb; padding: 4px 8px; font-weight: 600; overflow: hidden;
  white-space: nowrap; text-overflow: ellipsis; }}
.lane.marks .who {{ font-weight: 400; font-style: italic; color: #555; }}
.lane.suspect .who {{ background: #f9dde8; color: var(--found); border-left: 5px solid var(--found); }}
.badge {{ background: var(--found); color: #fff; border-radius: 3px; padding: 0 4px; font-size: 11px; }}
.op {{ position: absolute; height: {TRACK_PX - 4}px; box-sizing: border-box; border: 1px solid; border-radius: 3px;
  font: {LABEL_FONT_PX}px/{TRACK_PX - 6}px ui-monospace, "DejaVu Sans Mono", monospace; padding: 0 4px;
  overflow: hidden; white-space: nowrap; text-overflow: ellipsis; color: #111; text-decoration: none; z-index: 1; }}
.op:hover {{ z-index: 4; box-shadow: 0 1px 4px rgba(0,0,0,0.4); }}
.op.ok, .swatch.ok {{ background: var(--ok-bg); border-color: var(--ok); }}
.op.fail, .swatch.fail {{ background: var(--fail-bg); border-color: var(--fail); }}
.op.info, .swatch.info {{ background: var(--info-bg); border-color: var(--info); }}
.op.open, .swatch.open {{ background: repeating-linear-gradient(135deg, #e9e9e9 0 6px, #fbfbfb 6px 12px);
  border-color: #777; border-right: 2px dashed #777; }}
.op.note, .swatch.note {{ background: var(--note-bg); border-color: var(--note); border-radius: 9px; }}
.op.named, .swatch.named {{ outline: 3px solid var(--found); outline-offset: 1px; font-weight: 700; z-index: 2; }}
.swatch.named {{ background: #fff; border: 1px solid #999; }}
.mark.prepared, .swatch.prepared {{ background: rgba(106, 79, 179, 0.18); border-color: var(--prepared); }}
.mark.crash, .swatch.crash {{ background: var(--crash); border-color: var(--crash); color: #fff; }}
.mark.restore, .swatch.restore {{ background: var(--restore); border-color: var(--restore); color: #fff; }}
.swatch.found {{ border: 0; border-left: 2px dashed var(--found); width: 10px; }}
table.events {{ border-collapse: collapse; font-size: 12px; }}
table.events th, table.events td {{ border: 1px solid #ddd; padding: 2px 6px; text-align: left;
  vertical-align: top; }}
table.events th {{ background: #f4f4f4; }}
table.events td code {{ white-space: pre-wrap; word-break: break-word; }}
table.events tr.suspect {{ background: #fcf0f4; }}
table.events tr.named {{ background: #f9dde8; outline: 2px solid var(--found); font-weight: 600; }}
table.events tr:target {{ background: #fff6c4; }}
table.events td.fail {{ color: var(--fail); }} table.events td.info {{ color: var(--info); }}
table.events td.ok {{ color: var(--ok); }}
"""
