"""tinyllm: a tiny GPT trainer with bitwise-exact resume, corpus building and evaluation suites.

Importing it sets nothing: a run's process settings (MKL's strict CNR mode, threads, the OpenMP wait
policy) are applied when a run starts, by ``tinyllm train`` and ``tinyllm.durable.DurableRun``
(tinyllm/runtime_env.py).
"""
