"""The other writers of the concurrency soak (``python -m tests.soak.concurrency``, docs/soak.md): each runs as a
process of its own beside the streaming job, on the same table, until a stop file appears.

    python -m tests.soak.others appender|deleter|tagger|orphans --home HOME --journal FILE --stop-file FILE

- ``appender``: a pyiceberg writer appending rows with ids of its own (``APPEND_ID_BASE`` upwards), through
  ``Table.append`` (pyiceberg's own commit, with its retries);
- ``deleter``: another engine's merge-on-read ``DELETE``: position delete files (a few rows of a few live data
  files) or an equality delete file (a few ids), in one ``delete`` snapshot (``tests/row_deletes.py``, the way
  Iceberg Java's ``RowDelta`` commits them). Its commit requires ``main`` to be where its plan read it (one swap,
  no rebase): Iceberg Java's RowDelta validates that the data files its position deletes name are still live, and a
  delete planned on a head that moved is planned again from the new head;
- ``tagger``: creates a tag at ``main``'s head (some with a ``max-ref-age-ms`` of their own, so that expiry may
  remove them), now and then moves one to the new head or removes one;
- ``orphans``: ``lakesink remove-orphan-files TABLE --older-than 0 --json`` in a loop (the command line, a new
  process each time).

Every operation is journaled as JSON lines: an ``intent`` before it commits (what it will do) and an ``outcome``
after (``committed`` with the snapshot id and sequence number, or ``failed``), settled by reading the table back
when the commit raised (every snapshot carries ``soak.op`` in its summary). The runner's model counts only
committed operations; an intent without an outcome is settled by the runner from the table it reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: The pyiceberg writer's ids start here (the stream's ids count up from 0).
APPEND_ID_BASE = 1_000_000_000
SUMMARY_OP = "soak.op"
TAG_PREFIX = "soak-tag-"
IDENT = ("soak", "events")
TABLE = "soak.events"


def catalog_properties(home: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{home}/catalog.db", "warehouse": f"file://{home}/warehouse"}


class Journal:
    """Append-only JSON lines; one ``write`` per line, so a reader sees whole lines (a last line without its newline
    is not read)."""

    def __init__(self, path: Path):
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def write(self, **record: Any) -> None:
        record.setdefault("t", time.time())
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()


def read_journal(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8")
    complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    for line in complete.splitlines():
        if line.strip():
            yield json.loads(line)


class Worker:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.home = Path(args.home)
        self.journal = Journal(Path(args.journal))
        self.stop_file = Path(args.stop_file)
        self.rng = random.Random(args.seed)
        self.ops = 0
        self.equality_from = 0.0
        from lakesink.driver import catalogs

        self.catalog = catalogs.load(None, catalog_properties(self.home))

    def say(self, text: str) -> None:
        print(f"{datetime.now():%H:%M:%S} {self.args.role}: {text}", flush=True)

    def stopped(self) -> bool:
        return self.stop_file.exists()

    def table(self) -> Any:
        return self.catalog.load_table(IDENT)

    def pause(self) -> None:
        """Sleep about ``--interval`` seconds (jittered), waking early when the stop file appears."""
        end = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.args.interval
        while time.monotonic() < end and not self.stopped():
            time.sleep(0.1)

    def wait_for_table(self) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        while not self.stopped():
            try:
                if self.table().current_snapshot() is not None:
                    return
            except (NoSuchTableError, NoSuchNamespaceError):
                pass
            time.sleep(0.5)

    def run(self) -> int:
        self.wait_for_table()
        start = time.monotonic() + self.args.start_after
        self.equality_from = start + self.args.equality_after
        while not self.stopped() and time.monotonic() < start:
            time.sleep(0.2)
        while not self.stopped():
            try:
                self.step()
            except Exception:
                # a failed operation is journaled by the step; an error outside one is logged and the loop goes on
                self.say(f"error outside an operation:\n{traceback.format_exc()}")
            self.pause()
        self.say(f"stopped after {self.ops} operation(s)")
        return 0

    def step(self) -> None:
        raise NotImplementedError

    def new_op(self, kind: str) -> str:
        self.ops += 1
        return f"{self.args.role}-{self.args.seed}-{self.ops}"

    def settle(self, op: str) -> tuple[int, int] | None:
        """(snapshot id, sequence number) of the snapshot ``op`` committed, or None: read from the table."""
        for snapshot in self.table().metadata.snapshots:
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if props.get(SUMMARY_OP) == op:
                return snapshot.snapshot_id, snapshot.sequence_number
        return None


class Appender(Worker):
    """A pyiceberg writer: ``Table.append`` of ``--rows`` rows with new ids."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.next_id = APPEND_ID_BASE + args.seed * 100_000_000

    def step(self) -> None:
        import pyarrow as pa

        table = self.table()
        op = self.new_op("append")
        first, count = self.next_id, self.args.rows
        self.next_id += count
        ids = list(range(first, first + count))
        schema = table.schema().as_arrow()
        rows = pa.Table.from_pydict(
            {
                "id": ids,
                "ts": [datetime(2024, 3, 1 + i % 28, i % 24, 15, tzinfo=timezone.utc) for i in ids],
                "user": [f"appender-{i % 13}" for i in ids],
                "amount": [i * 0.25 for i in ids],
                "kind": [i % 5 for i in ids],
            }
        )
        rows = rows.select(schema.names).cast(schema)
        self.journal.write(op=op, kind="append", phase="intent", first=first, count=count)
        error = None
        try:
            table.append(rows, snapshot_properties={SUMMARY_OP: op})
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        self.outcome(op, error)

    def outcome(self, op: str, error: str | None) -> None:
        landed = self.settle(op)
        if landed is None:
            self.journal.write(op=op, phase="outcome", outcome="failed", error=error)
            self.say(f"{op} failed: {error}")
        else:
            self.journal.write(
                op=op, phase="outcome", outcome="committed", snapshot_id=landed[0], sequence=landed[1], error=error
            )


