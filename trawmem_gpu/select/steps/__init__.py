"""The steps of Stage 2 (``shared/design/trawmem-method.md``), one module each; every module holds
its NumPy reference, its torch batch and (where the CPU engine compiles it) its numba variant
side by side:

====  =====================================================  ================================
step  what                                                   module
====  =====================================================  ================================
1     seeds r0 (head or best-unit scores), head search       ``seeds.py``
2     propagation over G_H, neighbourhood cap                ``propagation.py``
3     candidates U_q and their affinity alpha                ``candidates.py``
4     demand delta, unit features, rho, phi                  ``roles.py``
5-6   costs C, B_q, priorities w and pi                      ``priority.py``
7     the objective J, its terms                             ``../objective.py``, ``../terms/``
7     greedy maximization of J, the budget / stop rule       ``greedy.py``
8     workspace assembly                                     ``trawmem_gpu/select/workspace.py``
====  =====================================================  ================================

``select/reference.py`` composes the references; ``select/engine/`` composes the batched variants.
"""
