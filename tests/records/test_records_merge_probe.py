"""Merge record identity and the endpoint probe cache."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace

import pytest
from records_samples import DEST, hexd, make_merge_record, make_probe

from ckptflow.errors import InvalidRecord
from ckptflow.jsonio import encode_json
from ckptflow.records import LegacyRecord
from ckptflow.records.merge_record import (
    PROTOCOL,
    MergeRecord,
    parse_merge_record,
    read_merge_record,
    request_identity,
    write_merge_record,
)
from ckptflow.records.probe import (
    ProbeDestination,
    encode_probe_record,
    parse_probe_record,
    probe_cache_dir,
    probe_record_path,
    read_probe_record,
    write_probe_record,
)


def test_expert_order_is_kept_and_is_part_of_the_identity(tmp_path):
    record = make_merge_record(0)
    write_merge_record(tmp_path, record)
    back = read_merge_record(tmp_path)
    assert [e.path for e in back.request.experts] == ["/ckpt/z/model.pt", "relative/a/model.pt"]
    swapped = replace(record.request, experts=tuple(reversed(record.request.experts)))
    assert swapped.identity() != record.request.identity()


def test_request_identity_is_the_sha256_of_the_encoded_request():
    request = make_merge_record(0).request
    assert request_identity(request.to_dict()) == hashlib.sha256(encode_json(request.to_dict())).hexdigest()
    assert request.identity() == make_merge_record(0).request.identity()
    assert request.identity() != make_merge_record(1).request.identity()
    reordered_keys = dict(reversed(list(request.to_dict().items())))
    assert request_identity(reordered_keys) == request.identity()


@pytest.mark.parametrize("tool_version", ["0.0.1-legacy", "99.0", ""])
def test_record_from_any_tool_version_is_readable(tmp_path, tool_version):
    record = replace(make_merge_record(0), tool_version=tool_version)
    write_merge_record(tmp_path, record)
    assert read_merge_record(tmp_path).tool_version == tool_version


@pytest.mark.parametrize("protocol", [None, "ckptflow.merge-complete.v0"], ids=["missing", "older"])
def test_record_from_an_older_tool_raises_legacy_record_naming_force(tmp_path, protocol):
    data = make_merge_record(0).to_dict()
    if protocol is None:
        del data["protocol"]
    else:
        data["protocol"] = protocol
    (tmp_path / ".merge-complete.json").write_bytes(encode_json(data))
    with pytest.raises(
        LegacyRecord, match=r"\.merge-complete\.json.*older tool; rebuild the merge with --force"
    ):
        read_merge_record(tmp_path)


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d["request"].update(experts=[]), "should be non-empty"),
        (lambda d: d["request"].update(mode="ties"), "is not one of ['avg', 'tv']"),
        (lambda d: d["request"]["experts"][0].update(sha256=hexd("G")), "does not match"),
        (lambda d: d.update(diag="../diag.json"), "'..' segment"),
        (lambda d: d.update(diag="/tmp/diag.json"), "is absolute"),
        (lambda d: d["request"].update(lam=True), "is not of type 'number', 'null'"),
        (
            lambda d: d["request"].update(base={"config_sha256": hexd("a")}),
            "'index_sha256' is a required property",
        ),
    ],
    ids=[
        "no_experts",
        "unknown_mode",
        "bad_expert_digest",
        "diag_escapes",
        "diag_absolute",
        "bool_lam",
        "half_base",
    ],
)
def test_bad_merge_record_is_refused_by_name(mutate, problem):
    data = make_merge_record(0).to_dict()
    mutate(data)
    with pytest.raises(InvalidRecord) as info:
        parse_merge_record(encode_json(data), what="`.merge-complete.json` in /out")
    assert problem in str(info.value) and ".merge-complete.json" in str(info.value)


def test_non_finite_lam_is_refused():
    data = make_merge_record(0).to_dict()
    data["request"]["lam"] = math.inf
    with pytest.raises(InvalidRecord, match=r"request\.lam"):
        MergeRecord.from_dict(data)
    assert data["protocol"] == PROTOCOL


def test_probe_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    assert probe_cache_dir() == tmp_path / "cache" / "probes"
    monkeypatch.delenv("CKPTFLOW_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert probe_cache_dir() == tmp_path / "home" / ".cache" / "ckptflow" / "probes"


def test_probe_record_is_keyed_by_scheme_endpoint_and_bucket():
    base = probe_record_path(DEST)
    assert base == probe_record_path(ProbeDestination.of(DEST)) == probe_record_path({**DEST, "prefix": "p"})
    for key, value in [("scheme", "gs"), ("endpoint", "other:1"), ("bucket", "other")]:
        assert probe_record_path({**DEST, key: value}) != base


def test_absent_probe_record_reads_as_none_and_written_one_reads_back():
    assert read_probe_record(DEST) is None
    path = write_probe_record(make_probe(0))
    assert path == probe_record_path(DEST)
    assert read_probe_record(DEST) == make_probe(0)
    assert read_probe_record({**DEST, "bucket": "elsewhere"}) is None


def test_corrupt_probe_record_is_refused_not_treated_as_absent():
    path = probe_record_path(DEST)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"protocol": "ckptflow.probe.v1", "passed": tr')
    with pytest.raises(InvalidRecord, match=path.name):
        read_probe_record(DEST)


def test_probe_record_copied_under_another_destination_is_refused():
    write_probe_record(make_probe(0))
    other = {**DEST, "bucket": "other"}
    probe_record_path(other).write_bytes(probe_record_path(DEST).read_bytes())
    with pytest.raises(InvalidRecord, match=r"different destination"):
        read_probe_record(other)


@pytest.mark.parametrize(
    "results",
    [
        {"create_once_refused_second_write": False},
        {"concurrent_winners": 2},
        {"concurrent_winners": 0},
        {"concurrent_creators": 1},
        {"sha256_metadata_roundtrip": False},
        {"checksum_sha256": "accepted-wrong"},
    ],
    ids=[
        "overwrite_accepted",
        "two_winners",
        "no_winner",
        "no_race",
        "metadata_lost",
        "wrong_checksum_accepted",
    ],
)
def test_probe_record_claiming_pass_against_its_results_is_refused(results):
    record = make_probe(0)
    failing = replace(record, results=replace(record.results, **results))
    assert not failing.results.qualifies
    with pytest.raises(InvalidRecord, match=r"says passed but its results do not qualify"):
        write_probe_record(failing)
    write_probe_record(replace(failing, passed=False))
    assert read_probe_record(DEST).passed is False


def test_more_winners_than_creators_is_refused():
    record = make_probe(0)
    bad = replace(
        record, passed=False, results=replace(record.results, concurrent_creators=2, concurrent_winners=3)
    )
    with pytest.raises(InvalidRecord, match=r"3 concurrent winners among 2 creators"):
        write_probe_record(bad)


def test_probe_results_qualify_when_create_once_is_enforced_whether_or_not_checksums_are_offered():
    assert make_probe(0).results.checksum_sha256 == "rejected-wrong" and make_probe(0).results.qualifies
    assert make_probe(1).results.checksum_sha256 == "not-offered" and make_probe(1).results.qualifies


def test_part_checksum_result_is_optional_and_checked_when_present():
    enforced, older = make_probe(0), make_probe(1)
    assert encode_probe_record(older).count(b"part_checksum_sha256") == 0
    assert parse_probe_record(encode_probe_record(older)).results.part_checksum_sha256 is None
    data = json.loads(encode_probe_record(enforced))
    assert data["results"]["part_checksum_sha256"] == "enforced"
    data["results"]["part_checksum_sha256"] = "maybe"
    with pytest.raises(InvalidRecord, match="part_checksum_sha256"):
        parse_probe_record(json.dumps(data).encode())
