"""QNN lowering: turning the MNN ops of one partition subgraph into QNN graph ops.

``support.unsupported_reason`` is the question the partition stage asks before it puts an op
on the NPU; the lowering itself answers it by implementing exactly the ops that table accepts.
"""
