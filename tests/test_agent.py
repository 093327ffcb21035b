"""The node agent: GPU readings from recorded real NVML / nvidia-smi output, host readings from real /proc,
the sim and replay sources, and the stdin protocol that ends the agent when the console leaves.

The only stand-in is for the GPU itself (none here): `RecordedNvml` answers pynvml calls with the readings an
H100 gave (tests/fixtures/nvidia-h100-probe.json, copied from the shared fixtures), and NOT_SUPPORTED where
the recording has nothing — exactly how the driver answers for a reading it cannot give.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import pynvml
import pytest

from sparkconsole import agent
from sparkconsole.nodes.monitor import BOOTSTRAP, agent_payload
from sparkconsole.nodes.samples import REASON_BITS, GpuSample, Tick

FIX = Path(__file__).parent / "fixtures"
PROBE = json.loads((FIX / "nvidia-h100-probe.json").read_text())
SMI_Q = (FIX / "nvidia-h100-smi-q.txt").read_text()
# the agent run in place, as a node runs it (python3 -m sparkconsole.agent)
AGENT = ("-m", "sparkconsole.agent")
AGENT_DIR = Path(agent.__file__).parent
# The query behind probe.json's "smi_query_output" (19 columns, read off the row against nvidia-smi -q).
PROBE_SMI_FIELDS = (
    "timestamp", "name", "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "clocks.sm",
    "clocks.mem", "clocks.max.sm", "utilization.gpu", "memory.total", "memory.used", "clocks_event_reasons.active",
    "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown", "clocks_event_reasons.hw_thermal_slowdown", "fan.speed", "pstate",
)


def smi_q(label: str, section: str = "") -> float:
    """A number from the recorded `nvidia-smi -q` text (first 'label : N unit' after the section heading)."""
    text = SMI_Q[SMI_Q.index("\n    " + section + "\n"):] if section else SMI_Q
    m = re.search(rf"^\s*{re.escape(label)}\s*:\s*([\d.]+)", text, re.M)
    assert m, label
    return float(m.group(1))


# ---------------------------------------------------------------- nvidia-smi CSV

def test_smi_csv_recorded_h100_matches_smi_q():
    gpus = agent.parse_smi_csv(PROBE["smi_query_output"], PROBE_SMI_FIELDS)
    assert len(gpus) == 1
    g = gpus[0]
    row = [c.strip() for c in PROBE["smi_query_output"].split(",")]
    assert g["name"] == row[1] == re.search(r"Product Name\s*:\s*(.+)", SMI_Q).group(1).strip()
    assert g["mem_total_b"] == smi_q("Total") * 1048576          # FB Memory Usage: Total, same card
    assert g["sm_clock_max_mhz"] == smi_q("SM", "Max Clocks")
    assert g["power_limit_w"] == smi_q("Current Power Limit")
    assert g["unified"] is False
    mask = int(row[12], 16)
    assert g["reasons_mask"] == mask and g["reasons"] == [n for n, b in REASON_BITS.items() if mask & b]
    assert abs(g["temp_c"] - smi_q("GPU Current Temp")) <= 3      # two readings a second apart
    assert GpuSample.from_json(g).power_w == float(row[4])


def test_smi_csv_gb10_style_memory_not_supported_is_unified_and_absent():
    # The same real row as a GB10 answers it: memory "[N/A]" and no power cap (gb10-facts.md).
    row = [c.strip() for c in PROBE["smi_query_output"].split(",")]
    row[5] = "[N/A]"
    row[10] = row[11] = "[N/A]"
    g = agent.parse_smi_csv(", ".join(row) + "\n", PROBE_SMI_FIELDS)[0]
    assert g["unified"] is True
    assert "mem_total_b" not in g and "mem_used_b" not in g and "power_limit_w" not in g
    s = GpuSample.from_json(g)
    assert s.mem_total_b is None and s.power_limit_w is None and s.temp_c == float(row[2])


def test_smi_csv_skips_rows_of_the_wrong_width():
    assert agent.parse_smi_csv("garbage\n0, 1\n", agent.SMI_FIELDS) == []


# ---------------------------------------------------------------- NVML (recorded readings)

class RecordedNvml(types.ModuleType):
    """pynvml as an H100 answered it (probe.json); NOT_SUPPORTED for anything the recording lacks."""

    def __init__(self, frames: list[dict], *, memory: bool = True) -> None:
        super().__init__("pynvml")
        for k in dir(pynvml):
            if k.startswith("NVML"):
                setattr(self, k, getattr(pynvml, k))
        self.frames, self.frame, self.memory = frames, 0, memory
        self.calls: dict[str, int] = {}

    def _nope(self, *_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def __getattr__(self, name):     # every nvml* call the recording has no answer for
        if name.startswith("nvml"):
            return self._nope
        raise AttributeError(name)

    @property
    def f(self) -> dict:
        return self.frames[min(self.frame, len(self.frames) - 1)]

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return ("h", i)
    def nvmlSystemGetDriverVersion(self): return PROBE["driver"]
    def nvmlDeviceGetName(self, h): return re.search(r"Product Name\s*:\s*(.+)", SMI_Q).group(1).strip()

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        names = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "SHUTDOWN", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
                 "SLOWDOWN", pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "GPU_MAX"}
        v = self.f.get(f"NVML_TEMPERATURE_THRESHOLD_{names.get(kind, '?')}")
        return v if isinstance(v, int) else self._nope()

    def nvmlDeviceGetTemperature(self, h, kind): return self.f["temp"]
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.f["reasons"]
    def nvmlDeviceGetPowerUsage(self, h): return self.f["power_mw"]
    def nvmlDeviceGetClockInfo(self, h, kind): return self.f["sm_clock"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.f["util"][0], memory=self.f["util"][1])

    def nvmlDeviceGetMemoryInfo(self, h):
        self._count("mem")
        if not self.memory:
            self._nope()
        total, used, free = self.f["mem"]
        return types.SimpleNamespace(total=total, used=used, free=free)


def _nvml_source(monkeypatch, frames, **kw):
    rec = RecordedNvml(frames, **kw)
    monkeypatch.setitem(sys.modules, "pynvml", rec)
    return rec, agent.NvmlSource()


def test_nvml_recorded_idle_reading(monkeypatch):
    s0 = PROBE["nvml_sample"]
    rec, src = _nvml_source(monkeypatch, [s0])
    errors: list = []
    g = src.sample(errors)[0]
    assert errors == []
    assert g["temp_c"] == s0["temp"] and g["power_w"] == s0["power_mw"] / 1000
    assert g["slowdown_c"] == s0["NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"]
    assert g["shutdown_c"] == s0["NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"]
    assert g["gpu_max_c"] == s0["NVML_TEMPERATURE_THRESHOLD_GPU_MAX"]
    assert g["reasons"] == agent.reasons_from_mask(s0["reasons"]) == ["idle"]
    assert (g["mem_total_b"], g["mem_used_b"]) == tuple(s0["mem"][:2]) and g["unified"] is False
    # Not in the recording = not supported = absent (never a made-up 0).
    for key in ("power_limit_w", "sm_clock_max_mhz", "reason_us"):
        assert key not in g
    assert src.hello()["driver"] == PROBE["driver"]


def test_nvml_recorded_load_shows_power_cap_and_rising_temperature(monkeypatch):
    frames = PROBE["under_load"]
    rec, src = _nvml_source(monkeypatch, frames)
    seen = []
    for i in range(len(frames)):
        rec.frame = i
        seen.append(src.sample([])[0])
    assert [g["temp_c"] for g in seen] == [f["temp"] for f in frames]
    assert seen[0]["reasons"] == ["idle"]
    loaded = [g for g in seen if "sw_power_cap" in g["reasons"]]
    assert len(loaded) == sum(1 for f in frames if f["reasons"] & 0x4) > 0
    assert max(g["temp_c"] for g in loaded) > seen[0]["temp_c"] + 10
    assert max(g["power_w"] for g in loaded) > 500
    tick = Tick.from_json({"type": "tick", "time": 1.0, "gpus": [loaded[-1]]}, 2.0)
    assert tick.gpus[0].reasons == ("sw_power_cap",) and tick.gpus[0].slowdown_margin_c == 89 - loaded[-1]["temp_c"]


def test_nvml_gb10_memory_not_supported_is_unified_and_asked_once(monkeypatch):
    rec, src = _nvml_source(monkeypatch, PROBE["under_load"], memory=False)
    for i in range(3):
        rec.frame = i
        g = src.sample([])[0]
        assert g["unified"] is True and "mem_total_b" not in g and "mem_used_b" not in g
        assert g["temp_c"] == PROBE["under_load"][i]["temp"]
    assert rec.calls["mem"] == 1


# ---------------------------------------------------------------- the agent process

def run_agent(*args: str, env: dict | None = None, timeout: float = 20) -> list[dict]:
    r = subprocess.run([sys.executable, *AGENT, *args], capture_output=True, text=True, timeout=timeout,
                       env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def meminfo_kb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_agent_reads_this_machines_proc():
    lines = run_agent("--count", "5", "--interval", "0.1", "--gpu-source", "none", "--containers", "none")
    hello, ticks = lines[0], lines[1:]
    assert hello["type"] == "hello" and hello["gpu_source"] == "none" and hello["simulated"] is False
    assert hello["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert hello["kernel"] == os.uname().release
    assert [t["seq"] for t in ticks] == [0, 1, 2, 3, 4]
    t = ticks[-1]
    assert t["mem"]["total_kb"] == meminfo_kb("MemTotal")
    assert abs(t["mem"]["available_kb"] - meminfo_kb("MemAvailable")) < 0.1 * meminfo_kb("MemTotal")
    vm = {k: int(Path(f"/proc/sys/vm/{k}").read_text()) for k in ("overcommit_memory", "min_free_kbytes", "swappiness")}
    assert {k: t["guards"][k] for k in vm} == vm
    assert "gpus" not in t           # no GPU source: no GPU readings at all (not zeros)
    # ticks at the asked interval, not the default 0.5 s. One gap can run late on a loaded machine (0.198 s with
    # the suite's vLLM launches on both cores): the middle of four tells the interval
    gaps = sorted(b["time"] - a["time"] for a, b in zip(ticks, ticks[1:], strict=False))
    assert 0.05 <= statistics.median(gaps) < 0.3, gaps


def test_agent_proc_root(tmp_path):
    # A proc tree built from the H100 host's recorded /proc readings, plus one swap file to see the guard input.
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "meminfo").write_text(PROBE["meminfo_head"].rsplit("\n", 1)[0] + "\n")
    (tmp_path / "swaps").write_text(PROBE["swaps"] + "/swapfile                               file\t\t8388604\t\t0\t\t-2\n")
    for k, v in PROBE["vm"].items():
        (tmp_path / "sys" / "vm" / k).write_text(v + "\n")
    t = run_agent("--count", "1", "--proc-root", str(tmp_path), "--gpu-source", "none", "--containers", "none")[1]
    assert t["mem"] == {"total_kb": 131981020, "available_kb": 131456992, "cached_kb": 947512,
                        "swap_total_kb": 0, "swap_free_kb": 0}
    guards = dict(t["guards"])
    assert "pid" not in guards.pop("earlyoom", {})    # no earlyoom among this tree's processes (none at all)
    assert guards == {"swaps": ["/swapfile"], **{k: int(v) for k, v in PROBE["vm"].items()}}
    assert "pressure" not in t       # no pressure file under this root: absent, not zero


def test_agent_without_docker_says_so_once(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}      # nothing on PATH: no docker, no nvidia-smi
    ticks = run_agent("--count", "3", "--interval", "0.05", "--gpu-source", "none", env=env)[1:]
    assert any("docker: not found" in e for e in ticks[0].get("errors", []))
    assert all("errors" not in t and "containers" not in t for t in ticks[1:])


def test_agent_containers_from_a_docker_cli(tmp_path):
    # A `docker` on PATH, as the simulator provides for sim nodes: answers `ps -aq` and `inspect`.
    inspect = {"Id": "abc123", "Name": "/vllm_node", "RestartCount": 2, "Config": {"Image": "vllm-node"},
               "State": {"Status": "running", "StartedAt": "2026-11-22T14:00:00Z", "OOMKilled": False, "ExitCode": 0,
                         "Health": {"Status": "healthy"}}, "HostConfig": {"Memory": 107374182400}}
    shim = tmp_path / "docker"
    shim.write_text("#!/bin/sh\ncase \"$1\" in ps) echo abc123;; inspect) cat %s;; esac\n" % (tmp_path / "i.json"))
    shim.chmod(0o755)
    (tmp_path / "i.json").write_text(json.dumps(inspect) + "\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    ticks = run_agent("--count", "6", "--interval", "0.1", "--container-interval", "10", "--gpu-source", "none",
                      env=env)[1:]
    with_c = [t for t in ticks if "containers" in t]
    assert len(with_c) == 1          # one reading per container interval, not one per tick
    c = Tick.from_json(with_c[0], 0).containers[0]
    assert (c.name, c.image, c.state, c.health, c.restart_count, c.memory_limit_b, c.oom_killed) == \
        ("vllm_node", "vllm-node", "running", "healthy", 2, 107374182400, False)


def test_agent_replay_source_replays_recorded_ticks(tmp_path):
    rec = tmp_path / "agent-rec.jsonl"
    frames = [[{"index": 0, "temp_c": f["temp"], "power_w": f["power_mw"] / 1000}] for f in PROBE["under_load"][:4]]
    rec.write_text("\n".join(json.dumps({"type": "tick", "seq": i, "time": i, "gpus": g}) for i, g in enumerate(frames)))
    lines = run_agent("--count", "6", "--interval", "0.02", "--gpu-source", f"replay:{rec}", "--containers", "none")
    assert lines[0]["gpu_source"] == "replay"
    assert [t["gpus"] for t in lines[1:]] == frames + frames[:2]


def test_agent_sim_source_rereads_its_file(tmp_path):
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"gpus": [{"index": 0, "name": "NVIDIA GB10", "temp_c": 40, "unified": True}],
                               "hello": {"hostname": "spark-sim-1", "driver": "580.95.05"}}))
    proc = subprocess.Popen([sys.executable, *AGENT, "--interval", "0.05", "--gpu-source", f"sim:{sim}",
                             "--containers", "none"], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        hello = json.loads(proc.stdout.readline())
        assert (hello["gpu_source"], hello["simulated"], hello["hostname"]) == ("sim", True, "spark-sim-1")
        assert json.loads(proc.stdout.readline())["gpus"][0]["temp_c"] == 40
        tmp = sim.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": [{"index": 0, "temp_c": 83, "unified": True}]}))
        os.replace(tmp, sim)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if json.loads(proc.stdout.readline())["gpus"][0]["temp_c"] == 83:
                break
        else:
            pytest.fail("the sim file's new reading never came through")
    finally:
        proc.kill()
        proc.wait()


# Each agent module's imports, read by ast in a fresh interpreter: in a worker that has run other tests CPython
# 3.11.7's parser once failed here ("AST constructor recursion depth mismatch"), a state of that process's.
IMPORTS = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            found.append([node.level, node.module or ""])
        elif isinstance(node, ast.Import):
            found += [[0, a.name] for a in node.names]
    out[path] = found
print(json.dumps(out))
"""


