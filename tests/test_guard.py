"""OOM guards: inputs read by the real agent from real proc trees, fixes checked by a real shell parser."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.nodes.guard import KEYS, MIN_FREE_KBYTES, evaluate_guards
from sparkconsole.nodes.samples import ContainerInfo, Tick

PROBE = json.loads((Path(__file__).parent / "fixtures" / "nvidia-h100-probe.json").read_text())


def agent_tick(proc_root: Path) -> Tick:
    r = subprocess.run([sys.executable, "-m", "sparkconsole.agent", "--count", "1", "--proc-root", str(proc_root),
                        "--gpu-source", "none", "--containers", "none"], capture_output=True, text=True, check=True)
    return Tick.from_json(json.loads(r.stdout.splitlines()[1]), 0)


def proc_tree(root: Path, *, meminfo: str, swaps: str, vm: dict[str, str]) -> Path:
    (root / "sys" / "vm").mkdir(parents=True)
    (root / "meminfo").write_text(meminfo)
    (root / "swaps").write_text(swaps)
    for k, v in vm.items():
        (root / "sys" / "vm" / k).write_text(v + "\n")
    return root


def by_key(results):
    assert [r.key for r in results] == list(KEYS)
    return {r.key: r for r in results}


def test_recorded_h100_host_settings(tmp_path):
    # The H100 host's real /proc readings: no swap, overcommit 1, a 66 MiB reserve, little page cache.
    root = proc_tree(tmp_path, meminfo=PROBE["meminfo_head"].rsplit("\n", 1)[0] + "\n", swaps=PROBE["swaps"],
                     vm=PROBE["vm"])
    t = agent_tick(root)
    r = by_key(evaluate_guards(t.guards, t.mem, (), "vllm_node"))
    assert r["swap"].status == "ok"
    assert r["overcommit"].status == "bad" and "never 1" in r["overcommit"].reason
    assert r["overcommit"].fix == "sudo sysctl -w vm.overcommit_memory=0"
    assert r["min_free"].status == "warn" and r["min_free"].fix == f"sudo sysctl -w vm.min_free_kbytes={MIN_FREE_KBYTES}"
    assert r["container_cap"].status == "unknown"
    assert r["page_cache"].status == "ok"
    for res in r.values():
        assert "\n" not in res.reason
        if res.status == "bad":
            assert "freezes the whole machine" in res.reason


def test_swap_on_and_large_page_cache(tmp_path):
    total = 127535104
    root = proc_tree(tmp_path, meminfo=f"MemTotal: {total} kB\nMemAvailable: {total // 2} kB\nCached: {total // 4} kB\n"
                     "SwapTotal: 16777212 kB\nSwapFree: 16777212 kB\n",
                     swaps="Filename\tType\tSize\tUsed\tPriority\n/swap.img  file  16777212  0  -2\n",
                     vm={"overcommit_memory": "0", "min_free_kbytes": str(MIN_FREE_KBYTES), "swappiness": "60"})
    t = agent_tick(root)
    r = by_key(evaluate_guards(t.guards, t.mem, (), "vllm_node"))
    assert r["swap"].status == "bad" and "/swap.img" in r["swap"].reason and "swapoff -a" in r["swap"].fix
    assert r["overcommit"].status == "ok" and r["min_free"].status == "ok"
    assert r["page_cache"].status == "warn" and r["page_cache"].fix == "sync && echo 3 | sudo tee /proc/sys/vm/drop_caches"


def test_swap_fix_comments_out_fstab_swap_lines_only(tmp_path):
    fstab = tmp_path / "fstab"
    fstab.write_text("UUID=1 / ext4 defaults 0 1\n/swap.img\tnone\tswap\tsw\t0\t0\n# /old none swap sw 0 0\n")
    t = agent_tick(proc_tree(tmp_path / "p", meminfo="MemTotal: 1 kB\n", swaps="h\n/swap.img file 1 0 -2\n", vm={}))
    fix = by_key(evaluate_guards(t.guards, t.mem, (), "x"))["swap"].fix
    sed = fix.split("&& ", 1)[1].replace("sudo ", "").replace("/etc/fstab", shlex.quote(str(fstab)))
    subprocess.run(sed, shell=True, check=True)
    assert fstab.read_text() == "UUID=1 / ext4 defaults 0 1\n#/swap.img\tnone\tswap\tsw\t0\t0\n# /old none swap sw 0 0\n"


@pytest.mark.parametrize("limit,status", [(None, "bad"), (0, "bad"), (100 * 2**30, "ok"), (200 * 2**30, "bad")])
def test_container_cap(limit, status):
    from sparkconsole.nodes.samples import HostMemory
    name = "vllm node;rm -rf ~"                # a hostile name must reach the shell as one word
    conts = (ContainerInfo(name="other", memory_limit_b=0), ContainerInfo(name=name, memory_limit_b=limit))
    r = by_key(evaluate_guards(None, HostMemory(total_kb=127535104), conts, name))["container_cap"]
    assert r.status == status
    if status != "ok":
        assert shlex.split(r.fix) == ["docker", "update", "--memory", "100g", "--memory-swap", "100g", name]


def test_nothing_known_is_unknown_not_ok():
    assert {r.status for r in evaluate_guards(None, None, (), "vllm_node")} == {"unknown"}


def test_overcommit_strict_is_a_warning():
    from sparkconsole.nodes.samples import GuardInputs
    r = by_key(evaluate_guards(GuardInputs(swaps=(), overcommit_memory=2, min_free_kbytes=MIN_FREE_KBYTES), None, (),
                               "x"))
    assert r["overcommit"].status == "warn"


@pytest.mark.slow
def test_container_cap_read_from_a_real_docker_engine(docker_engine, testbed_base_image):
    """Real containers on a real engine: the agent's docker reading feeds the cap guard."""
    import os
    mount = ["--mount", "type=bind,source=/usr,target=/usr,readonly"]
    names = {"sc-guard-capped": ["--memory", "64m"], "sc-guard-uncapped": []}
    for name, extra in names.items():
        docker_engine.run(["rm", "-f", name], check=False)
        docker_engine.run(["run", "--detach", "--name", name, "--init", "--network", "host", *extra, *mount,
                           testbed_base_image, "/usr/bin/sleep", "300"])
    try:
        env = {**docker_engine.env(), "PATH": f"{Path(docker_engine.cli).parent}:{os.environ['PATH']}"}
        r = subprocess.run([sys.executable, "-m", "sparkconsole.agent", "--count", "8", "--interval", "0.25", "--gpu-source", "none",
                            "--container-interval", "0.2"], capture_output=True, text=True, env=env, timeout=60,
                           check=True)
        ticks = [Tick.from_json(json.loads(x), 0) for x in r.stdout.splitlines()[1:]]
        conts = next(t.containers for t in reversed(ticks) if t.containers is not None)
        got = {c.name: c for c in conts}
        for name in names:
            truth = docker_engine.inspect(name)
            c = got[name]
            assert (c.state, c.started_at, c.memory_limit_b, c.oom_killed, c.restart_count) == \
                (truth["State"]["Status"], truth["State"]["StartedAt"], truth["HostConfig"]["Memory"],
                 truth["State"]["OOMKilled"], truth["RestartCount"])
        assert got["sc-guard-capped"].memory_limit_b == 64 * 2**20
        mem = ticks[-1].mem
        assert by_key(evaluate_guards(None, mem, conts, "sc-guard-capped"))["container_cap"].status == "ok"
        assert by_key(evaluate_guards(None, mem, conts, "sc-guard-uncapped"))["container_cap"].status == "bad"
    finally:
        for name in names:
            docker_engine.run(["rm", "-f", name], check=False)


