"""What each workload measurably holds (issue 37 item 1): NVML's per-process GPU memory, each PID mapped to its
container through /proc/PID/cgroup, plus the container's memory.current — and "not measured" with the reason
wherever a figure cannot be had.

Real readings only: the H200 recording (tests/fixtures/nvidia-h200-gpu-procs.json: allocations of exactly 1 GiB
and 3 GiB, read by the real agent on a real GPU), this machine's own processes and /proc, a real container on the
test bed's Docker engine (slow), and for the unified case the public GB10 figures (gb10-public-process-memory.json,
each with its source)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pynvml
import pytest

from sparkconsole import agent
from sparkconsole.nodes.samples import Tick
from sparkconsole.nodes.workload_memory import NO_PROCS_REASON, workload_memory
from sparkconsole.placement.budget import GB10_MEMTOTAL_B, HOST_PROCESSES, MIN_FREE_B, node_budget, offline_budget

FIX = Path(__file__).parent / "fixtures"
H200 = json.loads((FIX / "nvidia-h200-gpu-procs.json").read_text())
GB10 = json.loads((FIX / "gb10-public-process-memory.json").read_text())
GIB = 1 << 30


class ProcNvml(types.ModuleType):
    """pynvml answering nvmlDeviceGetComputeRunningProcesses from recorded frames ({"pid", "usedGpuMemory"}), the
    rest of NVML as a GB10 answers memory info: NOT_SUPPORTED. `missing`: the call names this driver lacks."""

    def __init__(self, frames: list[list[dict]], missing: tuple[str, ...] = (), code: int | None = None) -> None:
        super().__init__("pynvml")
        for k in dir(pynvml):
            if k.startswith("NVML"):
                setattr(self, k, getattr(pynvml, k))
        self.frames, self.frame, self.missing, self.code = frames, 0, missing, code
        self.asked: list[str] = []

    def _nope(self, *_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def __getattr__(self, name):
        if name.startswith("nvml"):
            return self._nope
        raise AttributeError(name)

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return ("h", i)

    def _procs(self, name):
        def call(h):
            self.asked.append(name)
            if name in self.missing:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if self.code is not None:
                raise pynvml.NVMLError(self.code)
            return [types.SimpleNamespace(pid=p["pid"], usedGpuMemory=p["usedGpuMemory"])
                    for p in self.frames[min(self.frame, len(self.frames) - 1)]]
        return call

    @property
    def nvmlDeviceGetComputeRunningProcesses(self):
        return self._procs("nvmlDeviceGetComputeRunningProcesses")

    @property
    def nvmlDeviceGetComputeRunningProcesses_v2(self):
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2")


def nvml_source(monkeypatch, frames, **kw):
    rec = ProcNvml(frames, **kw)
    monkeypatch.setitem(sys.modules, "pynvml", rec)
    return rec, agent.NvmlSource()


def tick(d: dict) -> Tick:
    return Tick.from_json({"type": "tick", "time": 1.0, **d}, 2.0)


# ---------------------------------------------------------------- the H200 recording: known allocations

def h200_step(name: str) -> dict:
    return next(s for s in H200["steps"] if s["step"] == name)


def test_h200_nvml_per_process_figures_are_the_allocations_plus_the_context():
    ctx = {p["pid"]: p["usedGpuMemory"] for p in h200_step("contexts")["nvml"]}
    one = {p["pid"]: p["usedGpuMemory"] for p in h200_step("a1 +1 GiB")["nvml"]}
    three = {p["pid"]: p["usedGpuMemory"] for p in h200_step("a3 +3 GiB")["nvml"]}
    a1, a3 = (cg["pid"] for cg in H200["cgroups"])
    assert one[a1] - ctx[a1] == GIB and three[a3] - ctx[a3] == 3 * GIB and three[a1] == one[a1]
    # what the kernel charged to each 1 GiB-capped cgroup did not move while 1 and 3 GiB went to the GPU
    cur = {s["step"]: {k: int(v["memory.current"]) for k, v in s["cgroup_memory"].items()}
           for s in H200["steps"] if s.get("cgroup_memory")}
    assert len({c["alloc-3g"] for c in cur.values()}) == 1 and cur["a3 +3 GiB"]["alloc-3g"] < 64 << 20
    assert all("oom_kill 0" in v["memory.events"] for v in h200_step("a3 +3 GiB")["cgroup_memory"].values())


def test_h200_recorded_nvml_read_and_mapped_by_the_agent(monkeypatch, tmp_path):
    """The recorded NVML answers through NvmlSource.processes, mapped through the recorded /proc/PID/cgroup files
    (Docker's cgroup v2 layout, read on the H200) to the containers: each workload's GPU figure is its allocation
    plus its CUDA context, to the byte."""
    frames = [h200_step(s)["nvml"] for s in ("contexts", "a1 +1 GiB", "a3 +3 GiB")]
    rec, src = nvml_source(monkeypatch, frames)
    proc = tmp_path / "proc"
    ids = {}
    for cg in H200["cgroups"]:
        (proc / str(cg["pid"])).mkdir(parents=True)
        (proc / str(cg["pid"]) / "cgroup").write_text(cg["proc_cgroup"])
        (proc / str(cg["pid"]) / "comm").write_text("python3\n")
        ids[cg["id"]] = cg["name"]
    reader = agent.GpuProcsReader(src, str(proc), refresh_s=0.0)
    seen = []
    for i in range(3):
        rec.frame = i
        t = tick({"gpu_procs": reader.reading(ids, []),
                  "cgroups": [{"name": c["name"], "current_b": int(c["files"]["memory.current"])
                               if "files" in c else 34078720, "max_b": 1 << 30} for c in H200["cgroups"]]})
        seen.append({k: w.gpu_b for k, w in workload_memory(t).items()})
    ctx = frames[0][0]["usedGpuMemory"]
    assert seen == [{"alloc-1g": ctx, "alloc-3g": ctx}, {"alloc-1g": ctx + GIB, "alloc-3g": ctx},
                    {"alloc-1g": ctx + GIB, "alloc-3g": ctx + 3 * GIB}]
    assert rec.asked == ["nvmlDeviceGetComputeRunningProcesses"] * 3


def test_h200_agent_lines_replay_through_the_agent(tmp_path):
    """The real agent's ticks from the H200, replayed by the agent process (--gpu-source replay:): the node's own
    mapping comes through, and workload_memory gives each container its GPU figure and its cgroup's usage."""
    lines = H200["agent"]["lines"]
    rec = tmp_path / "h200.jsonl"
    rec.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "sparkconsole.agent", "--count", str(len(lines) - 1), "--interval", "0.01",
                          "--gpu-source", f"replay:{rec}", "--containers", "none"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    ticks = [json.loads(x) for x in out.stdout.splitlines()][1:]
    last = workload_memory(tick({**ticks[-1], "cgroups": lines[-1]["cgroups"]}))
    want = H200["workload_memory"]
    assert {k: (w.gpu_b, w.cgroup_b, w.cap_b) for k, w in last.items()} == \
        {k: (w["gpu_b"], w["cgroup_b"], w["cap_b"]) for k, w in want.items()}
    assert last["alloc-3g"].gpu_b > last["alloc-3g"].cap_b > last["alloc-3g"].cgroup_b
    # the first recorded tick came before the docker poll answered: its PIDs were "unlisted", not guessed
    assert {p["where"] for p in lines[1]["gpu_procs"]["procs"]} == {"unlisted"}


def test_h200_a_process_gone_before_its_mapping_withholds_every_gpu_figure():
    """Recorded for real: a third process was in NVML's list and had ended before the agent mapped it."""
    gone = H200["gone"]
    assert [m.get("where") for m in gone["mapped"]] == [None, None, "gone"]
    t = tick({"gpu_procs": {"read_at": 1.0, "procs": gone["mapped"]}})
    for w in workload_memory(t).values():
        assert w.gpu_b is None and f"GPU process {gone['pid']} ended before it could be mapped" in w.reason


# ---------------------------------------------------------------- the unified case: public GB10 figures

def test_gb10_per_process_memory_reads_although_memory_info_is_not_supported(monkeypatch):
    """vllm-project/vllm pull request 55828 (a GB10, driver 580.95.05): usedGpuMemory moved by exactly the 512 MiB
    allocated, while nvmlDeviceGetMemoryInfo said NOT_SUPPORTED. Those two answers, through the agent."""
    f = GB10["vllm_pr_55828_comment"]
    frames = [[{"pid": 4242, "usedGpuMemory": f["used_gpu_memory_before_b"]}],
              [{"pid": 4242, "usedGpuMemory": f["used_gpu_memory_after_b"]}]]
    rec, src = nvml_source(monkeypatch, frames)
    g = src.sample([])[0]
    assert g["unified"] is True and "mem_total_b" not in g
    before = src.processes([])
    rec.frame = 1
    after = src.processes([])
    assert after[0]["used_b"] - before[0]["used_b"] == f["allocated_b"]


def test_gb10_serving_worker_and_the_node_budget_from_nvtop_511():
    """Syllo/nvtop pull request 511 on a GB10: NVML held 89.276 GiB for a serving vLLM worker while MemTotal −
    MemAvailable read 98.695 GiB of 121.690. The worker is the workload; its container's cgroup figure was not
    published, so that part is "not measured", and the budget left for a second workload is the node's."""
    f = GB10["nvtop_pr_511"]
    used = round(f["serving_vllm_worker"]["nvml_process_gib"] * GIB)
    total_kb = round(f["memtotal_gib"] * 1048576)
    avail_kb = total_kb - round(f["serving_vllm_worker"]["memtotal_minus_memavailable_gib"] * 1048576)
    t = tick({"mem": {"total_kb": total_kb, "available_kb": avail_kb},
              "guards": {"min_free_kbytes": 1572864},
              "gpu_procs": {"read_at": 1.0, "procs": [{"pid": 7, "used_b": used, "container": "vllm_node"}]},
              "cgroups": [{"name": "vllm_node", "reason": "not published"}]})
    w = workload_memory(t)["vllm_node"]
    assert (w.gpu_b, w.cgroup_b, w.total_b) == (used, None, used) and "cgroup: not published" in w.reason
    b = node_budget("spark1", t, 8.0)
    assert b.measured and b.reserve_b == 8 * GIB + 1572864 * 1024
    assert b.free_b == total_kb * 1024 - b.reserve_b - used
    assert 22 * GIB < b.free_b < 23 * GIB and b.unmeasured == (w,)
    # the one being replaced is not counted against itself
    assert node_budget("spark1", t, 8.0, exclude={"vllm_node"}).free_b == total_kb * 1024 - b.reserve_b


def test_in_another_pid_namespace_the_agent_says_it_cannot_map_the_pids(monkeypatch, tmp_path):
    """MiaAI-Lab/sparkDash pull request 10: inside a container the process list came back empty — the driver's PIDs
    are the host's, and that /proc has none of them. An agent whose /proc holds none of NVML's PIDs says so, instead
    of reporting that nothing holds GPU memory; one PID gone among others only withholds that read (above)."""
    assert GB10["sparkdash_pr_10"]["compute_apps_inside_a_container"] == []
    host_pids = [{"pid": 4242, "usedGpuMemory": 89 << 30}, {"pid": 4243, "usedGpuMemory": 1 << 30}]
    _, src = nvml_source(monkeypatch, [host_pids])
    (tmp_path / "proc").mkdir()                       # a container's /proc: none of the host's PIDs
    got = agent.GpuProcsReader(src, str(tmp_path / "proc")).reading({}, [])
    assert "none of the 2 PIDs NVML lists is in" in got["reason"] and "another PID namespace" in got["reason"]
    w = workload_memory(tick({"gpu_procs": got, "cgroups": [{"name": "vllm_node", "current_b": 1}]}))["vllm_node"]
    assert w.gpu_b is None and "another PID namespace" in w.reason
    # an empty list is an empty list: nothing holds GPU memory
    _, src = nvml_source(monkeypatch, [[]])
    assert agent.GpuProcsReader(src, str(tmp_path / "proc")).reading({}, []) == \
        {"read_at": pytest.approx(time.time(), abs=5), "procs": []}


# ---------------------------------------------------------------- bad input: not measured, with the reason

def test_nvml_without_per_process_support(monkeypatch):
    _, src = nvml_source(monkeypatch, [[]], code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert src.processes([]) == "NVML gives no per-process memory on GPU 0 (NOT_SUPPORTED)"
    t = tick({"gpu_procs": agent.GpuProcsReader(src, "/proc").reading({}, []),
              "cgroups": [{"name": "vllm_node", "current_b": 5 << 30}]})
    w = workload_memory(t)["vllm_node"]
    assert (w.gpu_b, w.cgroup_b, w.total_b) == (None, 5 << 30, 5 << 30) and "NOT_SUPPORTED" in w.reason


def test_an_older_driver_is_asked_the_older_call(monkeypatch):
    rec, src = nvml_source(monkeypatch, [[{"pid": 9, "usedGpuMemory": 5}]],
                           missing=("nvmlDeviceGetComputeRunningProcesses",))
    assert src.processes([]) == [{"gpu": 0, "pid": 9, "used_b": 5}]
    assert src.processes([]) == [{"gpu": 0, "pid": 9, "used_b": 5}]
    assert rec.asked == ["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
                         "nvmlDeviceGetComputeRunningProcesses_v2"]
    rec.missing = ("nvmlDeviceGetComputeRunningProcesses_v2",)
    assert "no per-process memory call" in src.processes([])


def test_no_figure_from_nvml_for_a_process(monkeypatch):
    # NVML_VALUE_NOT_AVAILABLE: pynvml hands it back as None (newer) or the raw all-ones value (older)
    _, src = nvml_source(monkeypatch, [[{"pid": 9, "usedGpuMemory": None}, {"pid": 10, "usedGpuMemory": 2**64 - 1}]])
    assert src.processes([]) == [{"gpu": 0, "pid": 9}, {"gpu": 0, "pid": 10}]
    t = tick({"gpu_procs": {"read_at": 1.0, "procs": [{"pid": 9, "container": "a"}]}})
    assert workload_memory(t)["a"].gpu_b is None and "no memory figure for PID 9" in workload_memory(t)["a"].reason


def test_a_container_without_a_cgroup_file_and_an_agent_without_procs():
    t = tick({"cgroups": [{"name": "a", "reason": "no memory cgroup file (a cgroup v1 host without the memory "
                                                  "controller)"}]})
    w = workload_memory(t)["a"]
    assert w.total_b is None and not w.measured
    assert w.reason == f"GPU: {NO_PROCS_REASON}; cgroup: no memory cgroup file (a cgroup v1 host without the memory " \
                       "controller)"


def test_find_cgroup_memory_says_why(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "5").mkdir(parents=True)
    (proc / "5" / "cgroup").write_text("3:cpu:/docker/x\n1:name=systemd:/\n")
    assert agent.find_cgroup_memory(5, str(proc), str(cg)) == \
        (None, "no memory cgroup file (a cgroup v1 host without the memory controller)")
    (proc / "5" / "cgroup").write_text("4:memory:/docker/x\n")
    files, why = agent.find_cgroup_memory(5, str(proc), str(cg))
    assert files is None and "usage file is not under" in why
    assert agent.find_cgroup_memory(6, str(proc), str(cg)) == (None, "its process 6 has no readable /proc/6/cgroup")
    assert agent.read_cgroup_memory({}, {"a": "why"}) == [{"name": "a", "reason": "why"}]


# ---------------------------------------------------------------- PIDs to containers, on real /proc files

CID = "f" * 12 + "0123456789abcdef" * 3 + "0123"


@pytest.mark.parametrize("text", [
    f"0::/system.slice/docker-{CID}.scope\n",                                    # cgroup v2, systemd driver
    f"0::/docker/{CID}\n",                                                       # cgroup v2, cgroupfs driver
    f"12:memory:/docker/{CID}\n11:pids:/docker/{CID}\n0::/\n",                    # cgroup v1, cgroupfs (this test bed)
    f"9:memory:/system.slice/docker-{CID}.scope\n",                              # cgroup v1, systemd driver
    f"0::/docker/{CID}/docker/{'a' * 64}\n",                                     # docker in docker: the outer one
])
def test_container_id_in_every_docker_layout(text):
    assert agent.container_id_in_cgroup(text) == CID


def test_container_id_absent_for_host_processes():
    for text in ("0::/user.slice/user-0.slice/session-1.scope\n", Path("/proc/self/cgroup").read_text(),
                 "0::/system.slice/docker.service\n", "0::/docker/notanid\n"):
        assert agent.container_id_in_cgroup(text) is None


def test_real_processes_of_this_machine_map_to_host_then_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mapper = agent.ProcessMapper("/proc")
        [m] = mapper.map([{"gpu": 0, "pid": child.pid, "used_b": GIB}], {})
        assert m == {"gpu": 0, "pid": child.pid, "used_b": GIB, "comm": "python3", "where": "host"} or \
            m["comm"].startswith("python")
        assert m["where"] == "host"
    finally:
        child.kill()
        child.wait()
    # its PID is in the list NVML gave, but the process has ended: mapped afresh (new container list), it is gone
    assert agent.ProcessMapper("/proc").map([{"gpu": 0, "pid": child.pid, "used_b": GIB}], {}) == \
        [{"gpu": 0, "pid": child.pid, "used_b": GIB, "where": "gone"}]


def test_the_mapping_is_remembered_until_the_container_list_changes(tmp_path):
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    mapper = agent.ProcessMapper(str(proc))
    assert mapper.map([{"pid": 7, "gpu": 0}], {})[0]["where"] == "unlisted"
    assert mapper.map([{"pid": 7, "gpu": 0}], {CID: "vllm_node"})[0]["container"] == "vllm_node"
    os.remove(proc / "7" / "cgroup")       # remembered: not read again while the list is the same
    assert mapper.map([{"pid": 7, "gpu": 0}], {CID: "vllm_node"})[0]["container"] == "vllm_node"
    assert mapper.map([{"pid": 7, "gpu": 0}], {CID: "other"})[0]["where"] == "gone"


# ---------------------------------------------------------------- the budget

def test_budget_counts_host_gpu_processes_and_reports_unmeasured_workloads():
    t = tick({"mem": {"total_kb": 100 * 1048576, "available_kb": 50 * 1048576},
              "gpu_procs": {"read_at": 1.0, "procs": [
                  {"pid": 1, "used_b": 10 * GIB, "container": "a"}, {"pid": 2, "used_b": 3 * GIB, "where": "host"}]},
              "cgroups": [{"name": "a", "current_b": 2 * GIB}, {"name": "b", "reason": "no memory cgroup file"}]})
    b = node_budget("n", t, 4.0)
    assert b.reserve_b == 4 * GIB + MIN_FREE_B       # min_free_kbytes unread: the recommended 1.5 GiB
    assert {w.container: w.total_b for w in b.held} == {"a": 12 * GIB, "b": 0, HOST_PROCESSES: 3 * GIB}
    assert b.free_b == 100 * GIB - b.reserve_b - 15 * GIB and b.available_b == 50 * GIB
    assert [w.container for w in b.unmeasured] == ["b"] and "b: " in b.reason


def test_budget_of_a_node_not_read_is_an_estimate_marked_as_such():
    b = node_budget("n", None, 8.0)
    assert not b.measured and b.total_b == GB10_MEMTOTAL_B and "no reading from the node" in b.reason
    assert b.free_b == GB10_MEMTOTAL_B - 8 * GIB - MIN_FREE_B
    assert offline_budget("n").held == () and offline_budget("n", 64 * GIB).total_b == 64 * GIB
    assert not node_budget("n", tick({}), 8.0).measured