class Deleter(Worker):
    """Merge-on-read deletes of a few rows, committed on exactly the head they were planned on."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.deleted: set[int] = set()  # ids whose delete committed (never chosen again)

    def live_data_files(self, table: Any, head: Any) -> list[Any]:
        from pyiceberg.manifest import ManifestContent

        files: list[Any] = []
        for manifest in head.manifests(table.io):
            if manifest.content == ManifestContent.DATA:
                files.extend(e.data_file for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
        return files

    def step(self) -> None:
        import pyarrow.parquet as pq
        from pyiceberg.exceptions import CommitFailedException

        from tests.support.row_deletes import equality_delete_file, position_delete_files

        equality = self.rng.random() < self.args.equality_share and time.monotonic() >= self.equality_from
        for _attempt in range(self.args.attempts):
            if self.stopped():
                return
            table = self.table()
            head = table.metadata.snapshot_by_name("main")
            files = self.live_data_files(table, head)
            if not files:
                return
            chosen: list[int] = []
            picked = self.rng.sample(files, min(len(files), self.rng.randint(1, 3)))
            for data in picked:
                with table.io.new_input(data.file_path).open() as f:
                    ids = [i for i in pq.read_table(f, columns=["id"]).column("id").to_pylist() if i not in self.deleted]
                chosen += self.rng.sample(ids, min(len(ids), self.rng.randint(1, 4)))
            if not chosen:
                return
            op = self.new_op("delete")
            kind = "equality-delete" if equality else "position-delete"
            self.journal.write(op=op, kind=kind, phase="intent", ids=sorted(chosen), base=head.snapshot_id)
            error = None
            try:
                if equality:
                    deletes = [equality_delete_file(table, "id", sorted(chosen))]
                else:
                    deletes = position_delete_files(table, chosen, only_files={d.file_path for d in picked})
                commit_on_head(table, deletes, op)
            except CommitFailedException as e:
                error = f"{type(e).__name__}: {e}"
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                self.say(f"{op}: {error}")
            landed = self.settle(op)
            if landed is None:
                self.journal.write(op=op, phase="outcome", outcome="failed", error=error)
                continue  # the head moved (or the commit failed): plan again on the new head
            self.deleted.update(chosen)
            self.journal.write(op=op, phase="outcome", outcome="committed", snapshot_id=landed[0], sequence=landed[1])
            return


def commit_on_head(table: Any, delete_files: list[Any], op: str) -> None:
    """One ``delete`` snapshot of ``delete_files`` on ``main``, swapped only if ``main`` is still the head the files were
    planned on (pyiceberg's ``Transaction.commit_transaction`` would rebase it onto a new head without validating
    that the data files its position deletes name are still live)."""
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update import AssertTableUUID

    from tests.support.row_deletes import _RowDelta

    tx = table.transaction()
    producer = _RowDelta(
        operation=Operation.DELETE,
        transaction=tx,
        io=table.io,
        branch="main",
        delete_files=delete_files,
        snapshot_properties={SUMMARY_OP: op},
    )
    updates, requirements = producer._commit()
    table._do_commit(updates=updates, requirements=(*requirements, AssertTableUUID(uuid=table.metadata.table_uuid)))


class Tagger(Worker):
    """Tags on ``main``'s head: created, now and then moved to the new head or removed."""

    def step(self) -> None:
        from lakesink.table.keys import LAST_BATCH_PREFIX

        table = self.table()
        md = table.metadata
        head = md.snapshot_by_name("main")
        if head is None:
            return
        markers = [json.loads(v)["batch-id"] for k, v in md.properties.items() if k.startswith(LAST_BATCH_PREFIX)]
        tags = sorted(
            name for name, ref in md.refs.items() if ref.snapshot_ref_type.value == "tag" and name.startswith(TAG_PREFIX)
        )
        roll = self.rng.random()
        if len(tags) >= self.args.max_tags:  # at most --max-tags (the runner reads every tag at every check)
            roll *= self.args.remove_share + self.args.move_share
        op = self.new_op("tag")
        if tags and roll < self.args.remove_share:
            kind, name = "tag-remove", self.rng.choice(tags)
        elif tags and roll < self.args.remove_share + self.args.move_share:
            kind, name = "tag-move", self.rng.choice(tags)
        else:
            kind, name = "tag-create", f"{TAG_PREFIX}{self.args.seed}-{self.ops}"
        max_age = self.args.tag_max_age_ms if kind == "tag-create" and self.rng.random() < self.args.aging_share else None
        self.journal.write(
            op=op,
            kind=kind,
            phase="intent",
            tag=name,
            snapshot_id=head.snapshot_id,
            sequence=head.sequence_number,
            timestamp_ms=head.timestamp_ms,
            stream_batch=max(markers) if markers else None,
            stream_markers=len(markers),
            max_ref_age_ms=max_age,
        )
        error = None
        try:
            manage = table.manage_snapshots()
            if kind == "tag-remove":
                manage = manage.remove_tag(name)
            else:
                manage = manage.create_tag(head.snapshot_id, name, max_ref_age_ms=max_age)
            manage.commit()
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        # settled from the table (an exception does not prove that nothing landed)
        refs = self.table().metadata.refs
        if kind == "tag-remove":
            ok = name not in refs
        else:
            ok = name in refs and refs[name].snapshot_id == head.snapshot_id
        self.journal.write(op=op, phase="outcome", outcome="committed" if ok else "failed", error=error)
        if error:
            self.say(f"{op} {kind} {name}: {error}")


