"""The dataset card's plots, drawn with matplotlib into PNG bytes.

matplotlib is imported here only when a card is drawn (no other command pays for it), and through
its object API (``Figure``), never ``pyplot``: no global figure state, no GUI backend, so a Dagster
process can draw (one card at a time: the style is matplotlib's process-wide rcParams). The bytes
are reproducible: matplotlib's default style whatever the user's matplotlibrc or rcParams (one
``rc_context`` a card, ``_style``), the DejaVu fonts it ships, fixed sizes and dpi, and no text
chunk (no ``Software`` version) in the PNG, which PIL writes from the Agg canvas as RGB (the figures
are opaque).

A +1% child redraws nearly every plot, so drawing them is most of a build's card. What it costs was
cut without a pixel moving (the tests compare decoded pixels): figures have fixed margins, no layout
engine, so each is drawn once (``_figure``); titles and empty axis labels are placed before the draw
where matplotlib's search would place them (``_pin_layout``: each search laid out the tick labels
once more); histograms are one step outline, not a bar a bin; the arrows of the lineage skip the
data-limit update of its fixed axes; zlib at level 3. Each plot is a function of its own inputs
alone (``PLOTS``: the least it reads of the card, then how it draws that), so its bytes are cached
(``PlotCache``) under the digest of those inputs, this module's code identity and matplotlib's
version: an unchanged rebuild draws only the lineage (its title names the new snapshot), and a child
redraws only the plots whose inputs moved (not the S-curve, which reads the LSH settings only, nor
contamination while the benchmarks and flags stay).
"""

import functools
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import pydantic_core

from corpus_assets.core.audit.card import Card, Histogram
from corpus_assets.core.audit.snapshot_graph import LineageGraph, Node
from corpus_assets.core.dedup.report import LshSettings, NearReport, SCurvePoint
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.snapshot_manifest import ContaminationEntry, MixtureRow
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import json_digest

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
SIZE = (7.0, 3.6)  # inches: 700 x 360 pixels at DPI
# Fixed margins in inches (left, right, bottom, top; and between two charts side by side), not
# a layout engine: matplotlib's constrained layout drew every figure twice (once unrendered, to
# measure each tick label) - half of a card's drawing. These leave room for 7-digit tick labels,
# an axis label on each side and the title, which is all the charts here have.
Margins = tuple[float, float, float, float, float]
AXES_MARGINS: Margins = (0.85, 0.15, 0.5, 0.3, 0.75)
FRAMELESS: Margins = (0.05, 0.05, 0.05, 0.3, 0.0)  # no axes drawn: the lineage's boxes
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
SHOWN_PER_RANK = 8  # lineage boxes in one column; more are summed up in one box
SPLITS = ("train", "validation", "test")
# zlib's level: 3 deflates a card in ~0.6x the CPU of the default 6 for ~8% more bytes (still
# ~3% fewer than the RGBA PNGs at 6 the card had before)
PNG_LEVEL = 3
# rcParams that are not style: those style.use("default") leaves alone (its blacklist)
NOT_STYLE = frozenset(
    (
        *("backend", "backend_fallback", "interactive", "toolbar", "timezone", "date.epoch"),
        *("webagg.port", "webagg.address", "webagg.port_retries", "webagg.open_in_browser"),
        *("figure.max_open_warning", "figure.raise_window", "savefig.directory"),
        *("tk.window_focus", "docstring.hardcopy"),
    )
)


CODE = stage_code("card.plots.v1", __name__)  # its closure, hashed at import
MEMO = "card.plot"  # the memo rows' layer name


class PlotCache:
    """PNG bytes by plot key in the store, found through the memo table. Like every memo, not a
    gc root: a plot collected (or damaged) is drawn again, never shown wrong - the store
    re-hashes the bytes it returns."""

    def __init__(self, cas: ContentStore, catalog: Catalog, keep: bool = True) -> None:
        """``keep=False``: a reader's cache (``corpus-assets card``), which takes the plots a
        build drew and writes nothing to the home."""
        self.cas, self.catalog, self.keep = cas, catalog, keep

    def get(self, key: str) -> bytes | None:
        hit = self.catalog.memo(key)
        if hit is None:
            return None
        try:
            return self.cas.get_bytes(hit[0], "card plot")
        except CasError:
            return None

    def put(self, key: str, data: bytes) -> None:
        if self.keep:
            self.catalog.remember(key, MEMO, self.cas.put_bytes(data), "{}")


