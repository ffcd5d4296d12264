"""``corpus-assets trust list|add|rotate``: the readers' trust root (``publication.trust_root``),
the one file outside the data home that says which signing keys count. Keys enter it only here,
when the builder creates a home's key pair, or from ``CORPUS_SIGNING_KEY``; nothing removes one,
so a snapshot keeps verifying under the key id that signed it. ``add`` and ``rotate`` also pin
the key for every alias of the catalog (an alias accepts only the keys its catalog pins)."""

import argparse
import json
from pathlib import Path

from sqlalchemy import select

from corpus_assets.cli.common import CliError, opened
from corpus_assets.core.publication import trust_root
from corpus_assets.core.publication.signing import public_key_of, rotate_key
from corpus_assets.core.storage.catalog import Catalog, snapshots


def cmd_trust_list(args: argparse.Namespace) -> int:
    with opened() as opened_home:
        return _list(args, opened_home.home, opened_home.catalog)


def _list(args: argparse.Namespace, home: Path, catalog: Catalog) -> int:
    path = trust_root.trust_file(home)
    keys = [entry.model_dump(exclude={"public_pem"}) for entry in trust_root.load(path).keys]
    public = public_key_of(home)
    current = trust_root.keyid_of(public.read_bytes()) if public.is_file() else None
    trusted = current is not None and any(entry["keyid"] == current for entry in keys)
    pins = {alias: sorted(trust_root.pinned(catalog, alias)) for alias in _aliases(catalog)}
    report = {
        "file": str(path),
        "keys": keys,
        "home_key": current,
        "home_key_trusted": trusted,
        "alias_keys": pins,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"trust file {path}")
    for entry in keys:
        print(f"  {entry['keyid']}  {entry['origin']}")
    state = "trusted" if trusted else "NOT trusted: readers refuse what it signs"
    print(f"this home signs with {current or 'no key yet'}" + (f" ({state})" if current else ""))
    for alias, pinned in pins.items():
        print(f"alias {alias}: the catalog pins {', '.join(pinned) or 'nothing yet'}")
    return 0


def _aliases(catalog: Catalog) -> list[str]:
    with catalog.begin() as conn:
        return sorted(set(conn.scalars(select(snapshots.c.alias).distinct())))


def cmd_trust_add(args: argparse.Namespace) -> int:
    with opened() as home:
        source = Path(args.public_key).resolve()
        try:
            pem = source.read_bytes()
        except OSError as error:
            raise CliError(f"{source}: cannot read the public key ({error.strerror})") from None
        trust = trust_root.trust_file(home.home)
        keyid, new = trust_root.add_key(trust, pem, f"added from {source}")
        pinned = trust_root.pin(home.catalog, keyid, f"corpus-assets trust add {source}")
    print(f"{'trusted' if new else 'already trusted'}: {keyid}")
    print(f"pinned for aliases: {', '.join(pinned) or 'none new'}")
    return 0


def cmd_trust_rotate(_args: argparse.Namespace) -> int:
    with opened() as home:
        old, new = rotate_key(home.home)
        trust_root.pin(home.catalog, new, f"corpus-assets trust rotate from {old}")
        path = trust_root.trust_file(home.home)
    print(f"rotated: new snapshots are signed by {new}; {old} stays trusted in {path}")
    return 0
