"""The id index of compressed audit parts: `why` reads the parts that may hold an
id, and never finds less than it would reading every part."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from daemon.audit.files import compress, list_files
from daemon.audit.ids import IdCollector, IdIndex, id_hash, index_path
from daemon.audit.records import AuditRecord, encode_line
from daemon.audit.why import collect, explain
from daemon.audit.writer import AuditWriter
from tests.audit.factory import hook, opened_parts, order, run, ts, wake


def _collected(data: bytes, step: int) -> set[int]:
    ids = IdCollector()
    for i in range(0, len(data), step):
        ids.feed(data[i : i + step])
    ids.close()
    return set(ids.hashes)


def _hashed(*idents: str) -> set[int]:
    return {id_hash(i) for i in idents}


def test_a_parts_ids_are_collected_across_chunks_and_damaged_lines() -> None:
    """Every id a row names (event, trace, run, order ids, and the lists a run row
    carries) whatever the chunking; a damaged line costs its own ids only (the reader
    cannot decode it either); a last line without its newline still counts."""
    rows: list[AuditRecord] = [
        hook(event_id="e1", trace_id="t1"),
        order(client_order_id="mw-1", trace_id="t2"),
        run(run_id="r1", trace_id="t3", event_ids=["e2", "e3"], trace_ids=["t3", "t4"]),
    ]
    data = b"".join(map(encode_line, rows))
    want = _hashed("e1", "t1", "mw-1", "t2", "r1", "t3", "e2", "e3", "t4")
    for step in (1, 7, 100, len(data)):
        assert _collected(data, step) == want, step
    damaged = data + b'{"eventId": "torn", "tr\n' + encode_line(hook(event_id="e9"))[:-1]
    assert _collected(damaged, 64) == want | _hashed("e9")


def test_an_index_answers_for_its_ids_and_only_its_own_part(tmp_path: Path) -> None:
    """A compressed part's index says which ids it may hold; an index that is not the
    part's own (another part's, torn, missing) is not used at all."""
    a, b = tmp_path / "audit-2026-02-16.jsonl", tmp_path / "audit-2026-02-17.jsonl"
    a.write_bytes(
        b"".join(encode_line(hook(event_id=f"a{i}", trace_id=f"ta{i}")) for i in range(50))
    )
    b.write_bytes(encode_line(hook(event_id="b0", trace_id="tb0")))
    gz_a, gz_b = compress(a), compress(b)
    index = IdIndex.of(gz_a)
    assert index is not None
    assert all(index.may_name([f"a{i}"]) and index.may_name([f"ta{i}"]) for i in range(50))
    assert index.may_name(["nope", "a7"])
    assert not any(index.may_name([f"x{i}"]) for i in range(1000))  # (2**32 hashes: no clash)
    index_path(gz_b).write_bytes(index_path(gz_a).read_bytes())  # another part's
    assert IdIndex.of(gz_b) is None
    index_path(gz_a).write_bytes(index_path(gz_a).read_bytes()[:-3])  # torn
    assert IdIndex.of(gz_a) is None
    index_path(gz_a).unlink()
    assert IdIndex.of(gz_a) is None


def _log(tmp_path: Path) -> Path:
    """Three days through the writer: two compressed with their indexes, the last open."""
    w = AuditWriter(tmp_path)
    for day, n in (("2026-02-15", 0), ("2026-02-16", 1), ("2026-02-17", 2)):
        w.write(hook(event_id=f"ev{n}", trace_id=f"tr{n}", decision="WAKE", ts=ts(day)))
        w.write(wake(run_id=f"run{n}", trace_id=f"tr{n}", ts=ts(day, 1)))
        w.write(run(run_id=f"run{n}", trace_id=f"tr{n}", ts=ts(day, 2)))
    w.close()
    assert [index_path(f.path).exists() for f in list_files(tmp_path)] == [True, True, False]
    return tmp_path


def test_why_reads_only_the_parts_that_may_hold_the_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace (no time in it) of the middle day: its compressed part and the open
    one are read, the other compressed part is not; the story is the whole one."""
    opened = opened_parts(monkeypatch)
    exp = explain(collect(_log(tmp_path), "tr1"), "tr1")
    ((story),) = exp.agents
    assert story.outcome == "WOKE" and len(story.records) == 3
    assert "audit-2026-02-15.jsonl.gz" not in opened, opened
    assert "audit-2026-02-16.jsonl.gz" in opened and "audit-2026-02-17.jsonl" in opened
    opened.clear()
    assert not explain(collect(tmp_path, "not-there"), "not-there").found
    assert opened == ["audit-2026-02-17.jsonl"]


