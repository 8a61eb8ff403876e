"""QNN lowering: turning the MNN ops of one partition subgraph into a QNN graph description.

`lower.lower_subgraph` lowers one subgraph at one shape with the rules of `ops.REGISTRY`; `graph.compose`
plays a description into a QNN graph; `support.unsupported_reason` is what the partition asks per op (the
op kinds and checks of the registry, importable without the rule bodies).
"""
