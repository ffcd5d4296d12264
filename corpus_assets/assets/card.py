"""The dataset card on the manifest's materialization: the card's facts and plots as Markdown
the UI renders (plots inline as PNG ``data:`` URIs, which Dagster's Markdown shows), and the
static page ``corpus-assets card`` writes, kept beside the data home (``cards/<hex>/``).

The card is read from the signed manifest only (``core.audit.card``), so it is the same bytes
whenever it is drawn and never goes stale; where the snapshot stands is on its observations.
"""

import dagster as dg

from corpus_assets.core.audit.card import load_card
from corpus_assets.core.audit.card_html import card_markdown, write_card
from corpus_assets.core.audit.card_plots import PlotCache, render_plots
from corpus_assets.core.governance.states import StateError
from corpus_assets.core.publication.signing import SignatureError
from corpus_assets.core.publication.trust_root import TrustRootError
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas import CasError

CARDS = "cards"  # under the data home: one folder per snapshot


def card_metadata(ws: Workspace, digest: str) -> dict[str, dg.MetadataValue]:
    """``card`` (Markdown with the plots) and ``card_page`` (the static page's path); a card
    that cannot be drawn (unsigned, untrusted or damaged manifest) says why in one line and
    leaves the build to the validation check, which names the broken rule."""
    try:
        card = load_card(ws.cas, ws.catalog, digest)
    except (SignatureError, TrustRootError, StateError, CasError) as error:
        return {"card": dg.MetadataValue.md(f"No dataset card: {error}")}
    plots = render_plots(card, PlotCache(ws.cas, ws.catalog))  # an unchanged plot: not drawn
    page = write_card(card, ws.home / CARDS / card.snapshot_id.removeprefix("sha256:"), plots)
    return {
        "card": dg.MetadataValue.md(card_markdown(card, plots=plots)),
        "card_page": dg.MetadataValue.path(str(page)),
    }
