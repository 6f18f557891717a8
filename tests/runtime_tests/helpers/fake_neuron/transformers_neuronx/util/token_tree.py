"""Mirrors src/transformers_neuronx/util/token_tree.py (0.13.x, 1ade6d7): EAGLE token trees are {node: [children]}
rooted at 0, numbered in level order; `validate_token_tree` returns (number of nodes, depth in levels)."""

from queue import Queue
from typing import Dict, List, Set, Tuple

ROOT_NODE = 0


def _validate_level_dict(level_dict: Dict[int, List[int]]) -> Tuple[int, int]:
    tree_depth = len(level_dict)
    nodes_counter = 0
    for lvl in range(tree_depth):
        expected = set(range(nodes_counter, nodes_counter + len(level_dict[lvl])))
        for node in level_dict[lvl]:
            assert node in expected, f"Node {node} not indexed correctly in a leveled order for level {lvl}"
            expected.remove(node)
        nodes_counter += len(level_dict[lvl])
    return nodes_counter, tree_depth


def _validate_all_nodes_discovered(visited: Set[int], token_tree: Dict[int, List[int]]) -> None:
    for k in token_tree.keys():
        assert k in visited, f"Invalid token tree with node {k}."


def validate_token_tree(token_tree: Dict[int, List[int]]) -> Tuple[int, int]:
    assert ROOT_NODE in token_tree, "Token tree does not have the root node indexed as 0"
    visited = {ROOT_NODE}
    level_dict = {0: [ROOT_NODE]}
    q: Queue = Queue(maxsize=0)
    q.put((ROOT_NODE, 0))
    while not q.empty():
        curr, lvl = q.get()
        for child in token_tree.get(curr, ()):
            assert child not in visited, "Cycle/Graph found instead of a tree."
            visited.add(child)
            q.put((child, lvl + 1))
            level_dict.setdefault(lvl + 1, []).append(child)
    _validate_all_nodes_discovered(visited, token_tree)
    return _validate_level_dict(level_dict)
