"""Every call that removes, truncates or replaces bytes is registered with its proof and the test that shows it.

The calls are found from the code (tests/helpers/destructive.py, ast); the registry is
tests/destructive_calls.txt; the documentation's registry page is generated from the registry.
"""

from __future__ import annotations

import ast
import re

from helpers.destructive import (
    REGISTRY,
    REPO,
    Site,
    classify,
    find_sites,
    read_registry,
)

REGISTER = (
    "add an entry to tests/destructive_calls.txt (file :: function :: call xN, then what/proof/test/by), "
    "then run `make docs-pages`"
)


def _calls(source: str) -> list[str | None]:
    return [classify(node) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]


def test_the_finder_sees_every_kind_of_destructive_call():
    source = """
import os, shutil
os.unlink(a); os.remove(a); p.unlink(); os.rmdir(d); p.rmdir(); shutil.rmtree(d)
os.rename(a, b); os.replace(a, b); p.rename(b); p.replace(b); shutil.move(a, b); shutil.copyfile(a, b)
os.truncate(a, 0); os.ftruncate(fd, 0); fh.truncate(); p.write_text(t); p.write_bytes(b)
open(a, "w"); open(a, mode="wb"); p.open("w"); os.open(a, os.O_WRONLY | os.O_TRUNC)
client.abort_multipart_upload(Bucket=b, Key=k, UploadId=u); client.delete_object(Bucket=b, Key=k)
store.delete(k)
"""
    found = _calls(source)
    assert None not in found, found
    assert len(found) == 24


def test_the_finder_counts_every_store_write_as_a_replacement():
    source = """
client.put_object(Bucket=b, Key=k, Body=d); client.copy_object(Bucket=b, Key=k, CopySource=s)
client.complete_multipart_upload(Bucket=b, Key=k, UploadId=u); client.upload_file(p, b, k); client.upload_fileobj(f, b, k)
store._call("PUT", k, client.put_object, Body=d); store._call("CompleteMultipartUpload", k, client.complete_multipart_upload)
requests.Request("PUT", url, data=d); session.request("POST", url)
store.put_file(k, p, digest=d); store.put_files(files); store.put_bytes_create_once(k, d, sha256=h)
store.put_bytes_wrong_checksum(k, d)
"""
    found = _calls(source)
    assert None not in found, found
    assert found.count("put_object") == 2 and found.count("complete_multipart_upload") == 2
    assert {"http PUT", "http POST", "put_file", "put_files", "put_bytes_create_once"} <= set(found)
    # A part is invisible until its upload is completed; a read or a wrapper of reads is no write.
    assert _calls('client.upload_part(Bucket=b, Key=k); store._call("GET", k, client.get_object); '
                  'requests.Request("GET", url)') == [None] * 3


def test_the_finder_ignores_calls_that_keep_bytes():
    source = """
import dataclasses, os
s.replace("a", "b"); dataclasses.replace(r, x=1); t.replace(tzinfo=None); items.remove(x)
open(a); open(a, "rb"); p.open(); os.open(a, os.O_RDONLY); os.open(a, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
shutil.copyfileobj(a, b)
"""
    assert _calls(source) == [None] * 10


def test_every_destructive_call_is_registered_with_its_count():
    found = find_sites()
    registered = {entry.site: entry.count for entry in read_registry()}
    unregistered = sorted(f"{s.file} :: {s.function} :: {s.call} x{n}" for s, n in found.items()
                          if registered.get(s) != n)
    stale = sorted(f"{s.file} :: {s.function} :: {s.call} x{n}" for s, n in registered.items()
                   if found.get(s) != n)
    assert not unregistered and not stale, (
        f"destructive calls in the code without a matching registry entry: {unregistered}; "
        f"registry entries that match no call: {stale}. Remedy: {REGISTER}"
    )


_TEST_ID = re.compile(r"^(?P<file>tests/\S+\.py)::(?P<name>\w+)$")


def test_every_entry_names_what_it_removes_its_proof_who_reaches_it_and_an_existing_test():
    for entry in read_registry():
        site = f"{entry.site.file} :: {entry.site.function}"
        assert entry.what and entry.proof and entry.by, f"{site}: what, proof and by are all required"
        assert entry.tests, f"{site}: name at least one test that shows the proof holds"
        for test in entry.tests:
            match = _TEST_ID.match(test)
            assert match, f"{site}: {test!r} is not tests/<file>.py::<test_name>"
            path = REPO / match["file"]
            assert path.is_file(), f"{site}: {match['file']} does not exist"
            assert re.search(rf"^\s*(async )?def {match['name']}\(", path.read_text(encoding="utf-8"), re.M), (
                f"{site}: {match['file']} has no test {match['name']}"
            )


def test_registry_sites_are_unique():
    sites = [entry.site for entry in read_registry()]
    assert len(sites) == len(set(sites)), [s for s in sites if sites.count(s) > 1]
    assert all(isinstance(s, Site) for s in sites)


def test_registry_page_is_generated_from_the_registry():
    from helpers import docs_pages

    page = REPO / "docs" / "reference" / "destructive-calls.md"

    assert page.read_text(encoding="utf-8") == docs_pages.destructive_calls_page(), (
        f"{page.relative_to(REPO)} differs from {REGISTRY.name}: run `make docs-pages`")