def test_without_its_own_index_a_part_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part with no index (compressed by an older version) or another part's index
    is read: the id is found all the same."""
    _log(tmp_path)
    first = tmp_path / "audit-2026-02-15.jsonl.gz"
    index_path(first).unlink()
    opened = opened_parts(monkeypatch)
    assert explain(collect(tmp_path, "tr0"), "tr0").found
    assert "audit-2026-02-15.jsonl.gz" in opened
    second = tmp_path / "audit-2026-02-16.jsonl.gz"
    index_path(first).write_bytes(index_path(second).read_bytes())
    assert IdIndex.of(first) is None
    assert explain(collect(tmp_path, "tr0"), "tr0").found


def test_a_part_appended_to_after_a_cut_compression_is_indexed_again(tmp_path: Path) -> None:
    """A kill between writing a part's index and renaming its .gz leaves the plain part,
    which a restart appends to: its next compression indexes what was added."""
    part = tmp_path / "audit-2026-02-16.jsonl"
    part.write_bytes(encode_line(hook(event_id="early", trace_id="t-early", ts=ts("2026-02-16"))))
    compress(part)
    gz = tmp_path / "audit-2026-02-16.jsonl.gz"
    part.write_bytes(gzip.decompress(gz.read_bytes()))  # as if the rename never happened
    gz.unlink()
    w = AuditWriter(tmp_path)
    w.write(hook(event_id="late", trace_id="t-late", ts=ts("2026-02-16", 5)))  # appended
    w.write(hook(event_id="next", trace_id="t-next", ts=ts("2026-02-17")))  # closes the part
    w.close()
    index = IdIndex.of(gz)
    assert index is not None and index.may_name(["t-late"]) and index.may_name(["t-early"])
    assert explain(collect(tmp_path, "t-late"), "t-late").found


def test_retention_deletes_a_parts_index_with_it_and_counts_it(tmp_path: Path) -> None:
    """The disk bound counts the indexes, deletes one with its part, and removes an
    index whose part is gone (a kill between the two deletes)."""
    (tmp_path / "audit-2026-01-01.ids").write_bytes(b"left over")
    w = AuditWriter(tmp_path, max_days=2)
    for day in ("2026-02-15", "2026-02-16", "2026-02-17"):
        w.write(hook(ts=ts(day)))
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "audit-2026-02-16.ids", "audit-2026-02-16.jsonl.gz", "audit-2026-02-17.jsonl",
    ]  # fmt: skip
    many = tmp_path / "many"
    w = AuditWriter(many, flush_every=1, max_pending=1, max_total_bytes=4000, max_file_bytes=600)
    rows = [hook(event_id=f"event-{i:04d}", trace_id=f"trace-{i:04d}") for i in range(200)]
    for r in rows:
        w.write(r)
    w.close()
    held = sum(p.stat().st_size for p in many.iterdir())
    assert held <= 4000 and w.deleted_files > 0, held  # (checked last as the writer closed)
    assert {index_path(f.path) for f in list_files(many) if f.compressed} == set(many.glob("*.ids"))


def test_a_damaged_rows_ids_are_indexed_and_why_reads_it(tmp_path: Path) -> None:
    """A row whose id lists are not lists (a damaged or foreign row) still has its
    string ids indexed, as the reader still reads it: `why` finds it in a compressed
    part, and a run row with such a list does not stop `why`."""
    bad_hook = {"type": "hook", "ts": ts("2026-02-16"), "agentId": "alpha", "eventId": "e-bad",
                "traceId": "t-bad", "traceIds": 5, "decision": "WAKE"}  # fmt: skip
    bad_run = {"type": "run", "ts": ts("2026-02-16", 1), "agentId": "alpha", "runId": "r-bad",
               "traceId": "t-bad", "traceIds": "t-bad", "eventIds": [7, "e-bad"],
               "status": "finished"}  # fmt: skip
    rows = [
        json.dumps(bad_hook, separators=(",", ":")).encode() + b"\n",
        json.dumps(bad_run, separators=(",", ":")).encode() + b"\n",
        encode_line(hook(event_id="e-ok", trace_id="t-ok", ts=ts("2026-02-16", 2))),
    ]
    part = tmp_path / "audit-2026-02-16.jsonl"
    part.write_bytes(b"".join(rows))
    index = IdIndex.of(compress(part))
    assert index is not None
    assert all(index.may_name([i]) for i in ("e-bad", "t-bad", "r-bad", "e-ok", "t-ok"))
    assert explain(collect(tmp_path, "e-bad"), "e-bad").found
    (story,) = explain(collect(tmp_path, "r-bad"), "r-bad").agents
    assert {r["type"] for r in story.records} == {"hook", "run"}


def test_an_index_that_is_no_plain_file_of_its_size_is_not_read(tmp_path: Path) -> None:
    """A FIFO where the index goes (it would block `why`), a link, or a file bigger
    than its part could make an index: not read; the part is read whole."""
    import os

    part = tmp_path / "audit-2026-02-16.jsonl"
    part.write_bytes(encode_line(hook(event_id="e1", trace_id="t1", ts=ts("2026-02-16"))))
    gz = compress(part)
    index = index_path(gz)
    real = index.read_bytes()
    index.unlink()
    os.mkfifo(index)
    assert IdIndex.of(gz) is None
    assert explain(collect(tmp_path, "e1"), "e1").found
    index.unlink()
    (tmp_path / "elsewhere.ids").write_bytes(real)
    index.symlink_to(tmp_path / "elsewhere.ids")
    assert IdIndex.of(gz) is None
    index.unlink()
    length = len(gzip.decompress(gz.read_bytes()))
    index.write_bytes(real + bytes(4 * length))  # more ids than the part has bytes
    assert IdIndex.of(gz) is None
    index.write_bytes(real)
    assert IdIndex.of(gz) is not None
