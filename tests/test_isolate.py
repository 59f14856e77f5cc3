"""suite/isolate.py (the one process-isolation helper) and the runner's held third-party
messages. CPU."""
from __future__ import annotations

import io
import json
import logging
import sys
import textwrap
import warnings

import pytest

from suite import isolate, runner
from suite.results import read_rows

FAKE_CHILD = textwrap.dedent("""
    import os, sys
    from suite.isolate import serve

    def handle(job):
        print("chatter from the child", flush=True)
        if job["what"] == "crash":
            os._exit(7)
        if job["what"] == "fatal":
            return {"status": "error", "fatal": True, "pid": os.getpid()}
        if job["what"] == "hang":
            import time
            time.sleep(60)
        return {"status": "ok", "pid": os.getpid(), "n": job["n"]}

    serve(handle)
""")


def test_worker_keeps_one_child_and_replaces_it_after_a_crash_timeout_or_fatal(capsys):
    worker = isolate.Worker([sys.executable, "-c", FAKE_CHILD])
    try:
        first = worker.run({"what": "ok", "n": 1})
        assert first["n"] == 1 and worker.run({"what": "ok", "n": 2})["pid"] == first["pid"]
        crashed = worker.run({"what": "crash", "n": 3})
        assert crashed["status"] == "crashed" and crashed["returncode"] == 7
        assert "exit code 7" in crashed["error"]
        assert worker.run({"what": "ok", "n": 4})["pid"] != first["pid"]
        assert worker.run({"what": "hang", "n": 5}, timeout_s=1)["status"] == "timeout"
        fatal = worker.run({"what": "fatal", "n": 6})
        assert fatal["fatal"] and worker.run({"what": "ok", "n": 7})["pid"] != fatal["pid"]
        before = worker.pid
        worker.close()
        assert worker.pid is None and worker.run({"what": "ok", "n": 8})["pid"] != before
    finally:
        worker.close()
    assert "  | chatter from the child" in capsys.readouterr().out


def test_worker_leaves_no_pipe_of_an_ended_child_open():
    """A child that answered and was closed, and one that crashed: neither leaves its stdin or
    stdout pipe to the garbage collector (a ResourceWarning each, which the bench printed as a
    message from the measured code)."""
    import gc
    import time

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        worker = isolate.Worker([sys.executable, "-c", FAKE_CHILD], echo_prefix="")
        assert worker.run({"what": "ok", "n": 1})["status"] == "ok"
        assert worker.run({"what": "crash", "n": 2})["status"] == "crashed"
        assert worker.run({"what": "ok", "n": 3})["status"] == "ok"
        worker.close()
        time.sleep(0.5)  # the reader threads reach their pipes' end
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, unclosed


def test_exit_text_names_the_signal():
    assert isolate.exit_text(-9) == "child process killed by signal 9"
    assert isolate.exit_text(3) == "child process died (exit code 3)"


def test_serve_answers_each_job_and_stops_after_a_fatal_result():
    jobs = io.StringIO('{"n": 1}\n\n{"n": 2}\n{"n": 3}\n')
    out = io.StringIO()
    with pytest.raises(SystemExit) as stop:
        isolate.serve(lambda job: {"n": job["n"], "fatal": job["n"] == 2}, jobs, out)
    assert stop.value.code == 3
    answers = [json.loads(x[len(isolate.RESULT_TAG):]) for x in out.getvalue().splitlines()]
    assert [a["n"] for a in answers] == [1, 2]


def test_in_process_has_the_workers_interface():
    runs = isolate.InProcess(lambda job: {"status": "ok", "twice": 2 * job["n"]})
    assert runs.run({"n": 3}, timeout_s=1) == {"status": "ok", "twice": 6}
    runs.close()


def test_held_messages_hold_warnings_and_log_records(capsys):
    with runner.held_messages() as held:
        warnings.warn("falling back to triton", UserWarning)
        logging.getLogger("liger_kernel.backends").warning("backend %s not importable", "cute")
        logging.getLogger("quiet").info("below the warning level")
    assert capsys.readouterr().err == ""
    assert sorted(held) == ["UserWarning: falling back to triton",
                            "liger_kernel.backends: backend cute not importable"]
    runner.print_held(held + held[:1])
    out = capsys.readouterr().out
    assert "2 message(s)" in out and "(x2)" in out


def test_run_prints_a_providers_warnings_after_the_bar(temp_providers, tmp_path, capsys):
    from suite.providers.naive import naive

    def noisy(e, c, targets, **kw):
        logging.getLogger("thirdparty").warning("optional backend missing")
        return naive(e, c, targets, **kw)

    name = temp_providers("noisy", noisy)
    cells = runner.preset_cells("smoke", dist=["uniform"], n=[16], d=[8], v=[40], dtype=["fp32"],
                                softcap=[None], ignore_frac=[0.0], bias=[False])
    out = runner.run(cells, [name], ["fwd", "loss"], tmp_path / "run", reps=1, warmup=0,
                     device="cpu", summary=False)
    assert {r["status"] for r in read_rows(out)} == {"ok"}
    captured = capsys.readouterr()
    assert "optional backend missing" not in captured.err
    assert "thirdparty: optional backend missing (x" in captured.out