class Orphans(Worker):
    """``lakesink remove-orphan-files soak.events --older-than 0 --json`` in a loop."""

    def step(self) -> None:
        op = self.new_op("orphans")
        command = [str(Path(sys.executable).parent / "lakesink"), "remove-orphan-files", TABLE, "--older-than", "0", "--json"]
        env = {**os.environ, "LAKESINK_HOME": str(self.home)}
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        record: dict[str, Any] = {"op": op, "kind": "orphans", "phase": "outcome", "exit": done.returncode, "started": started}
        if done.returncode == 0:
            report = json.loads(done.stdout)
            record.update(
                outcome="committed",
                listed=report["listed"],
                removed=[(f["kind"], f["path"].rsplit("/", 1)[-1]) for f in report["removed"]],
                kept_in_flight=report["kept_in_flight_count"],
                failed=report["failed_count"],
            )
        else:
            record.update(outcome="failed", error=done.stderr[-2000:])
            self.say(f"{op}: exit {done.returncode}: {done.stderr[-500:]}")
        self.journal.write(**record)


ROLES = {"appender": Appender, "deleter": Deleter, "tagger": Tagger, "orphans": Orphans}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.soak.others", description=__doc__)
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--home", required=True, help="LAKESINK_HOME of the soak (its SQLite catalog and warehouse)")
    p.add_argument("--journal", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--interval", type=float, default=3.0, help="seconds between operations (jittered)")
    p.add_argument("--start-after", type=float, default=0.0, help="seconds to wait after the table exists")
    p.add_argument("--rows", type=int, default=20, help="appender: rows per append")
    p.add_argument("--attempts", type=int, default=5, help="deleter: plans per delete before it gives up")
    p.add_argument("--equality-share", type=float, default=0.4, help="deleter: share of equality deletes")
    p.add_argument("--equality-after", type=float, default=0.0, help="deleter: seconds after its start before equality deletes")
    p.add_argument("--remove-share", type=float, default=0.15, help="tagger: share of removals")
    p.add_argument("--move-share", type=float, default=0.15, help="tagger: share of moves")
    p.add_argument("--max-tags", type=int, default=8, help="tagger: at most this many tags at a time")
    p.add_argument("--aging-share", type=float, default=0.25, help="tagger: share of new tags with a max-ref-age-ms")
    p.add_argument("--tag-max-age-ms", type=int, default=90_000, help="tagger: the max-ref-age-ms of those tags")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return int(ROLES[args.role](args).run())


if __name__ == "__main__":
    sys.exit(main())