def render_plots(card: Card, cache: PlotCache | None = None) -> dict[str, bytes]:
    """Every plot of the card: file name -> PNG bytes; with ``cache``, a plot drawn before from
    the same inputs under this code is taken from it, and a plot drawn here is put in it."""
    inputs = {name: inputs_of(card) for name, (inputs_of, _) in PLOTS.items()}
    keys = {} if cache is None else {n: plot_key(n, value) for n, value in inputs.items()}
    cached = {} if cache is None else {name: cache.get(key) for name, key in keys.items()}
    plots = {name: found for name, found in cached.items() if found is not None}
    if missing := [name for name in PLOTS if name not in plots]:
        # one style for the plots drawn here; a card whose plots are all cached (the same
        # snapshot's card again: ``corpus-assets card``, a re-materialization) never imports
        # matplotlib, ~0.4 CPU-s
        with _style():
            for name in missing:
                plots[name] = _png(PLOTS[name][1](inputs[name]))
                if cache is not None:
                    cache.put(keys[name], plots[name])
    return {name: plots[name] for name in PLOTS}


def plot_key(name: str, inputs: Any) -> str:
    """What a plot's bytes are a function of: its name and inputs, this code, matplotlib."""
    return json_digest(
        {
            "plot": name,
            "code": CODE,
            "matplotlib": _matplotlib_version(),
            "inputs": json.loads(pydantic_core.to_json(inputs)),
        }
    )


@functools.cache
def _matplotlib_version() -> str:
    """Read from its installed metadata (~2 ms a lookup), without importing it."""
    return version("matplotlib")


@contextmanager
def _style() -> Iterator[None]:
    """matplotlib's default style (and our font size) whatever the user's matplotlibrc or
    ``rcParams``, which are theirs again after: one ``rc_context`` for a whole card. Not
    ``style.context("default")`` per plot: that builds and validates every rcParam each time
    (and imports ``matplotlib.style``), 1.5% of a +1% child's CPU for eight plots."""
    import matplotlib

    with matplotlib.rc_context(_default_style()):
        yield


@functools.cache
def _default_style() -> dict[str, Any]:
    """``rcParamsDefault`` (matplotlib's own matplotlibrc, never the user's) less what
    ``style.use("default")`` leaves alone (backend, interactive, ...: not style), with the
    card's font size; built once a process, validated on each ``rc_context`` entry."""
    import matplotlib

    defaults = matplotlib.rcParamsDefault
    # keys first: reading "backend" from rcParamsDefault would resolve (and switch) a backend
    style = {key: defaults[key] for key in defaults if key not in NOT_STYLE}
    return {**style, "font.size": 9}


def _figure(
    columns: int = 1, size: tuple[float, float] = SIZE, margins: Margins = AXES_MARGINS
) -> tuple["Figure", Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=DPI)
    (width, height), (left, right, bottom, top, between) = size, margins
    chart = (width - left - right - between * (columns - 1)) / columns
    figure.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=between / chart,
    )
    return figure, figure.subplots(1, columns)


def _png(figure: "Figure") -> bytes:
    """Drawn once on an Agg canvas, its pixels written by PIL as RGB: the figure is opaque
    (a white face under every artist, alpha 255 everywhere), so the alpha channel is a
    quarter of the bytes to filter and deflate for nothing. No text chunk (no ``Software``
    version): the bytes are a function of the pixels alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    for axes in figure.axes:
        _pin_layout(axes)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    rgba = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba())
    out = io.BytesIO()
    rgba.convert("RGB").save(out, format="png", compress_level=PNG_LEVEL)
    return out.getvalue()


def _pin_layout(axes: "Axes") -> None:
    """Where matplotlib would put the title and axis labels, set before the draw so it does
    not search: an empty axis label is not drawn, so its place is not searched for (each
    search updates the axis's ticks and lays out its tick labels once more than the draw
    does); a title goes where the search would put it (``_pin_title``)."""
    for axis in (axes.xaxis, axes.yaxis):
        if not axis.get_label_text():
            axis.set_label_coords(0.5, 0.5)  # no text: drawn nowhere
    _pin_title(axes)


def _pin_title(axes: "Axes") -> None:
    """The title at the axes' top (``y=1``, then its pad), where matplotlib's search would put
    it, without the search: it lays out every y tick label before the draw does it again (~10%
    of drawing a card). The search moves a title only above x ticks on top (none here) or an
    offset text of the y axis (``1e7``, over large counts): there it is left to run."""
    title = axes.get_title()
    if not title:
        return
    formatter = axes.yaxis.get_major_formatter()
    formatter.set_locs(axes.yaxis.get_majorticklocs())  # as the draw will, on the same limits
    if not formatter.get_offset():
        axes.set_title(title, y=1.0)  # the same title, its position fixed


def _shares(rows: list[MixtureRow]) -> "Figure":
    """Target beside realised share per source, by documents and by tokens: one chart."""
    figure, axes = _figure()
    series = (("target", "target_share"), ("docs", "doc_share"), ("tokens", "token_share"))
    width = 0.8 / len(series)
    for n, (label, key) in enumerate(series):
        xs = [i + (n - 1) * width for i in range(len(rows))]
        shares = [float(getattr(r, key) or 0) for r in rows]
        bars = axes.bar(xs, shares, width, label=label, color=COLOURS[n])
        axes.bar_label(bars, fmt="{:.1%}", fontsize=7)
    axes.set_xticks(range(len(rows)), [r.source for r in rows])
    axes.set_ylabel("share")
    axes.set_title("mixture: target vs realised share per source")
    axes.legend()
    return figure


def _s_curve_inputs(near: NearReport | None) -> tuple[LshSettings, list[SCurvePoint]] | None:
    """The curve's settings and points only: they move with the settings, not with the data,
    so a child's card takes its S-curve from the cache."""
    return None if near is None else (near.lsh, near.s_curve)


