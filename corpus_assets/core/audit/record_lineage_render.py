"""Record lineage answers as people read them: plain text for the CLI, Markdown for the UI.

Both forms render the same sections from the same answer (``record_lineage`` or
``span_records``); JSON is the answer itself. Digests are printed whole: they are what a
reader copies into the next command.
"""

from typing import Any

Section = tuple[str, list[str]]


def record_sections(a: dict[str, Any]) -> list[Section]:
    """(heading, lines) of a record answer, in lineage order."""
    origin, canonical = a["origin"], a["canonical"]
    obj = origin["object"]
    sections: list[Section] = [
        ("status", [f"{a['status']}: {a['why']}"]),
        (
            "origin",
            [
                f"source {origin['source_id']}, object {obj['name']} {obj['digest']}",
                f"listed from {obj['location']}, pinned copy {obj['cas_uri']}",
                f"line {origin['line']}, byte offset {origin['byte_offset']}, "
                f"raw line {_facts(origin['raw_line'])}",
            ]
            + ([f"record digest {origin['record_digest']}"] if "record_digest" in origin else []),
        ),
        ("canonical", _canonical(canonical)),
    ]
    if a.get("dedup"):
        sections.append(("dedup", _dedup(a["dedup"])))
    if a.get("split"):
        split = a["split"]
        name = split["split"] or "none (not a member)"
        line = f"{name}; group {split['group_id']}, leakage {split['leakage_id']}"
        sections.append(("split", [line]))
    sections += _consumed(a)
    if "carried_by" in a:
        carried = a["carried_by"]
        samples, spans = _consumed(carried)
        sections.append(("carried", [f"its content reached training as {carried['record_id']}:"]))
        sections += [("  " + samples[0], samples[1]), ("  " + spans[0], spans[1])]
    sections.append(("runs", _runs(a["runs"])))
    return sections


def _facts(raw: dict[str, Any]) -> str:
    if "bytes" in raw:
        return f"{raw['bytes']} bytes {raw['sha256']}"
    return f"a Parquet row with fields {', '.join(raw['fields'])}"


def _canonical(c: dict[str, Any]) -> list[str]:
    lines = []
    if "kind" in c:
        lines.append(f"kind {c['kind']}, adapter {c['adapter']}, script {c['script']}")
    lines.append("stages passed: " + (", ".join(c["stages_passed"]) or "none"))
    if c.get("reason"):
        lines.append(f"excluded at {c['failed_stage']}: {c['reason']} ({c['detail']})")
    if "pii_redacted" in c:
        lines.append(f"PII redacted: {c['pii_redacted'] or 'none'}")
        checked = c["contamination"]["checked_against"]
        lines.append(
            f"contamination ({c['contamination']['policy']}): not flagged; benchmarks "
            f"checked: {', '.join(checked) or 'none registered at the fence'}"
        )
    lines.append("replay: " + _replay(c["replay"]))
    return lines


def _replay(r: dict[str, Any]) -> str:
    if not r.get("replayed"):
        return f"not replayed ({r['why']})"
    if "reason" in r:
        return f"excluded again: {r['reason']} ({r['detail']})"
    if not r.get("reproduced"):
        return (
            f"gives another record {r['record_digest']} (code or policy changed): repairs unknown"
        )
    return f"reproduced the record digest; repairs {r['repairs'] or 'none'}"


def _dedup(d: dict[str, Any]) -> list[str]:
    row = d["record"]
    lines = [f"verdict {row['verdict']}, representative {row['representative_id'] or '-'}"]
    if row.get("match_id"):
        lines.append(f"direct match {row['match_id']} (Jaccard {row['match_jaccard']})")
    if row.get("excluded"):
        lines.append(f"excluded: {row['excluded']}")
    cluster = ", ".join(f"{r['record_id']} ({r['verdict']})" for r in d["cluster"])
    lines.append(f"cluster: {cluster or '-'}")
    group = ", ".join(
        f"{r['record_id']} ({r['split'] or 'no split'})" for r in d["leakage_group"]["records"]
    )
    lines.append(f"leakage group {d['leakage_group']['id']}: {group}")
    return lines


def _consumed(a: dict[str, Any]) -> list[Section]:
    samples = [f"position {s['position']} repeat {s['repeat']}" for s in a["samples"]]
    spans = [_span(s) for s in a["packed"]]
    return [
        ("samples", [f"{len(samples)} sample(s)", *samples]),
        ("packed", [f"{len(spans)} span(s)", *spans]),
    ]


def _span(s: dict[str, Any]) -> str:
    return (
        f"shard {s['shard_index']} {s['shard']} block {s['block']} [{s['start']}, {s['end']}) "
        f"record offset {s['record_offset']} sample {s['sample']} repeat {s['repeat']}"
    )


def _runs(runs: dict[str, Any]) -> list[str]:
    lines = [f"a permit reads {runs['reads']}"]
    for r in runs["permits"]:
        read = f"read it in blocks {r['blocks']}" if r["read_record"] else "did not read it"
        if r.get("read_content_via"):
            read += f"; read its content via {r['read_content_via']} in {r['carried_blocks']}"
        lines.append(f"{r['run_id']} ({r['purpose']}) permit {r['permit_id']}: {read}")
    return lines if runs["permits"] else [*lines, "no training run holds a permit for it"]


def span_sections(a: dict[str, Any]) -> list[Section]:
    """(heading, lines) of a shard/block answer."""
    shard = a["shard"]
    where = f"blocks {a['blocks'][0]}-{a['blocks'][1]}"
    if shard is not None:
        where = f"shard {shard['index']} {shard['digest']}, " + where
    if a["tokens"] is not None:
        where += f", tokens [{a['tokens'][0]}, {a['tokens'][1]})"
    rows = [
        f"block {s['block']} [{s['start']}, {s['end']}) {s['record_id']} offset "
        f"{s['record_offset']} sample {s['sample']} repeat {s['repeat']} <- "
        + (
            f"{s['source_id']} {s['name']} {s['object']} line {s['line']} byte {s['byte_offset']}"
            if s["member"]
            else "not a member"
        )
        for s in a["spans"]
    ]
    return [("range", [where]), ("records", [", ".join(a["records"]) or "none"]), ("spans", rows)]


def text(title: str, sections: list[Section]) -> str:
    """Headings in a left column, one fact per line."""
    lines = [title]
    for heading, body in sections:
        for n, line in enumerate(body or ["-"]):
            lines.append(f"{heading if n == 0 else '':<10} {line}")
    return "\n".join(lines) + "\n"


def markdown(title: str, sections: list[Section]) -> str:
    """A heading per section and a bullet per fact (the UI renders it on the run page)."""
    lines = [f"### {title}"]
    for heading, body in sections:
        lines += ["", f"**{heading}**", ""] + [f"- {_code_digests(line)}" for line in body or ["-"]]
    return "\n".join(lines) + "\n"


def _code_digests(line: str) -> str:
    """Digests in backticks, so Markdown neither wraps nor reinterprets them."""
    return " ".join(f"`{w}`" if w.startswith(("sha256:", "cas://")) else w for w in line.split(" "))


def record_title(a: dict[str, Any]) -> str:
    return f"record {a['record_id']} in snapshot {a['snapshotId']} (partition {a['partition']})"


def span_title(a: dict[str, Any]) -> str:
    return f"packed spans of snapshot {a['snapshotId']} (partition {a['partition']})"
