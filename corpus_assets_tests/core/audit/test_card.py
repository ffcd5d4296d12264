"""``corpus-assets card DIGEST --out DIR``: a static page with matplotlib plots of what a
snapshot is - sources, target vs realised shares, dedup, splits, lengths and padding,
contamination per benchmark, lineage, signature and fences - read through the signed-manifest
door, so a re-signed or edited manifest gets no card. A plot whose inputs, code and matplotlib are
unchanged comes from the plot cache, not drawn again. Built once: the demo, a benchmark holding
one of its records, and the build after it (so contamination has a flagged record to show)."""

import base64
import io
import json
import re
import shutil
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import select

from corpus_assets.core.audit import card_plots
from corpus_assets.core.audit.card import Card, Histogram, load_card
from corpus_assets.core.audit.card_html import SECTIONS, card_html, card_markdown
from corpus_assets.core.audit.card_plots import MEMO, PlotCache, plot_key, render_plots
from corpus_assets.core.publication import trust_root
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, layer_memo
from corpus_assets.selftest.attack.signatures import repoint, resign_with_new_key
from corpus_assets_tests.cli.test_cli_imports import _modules_after
from corpus_assets_tests.cli_process import cli_env, output_field, run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NOT_STORED = "sha256:" + "0" * 64
PLOTS = {
    "shares.png",
    "dedup_s_curve.png",
    "cluster_sizes.png",
    "splits.png",
    "sample_lengths.png",
    "block_padding.png",
    "contamination.png",
    "lineage.png",
}

# a user's settings that would change every plot's pixels
HOSTILE_RCPARAMS = {
    "font.size": 20.0,
    "font.family": ["serif"],
    "axes.facecolor": "red",
    "figure.facecolor": "black",
    "lines.linewidth": 5.0,
    "text.antialiased": False,
    "savefig.transparent": True,
}
HOSTILE_RC = """font.size: 20
font.family: serif
axes.facecolor: red
figure.facecolor: black
lines.linewidth: 5
text.antialiased: False
savefig.transparent: True
"""


@dataclass(frozen=True)
class Built:
    home: Path  # run() 's home: the data home is home/.corpus
    snapshot_id: str
    manifest: dict


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    home = tmp_path_factory.mktemp("card")
    demo = run(home, "demo")
    assert demo.returncode == 0, demo.stderr
    essays = home / ".corpus" / "demo-sources" / "essays" / "essays-00001.jsonl"
    leaked = json.loads(essays.read_text().splitlines()[0])["text"]  # a training record, whole
    items = home / "quiz.jsonl"
    items.write_text(json.dumps({"id": "q1", "text": leaked}) + "\n")
    assert run(home, "benchmark", "add", "quiz", str(items)).returncode == 0
    after = run(home, "build")
    assert after.returncode == 0, after.stderr
    sid = output_field(after.stdout, "snapshotId")
    return Built(home, sid, json.loads(run(home, "show", sid).stdout))


@pytest.fixture
def card(built: Built, monkeypatch: pytest.MonkeyPatch) -> Iterator[Card]:
    """The card loaded in this process, from the same home the CLI processes use."""
    monkeypatch.chdir(built.home)  # the demo config names its data home relative to it
    monkeypatch.setenv("CORPUS_HOME", str(built.home / ".corpus"))
    with open_workspace(built.home / ".corpus" / "corpus.yaml") as ws:
        yield load_card(ws.cas, ws.catalog, built.snapshot_id)


