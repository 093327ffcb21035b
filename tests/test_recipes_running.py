"""The launches the console finds on the nodes (their containers' labels) and what r does with one that is
not whole yet: a 2x-solo's router starts after its servers, and its labels say which router it is."""

from __future__ import annotations

from sparkconsole.nodes.launches import SERVING, STARTING, launch_groups
from sparkconsole.nodes.samples import ContainerInfo, NodeState
from sparkconsole.tui.screens.confirm import ConfirmScreen
from tests.helpers import wait_for
from tests.screen import screen_text
from tests.test_tui_app import SIZE, make_app, recording, state_dir  # noqa: F401  (fixtures)


def labelled(name: str, node: str, role: str, url: str, router: str | None = None) -> ContainerInfo:
    labels = {"recipe": "gpt-oss-120b", "topology": "2x-solo", "role": role, "node": node, "url": url}
    if router:
        labels["router"] = router
    return ContainerInfo(name=name, state="running",
                         labels=tuple((f"sparkconsole.{k}", v) for k, v in labels.items()))


SERVERS = {"spark1": (labelled("vllm_node", "spark1", "server", "http://127.0.0.1:8000"),),
           "spark2": (labelled("vllm_node", "spark2", "server", "http://127.0.0.1:8000"),)}
ROUTER = labelled("sc_router", "spark1", "router", "http://127.0.0.1:4000", "simple-shuffle")


class Node:
    def __init__(self, name: str, containers) -> None:
        self.name, self.containers = name, containers


def test_a_routed_launch_without_its_router_is_starting():
    (g,) = launch_groups([Node(n, cs) for n, cs in SERVERS.items()])
    assert (g.verdict, g.reason, g.router) == (STARTING, "its router is not running yet", None)
    (g,) = launch_groups([Node("spark1", (*SERVERS["spark1"], ROUTER)), Node("spark2", SERVERS["spark2"])])
    assert (g.verdict, g.router, len(g.members)) == (SERVING, "simple-shuffle", 3)


def test_a_launch_one_node_does_not_list_yet_is_starting_not_serving():
    """Each node's agent lists its containers every few seconds: right after a 2x-solo launch the head may list its
    server and router while the other node's list is older. That launch is not whole: SERVING would let r plan it
    on the one node listed (found by CI: "2x-solo runs on two nodes, 1 named")."""
    (g,) = launch_groups([Node("spark1", (*SERVERS["spark1"], ROUTER)), Node("spark2", ())])
    assert (g.verdict, g.reason) == (STARTING, "1 of its 2 servers listed (the other is starting, or was removed)")
    head = labelled("vllm_node", "spark1", "server", "http://127.0.0.1:8000")
    tp = [Node("spark1", (ContainerInfo(name=head.name, state="running", labels=tuple(
        (k, "cluster-tp2" if k.endswith(".topology") else v) for k, v in head.labels)),)), Node("spark2", ())]
    (g,) = launch_groups(tp)
    assert (g.verdict, g.reason) == (STARTING, "its worker is not listed (starting, or removed)")


def rank(node: str, role: str, ranks: int | None) -> ContainerInfo:
    labels = {"recipe": "tiny", "topology": "cluster-tp2", "role": role, "node": node}
    if role == "server":
        labels["url"] = "http://127.0.0.1:8000"
    if ranks is not None:
        labels["ranks"] = str(ranks)
    return ContainerInfo(name="vllm_node", state="running",
                         labels=tuple((f"sparkconsole.{k}", v) for k, v in labels.items()))


