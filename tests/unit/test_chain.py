"""The tamper-evident history: real runs (audits of localhost, a campaign driven with scripted steps) sealed in the
hash chain; editing, deleting or reordering any record is caught and named by `fleetctl report verify`."""

from __future__ import annotations


import pytest

from orchestrator.history import chain
from orchestrator.history.store import Store
from tests.helpers.cli import fleetctl
from tests.helpers.history import tamper


def verify(home, *args):
    proc = fleetctl("report", "verify", *args, home=home)
    return proc.returncode, proc.stdout.strip()


def test_a_valid_chain_passes_and_states_its_head(history):
    code, line = verify(history)
    assert code == 0 and line.startswith("history chain intact:")
    with Store(history / "history.sqlite3") as store:
        head = chain.head(store.db)
        kinds = [r[0] for r in store.db.execute("SELECT kind FROM chain ORDER BY seq")]
    assert head["records"] > 40 and kinds[:3] == ["run", "run", "run"] and "event" in kinds
    assert head["digest"] in line
    assert verify(history, "--head", head["digest"])[0] == 0


@pytest.mark.parametrize("statement, named", [
    ("UPDATE findings SET status='pass' WHERE rowid=(SELECT MIN(rowid) FROM findings WHERE status!='pass')",
     "(run 1): its content changed"),
    ("UPDATE runs SET operator='somebody else' WHERE id=2", "(run 2): its content changed"),
    ("UPDATE campaign_steps SET status='ok', reason=NULL WHERE host='b' AND step='verify'",
     "its content changed"),
    ("UPDATE campaign_events SET data=replace(data, 'verify fail', 'verify ok') WHERE event='step_finished'",
     "its content changed"),
    ("DELETE FROM campaign_events WHERE seq=5", "its rows are gone"),
    ("DELETE FROM host_results WHERE run_id=2", "(run 2): its content changed"),
])
def test_editing_or_deleting_a_recorded_row_is_caught(history, statement, named):
    tamper(history, statement)
    code, line = verify(history)
    assert code == 1 and line.startswith("history chain broken at") and named in line, line


def test_deleting_a_chain_record_is_caught(history):
    tamper(history, "DELETE FROM chain WHERE seq=3")
    assert "record 4" in verify(history)[1] and "deleted" in verify(history)[1]


def test_swapping_two_records_is_caught(history):
    tamper(history, "UPDATE chain SET seq=-1 WHERE seq=2", "UPDATE chain SET seq=2 WHERE seq=3",
           "UPDATE chain SET seq=3 WHERE seq=-1")
    code, line = verify(history)
    assert code == 1 and "record 2" in line and "reordered" in line


def test_dropping_the_newest_records_is_caught_against_an_exported_head(history):
    with Store(history / "history.sqlite3") as store:
        head = chain.head(store.db)
        last = store.db.execute("SELECT ref FROM chain WHERE seq=?", (head["records"],)).fetchone()[0]
    cid, seq = last.split(":")
    tamper(history, f"DELETE FROM chain WHERE seq={head['records']}",
           f"DELETE FROM campaign_events WHERE campaign_id={cid} AND seq={seq}")
    assert verify(history)[0] == 0  # a consistent prefix on its own...
    code, line = verify(history, "--head", head["digest"])
    assert code == 1 and "not at the head given" in line  # ...but not the history the export was made from


def test_a_run_added_behind_fleetctls_back_is_caught(history):
    tamper(history, "INSERT INTO runs (uuid, kind, started_at, finished_at, status, operator, control_node,"
                    " tool_version, argv) VALUES ('x', 'audit', 'now', 'now', 'done', 'me', 'here', '0', '[]')")
    code, line = verify(history)
    assert code == 1 and "not in the chain" in line
