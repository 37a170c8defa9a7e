"""Selection shared between the model tree and netron's graph: which ONNX nodes a layer stands for, which
module a clicked node belongs to, and the scripts that drive netron's page.

netron keeps its view in ``window.__view__`` (its ``index.js``); the graph drawn is ``view.target``, whose
``_table`` maps each model object (an ONNX node: ``name``, ``type``, ``inputs``, ``outputs``) to the element
drawn for it, and whose ``select(values)`` / ``scrollTo(elements)`` highlight and reveal them. The export
names nodes after modules (:mod:`workbench.export.naming`: ``bert.encoder.layer.0.attention.self.query/MatMul``,
Q/DQ nodes after their quantizer), so both directions are a matter of names.

Clicks travel back as a console message (:data:`CLICK_PREFIX` + a JSON list of the selected node names),
which the page class passes on as a signal: no polling, no QWebChannel object to keep alive.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from workbench.export.naming import module_of_node_name

__all__ = ["CLICK_PREFIX", "INSTALL_JS", "SELECTED_JS", "select_js", "nodes_of_layers", "tree_row_of_node",
           "clicked_names"]

CLICK_PREFIX = "__workbench_selected__"

# Installed once per page load, after netron has drawn the graph (idempotent: a second run does nothing).
INSTALL_JS = r"""
(function () {
  var view = window.__view__;
  if (!view || !view.target || !view.target._table) { return -1; }
  if (!window.__workbench__) {
    var isNode = function (key, element) {
      return key && element && element.value === key && typeof key.name === 'string' && key.type &&
             Array.isArray(key.inputs) && Array.isArray(key.outputs);
    };
    window.__workbench__ = {
      nodes: function () {
        var out = [];
        var target = window.__view__ && window.__view__.target;
        if (target && target._table) {
          target._table.forEach(function (element, key) { if (isNode(key, element)) { out.push(key.name); } });
        }
        return out;
      },
      selected: function () {
        var out = [];
        var target = window.__view__ && window.__view__.target;
        if (target && target.selection) {
          target.selection.forEach(function (element) {
            if (element && element.value && isNode(element.value, element)) { out.push(element.value.name); }
          });
        }
        return out;
      },
      select: function (names) {
        var target = window.__view__ && window.__view__.target;
        if (!target || !target._table) { return 0; }
        var wanted = new Set(names);
        var keys = [];
        target._table.forEach(function (element, key) {
          if (isNode(key, element) && wanted.has(key.name)) { keys.push(key); }
        });
        if (keys.length === 0) { target.select(null); return 0; }
        var elements = target.select(keys);
        target.scrollTo(elements, 'instant');
        return keys.length;
      }
    };
    // a user's click: report what netron selected once its own handler ran (capture phase, next tick)
    document.addEventListener('click', function () {
      setTimeout(function () {
        var names = window.__workbench__.selected();
        if (names.length > 0) { console.info('__PREFIX__' + JSON.stringify(names)); }
      }, 0);
    }, true);
  }
  return window.__workbench__.nodes().length;
})()
""".replace("__PREFIX__", CLICK_PREFIX)

SELECTED_JS = "JSON.stringify(window.__workbench__ ? window.__workbench__.selected() : [])"
NODES_JS = "JSON.stringify(window.__workbench__ ? window.__workbench__.nodes() : [])"


def select_js(node_names: Iterable[str]) -> str:
    """The script that selects (and scrolls to) ``node_names`` in netron; it returns how many it found."""
    return f"window.__workbench__ ? window.__workbench__.select({json.dumps(list(node_names))}) : -1"


def nodes_of_layers(node_names: Iterable[str], layers: Iterable[str]) -> list[str]:
    """The nodes drawn for ``layers``: those named after the layer or a module inside it, and its Q/DQ nodes.

    ``layers`` may hold containers (``bert.encoder.layer.0``): every node inside is theirs.
    """
    wanted = [layer for layer in layers if layer]
    if not wanted:
        return []
    out = []
    for name in node_names:
        module = module_of_node_name(name)
        if module is None:
            continue
        if any(module == layer or module.startswith(layer + ".") for layer in wanted):
            out.append(name)
    return out


def tree_row_of_node(node_name: str, has_row: Callable[[str], bool]) -> str | None:
    """The tree row a clicked node belongs to: its module, else the nearest enclosing module with a row.

    ``has_row(path)`` says whether the tree shows ``path``. A node of the top-level forward (``/Reshape``)
    or one the exporter made up (``node_add_3``) has none.
    """
    module = module_of_node_name(node_name)
    while module:
        if has_row(module):
            return module
        module = module.rpartition(".")[0]
    return None


def clicked_names(message: str) -> list[str] | None:
    """The node names in a click report logged by :data:`INSTALL_JS`, or None for any other console message."""
    if not message.startswith(CLICK_PREFIX):
        return None
    try:
        names = json.loads(message[len(CLICK_PREFIX):])
    except ValueError:
        return None
    return [str(name) for name in names] if isinstance(names, list) else None