def _s_curve(curve: tuple[LshSettings, list[SCurvePoint]] | None) -> "Figure":
    figure, axes = _figure()
    if curve is None:
        return _empty(figure, axes, "near-dedup is off for this snapshot")
    lsh, points = curve
    s = [float(p.s) for p in points]
    axes.plot(s, [float(p.p) for p in points], marker="o", color=COLOURS[0])
    axes.axvline(float(lsh.threshold), color=COLOURS[3], linestyle="--", label="threshold")
    axes.set_xlabel("Jaccard similarity s")
    axes.set_ylabel("P(candidate pair)")
    axes.set_title(f"LSH S-curve: {lsh.bands} bands x {lsh.rows} rows")
    axes.legend()
    return figure


def _cluster_size_totals(near: NearReport | None) -> dict[str, int]:
    """Near-duplicate clusters by size (power-of-two bins), summed over the near-dedup classes:
    all the chart reads of the report."""
    sizes: dict[str, int] = {}
    for report in (near.classes if near else {}).values():
        for size, clusters in report.cluster_sizes.items():
            sizes[size] = sizes.get(size, 0) + clusters
    return dict(sorted(sizes.items()))


def _cluster_sizes(sizes: dict[str, int]) -> "Figure":
    figure, axes = _figure()
    if not sizes:
        return _empty(figure, axes, "no near-duplicate clusters")
    labels = sorted(sizes, key=lambda label: int(label.split("-")[0]))
    axes.bar_label(axes.bar(labels, [sizes[k] for k in labels], color=COLOURS[0]))
    axes.set_xlabel("records in the cluster")
    axes.set_ylabel("clusters")
    axes.set_title("near-duplicate cluster sizes")
    return figure


def _splits(counts: dict[str, int]) -> "Figure":
    figure, (records, tokens) = _figure(2)
    for axes, suffix, title in ((records, "", "records"), (tokens, "_tokens", "tokens")):
        values = [counts.get(f"{split}{suffix}", 0) for split in SPLITS]
        axes.bar_label(axes.bar(SPLITS, values, color=COLOURS[: len(SPLITS)]))
        axes.set_title(f"{title} per split")
    return figure


def _histogram(shape: Histogram, what: str) -> "Figure":
    """The bins as one filled step outline: the pixels of a bar per bin (rectilinear paths
    are snapped to the pixel grid either way, no seams between bars to lose; the same data
    limits and zero baseline), without thirty patches each added, bounded and drawn."""
    figure, axes = _figure()
    axes.stairs(shape.counts, shape.edges, fill=True, color=COLOURS[0])
    axes.set_xlabel(what)
    axes.set_ylabel("count")
    axes.set_title(f"{what}: median {shape.median}, min {shape.low}, max {shape.high}")
    return figure


def _contamination(report: ContaminationEntry | None) -> "Figure":
    figure, axes = _figure()
    rows = report.benchmarks if report is not None else []
    if not rows:
        return _empty(figure, axes, "no benchmark was registered when this snapshot was built")
    names = [row.benchmark for row in rows]
    xs = range(len(rows))
    for n, key in enumerate(("items", "flagged")):
        bars = axes.bar(
            [x + (n - 0.5) * 0.4 for x in xs], [getattr(r, key) for r in rows], 0.4, label=key
        )
        axes.bar_label(bars)
    axes.set_xticks(list(xs), names)
    axes.set_title("benchmark items and the records flagged against them")
    axes.legend()
    return figure


