"""QNN lowering: turning the MNN ops of one partition subgraph into a QNN graph description.

`lower.lower_subgraph` lowers one subgraph at one shape; `graph.compose` plays a description into a
QNN graph; `support.unsupported_reason` (the registry's answer) is what the partition asks per op.
"""
