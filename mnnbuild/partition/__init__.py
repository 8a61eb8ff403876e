"""The partition (upstream ``compilefornpu``): cut an MNN LLM graph into CPU ops and QNN subgraphs.

- ``cut``: the pure graph algorithm (needed ops, folding, break ops, the op schedule, splits, boundaries,
  plugins).
- ``fold``: per-shape constant values of the folded tensors and the folded copies of the model.
- ``reference``: run every module in order at every sample shape, each loaded once (the per-graph reference IO),
  and ``SourceSubgraphRunner``, a plugin's CPU reference (its source ops): for ``mnnbuild_runtime``'s hybrid
  executor and verify's per-graph check.
- ``rewrite``: the Plugin ops, their attributes (per shape, then fused), and ``qnn/llm.mnn``.
- ``records``: ``graph.json`` / ``partition.json`` models and the naming rules (``t<index>``, ``graphllm<k>``).
- ``graphs``: each plugin graph's dir (description, reference values), convolutions split by output channels, the
  sample runs that check the cut, the plugins' attributes per shape.
- ``report``: the partition report (JSON and text).

MNN op semantics (what an op reads, what decides its shape) are ``mnnbuild.mnn.semantics``.
The stage entry is ``mnnbuild.stages.partition.partition``; what is made of the cut's graphs (context binaries, their
unshared twins, model-libs) is ``mnnbuild.plugin``.
"""
