"""The wall time a claim runner reports: measured by the call that trained, kept by one that only re-reads."""
import json

from sigprop.experiments.outputs import WallClock, finished_points


def add_point(path, point_id):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"id": point_id}) + "\n")


def save_summary(out, wall_s):
    (out / "claim.json").write_text(json.dumps({"summary": {"wall_s": wall_s}, "data": {}}))


def test_a_call_that_trains_reports_its_own_time(tmp_path):
    save_summary(tmp_path, 1234.5)
    clock = WallClock(tmp_path, "claim")
    add_point(tmp_path / "sweeps" / "a" / "sweep.jsonl", "p0")
    assert finished_points(tmp_path) == 1
    assert clock.seconds() != 1234.5


def test_a_call_that_only_rereads_keeps_the_measured_time(tmp_path):
    add_point(tmp_path / "sweeps" / "sweep.jsonl", "p0")
    save_summary(tmp_path, 1234.5)
    assert WallClock(tmp_path, "claim").seconds() == 1234.5


def test_without_an_earlier_summary_the_call_reports_its_own_time(tmp_path):
    add_point(tmp_path / "sweeps" / "sweep.jsonl", "p0")
    assert WallClock(tmp_path, "claim").seconds() >= 0
