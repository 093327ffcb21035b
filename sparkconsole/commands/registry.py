"""`sparkconsole recipe registry add|list|update|rm|trust|untrust`: recipe registries (recipes/registry.py).

    sparkconsole recipe registry add https://github.com/ORG/REPO.git [--name N] [--trust]
    sparkconsole recipe registry list
    sparkconsole recipe registry update [NAME]       (the Spark Arena registries are fetched here the first time)
    sparkconsole recipe registry rm NAME
    sparkconsole recipe registry trust NAME          (its pre_exec and mods run without asking)
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("registry", help="add, list, update and remove recipe registries (git repositories)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rs = p.add_subparsers(dest="registry_command", metavar="ACTION")
    rs.required = True
    add = rs.add_parser("add", help="clone a registry (https, ssh or file URL) into the state directory")
    add.add_argument("url", metavar="URL")
    add.add_argument("--name", help="what @NAME/recipe calls it (default: the repository's name)")
    add.add_argument("--trust", action="store_true", help="run its recipes' pre_exec commands and mods without asking")
    rs.add_parser("list", help="each registry: its sections, fetched or not, trusted or not")
    up = rs.add_parser("update", help="fetch what changed (all registries, or one)")
    up.add_argument("name", nargs="?", metavar="NAME")
    for verb, what in (("rm", "remove a registry and its clone"), ("trust", "mark a registry trusted"),
                       ("untrust", "mark a registry not trusted")):
        sp = rs.add_parser(verb, help=what)
        sp.add_argument("name", metavar="NAME")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..recipes.registry import Registries

    regs = Registries.load()
    verb = args.registry_command
    if verb == "add":
        entry, sections = regs.add(args.url, args.name, trusted=args.trust)
        n = sum(1 for rr in regs.recipes() if rr.registry == entry.name)
        print(f"added {entry.name} ({entry.url}): {n} recipe(s) in {len(sections)} section(s): "
              + ", ".join(s.name + ("" if s.visible else " (hidden)") for s in sections)
              + ("; trusted" if entry.trusted else "; not trusted: its pre_exec and mods run only after you confirm"))
        return 0
    if verb == "list":
        if not regs.entries:
            print("no registries (add one: sparkconsole recipe registry add URL)")
        for e in regs.entries:
            if regs.fetched(e.name):
                secs = regs.sections(e.name)
                n = sum(1 for rr in regs.recipes() if rr.registry == e.name)
                state = f"{n} recipe(s); sections: " + ", ".join(s.name + ("" if s.visible else " (hidden)") for s in secs)
            else:
                state = "not fetched (sparkconsole recipe registry update" + (f" {e.name})" if not e.default else ")")
            print(f"{e.name:<16} {'trusted' if e.trusted else 'untrusted':<9}  {e.url}\n{'':<16} {state}")
        return 0
    if verb == "update":
        for line in regs.update(args.name):
            print(line)
        return 0
    if verb == "rm":
        regs.remove(args.name)
        print(f"removed {args.name}")
        return 0
    regs.trust(args.name, verb == "trust")
    print(f"{args.name}: {'trusted' if verb == 'trust' else 'not trusted'}")
    return 0
