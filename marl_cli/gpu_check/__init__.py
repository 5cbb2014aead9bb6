"""``marl gpu-check``: tiny-model checks of every GPU path (device, bf16 with fp32 masters, gradient checkpointing,
vLLM colocated, sleep mode, NCCL, FSDP2, tensor parallelism, async rollouts, a paper cell's real shape), one row
each, in one table.

``checks`` names them (each a function of a ``Setup``: the device and how many processes it may use, so the CPU
runs the ones with a stand-in), ``runner`` runs them one process each with a timeout, ``table`` renders the rows.
"""
