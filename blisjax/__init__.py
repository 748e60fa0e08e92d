"""blisjax: LLM-inference serving cluster simulator for policy search.

Two engines share one configuration and one workload:

* ``blisjax.reference`` — plain event-driven Python, the semantic oracle (BLIS-compatible);
* ``blisjax.engine`` — the JAX engine (fixed-shape state, jitted next-event kernel, vmapped populations).
"""

__version__ = "0.1.0"
