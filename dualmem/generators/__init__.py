"""The data generators: RoleMemo-style histories woven from personas (``weave``) and RealMem-style simulated
sessions (``simulate``), with their checks, the long-history assembler and scripted offline answers.

:mod:`~dualmem.generate` is their Python API (:func:`~dualmem.generate.generate_rolememo`,
:func:`~dualmem.generate.generate_realmem`); the graphs are :mod:`dualmem.graphs.weave` and
:mod:`dualmem.graphs.simulate`, their nodes :mod:`dualmem.nodes.weave` and :mod:`dualmem.nodes.simulate`.
"""