def _empty(figure: "Figure", axes: "Axes", why: str) -> "Figure":
    axes.set_axis_off()
    axes.text(0.5, 0.5, why, ha="center", va="center", transform=axes.transAxes)
    return figure


def _ranks(graph: LineageGraph) -> dict[str, int]:
    """Each node's column: the longest path reaching it (nodes come in dependency order)."""
    rank = {node.id: 0 for node in graph.nodes}
    for _ in graph.nodes:  # relax until stable; the graph is small and acyclic
        for edge in graph.edges:
            rank[edge.target] = max(rank[edge.target], rank[edge.source] + 1)
    return rank


def _box_text(node: Node) -> str:
    name = node.id.split(":", 1)[1] if node.kind in ("source", "layer") else node.kind
    return f"{name}\n{node.digest[:19]}…" if node.digest else name


def _lineage(graph: LineageGraph) -> "Figure":
    """Boxes in columns by rank, arrows from each index's inputs (arcs below when they skip
    a column)."""
    from matplotlib.patches import FancyArrowPatch

    rank = _ranks(graph)
    columns: dict[int, list[Node]] = {}
    for node in graph.nodes:
        columns.setdefault(rank[node.id], []).append(node)
    height = max(min(len(c), SHOWN_PER_RANK + 1) for c in columns.values())
    # one free row below the boxes for the arcs of the inputs that skip columns
    figure, axes = _figure(size=(1.9 * len(columns), 1.0 + 0.75 * (height + 1)), margins=FRAMELESS)
    axes.set_xlim(-0.5, len(columns) - 0.5)
    axes.set_ylim(-1.8, height - 0.4)
    axes.set_axis_off()
    where: dict[str, tuple[float, float]] = {}
    for x, nodes in sorted(columns.items()):
        shown = nodes if len(nodes) <= SHOWN_PER_RANK + 1 else nodes[:SHOWN_PER_RANK]
        for y, node in enumerate(shown):
            where[node.id] = (x, height - 1 - y)
            _box(axes, where[node.id], _box_text(node), COLOURS[rank[node.id] % len(COLOURS)])
        if len(shown) < len(nodes):
            _box(axes, (x, height - 1 - len(shown)), f"+{len(nodes) - len(shown)} more", "#999")
    for edge in graph.edges:
        if edge.source in where and edge.target in where:
            (x0, y0), (x1, y1) = where[edge.source], where[edge.target]
            bend = 0.0 if x1 - x0 <= 1 else 0.2  # downwards, under the boxes between
            arrow = FancyArrowPatch(
                (x0 + 0.42, y0),
                (x1 - 0.42, y1),
                arrowstyle="-|>",
                mutation_scale=10,
                connectionstyle=f"arc3,rad={bend}",
                color="#444",
                linewidth=0.8,
            )
            axes.add_artist(arrow)  # not add_patch: the limits are set, no data limits
    axes.set_title(f"lineage of {graph.snapshot_id[:19]}…", y=1.0)  # y: no tick-label search
    return figure


def _box(axes: "Axes", at: tuple[float, float], text: str, colour: str) -> None:
    axes.text(
        *at,
        text,
        ha="center",
        va="center",
        fontsize=7,
        bbox={"boxstyle": "round,pad=0.4", "facecolor": colour, "alpha": 0.25},
    )


Drawer = Callable[[Any], "Figure"]
# each plot: what it reads of the card (all it reads: the cache key), and how it draws that
PLOTS: dict[str, tuple[Callable[[Card], Any], Drawer]] = {
    "shares.png": (lambda c: c.manifest.mixture, _shares),
    "dedup_s_curve.png": (lambda c: _s_curve_inputs(c.dedup.near), _s_curve),
    "cluster_sizes.png": (lambda c: _cluster_size_totals(c.dedup.near), _cluster_sizes),
    "splits.png": (lambda c: c.split_counts, _splits),
    "sample_lengths.png": (
        lambda c: c.sample_lengths,
        lambda shape: _histogram(shape, "tokens per sample"),
    ),
    "block_padding.png": (
        lambda c: c.block_padding,
        lambda shape: _histogram(shape, "pad tokens per block"),
    ),
    "contamination.png": (lambda c: c.manifest.contamination, _contamination),
    "lineage.png": (lambda c: c.lineage, _lineage),
}