def test_a_cluster_launch_is_judged_on_every_rank_its_labels_count():
    """A TP 4 launch whose nodes list its head and two of its three workers does not serve: the `ranks` label
    says how many there are (it read SERVING on the head and one worker). A launch from before the label is
    judged as before, on one worker."""
    four = [Node(f"spark{i}", (rank(f"spark{i}", "server" if i == 1 else "worker", 4),)) for i in range(1, 5)]
    (g,) = launch_groups(four)
    assert (g.verdict, g.reason) == (SERVING, "")
    (g,) = launch_groups(four[:3])
    assert (g.verdict, g.reason) == (STARTING, "2 of its 3 workers listed (the other is starting, or was removed)")
    (g,) = launch_groups(four[:2])
    assert (g.verdict, g.reason) == (STARTING, "1 of its 3 workers listed (the others are starting, or were removed)")
    unsaid = [Node(f"spark{i}", (rank(f"spark{i}", "server" if i == 1 else "worker", None),)) for i in (1, 2)]
    (g,) = launch_groups(unsaid)
    assert (g.verdict, g.reason) == (SERVING, "")


async def test_r_waits_for_the_router_that_says_how_to_take_a_server_out(recording):
    """Planned before its router is seen, the restart would take the recipe's default router (vllm-router) and
    its worker API, not the LiteLLM that runs: r says so and does nothing until the router is there."""
    app, _, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        for name, cs in SERVERS.items():
            mon.nodes[name].containers = cs
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and scr.running_of("gpt-oss-120b") is not None, what="the launch")
        await wait_for(pilot, lambda: scr.selected == "gpt-oss-120b", what="it chosen")
        await pilot.press("r")
        await wait_for(pilot, lambda: any("its router is not running yet" in n.message for n in app._notifications),
                       what="r's warning")
        assert not isinstance(app.screen, ConfirmScreen)
        mon.nodes["spark1"].containers = (*SERVERS["spark1"], ROUTER)
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the restart's confirmation")
        shown = app.screen.command
        assert "behind simple-shuffle" in shown and "close it to new requests" in shown, shown
        await pilot.press("n")
        # the other node's list is older than the launch: r says so rather than plan it on the node listed
        mon.nodes["spark2"].containers = ()
        await wait_for(pilot, lambda: scr.running_of("gpt-oss-120b").verdict == STARTING, what="the launch not whole")
        await pilot.press("r")
        await wait_for(pilot, lambda: any("1 of its 2 servers listed" in n.message for n in app._notifications),
                       what="r's warning")
        assert not isinstance(app.screen, ConfirmScreen)
        assert not any("cannot be planned" in n.message for n in app._notifications)
        # s stops what runs now, and says what it cannot see
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the stop's confirmation")
        said = app.screen.detail
        assert "Only what the nodes list is stopped: 1 of its 2 servers listed" in said, said
        assert "spark2" not in app.screen.command and "Only what the nodes list" in screen_text(app)
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="cancelled")
        mon.nodes["spark2"].containers = SERVERS["spark2"]
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the restart's confirmation again")
        assert "spark2" in app.screen.command, app.screen.command
        await pilot.press("n")
        await pilot.press("q")


def workload(name: str, node: str, url: str, model: str, claim: int) -> ContainerInfo:
    labels = {"recipe": "llama-3.1-8b", "topology": "solo", "role": "server", "node": node, "url": url,
              "workload": name, "model": model, "claim": str(claim)}
    return ContainerInfo(name=f"vllm_node_{name}", state="running",
                         labels=tuple((f"sparkconsole.{k}", v) for k, v in labels.items()))