def _section(page: str, anchor: str) -> str:
    return page.split(f'<section id="{anchor}">', 1)[1].split("</section>", 1)[0]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_card_shows_every_section_with_the_manifests_values(built: Built) -> None:
    out = built.home / "card"
    ran = run(built.home, "card", built.snapshot_id, "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"{out / 'index.html'}\n"
    page = (out / "index.html").read_text()
    m = built.manifest
    assert [a for a, _ in SECTIONS] == re.findall(r'<section id="([a-z]+)">', page)
    assert built.snapshot_id in page.split("<section", 1)[0]
    assert f"<td>{m['counts']['members']:,}</td>" in page
    sources = _section(page, "sources")
    assert [s["id"] for s in m["sources"]] == re.findall(r"<tr><td>([a-z]+)</td>", sources)
    shares = _section(page, "shares")
    for row in m["mixture"]:  # target and realised, by documents and by tokens
        shown = (row["target_share"], row["doc_share"], row["token_share"])
        assert "".join(f"<td>{float(s):.2%}</td>" for s in shown) in shares
        assert f"<td>{row['selected_tokens']:,}</td>" in shares
    removed = m["counts"]["duplicates_removed"]
    dedup = _section(page, "dedup")
    assert f"{m['counts']['records']:,} records" in dedup and removed == 4  # 3 exact, 1 near
    assert "3 exact and 1 near duplicates removed" in dedup
    splits = _section(page, "splits")
    assert all(
        f"<td>{split}</td><td>{m['counts'][split]:,}</td>" in splits
        for split in ("train", "validation", "test")
    )
    assert f"{m['counts']['blocks']:,} blocks" in _section(page, "lengths")
    (quiz,) = m["contamination"]["benchmarks"]
    assert quiz["flagged"] == 2  # the record and its exact copy
    assert f"<td>quiz</td><td>{quiz['items']}</td>" in _section(page, "contamination")
    lineage = _section(page, "lineage")
    assert all(ref["digest"] in lineage for ref in m["layers"].values())
    signature = _section(page, "signature")
    assert m["signature"]["signatures"][0]["keyid"] in signature
    assert f"<td>benchmark fence</td><td>{m['benchmarkFence']}</td>" in signature
    assert f"<td>tombstone watermark</td><td>{m['tombstoneWatermark']}</td>" in signature
    images = set(re.findall(r'<img src="([^"]+)"', page))
    assert images == PLOTS and {p.name for p in out.iterdir()} == PLOTS | {"index.html"}
    for name in images:
        data = (out / name).read_bytes()
        width, height = _png_size(data)
        assert width >= 600 and height >= 300 and len(data) > 5000, name
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_the_plots_agree_with_the_counts_and_the_markdown_embeds_them(
    built: Built, card: Card
) -> None:
    packed = built.manifest["counts"]
    assert card.block_padding.values == packed["blocks"]
    assert card.block_padding.total == packed["tokens"] - card.sample_lengths.total
    assert sum(card.sample_lengths.counts) == card.sample_lengths.values
    out = built.home / "card-md"
    assert run(built.home, "card", built.snapshot_id, "--out", str(out)).returncode == 0
    inline = card_markdown(card)
    for name in PLOTS:  # the same bytes in this process as in the CLI's
        data = base64.b64encode((out / name).read_bytes()).decode()
        assert f"![{name[:-4]}](data:image/png;base64,{data})" in inline
    linked = card_markdown(card, image_base="cards/x/")
    assert "![lineage](cards/x/lineage.png)" in linked and "base64" not in linked
    assert f"| snapshotId | {built.snapshot_id} |" in linked

    hostile = replace(
        card, manifest=card.manifest.model_copy(update={"purpose": '<img src=x onerror="a|b">'})
    )
    assert "&lt;img src=x onerror=&quot;a|b&quot;&gt;" in card_html(hostile, PLOTS)
    assert "<img src=x" not in card_html(hostile, PLOTS)
    cell = "| purpose | &lt;img src=x onerror=&quot;a\\|b&quot;&gt; |"  # no raw HTML
    assert cell in card_markdown(hostile, "x")


@pytest.fixture
def cache(tmp_path: Path) -> PlotCache:
    """A store and catalog of the test's own."""
    return PlotCache(ContentStore(tmp_path / "cas"), Catalog(f"sqlite:///{tmp_path / 'c.db'}"))


def test_a_plot_drawn_before_from_the_same_inputs_comes_from_the_cache(
    card: Card, cache: PlotCache
) -> None:
    drawn = render_plots(card)
    assert render_plots(card, cache) == drawn  # cached: the bytes a drawing gives
    assert render_plots(card, cache) == drawn  # and given back
    # the cache is what answers: a stand-in put under a plot's key is what the card shows
    stand_in = PNG_MAGIC + b"stand-in"
    other = PlotCache(cache.cas, Catalog(f"sqlite:///{Path(cache.cas.root).parent / 'o.db'}"))
    key = plot_key("splits.png", card.split_counts)
    other.put(key, stand_in)
    plots = render_plots(card, other)
    assert plots["splits.png"] == stand_in
    assert {n: p for n, p in plots.items() if n != "splits.png"} == {
        n: p for n, p in drawn.items() if n != "splits.png"
    }


def test_a_card_whose_plots_are_all_cached_never_imports_matplotlib(
    card: Card, cache: PlotCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card drawn again (``corpus-assets card``, a re-materialization of the same snapshot)
    comes from the cache: matplotlib's import (~0.4 CPU-s) is paid only where a plot is drawn."""
    drawn = render_plots(card, cache)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` now fails
    assert render_plots(card, cache) == drawn
    moved = replace(card, split_counts={**card.split_counts, "train": 10**6})
    with pytest.raises(ImportError):  # a plot to draw: the guard above is what would stop it
        render_plots(moved, cache)


def test_a_plot_is_drawn_again_when_its_inputs_move_or_its_bytes_are_gone(
    card: Card, cache: PlotCache
) -> None:
    render_plots(card, cache)
    moved = replace(card, split_counts={**card.split_counts, "train": 10**6})
    inputs = {name: inputs_of for name, (inputs_of, _) in card_plots.PLOTS.items()}
    keys = {name: plot_key(name, of(card)) for name, of in inputs.items()}
    changed = {name for name, of in inputs.items() if plot_key(name, of(moved)) != keys[name]}
    assert changed == {"splits.png"}  # only the plot that reads the split counts
    assert render_plots(moved, cache)["splits.png"] == render_plots(moved)["splits.png"]
    assert render_plots(moved)["splits.png"] != render_plots(card)["splits.png"]

    gone = PlotCache(cache.cas, Catalog(f"sqlite:///{Path(cache.cas.root).parent / 'g.db'}"))
    gone.catalog.remember(keys["lineage.png"], MEMO, NOT_STORED, "{}")  # collected by gc
    assert render_plots(card, gone)["lineage.png"] == render_plots(card)["lineage.png"]


def test_a_childs_moved_dedup_counts_leave_its_s_curve_cached(card: Card) -> None:
    """The S-curve is a function of the LSH settings only: a child whose near-dedup counts moved
    (every build over new data) takes it from the cache; the cluster sizes chart is drawn again
    only when the cluster sizes moved."""
    near = card.dedup.near
    assert near is not None
    classes = {
        name: report.model_copy(update={"participants": report.participants + 1})
        for name, report in near.classes.items()
    }
    counted = replace(
        card,
        dedup=card.dedup.model_copy(update={"near": near.model_copy(update={"classes": classes})}),
    )
    inputs = {name: inputs_of for name, (inputs_of, _) in card_plots.PLOTS.items()}
    moved = {n for n, of in inputs.items() if plot_key(n, of(counted)) != plot_key(n, of(card))}
    assert moved == set()
    first = next(iter(classes))
    grown = {**classes[first].cluster_sizes, "2-3": classes[first].cluster_sizes.get("2-3", 0) + 1}
    classes[first] = classes[first].model_copy(update={"cluster_sizes": grown})
    clustered = replace(
        card,
        dedup=card.dedup.model_copy(update={"near": near.model_copy(update={"classes": classes})}),
    )
    moved = {n for n, of in inputs.items() if plot_key(n, of(clustered)) != plot_key(n, of(card))}
    assert moved == {"cluster_sizes.png"}


def test_a_users_rcparams_change_no_plot_and_are_theirs_again_after(card: Card) -> None:
    import matplotlib

    drawn = render_plots(card)
    with matplotlib.rc_context(HOSTILE_RCPARAMS):
        assert render_plots(card) == drawn
        assert {k: matplotlib.rcParams[k] for k in HOSTILE_RCPARAMS} == HOSTILE_RCPARAMS


def test_the_plots_style_is_what_matplotlibs_default_style_sets(card: Card) -> None:
    """``_style`` (one rc_context a card, its dict built once) sets every rcParam as
    ``style.context("default")`` with the card's font size did, from any user's rcParams."""
    import matplotlib
    import matplotlib.style

    def now() -> dict[str, object]:
        return {k: matplotlib.rcParams[k] for k in matplotlib.rcParams if k != "backend"}

    with matplotlib.rc_context(HOSTILE_RCPARAMS):
        with matplotlib.style.context("default"), matplotlib.rc_context({"font.size": 9}):
            expected = now()
        with card_plots._style():
            assert now() == expected
        with card_plots._style():  # the cached dict, again
            assert now() == expected


def test_a_pinned_title_or_label_is_where_matplotlibs_search_puts_it(
    card: Card, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Titles are pinned at the axes' top and empty axis labels anywhere instead of searched
    for (``_pin_layout``): the same pixels, on this card and on one whose counts are large
    enough for the y axes to show an offset text (``1e7``) above them."""
    shape = card.sample_lengths
    large = replace(
        card,
        split_counts={k: v * 10**7 + 3 for k, v in card.split_counts.items()},
        sample_lengths=replace(shape, counts=[c * 10**7 for c in shape.counts]),
    )
    for drawn in (card, large):
        pinned = render_plots(drawn)
        with monkeypatch.context() as patched:
            patched.setattr(card_plots, "_pin_layout", lambda axes: None)
            searched = render_plots(drawn)
        assert {n: _pixels(p) for n, p in pinned.items()} == {
            n: _pixels(p) for n, p in searched.items()
        }


@pytest.mark.parametrize(
    "counts",
    [[0, 2, 15, 15, 9, 0, 1] * 4, [0] * 30, [7], [10**9, 3, 0, 10**7] * 7, list(range(30))],
)
def test_a_histogram_is_the_pixels_of_a_bar_per_bin(counts: list[int]) -> None:
    """Drawn as one filled step outline (``stairs``), a histogram has the pixels its bars had
    (bars: matplotlib's ``bar`` per bin, as the card drew it before)."""
    for width in (1, 7, 683):
        edges = [width * n for n in range(len(counts) + 1)]
        shape = Histogram(edges, counts, sum(counts), 0, 0, 1, 2)
        with card_plots._style():
            steps = card_plots._png(card_plots._histogram(shape, "tokens"))
            figure, axes = card_plots._figure()
            axes.bar(edges[:-1], counts, width, align="edge", color=card_plots.COLOURS[0])
            axes.set_xlabel("tokens")
            axes.set_ylabel("count")
            axes.set_title("tokens: median 1, min 0, max 2")
            assert _pixels(steps) == _pixels(card_plots._png(figure)), (counts, width)


def _pixels(png: bytes) -> bytes:
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB").tobytes()


def test_every_plot_is_drawn_in_one_pass(card: Card) -> None:
    """No layout engine: each figure is rendered once when saved, not first drawn unrendered to
    measure its labels (which doubled a card's drawing)."""
    for name, (inputs_of, draw) in card_plots.PLOTS.items():
        draws: list[object] = []
        with card_plots._style():
            figure = draw(inputs_of(card))
            figure.canvas.mpl_connect("draw_event", draws.append)
            assert card_plots._png(figure).startswith(PNG_MAGIC)
        assert len(draws) == 1, name


def test_an_unchanged_rebuild_draws_only_its_lineage(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build (through Dagster's assets) caches every plot it draws; a build over the same
    sources draws again only the lineage, whose title names the new snapshot."""
    home, demo = _copy(built, "rebuilt", monkeypatch)
    again = run(home, "build")
    assert again.returncode == 0, again.stderr
    sids = (
        built.manifest["parents"][0],
        built.snapshot_id,
        output_field(again.stdout, "snapshotId"),
    )
    with open_workspace(demo.config) as ws:
        keys = [
            {
                name: plot_key(name, of(load_card(ws.cas, ws.catalog, sid)))
                for name, (of, _) in card_plots.PLOTS.items()
            }
            for sid in sids
        ]
        with ws.catalog.begin() as conn:
            memo = conn.execute(select(layer_memo.c.memo_key).where(layer_memo.c.layer == MEMO))
            cached = {row.memo_key for row in memo}
    assert cached == {key for plots in keys for key in plots.values()}
    same = {name for name, key in keys[2].items() if keys[1][name] == key}
    assert same == set(card_plots.PLOTS) - {"lineage.png"}


def test_the_same_snapshot_gives_the_same_bytes(built: Built) -> None:
    """Whatever the user's matplotlibrc: the second card is drawn under one that changes the
    font, the colours, the lines and the saving."""
    first, second = built.home / "same-1", built.home / "same-2"
    rc = built.home / "user" / "matplotlibrc"  # not in the CLI's cwd, which matplotlib reads
    rc.parent.mkdir(exist_ok=True)
    rc.write_text(HOSTILE_RC)
    for out, env in ((first, None), (second, {"MATPLOTLIBRC": str(rc)})):
        ran = run(built.home, "card", built.snapshot_id, "--out", str(out), extra_env=env)
        assert ran.returncode == 0, ran.stderr
    for path in sorted(first.iterdir()):
        data = path.read_bytes()
        assert data == (second / path.name).read_bytes(), path.name
        assert b"matplotlib" not in data  # no version text chunk in a PNG


@dataclass(frozen=True)
class _DemoHome:
    """What the attacks of ``selftest.attack.signatures`` need of a home."""

    config: Path
    trust_file: Path


def _copy(built: Built, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, _DemoHome]:
    home = built.home.parent / f"{built.home.name}-{name}"
    shutil.copytree(built.home / ".corpus", home / ".corpus")
    monkeypatch.chdir(home)
    monkeypatch.setenv("CORPUS_HOME", str(home / ".corpus"))
    trust = trust_root.trust_file(home / ".corpus")  # the session's, as the CLI's
    return home, _DemoHome(home / ".corpus" / "corpus.yaml", trust)


def _refused(home: Path, sid: str, reason: str, env: dict[str, str] | None = None) -> None:
    out = home / "refused-card"
    ran = run(home, "card", sid, "--out", str(out), extra_env=env)
    assert ran.returncode == 1, ran.stdout
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corpus-assets: error: "), ran.stderr
    assert reason in lines[0], ran.stderr
    assert not out.exists()


def test_a_resigned_or_edited_manifest_or_another_trust_root_gets_no_card(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = built.snapshot_id
    home, attacked = _copy(built, "resigned", monkeypatch)
    resign_with_new_key(attacked, sid)  # type: ignore[arg-type]
    _refused(home, sid, "unknown key")

    home, attacked = _copy(built, "edited", monkeypatch)
    repoint(attacked, sid, lambda m: m["counts"].update(members=1))  # type: ignore[arg-type]
    _refused(home, sid, "payload hashes to")

    other = Ed25519PrivateKey.generate().public_key()
    pem = other.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    trust = built.home.parent / f"{built.home.name}-other-trust.json"
    trust_root.add_key(trust, pem, "another operator's")
    _refused(built.home, sid, "unknown key", {trust_root.TRUST_ENV: str(trust)})


def test_an_unknown_digest_or_an_unwritable_out_is_one_line(built: Built, tmp_path: Path) -> None:
    unknown = "sha256:" + "0" * 64
    _refused(built.home, unknown, f"no snapshot with id or manifest digest {unknown}")
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    for out in (blocker, blocker / "card"):
        ran = run(built.home, "card", built.snapshot_id, "--out", str(out))
        assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran.stderr
        assert f"card --out {out}: not a" in ran.stderr
    assert blocker.read_text() == "kept"


def test_the_card_command_takes_the_plots_the_build_drew(built: Built, card: Card) -> None:
    """A built snapshot's card is written from the plots its build drew (re-hashed as read):
    no drawing, no matplotlib, and no pandas (which pyarrow's Parquet reads would import, ~0.25
    CPU-s, for nothing: no command goes with it); the same bytes a drawing gives."""
    out = built.home / "card-cached"
    argv = ["card", built.snapshot_id, "--out", str(out)]
    loaded = _modules_after(argv, built.home, cli_env(built.home), console=True)
    assert "corpus_assets.cli.commands.card" in loaded  # the command ran
    assert not {m for m in loaded if m.split(".")[0] in ("matplotlib", "pandas")}
    assert {n: (out / n).read_bytes() for n in PLOTS} == render_plots(card)


def test_no_other_command_imports_matplotlib(tmp_path: Path) -> None:
    assert not {m for m in _modules_after(["status"], tmp_path) if m.startswith("matplotlib")}
