"""Every reader checks the signature against a trust root that lives
outside the data home. Each attack is made on a copy of one built home and refused through the
real CLI (``read``, ``export``, ``verify``) or the reader the loaders are made from."""

import inspect
import json
import os
import stat
from pathlib import Path

import pytest

from corpus_assets.core.consumption import hf_loader, torch_dataset
from corpus_assets.core.consumption.hf_loader import hf_dataset_of
from corpus_assets.core.consumption.torch_dataset import torch_dataset_of
from corpus_assets.core.consumption.training import TrainingError, TrainingReader, take_permit
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.selftest.attack.signatures import (
    redirect_trust,
    replace_home_keys,
    repoint,
    resign_with_new_key,
    strip_signature,
    without_trust_env,
)
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab

READ = ("--run-id", "trust-run", "--purpose", "selftest")


@pytest.fixture
def lab(selftest_lab: Lab) -> Lab:
    return selftest_lab


def _published(lab: Lab, name: str) -> tuple[Home, str]:
    home, built = lab.copy_of_reference(name)
    home.publish(built.snapshot_id)
    return home, built.snapshot_id


def _one_line_refusal(err: str, reason: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert reason in lines[0], err


def test_read_refuses_a_manifest_resigned_with_another_key(lab: Lab) -> None:
    home, sid = _published(lab, "resigned")
    resign_with_new_key(home, sid)
    read = home.cli("read", sid, *READ)
    assert read.code == 1, read.out
    _one_line_refusal(read.err, "unknown key")
    verify = home.cli("verify", sid)
    assert verify.code == 1 and "unknown key" in verify.err


def test_read_refuses_a_manifest_whose_signature_was_removed(lab: Lab) -> None:
    home, sid = _published(lab, "unsigned")
    strip_signature(home, sid)
    read = home.cli("read", sid, *READ)
    assert read.code == 1, read.out
    _one_line_refusal(read.err, f"unsigned: snapshot {sid}")


def test_every_export_format_refuses_a_resigned_manifest_before_writing(lab: Lab) -> None:
    home, sid = _published(lab, "export-resigned")
    resign_with_new_key(home, sid)
    for fmt in ("megatron", "mds", "croissant"):
        out = home.dir / f"out-{fmt}"
        ran = home.cli("export", fmt, sid, "--out", str(out), *READ)
        assert ran.code == 1, (fmt, ran.out)
        _one_line_refusal(ran.err, "unknown key")
        assert not out.exists(), fmt


def test_the_reader_loaders_are_made_from_refuses_a_pinned_run_after_resigning(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that took its permit before the attack: reopening its reader (what
    ``torch_dataset_of`` and ``hf_dataset_of`` are made from) refuses."""
    home, sid = _published(lab, "pinned-resigned")
    monkeypatch.setenv("CORPUS_TRUST_FILE", str(home.trust_file))
    with workspace(home) as ws:
        permit = take_permit(ws.cas, ws.catalog, sid, "pinned-run", "selftest")
        with TrainingReader(ws.cas, ws.catalog, permit) as reader:
            assert hf_dataset_of(reader).n_shards >= 1  # the untouched snapshot opens
            assert torch_dataset_of(reader, seed=3) is not None
        resign_with_new_key(home, sid)
        with pytest.raises(TrainingError, match=r"manifest signature: unknown key"):
            TrainingReader(ws.cas, ws.catalog, permit)


def test_every_public_loader_takes_a_checked_reader() -> None:
    """A loader of a bare pack digest hands out bytes of a snapshot nobody checked the signature
    of: every public dataset maker of the loader modules must take a ``TrainingReader`` first."""
    makers = {
        f"{module.__name__}.{name}": function
        for module in (hf_loader, torch_dataset)
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if function.__module__ == module.__name__ and not name.startswith("_")
    }
    assert set(makers) == {
        f"{hf_loader.__name__}.hf_dataset_of",
        f"{torch_dataset.__name__}.torch_dataset_of",
    }
    for name, function in makers.items():
        first = next(iter(inspect.signature(function).parameters.values()))
        assert first.name == "reader" and "TrainingReader" in str(first.annotation), name


def test_a_replaced_home_key_pair_fails_verify_and_read(lab: Lab) -> None:
    home, sid = _published(lab, "keys-replaced")
    replace_home_keys(home, sid)
    verify = home.cli("verify", sid)
    assert verify.code == 1 and "unknown key" in verify.err, verify.err
    read = home.cli("read", sid, *READ)
    assert read.code == 1
    _one_line_refusal(read.err, "unknown key")
    listed = json.loads(home.cli("trust", "list", "--json").out)
    assert listed["file"] == str(home.trust_file)
    assert not Path(listed["file"]).resolve().is_relative_to(home.dir / "data")


def test_rotation_keeps_old_snapshots_verifying_and_signs_new_ones_with_the_new_key(
    lab: Lab,
) -> None:
    home, built = lab.copy_of_reference("rotate")
    before = json.loads(home.cli("trust", "list", "--json").out)["keys"]
    rotated = home.cli("trust", "rotate")
    assert rotated.code == 0, rotated.err
    after = json.loads(home.cli("trust", "list", "--json").out)["keys"]
    new = [key for key in after if key["keyid"] not in {k["keyid"] for k in before}]
    assert len(new) == 1 and new[0]["keyid"] in rotated.out
    assert home.cli("verify", built.snapshot_id).code == 0  # signed under the old key id
    keys = home.dir / "data" / "keys"
    assert stat.S_IMODE(os.stat(keys / "snapshot-signing.key.pem").st_mode) == 0o600
    retired = list((keys / "retired").iterdir())
    assert len(retired) == 1 and stat.S_IMODE(os.stat(retired[0]).st_mode) == 0o600
    # a snapshot signed by the new key verifies: rotate pinned it for the alias as well
    envelope = sign_snapshot(keys.parent, built.snapshot_id)
    assert [s["keyid"] for s in envelope["signatures"]] == [new[0]["keyid"]]
    repoint(home, built.snapshot_id, lambda m: m.update(signature=envelope))
    assert home.cli("verify", built.snapshot_id).code == 0


def test_a_config_pointed_at_another_trust_file_cannot_widen_an_alias(lab: Lab) -> None:
    home, sid = _published(lab, "redirected")
    redirect_trust(home, sid)
    verify = without_trust_env(home, "verify", sid)
    assert verify.code == 1 and "never pinned for alias 'train'" in verify.err, verify.err
    read = without_trust_env(home, "read", sid, *READ)
    assert read.code == 1
    _one_line_refusal(read.err, "never pinned for alias 'train'")


def test_a_trust_file_inside_the_data_home_is_refused(lab: Lab) -> None:
    home, built = lab.copy_of_reference("trust-inside")
    inside = home.dir / "data" / "keys" / "trust.json"
    config = home.config.read_text() + f"trust: {{file: {json.dumps(str(inside))}}}\n"
    home.config.write_text(config)
    ran = without_trust_env(home, "verify", built.snapshot_id)
    assert ran.code == 1
    _one_line_refusal(ran.err, "inside the data home")


def test_config_trust_keys_narrow_what_a_reader_accepts(lab: Lab) -> None:
    home, built = lab.copy_of_reference("trust-keys")
    other = "f" * 64
    home.config.write_text(home.config.read_text() + f"trust: {{keys: [{other}]}}\n")
    ran = home.cli("verify", built.snapshot_id)
    assert ran.code == 1 and "unknown key" in ran.err and other in ran.err, ran.err