# ---------------------------------------------------------------- earlyoom (issue 37 item 3)

def earlyoom_or_skip() -> Path:
    from tests.testbed.cache import TestbedError
    from tests.testbed.earlyoom import earlyoom_binary
    try:
        return earlyoom_binary()
    except (TestbedError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"no earlyoom binary here: {exc}")


def named_process(name: str, mib: int = 0) -> subprocess.Popen:
    """A process that holds `mib` MiB and calls itself `name` (its comm, what earlyoom matches)."""
    code = ("import ctypes, sys, time\n"
            f"ctypes.CDLL(None).prctl(15, ctypes.c_char_p({name.encode()!r}), 0, 0, 0)\n"
            f"b = bytearray({mib} << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
            "print('ready', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def guards_of_this_machine() -> dict:
    t = agent_tick(Path("/proc"))
    return by_key(evaluate_guards(t.guards, t.mem, (), "vllm_node"))


def test_earlyoom_check_reads_a_real_earlyoom(tmp_path):
    """The real earlyoom (--dryrun: it kills nothing), found by the real agent among this machine's processes: with
    the check's own arguments it is ok; without --prefer/--avoid it is a warning carrying the fix; not running, a
    warning too."""
    from sparkconsole.nodes.guard import EARLYOOM_AVOID, EARLYOOM_FIX, EARLYOOM_PREFER
    exe = earlyoom_or_skip()
    before = guards_of_this_machine()["earlyoom"]
    assert before.status == "warn" and before.fix == EARLYOOM_FIX and "not running" in before.reason \
        or "not installed" in before.reason
    for args, status in ((["--prefer", EARLYOOM_PREFER, "--avoid", EARLYOOM_AVOID], "ok"), ([], "warn")):
        eo = subprocess.Popen([str(exe), "--dryrun", "-r", "0", "-M", "1024", *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            r = guards_of_this_machine()["earlyoom"]
        finally:
            eo.kill()
            eo.wait()
        assert r.status == status, r
        if status == "ok":
            assert f"running (PID {eo.pid})" in r.reason and r.fix is None
        else:
            assert "its --prefer does not name vLLM's" in r.reason and r.fix == EARLYOOM_FIX


def test_earlyoom_with_the_fix_s_arguments_picks_vllm_and_spares_the_agent(tmp_path):
    """What the fix configures, run for real (--dryrun, its memory threshold set above what is free here so it
    selects a victim at once): a small process named as vLLM's engine is chosen over a far larger one named as the
    console's agent, and the fix's command line, read by a real shell, gives earlyoom exactly those arguments."""
    from sparkconsole.nodes.guard import EARLYOOM_ARGS, EARLYOOM_FIX
    exe = earlyoom_or_skip()
    eng, ag = named_process("VLLM::EngineCor", 16), named_process("python3-scagent", 512)
    try:
        r = subprocess.run(["timeout", "3", str(exe), "--dryrun", "-r", "1", "-m", "99,98",
                            *shlex.split(EARLYOOM_ARGS)[4:]], capture_output=True, text=True)
        out = r.stdout + r.stderr
    finally:
        for p in (eng, ag):
            p.kill()
            p.wait()
    chosen = [ln for ln in out.splitlines() if ln.startswith("sending SIG") and " to process " in ln]
    assert chosen, out
    # each choice is a process the --prefer names (another vLLM engine on this machine may outrank this one)
    assert all('"VLLM::' in ln or '"vllm"' in ln or '"sglang' in ln for ln in chosen), chosen
    assert not any(f"process {ag.pid} " in ln for ln in chosen)
    # the fix as a shell runs it: the file it writes holds these arguments, word for word
    fix = EARLYOOM_FIX.split(" && ")[1].replace("| sudo tee /etc/default/earlyoom >/dev/null",
                                                f"> {tmp_path / 'default'}")
    subprocess.run(["bash", "-c", fix], check=True)
    words = subprocess.run(["sh", "-c", f'. {tmp_path / "default"}; eval "set -- $EARLYOOM_ARGS"; '
                                        'printf "%s\\n" "$@"'], capture_output=True, text=True).stdout.splitlines()
    assert words == shlex.split(EARLYOOM_ARGS)


def test_earlyoom_unknown_for_an_older_agent_and_its_regexes():
    from sparkconsole.nodes.guard import check_earlyoom
    from sparkconsole.nodes.samples import EarlyOom, GuardInputs
    assert check_earlyoom(GuardInputs()).status == "unknown"
    r = check_earlyoom(GuardInputs(earlyoom=EarlyOom(True, 5, ("--prefer=(^|/)(vllm|VLLM::.*|sglang|sglang::.*)$",
                                                               "--avoid", "(^|/)(sshd)$"))))
    assert r.status == "warn" and "its --avoid does not name sshd, dockerd, python3-scagent" in r.reason
    assert "--prefer" not in r.reason
    r = check_earlyoom(GuardInputs(earlyoom=EarlyOom(True, 5, ("--prefer", "(", "--avoid", "x"))))
    assert r.status == "warn" and "--prefer does not name" in r.reason
