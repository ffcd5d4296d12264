"""``corpus-assets`` commands that work on the catalog and CAS directly, without a Dagster run:
inspection (status, show, diff, prov, dedup), the tombstone registry, tokenizer
training and the training read. ``corpus_assets.cli`` parses the command line and dispatches here.
"""

import argparse
import getpass
import json
from dataclasses import asdict
from pathlib import Path

from corpus_assets.cli.common import CliError, cli_actor, opened, print_json
from corpus_assets.core.audit.prov import prov_document
from corpus_assets.core.audit.snapshot_graph import lineage_prov, snapshot_lineage
from corpus_assets.core.consumption.export_run import check_out_folder, export_snapshot
from corpus_assets.core.consumption.training import TrainingReader, take_permit
from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.governance import tombstones
from corpus_assets.core.governance.deletion_reach import tombstone_hits
from corpus_assets.core.publication.shadow import shadow_diff
from corpus_assets.core.publication.verify import load_manifest, resolve, stored_manifest
from corpus_assets.core.runtime.layer_index import LayerOrderError
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.training_view.tokenizer_fit import fit_tokenizer


def cmd_show(args: argparse.Namespace) -> int:
    with opened() as home:
        # as stored, even if malformed
        document = stored_manifest(home.cas, resolve(home.catalog, args.digest))
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    with opened() as home:
        return print_json(shadow_diff(home.cas, home.catalog, args.digest))


def cmd_prov(args: argparse.Namespace) -> int:
    with opened() as home:
        manifest = load_manifest(home.cas, resolve(home.catalog, args.digest))
        freeze = get_json(home.cas, manifest.freeze, "freeze spec")
    return print_json(prov_document(manifest, freeze, agent=f"{getpass.getuser()}@corpus-assets"))


def cmd_lineage(args: argparse.Namespace) -> int:
    with opened() as home:
        graph = snapshot_lineage(home.cas, home.catalog, resolve(home.catalog, args.digest))
    if args.format == "json":
        return print_json(asdict(graph))
    if args.format == "prov":
        return print_json(lineage_prov(graph))
    print(graph.mermaid() if args.format == "mermaid" else graph.text(), end="")
    return 0


def cmd_dedup(args: argparse.Namespace) -> int:
    with opened() as home:
        manifest = load_manifest(home.cas, resolve(home.catalog, args.digest))
        try:
            return print_json(explain(home.cas, manifest, args.record_id))
        except KeyError as error:
            raise CliError(error.args[0]) from None


def cmd_tombstone_add(args: argparse.Namespace) -> int:
    kind, target = next((k, v) for k in ("record", "object", "group") if (v := getattr(args, k)))
    with opened() as home:
        seq = tombstones.add_tombstone(home.catalog, kind, target, args.reason, actor=cli_actor())
    print(f"tombstone {seq}: {kind} {target}; every alias is fenced at tombstone watermark {seq}")
    return 0


def cmd_tombstone_lift(args: argparse.Namespace) -> int:
    with opened() as home:
        seq = tombstones.lift_tombstone(home.catalog, args.seq, args.reason, actor=cli_actor())
    print(tombstones.lift_said(seq, args.seq))
    return 0


def cmd_tombstone_hits(args: argparse.Namespace) -> int:
    """Writes a snapshot's deletion index into the CAS if it has none yet."""
    with opened(writing=True) as home:
        try:
            return print_json(tombstone_hits(home.cas, home.catalog, args.seq))
        except LookupError as error:
            raise CliError(str(error)) from None


def cmd_read(args: argparse.Namespace) -> int:
    with opened() as home:
        permit = take_permit(home.cas, home.catalog, args.digest, args.run_id, args.purpose)
        reader = TrainingReader(home.cas, home.catalog, permit)
        blocks = sum(1 for _ in reader.blocks())
        return print_json({**reader.report(), "blocks": blocks, "resumed": permit.resumed})


def cmd_export(args: argparse.Namespace) -> int:
    """Writes the export's descriptor into the CAS; ``--out`` is checked first."""
    check_out_folder(Path(args.out))
    with opened(writing=True) as home:
        return _export(home.cas, home.catalog, args)


def _export(cas: ContentStore, catalog: Catalog, args: argparse.Namespace) -> int:
    permit = take_permit(cas, catalog, args.digest, args.run_id, args.purpose)
    with TrainingReader(cas, catalog, permit) as reader:
        return print_json(export_snapshot(reader, args.format, Path(args.out)))


DEFAULT_SPECIALS = {"eos": "<|endoftext|>", "pad": "<|pad|>", "bos": None}


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    """Train on the partition's train split, pin the file, print how to use it."""
    with opened(writing=True, config=True) as ws:
        declared = ws.config.policies.tokenizer
        specials = {}
        for name, default in DEFAULT_SPECIALS.items():
            configured = getattr(declared, name) if declared.kind == "huggingface" else None
            specials[name] = getattr(args, name) or configured or default
        tokens = [specials[n] for n in ("eos", "pad", "bos") if specials[n] is not None]
        out = Path(args.out).resolve() if args.out else None
        try:
            fitted = fit_tokenizer(ws, args.partition, args.vocab_size, tokens, out)
        except (LayerOrderError, ValueError) as error:  # FitError, a too small vocab size
            raise CliError(str(error)) from None
    print(
        f"tokenizer {fitted.digest} (byte-level BPE, {fitted.vocab_size} ids, trained on "
        f"{fitted.records} train records of partition {args.partition})"
    )
    if out is not None:
        print(f"written to {out}")
    print("use it in corpus.yaml:")
    print("policies:\n  tokenizer:\n    kind: huggingface")
    print(f"    digest: {fitted.digest}")
    if out is not None:
        print(f"    path: {json.dumps(str(out))}")
    for name in ("bos", "eos", "pad"):
        if specials[name] is not None:
            print(f"    {name}: {json.dumps(specials[name])}")
    return 0
