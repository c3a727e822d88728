"""A graph as a picture: nodes in layers by longest path from the inputs, coloured by kind.

Data edges are solid, order-only edges dashed. Uses matplotlib (a core dependency);
laid out by hand with networkx's topological generations, so no graphviz is needed.

    draw_graph(e_graph, Path("e-graph.png"))
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from teola_core.ir.graph import Graph
from teola_core.ir.kinds import Placement, spec_of

_COLOURS = {Placement.ENGINE: "#8ecae6", Placement.INLINE: "#e9ecef", Placement.USER: "#ffd6a5"}


def draw_graph(graph: Graph, path: Path) -> Path:
    """Write `graph` as a PNG at `path` (parent folders are created) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = nx.DiGraph()
    g.add_nodes_from(graph.nodes)
    g.add_edges_from((e.src, e.dst) for e in graph.data_edges)
    g.add_edges_from((c.src, c.dst) for c in graph.control_edges)
    layers = list(nx.topological_generations(g))
    pos = {node_id: (x, -y) for y, layer in enumerate(layers) for x, node_id in enumerate(sorted(layer))}
    width = max(len(layer) for layer in layers) if layers else 1
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * width), max(3.0, 1.1 * len(layers))))
    for e in graph.data_edges:
        _arrow(ax, pos[e.src], pos[e.dst], "solid")
    for c in graph.control_edges:
        _arrow(ax, pos[c.src], pos[c.dst], "dashed")
    for node_id, node in graph.nodes.items():
        x, y = pos[node_id]
        where = f"\n@{node.engine}" if node.engine else ""
        ax.text(
            x,
            y,
            f"{node_id}\n{node.kind.value}{where}",
            ha="center",
            va="center",
            fontsize=7,
            bbox={"boxstyle": "round", "facecolor": _COLOURS[spec_of(node.kind).placement], "edgecolor": "#555"},
        )
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-len(layers) + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(f"{graph.name}: {len(graph.nodes)} primitives", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _arrow(ax: object, start: tuple[float, float], end: tuple[float, float], style: str) -> None:
    ax.annotate(  # type: ignore[attr-defined]
        "",
        xy=end,
        xytext=start,
        arrowprops={"arrowstyle": "->", "linestyle": style, "color": "#666", "shrinkA": 14, "shrinkB": 14},
    )