async def test_every_running_workload_is_listed_and_s_stops_the_highlighted_one_alone(recording):
    """Two workloads of one recipe on one node: both rows (name, model, node:port, state); the budget bar counts
    each one's claim; s on the second row plans the stop of its container alone."""
    GIB = 1 << 30
    app, _, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        mon.nodes["spark1"].containers = (workload("chat", "spark1", "http://127.0.0.1:8000", "llama-chat", 20 * GIB),
                                          workload("coder", "spark1", "http://127.0.0.1:8001", "llama-coder", 7 * GIB))
        await pilot.press("2")
        scr = app.recipes_screen
        await wait_for(pilot, lambda: scr.is_mounted and len(scr.running_groups()) == 2, what="two workloads")
        scr.launches_changed()
        rows = scr.query_one("#workload-list")
        await wait_for(pilot, lambda: rows.option_count == 2, what="two rows")
        shown = [str(rows.get_option_at_index(i).prompt) for i in range(2)]
        assert "chat  llama-chat  spark1:8000  serving" in shown[0] and "coder  llama-coder  spark1:8001" in shown[1]
        bar = scr.query_one("#budget")
        await wait_for(pilot, lambda: any(s.label == "coder" for b in bar.bars for s in b.segments), what="the bar")
        spark1 = next(b for b in bar.bars if b.node == "spark1")
        claimed = {s.label: s.bytes for s in spark1.segments if s.kind in ("held", "claim")}
        assert claimed == {"chat": 20 * GIB, "coder": 7 * GIB}, claimed     # the recording measures no container
        rows.focus()
        rows.highlighted = 1
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the stop's confirmation")
        assert "Stop coder (llama-3.1-8b × solo) on spark1?" in app.screen.title_text
        assert "vllm_node_coder" in app.screen.command and "vllm_node_chat" not in app.screen.command
        await pilot.press("n")
        await pilot.press("q")


def test_what_a_containers_restart_alone_does_to_its_launch():
    """The dashboard's r / s act on one container: its words say what that does to the launch it belongs to."""
    from sparkconsole.nodes.launches import alone_words
    routed = launch_groups([Node("spark1", (*SERVERS["spark1"], ROUTER)), Node("spark2", SERVERS["spark2"])])
    said = alone_words(routed, "spark2", "vllm_node", "restart")
    assert said.startswith("vllm_node is one of gpt-oss-120b's servers behind its router"), said
    assert said.endswith("r restarts gpt-oss-120b as one launch, one server at a time, dropping no request."), said
    assert alone_words(routed, "spark2", "vllm_node", "stop").endswith("s stops gpt-oss-120b as one launch."), said
    tp = launch_groups([Node("spark1", (labelled_as("cluster-tp2", "spark1", "server"),)),
                        Node("spark2", (labelled_as("cluster-tp2", "spark2", "worker"),))])
    said = alone_words(tp, "spark2", "vllm_node", "restart")
    assert said.startswith("vllm_node is the worker of gpt-oss-120b × cluster-tp2: the tensor-parallel group cannot "
                           "serve without every rank, so this restart breaks it."), said
    # a container no launch labels, or a solo launch: only what it does on its node
    assert alone_words(routed, "spark1", "other", "restart") == "Requests in flight on this node will fail."


def labelled_as(topology: str, node: str, role: str) -> ContainerInfo:
    c = labelled("vllm_node", node, role, "http://127.0.0.1:8000")
    return ContainerInfo(name=c.name, state="running", labels=tuple(
        (k, topology if k.endswith(".topology") else v) for k, v in c.labels))


async def test_the_dashboards_r_on_a_server_behind_a_router_points_at_the_roll(recording):
    """On a node of a 2x-solo launch, the dashboard's r (a plain docker restart of that one container) says that
    requests through the router fail and that the recipes screen's r rolls the launch without failing any."""
    app, factory, mon = make_app(recording)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: all(nm.state == NodeState.LIVE for nm in mon.nodes.values()), what="LIVE")
        mon.nodes["spark1"].containers = (*SERVERS["spark1"], ROUTER)
        mon.nodes["spark2"].containers = SERVERS["spark2"]
        await wait_for(pilot, lambda: app.core is not None and any(len(g.members) == 3 for g in app.core.launches),
                       what="the launch grouped at the nodes' next ticks")
        await pilot.click("#node-spark2", offset=(5, 1))
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the restart's confirmation")
        shown = screen_text(app)
        assert "Restart the vLLM container on spark2?" in shown
        assert "servers behind its router" in shown and "dropping no request" in shown, shown
        await pilot.press("n")
        assert not any("restart" in c for t in factory.made.values() for c in t.commands)
        await pilot.press("q")
