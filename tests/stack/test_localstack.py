"""Binding each local vLLM server to its own core: every thread of a real process tree (a
process, its child, threads in both) ends up on the core asked for, and a process that has
exited is an error rather than nothing done."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stack.localstack import StackError, pin_tree, process_tree, threads, tree_threads

TREE = """
import subprocess, sys, threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", ""])
time.sleep(60)
"""


@pytest.fixture
def tree():
    proc = subprocess.Popen([sys.executable, "-c", TREE, "parent", TREE])
    try:
        deadline = time.monotonic() + 30
        while len(pids := process_tree(proc.pid)) < 2 or any(len(threads(p)) < 4 for p in pids):
            assert time.monotonic() < deadline, "the test's process tree did not start"
            time.sleep(0.05)
        yield proc
    finally:
        for p in reversed(process_tree(proc.pid)):
            os.kill(p, 9)
        proc.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("core", sorted(os.sched_getaffinity(0))[:2])
def test_every_thread_of_the_tree_is_bound_to_the_core(tree, core):
    pids = process_tree(tree.pid)
    assert len(pids) == 2 and pids[0] == tree.pid
    tids = tree_threads(tree.pid)
    assert len(tids) == 8  # main thread + 3 in each
    assert pin_tree(tree.pid, core) == 8
    assert {t: os.sched_getaffinity(t) for t in tids} == {t: {core} for t in tids}


def test_an_exited_process_is_an_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_tree(proc.pid) == []
    with pytest.raises(StackError, match=f"process {proc.pid} has exited"):
        pin_tree(proc.pid, 0)


def test_a_start_that_fails_names_the_cause_from_the_childs_log(tmp_path):
    """As when a killed engine's orphans hold its ZMQ port: the cause is in the child's log, not
    in the /health that never answers."""
    from stack.localstack import LocalCpuStack

    stack = LocalCpuStack(tmp_path, 18100)
    fail = (
        "import sys; print('INFO starting engine'); print('zmq.error.ZMQError: Address already in use "
        "(addr=tcp://127.0.0.1:5601)'); print('INFO shutting down'); sys.exit(1)"
    )
    stack._spawn("decode-0", [sys.executable, "-c", fail], dict(os.environ))
    with pytest.raises(StackError) as err:
        stack._wait(["http://127.0.0.1:9/health"], 60)
    said = str(err.value)
    assert "decode-0" in said and "ZMQError: Address already in use (addr=tcp://127.0.0.1:5601)" in said
    assert str(tmp_path / "decode-0.log") in said


def test_every_port_of_a_stack_is_its_own_whatever_core_its_engines_run_on(tmp_path, monkeypatch):
    """Pinned to one core both engines asked for the same NIXL side-channel port; two stacks at
    different base ports share none either."""
    from stack.localstack import ENGINES, LocalCpuStack

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # as under `taskset -c 0`
    used = []
    for base in (18100, 18110):
        stack = LocalCpuStack(tmp_path, base)
        envs = [stack.vllm_command(name, tmp_path)[1] for name in ENGINES]
        assert {e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs} == {"0"}
        nixl = [int(e["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for e in envs]
        assert all(base <= p < base + 10 for p in nixl)
        used += [*stack.ports.values()]
    assert len(used) == len(set(used)), sorted(used)
