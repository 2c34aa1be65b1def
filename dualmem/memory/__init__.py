"""The pure core of the dual memory: the writer's view, plans of memory operations, the poisoning guard.

Plain functions over plain data, no I/O: :mod:`~dualmem.memory.view` (which
items the writer sees, with short ids), :mod:`~dualmem.memory.plan`
(``plan_update``: a model's ``MemoryUpdate`` validated into rows — grounding,
dedup, the op cap), :mod:`~dualmem.memory.guard` and
:mod:`~dualmem.memory.poisoning` (requests to change the persona's mind).
The writer (:mod:`dualmem.writer`) and training (:mod:`dualmem.training`) call
the same functions.
"""
