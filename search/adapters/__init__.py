"""Adapters that make blisjax the evaluator of LLM-driven policy evolution (GEPA, OpenEvolve).

``search.adapters.core`` holds what both share: candidates as policy-bundle YAML sections,
workload cases, batched scoring through the JAX engine (the reference engine for the rest), and
decision-trace feedback. The framework modules import their framework only when used.
"""
