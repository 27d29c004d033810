"""The package's rooms, read from its source (no server): the leaf modules
(the underscored ones) import no shell, no module imports a private name
from a sibling, and the imports form no cycle, TYPE_CHECKING ones included."""

import ast
import os
import unittest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shardlock")
# The shells: what users import. Everything else in the package is a leaf
# they share (the codec, the router, auth and errors included).
SHELLS = {"client", "aio", "watch", "election", "reentrant", "__init__"}


def imports():
    """Module -> [(sibling imported, names imported from it)], every import
    statement anywhere in the module."""
    found = {}
    for name in sorted(os.listdir(PACKAGE)):
        if not name.endswith(".py"):
            continue
        module = name[:-3]
        with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
            tree = ast.parse(f.read(), name)
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module is None:  # from . import x
                    edges += [(alias.name, []) for alias in node.names]
                else:
                    edges.append((node.module, [alias.name for alias in node.names]))
        found[module] = edges
    return found


class Layout(unittest.TestCase):
    def test_no_module_imports_a_private_name_from_a_sibling(self):
        crossing = ["%s imports %s from %s" % (module, name, sibling)
                    for module, edges in imports().items()
                    for sibling, names in edges for name in names if name.startswith("_")]
        self.assertEqual(crossing, [])

    def test_the_leaves_import_no_shell(self):
        upward = ["%s imports %s" % (module, sibling)
                  for module, edges in imports().items() if module not in SHELLS
                  for sibling, _ in edges if sibling in SHELLS]
        self.assertEqual(upward, [])

    def test_the_imports_form_no_cycle(self):
        graph = {module: {sibling for sibling, _ in edges} for module, edges in imports().items()}
        done, path = set(), []

        def visit(module):
            if module in path:
                self.fail("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
            if module in done:
                return
            path.append(module)
            for sibling in sorted(graph.get(module, ())):
                visit(sibling)
            path.pop()
            done.add(module)

        for module in sorted(graph):
            visit(module)

    def test_the_layout_is_what_this_test_thinks_it_is(self):
        modules = set(imports())
        self.assertTrue({"client", "aio", "_policy", "_common"} <= modules, modules)


if __name__ == "__main__":
    unittest.main()