def test_the_bootstrap_sends_every_module_of_the_agent_each_after_those_it_imports():
    """A node makes the agent's package from what the console sends, in agent.MODULES' order, with nothing installed:
    every module of the folder is sent, each after the siblings it imports, and none imports beyond the standard
    library (a module left out, sent too early or importing a dependency fails on every node, not here)."""
    sent = list(agent.MODULES)
    assert set(sent) == {p.stem for p in AGENT_DIR.glob("*.py")} - {"__init__", "__main__"}
    header = agent_payload().split(b"\n", 1)[0].split()
    assert [h.split(b":")[0].decode() for h in header[2:]] == sent
    paths = [str(AGENT_DIR / f"{name}.py") for name in sent]
    r = subprocess.run([sys.executable, "-c", IMPORTS, *paths], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    imports = json.loads(r.stdout)
    for i, (name, path) in enumerate(zip(sent, paths, strict=True)):
        for level, module in imports[path]:
            if level:
                assert level == 1 and module in sent[:i], f"{name}.py imports .{module} before it is sent"
            else:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("__future__", "pynvml"), (name, module)


def test_bootstrap_bundles_pynvml_and_ends_on_stdin_eof():
    """The console's way in: a python without pynvml gets the bundled one; closing stdin ends the agent."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None or subprocess.run([py, "-c", "import pynvml"], capture_output=True).returncode == 0:
        pytest.skip("needs a system python3 without pynvml")
    proc = subprocess.Popen([py, "-u", "-c", BOOTSTRAP, "--interval", "0.1", "--gpu-source", "nvml", "--containers",
                             "none"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(agent_payload())
        proc.stdin.flush()
        hello = json.loads(proc.stdout.readline())
        tick = json.loads(proc.stdout.readline())
        assert hello["type"] == "hello" and tick["type"] == "tick"
        # The bundled bindings loaded (no ImportError); only the driver library is missing on this machine.
        assert any(e.startswith("nvml:") and "No module" not in e for e in tick["errors"]), tick["errors"]
        t0 = time.monotonic()
        proc.stdin.close()
        proc.wait(timeout=5)
        assert time.monotonic() - t0 < 3      # on EOF, not on a later signal (the wait above would time out)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_agent_exits_quietly_when_the_console_stops_reading():
    proc = subprocess.Popen([sys.executable, *AGENT, "--interval", "0.02", "--gpu-source", "none",
                             "--containers", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    proc.stdout.readline()
    proc.stdout.close()              # EPIPE on the next write
    proc.wait(timeout=5)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr.read()


# ---------------------------------------------------------------- the agent's own recordings on a real H100

def recorded(name: str) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in (FIX / name).read_text().splitlines()]
    return lines[0], lines[1:]


def test_recorded_h100_load_shows_power_cap_and_rising_temperature():
    hello, ticks = recorded("agent-h100-load.jsonl")
    assert hello["gpu_source"] == "nvml" and hello["gpus"][0]["name"].startswith("NVIDIA H100")
    parsed = [Tick.from_json(t, t["time"]) for t in ticks]
    gpus = [t.gpus[0] for t in parsed]
    capped = [g for g in gpus if "sw_power_cap" in g.reasons]
    assert capped and gpus[0].reasons == ("idle",)
    assert max(g.temp_c for g in capped) >= gpus[0].temp_c + 15
    assert max(g.power_w for g in capped) >= 0.95 * capped[0].power_limit_w
    counters = [g.reason_us["sw_power_cap"] for g in gpus]
    assert counters == sorted(counters) and counters[-1] > 0
    # The agent's counter is the one `nvidia-smi -q` shows (same units), read right after the run.
    smi = (FIX / "nvidia-h100-smi-q-after-load.txt").read_text()
    smi_us = int(re.search(r"SW Power Capping\s*:\s*(\d+) us", smi).group(1))
    assert counters[-1] <= smi_us < counters[-1] + 2_000_000
    # Seconds under the cap per the counter ≈ ticks that saw the reason × interval.
    assert abs(counters[-1] / 1e6 - len(capped) * hello["interval_s"]) < 0.2 * len(capped) * hello["interval_s"] + 1
    for g in gpus:       # everything this H100 reports is there; nothing is unified
        assert None not in (g.temp_c, g.power_w, g.power_limit_w, g.sm_clock_mhz, g.mem_total_b, g.slowdown_c)
        assert g.unified is False


def test_recorded_smi_csv_agrees_with_recorded_nvml():
    nv_hello, nv_idle = recorded("agent-h100-idle.jsonl")
    _, nv_load = recorded("agent-h100-load.jsonl")
    idle = agent.parse_smi_csv((FIX / "nvidia-h100-smi-query-idle.csv").read_text())[0]
    load = agent.parse_smi_csv((FIX / "nvidia-h100-smi-query-load.csv").read_text())[0]
    g0 = nv_idle[-1]["gpus"][0]
    assert idle["name"] == nv_hello["gpus"][0]["name"]
    assert idle["power_limit_w"] == g0["power_limit_w"] and idle["sm_clock_max_mhz"] == g0["sm_clock_max_mhz"]
    assert idle["reasons"] == ["idle"] and load["reasons"] == ["sw_power_cap"]
    assert idle["mem_total_b"] == g0["mem_total_b"]            # MiB from nvidia-smi, bytes from NVML
    loaded = [t["gpus"][0] for t in nv_load if "sw_power_cap" in t["gpus"][0]["reasons"]]
    assert min(x["temp_c"] for x in loaded) - 3 <= load["temp_c"] <= max(x["temp_c"] for x in loaded) + 3
    assert load["util_pct"] >= 90


def test_gb10_replay_is_unified_without_memory_fields():
    lines = run_agent("--count", "40", "--interval", "0.01", "--gpu-source",
                      f"replay:{FIX / 'agent-gb10-replay.jsonl'}", "--containers", "none")
    ticks = [Tick.from_json(t, 0) for t in lines[1:]]
    assert lines[0]["gpu_source"] == "replay"
    for t in ticks:
        g = t.gpus[0]
        assert g.unified and g.mem_total_b is None and g.mem_used_b is None and g.power_limit_w is None
        assert g.temp_c is not None and g.power_w is not None
    assert any("sw_power_cap" in t.gpus[0].reasons for t in ticks)


def test_bundled_pynvml_compiles_on_a_python_without_it():
    """The console's copy of the bindings loads under the node's python (driver check aside: no GPU here)."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None or subprocess.run([py, "-c", "import pynvml"], capture_output=True).returncode == 0:
        pytest.skip("needs a system python3 without pynvml")
    payload = agent_payload()
    header, rest = payload.split(b"\n", 1)
    n_nvml = int(header.split()[0])
    code = ("import sys, ctypes, importlib.util\n"
            "sys._sparkconsole_pynvml = sys.stdin.buffer.read()\n"
            "ctypes.CDLL = lambda *a, **k: None\n"          # only the 'is the driver there' probe
            # the agent's package from its folder, as a node's python has it: no sparkconsole installed
            f"s = importlib.util.spec_from_file_location('scagent', {str(AGENT_DIR / '__init__.py')!r}, "
            f"submodule_search_locations=[{str(AGENT_DIR)!r}])\n"
            "a = importlib.util.module_from_spec(s); sys.modules['scagent'] = a; s.loader.exec_module(a)\n"
            "m = sys.modules['scagent.nvml'].import_pynvml()\n"
            "print(m.NVML_ERROR_NOT_SUPPORTED, callable(m.nvmlDeviceGetFieldValues), m.__file__)\n")
    r = subprocess.run([py, "-c", code], input=rest[:n_nvml], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == [str(pynvml.NVML_ERROR_NOT_SUPPORTED), "True", "pynvml.py"]
