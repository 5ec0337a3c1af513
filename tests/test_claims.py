"""Many jobs, one results directory: no lost, torn or duplicated result.

Writers race on real files and processes; a claim on a trial is held by a real process
and dies with it.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import TINY, make_trial

from suite import files, store
from suite.runner import run_one

HOLD = """
import sys, time
from suite import store
with store.claim(sys.argv[1], "t1", 0):
    print("held", flush=True)
    time.sleep(120)
"""


# A job asking for a trial with N repeats, its launcher replaced by a stand-in run of 0.3 s:
# what is tested is how jobs share the store's runs, not the runs.
REPEATS_JOB = """
import sys, time
sys.path.insert(0, sys.argv[3])
from conftest import TINY, make_trial
from suite import launch, runner
from suite.record import Run

def stand_in(t, keep_logs=None, node=None):
    time.sleep(0.3)
    m = {"step_time_s": 1.0 + time.time() % 0.1, "step_time_std_s": 0.01, "peak_mem_gib": 0.1, "noisy": False,
         "tokens_per_step": 512, "model_flops_per_token": 1e6, "hardware_flops_per_token": 1e6}
    return Run("ok", "", m, 0.3)

launch.run_trial = stand_in
t = make_trial(TINY + ["measure.repeats=" + sys.argv[2]])
print(runner.run_one(t, sys.argv[1], "test", in_sweep=True).fresh_runs)
"""


@pytest.mark.slow  # seconds of subprocesses: the full tier
def test_jobs_sharing_a_store_never_run_more_repeats_than_asked(tmp_path):
    here = str(Path(__file__).parent)
    asked = ["3", "5", "3", "5"]
    jobs = [
        subprocess.Popen([sys.executable, "-c", REPEATS_JOB, str(tmp_path), n, here], stdout=subprocess.PIPE, text=True)
        for n in asked
    ]
    fresh = [int(j.communicate(timeout=120)[0].strip()) for j in jobs]
    assert all(j.returncode == 0 for j in jobs)
    rec = store.load(tmp_path, make_trial(TINY).id)
    assert sum(fresh) == len(rec.runs) == rec.n_runs == 5  # the most asked for, each run once
    assert [f.name for f in tmp_path.glob("*.json")] == [f"{rec.trial_id}.json"]


def _write_many(d: str, writer: int) -> None:
    for i in range(30):
        # Half the ids are shared by every writer, half are this writer's own.
        tid = f"shared{i % 5}" if i % 2 else f"w{writer}-{i}"
        files.write_json(store.path_for(d, tid), {"trial_id": tid, "writer": writer, "i": i, "pad": "x" * 20000})


def test_concurrent_writers_leave_one_whole_file_per_trial(tmp_path):
    procs = [multiprocessing.Process(target=_write_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 5 + 4 * 15  # every trial once, none lost
    assert all(json.loads(f.read_text())["pad"] == "x" * 20000 for f in files)  # none torn
    assert not [f for f in tmp_path.iterdir() if f.suffix != ".json"]  # no temp file left


def test_a_claim_is_exclusive_and_dies_with_its_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "CLAIM_SLACK_S", 0.0)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(store.Busy, match=f"trial t1 is still held by pid {holder.pid} on "):
            with store.claim(tmp_path, "t1", 0.5):
                pass
        with store.claim(tmp_path, "t2", 0.5):  # other trials are free
            pass
        holder.send_signal(signal.SIGKILL)  # as `scancel` or a dead node would end it
        holder.wait(timeout=10)
        with store.claim(tmp_path, "t1", 0):  # free at once: a wait of 0 s would raise Busy
            pass
    finally:
        holder.kill()
        holder.wait()


def test_two_jobs_asking_for_one_trial_at_once_measure_it_once(tmp_path):
    """The quick tier's one real DeepSpeed trial (two processes, seconds)."""
    t = make_trial(TINY)
    with ThreadPoolExecutor(2) as pool:
        ran = list(pool.map(lambda _: run_one(t, str(tmp_path), "test", in_sweep=True), range(2)))
    assert [r.record.outcome for r in ran] == ["ok", "ok"]
    assert sorted(r.fresh_runs for r in ran) == [0, 1] and sorted(r.from_store for r in ran) == [False, True]
    assert [f.name for f in tmp_path.glob("*.json")] == [f"{t.id}.json"]
    assert len(list((tmp_path / "logs").glob(f"{t.id}-rank*.log"))) == 2  # one run of its two ranks
