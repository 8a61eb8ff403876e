"""A plugin's QNN artifacts: its partition graphs lowered to QNN and composed into an HTP context binary.

- ``lowered``: a plugin's graph dirs lowered to QNN (``lower_plugin``; ``PluginGraphs``, the picklable recipe the
  context and twin stages compose from, and what the modellib stage writes to disk).
- ``compose``: one context binary composed in a fresh process (``compose_in_fresh_process``, ``compose_checked``):
  QNN numbers tensors from a process-wide counter, so one binary per process keeps its bytes a function of its inputs.
- ``binary``: a plugin's graphs composed into its context binary, checked and recorded (``build_plugin_binary``):
  the context stage's shipped, weight-shared binary and the twin stage's unshared twin, each with its own manifest.

The cut that decides the plugins is ``mnnbuild.partition``; the op-by-op lowering rules are ``mnnbuild.lowering``.
"""
