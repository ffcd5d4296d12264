"""``corpus-assets card DIGEST --out DIR``: the snapshot's dataset card, a static page and its
plots (``core.audit.card``), written into ``DIR``; prints the page's path."""

import argparse
from pathlib import Path

from corpus_assets.cli.common import opened
from corpus_assets.core.audit.card import load_card
from corpus_assets.core.audit.card_html import write_card
from corpus_assets.core.audit.card_plots import PlotCache
from corpus_assets.core.consumption.export_run import check_out_folder


def cmd_card(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    check_out_folder(out, "card")  # before the manifest is read: a refused card writes nothing
    with opened() as home:
        card = load_card(home.cas, home.catalog, args.digest)
        # the plots the build drew (re-hashed as read): no drawing, nor matplotlib's import
        print(write_card(card, out, cache=PlotCache(home.cas, home.catalog, keep=False)))
    return 0
