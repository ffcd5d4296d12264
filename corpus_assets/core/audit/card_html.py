"""The dataset card laid out: a static HTML page beside its PNG plots, or Markdown for the
manifest's materialization in the Dagster UI.

The page is self-contained (inline CSS, no script, no network resource; every value from the
snapshot HTML-escaped) and written by ``write_card``: plots first, ``index.html`` last, each file
atomically, so a reader never sees a page whose plots are missing or half written.
"""

import base64
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corpus_assets.core.audit.card import Card, Histogram
from corpus_assets.core.audit.card_plots import PlotCache, render_plots
from corpus_assets.core.storage.fsio import atomic_write

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;
text-align:left}th{background:#f0f0f0}code{font-size:.9em}img{max-width:100%}"""
SECTIONS = (
    ("sources", "Sources"),
    ("shares", "Target vs realised shares"),
    ("dedup", "Dedup"),
    ("splits", "Splits"),
    ("lengths", "Lengths and padding"),
    ("contamination", "Contamination"),
    ("lineage", "Lineage"),
    ("signature", "Signature and fences"),
)


def write_card(
    card: Card,
    out: Path,
    plots: Mapping[str, bytes] | None = None,
    cache: PlotCache | None = None,
) -> Path:
    """Write ``out/index.html`` and its plots (``out`` is created); the page's path.
    ``plots``: ``render_plots(card)`` when the caller already drew them; else they are drawn,
    those ``cache`` holds taken from it."""
    out.mkdir(parents=True, exist_ok=True)
    plots = render_plots(card, cache) if plots is None else plots
    for name, data in plots.items():
        _publish(out / name, data)
    page = out / "index.html"
    _publish(page, card_html(card, plots).encode())
    return page


def _publish(path: Path, data: bytes) -> None:
    """Atomically, and readable by whoever serves the folder (a temp file is private)."""
    atomic_write(path, data)
    path.chmod(0o644)


def card_html(card: Card, plots: Iterable[str]) -> str:
    """The page; ``plots`` are the PNG file names beside it."""
    shown = set(plots)
    body = [
        f"<h1>Dataset card <code>{_e(card.snapshot_id)}</code></h1>",
        _table(None, _facts(card)),
    ]
    makers = {
        "sources": _sources,
        "shares": _shares,
        "dedup": _dedup,
        "splits": _splits,
        "lengths": _lengths,
        "contamination": _contamination,
        "lineage": _lineage,
        "signature": _signature,
    }
    for anchor, title in SECTIONS:
        html_text, images = makers[anchor](card)
        body.append(f'<section id="{anchor}"><h2>{title}</h2>{html_text}')
        body += [f'<img src="{_e(i)}" alt="{_e(i)}">' for i in images if i in shown]
        body.append("</section>")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Dataset card {_e(card.snapshot_id)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def card_markdown(
    card: Card, image_base: str | None = None, plots: Mapping[str, bytes] | None = None
) -> str:
    """Markdown for the manifest's materialization: the facts table and every plot, linked
    under ``image_base`` (where ``write_card`` wrote them, as the UI can reach them) or, without
    one, inline as ``data:`` URIs (each plot is tens of KB; Dagster's UI renders them).
    ``plots``: ``render_plots(card)`` when the caller already drew them."""
    plots = render_plots(card) if plots is None else plots
    lines = [f"**Dataset card** of `{card.snapshot_id}`", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {_md(value)} |" for name, value in _facts(card)]
    lines.append("")
    for name, data in plots.items():
        inline = "data:image/png;base64," + base64.b64encode(data).decode()
        where = f"{image_base.rstrip('/')}/{name}" if image_base is not None else inline
        lines.append(f"![{name.removesuffix('.png')}]({where})")
    return "\n".join(lines) + "\n"


def _md(value: Any) -> str:
    """A Markdown table cell: no raw HTML, and a ``|`` in a value must not end the cell."""
    return _e(value).replace("|", "\\|")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str] | None, rows: Iterable[Sequence[Any]]) -> str:
    """A table of escaped cells; ``header`` None for a table of (name, value) rows."""
    lines = ["<table>"]
    lines += ["<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"] if header else []
    lines += ["<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows]
    return "".join(lines) + "</table>"


def _facts(card: Card) -> list[tuple[str, Any]]:
    m, counts = card.manifest, card.manifest.counts
    return [
        ("snapshotId", card.snapshot_id),
        ("alias", m.alias),
        ("partition", m.partition),
        ("purpose", m.purpose),
        ("members", f"{counts.members:,}"),
        ("tokens", f"{counts.tokens:,} in {counts.blocks:,} blocks"),
        ("tokenizer", m.tokenizer.kind),
        ("transform image", m.transform_image),
    ]


def _sources(card: Card) -> tuple[str, list[str]]:
    rows = []
    per_source = card.dedup.per_source
    for source in card.manifest.sources:
        sid = source.id
        kept, dedup = card.accounting.get(sid, {}), per_source.get(sid, {})
        removed = dedup.get("exact_duplicate", 0) + dedup.get("near_duplicate", 0)
        rows.append(
            [
                *(sid, source.kind, source.objects, kept.get("rows_in", 0)),
                *(kept.get("quarantined", 0), kept.get("kept", 0), removed, dedup.get("keep", 0)),
                source.object_versions,
            ]
        )
    header = ["source", "kind", "objects", "rows in", "quarantined", "records", "duplicates"]
    return _table([*header, "members", "pinned object versions"], rows), []


def _shares(card: Card) -> tuple[str, list[str]]:
    rows = [
        [
            *(r.source, r.weight, _pct(r.target_share), _pct(r.doc_share)),
            *(_pct(r.token_share), f"{r.selected_docs or 0:,}", f"{r.selected_tokens or 0:,}"),
        ]
        for r in card.manifest.mixture
    ]
    header = ["source", "weight", "target", "realised (docs)", "realised (tokens)", "docs"]
    return _table([*header, "tokens"], rows), ["shares.png"]


def _pct(share: Any) -> str:
    return f"{float(share):.2%}"


def _dedup(card: Card) -> tuple[str, list[str]]:
    c = card.dedup_counts
    text = (
        f"<p>{c.get('records', 0):,} records: {c.get('exact_duplicates', 0):,} exact and "
        f"{c.get('near_duplicates', 0):,} near duplicates removed, {c.get('kept', 0):,} kept in "
        f"{c.get('clusters', 0):,} clusters; {c.get('leakage_groups', 0):,} leakage groups.</p>"
    )
    near = card.dedup.near
    if near is not None:
        lsh = near.lsh
        text += (
            f"<p>MinHash LSH: {lsh.bands} bands x {lsh.rows} rows, threshold {_e(lsh.threshold)}"
            f", at most {lsh.bucket_heads} heads per bucket.</p>"
        )
        rows = [
            [
                *(name, r.participants, r.candidate_pairs, r.verified_pairs, r.near_duplicates),
                ", ".join(f"{k}: {v}" for k, v in r.cluster_sizes.items()) or "none",
            ]
            for name, r in sorted(near.classes.items())
        ]
        header = ["class", "records", "candidate pairs", "verified pairs", "near duplicates"]
        text += _table([*header, "clusters by size"], rows)
    return text, ["dedup_s_curve.png", "cluster_sizes.png"]


def _splits(card: Card) -> tuple[str, list[str]]:
    c = card.split_counts
    rows = [
        (s, f"{c.get(s, 0):,}", f"{c.get(f'{s}_tokens', 0):,}", c.get(f"{s}_components", 0))
        for s in ("train", "validation", "test")
    ]
    text = _table(["split", "records", "tokens", "leakage components"], rows)
    text += f"<p>{c.get('conflicts', 0):,} split conflicts, {c.get('moves', 0):,} moves.</p>"
    if card.conflicts:
        columns = list(card.conflicts[0])
        text += _table(columns, [[row[k] for k in columns] for row in card.conflicts])
    return text, ["splits.png"]


def _lengths(card: Card) -> tuple[str, list[str]]:
    p = card.pack_counts

    def row(what: str, shape: Histogram) -> tuple[Any, ...]:
        return (what, f"{shape.values:,}", f"{shape.total:,}", shape.low, shape.median, shape.high)

    rows = [
        row("tokens per sample", card.sample_lengths),
        row("pad tokens per block", card.block_padding),
    ]
    text = (
        f"<p>{p.get('blocks', 0):,} blocks of {p.get('block_tokens', 0):,} tokens: "
        f"{p.get('content_tokens', 0):,} content, {p.get('pad_tokens', 0):,} padding "
        f"({p.get('pad_tokens', 0) / max(p.get('tokens', 0), 1):.2%}), "
        f"{p.get('dropped_tokens', 0):,} dropped.</p>"
    )
    text += _table(["", "count", "sum", "min", "median", "max"], rows)
    return text, ["sample_lengths.png", "block_padding.png"]


def _contamination(card: Card) -> tuple[str, list[str]]:
    report = card.manifest.contamination
    if report is None or not report.benchmarks:
        return "<p>No benchmark was registered when this snapshot was built.</p>", []
    columns = ["benchmark", "items", "short_items", "checked_whole", "unchecked", "flagged"]
    text = _table(columns, [[getattr(r, k) for k in columns] for r in report.benchmarks])
    if report.flagged:
        text += _table(
            ["benchmark", "source", "records flagged"],
            [(r.benchmark, r.source, r.records) for r in report.flagged],
        )
    return f"<p>Policy {_e(report.policy)}.</p>" + text, ["contamination.png"]


def _lineage(card: Card) -> tuple[str, list[str]]:
    rows = [(n.kind, n.label, n.digest or "", n.code or "") for n in card.lineage.nodes]
    return _table(["kind", "node", "digest", "code"], rows), ["lineage.png"]


def _signature(card: Card) -> tuple[str, list[str]]:
    m = card.manifest
    rows: list[tuple[str, Any]] = [
        (
            "signature",
            f"DSSE, in-toto statement over the snapshotId ({m.signature.payload_type})",
        ),
        ("key id (verified, trusted, pinned for the alias)", card.keyid),
        ("manifest digest", card.snapshot.manifest_digest),
        ("build id", m.build_id),
        ("tombstone watermark", m.tombstone_watermark),
        ("benchmark fence", m.benchmark_fence),
        ("parents", ", ".join(m.parents) or "none"),
    ]
    rows += [(f"policy {k}", v) for k, v in m.policies().items()]
    return _table(None, rows), []
